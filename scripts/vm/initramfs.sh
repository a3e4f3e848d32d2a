#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# initramfs.sh MODULES_DIR BUSYBOX OUT.gz: a busybox initramfs that loads the
# 9p/virtio modules of that kernel (decompressed here: busybox insmod may not
# read .ko.xz), mounts this machine's root read-only over 9p (tag "host") and
# a writable results folder (tag "out"), then runs $out/cmd.sh in a chroot of
# the host root and writes its exit status to $out/rc (scripts/vm/run.sh).
# Scratch space is a tmpfs at /run/tmp (TMPDIR): /tmp stays the host's,
# read-only, so a checkout under /tmp is visible in the guest.
set -euo pipefail
mods="$1" bb="$2" out="$(realpath -m "$3")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{bin,proc,sys,dev,mnt,lib/modules}
cp "$bb" "$work/bin/busybox"

# Wanted modules and everything they depend on, dependencies first.
declare -A seen=()
order=()
add() {
  local path="$1" dep
  [ -n "${seen[$path]:-}" ] && return
  seen[$path]=1
  for dep in $(awk -F': *' -v m="$path" '$1 == m { print $2 }' "$mods/modules.dep"); do add "$dep"; done
  order+=("$path")
}
for name in virtio_pci virtio_console 9pnet_virtio 9p overlay; do
  path="$(awk -F: '{print $1}' "$mods/modules.dep" | grep -E "/$name\.ko(\.xz|\.zst|\.gz)?\$" | head -1 || true)"
  [ -n "$path" ] && add "$path"   # built in when absent
done
i=0
for path in "${order[@]}"; do
  dest="$work/lib/modules/$(printf '%02d' $i).ko"
  case "$path" in
    *.xz) xz -dc "$mods/$path" >"$dest" ;;
    *.zst) zstd -qdc "$mods/$path" >"$dest" ;;
    *.gz) gzip -dc "$mods/$path" >"$dest" ;;
    *) cp "$mods/$path" "$dest" ;;
  esac
  i=$((i + 1))
done

cat >"$work/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in /lib/modules/*.ko; do insmod "$m" 2>/dev/null; done
out="$(sed -n 's/.*ingero\.out=\([^ ]*\).*/\1/p' /proc/cmdline)"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 host /mnt || echo "ingero-vm: mounting the host root failed"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "/mnt$out" || echo "ingero-vm: mounting $out failed"
for d in proc sys dev; do mount --bind "/$d" "/mnt/$d"; done
chroot /mnt /bin/sh -c '
  mount -t tmpfs run /run; mkdir -m 1777 /run/tmp
  mkdir -p /dev/pts /dev/shm; mount -t devpts pts /dev/pts; mount -t tmpfs shm /dev/shm
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null
  mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
  mount -t bpf bpf /sys/fs/bpf 2>/dev/null
  mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
  ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up 2>/dev/null
  sh "$1/cmd.sh"; echo $? >"$1/rc"; sync
' sh "$out"
echo o >/proc/sysrq-trigger
poweroff -f
INIT
chmod +x "$work/init"
(cd "$work" && find . | cpio -o -H newc --quiet | gzip -1) >"$out"
