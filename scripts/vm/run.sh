#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run.sh SERIES COMMAND...: boots Debian's packaged SERIES kernel (5.10, 6.1,
# 6.12; scripts/vm/prepare.sh) under qemu and runs COMMAND as root in a chroot
# of this machine's root (read-only), in the current directory, with /tmp a
# tmpfs. Prints what the command printed and exits with its exit status.
# The results folder $INGERO_VM_OUT (the command can write there) is the only
# writable path shared with this machine.
set -euo pipefail
series="$1"; shift
here="$(pwd)"
VM_DIR="$(realpath -m "${INGERO_VM_DIR:-$(dirname "$0")/../../target/vm}")"
kdir="$VM_DIR/$series"
[ -f "$kdir/.ready" ] || { echo "kernel $series not prepared: run scripts/vm/prepare.sh" >&2; exit 2; }
mkdir -p "$VM_DIR/runs"
out="$(mktemp -d "$VM_DIR/runs/XXXXXX")"
trap 'rm -rf "$out"' EXIT
{
  echo "export PATH='$PATH' HOME=/root TMPDIR=/run/tmp CI='${CI:-}' INGERO_VM_OUT='$out' INGERO_VM_KERNEL='$series'"
  for v in RUST_LOG INGERO_TEST_LOG RUST_BACKTRACE; do
    [ -n "${!v:-}" ] && printf "export %s='%s'\n" "$v" "${!v}"
  done
  printf 'cd %q || exit 125\n' "$here"
  printf '%q ' "$@"; echo
} >"$out/cmd.sh"
# TCG (software emulation), all host CPUs as vCPUs, 9p shares: see prepare.sh.
# 1200 s: the `kernel` binary alone takes 640-750 s on 5.10 under emulation.
timeout --foreground "${INGERO_VM_TIMEOUT:-1200}" qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu max -smp "${INGERO_VM_CPUS:-2}" -m "${INGERO_VM_MEM:-3G}" \
  -nographic -no-reboot -nodefaults -serial stdio \
  -kernel "$kdir/vmlinuz" -initrd "$kdir/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 ingero.out=$out" \
  -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$out",mount_tag=out,security_model=none,multidevs=remap \
  </dev/null | perl -pe 's/\r//g; s/\ec|\e\[[0-9;?]*[A-Za-z]//g; s/^SeaBIOS .*\n//; s/Booting from ROM\.\.//; s/^\[ *[0-9.]+\] (sysrq: Power Off|reboot: Power down)\n//'
[ -f "$out/rc" ] || { echo "ingero-vm: $series: the command did not finish (no exit status)" >&2; exit 124; }
exit "$(cat "$out/rc")"
