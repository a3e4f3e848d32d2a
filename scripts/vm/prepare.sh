#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prepares the kernel matrix the agent's live tests run on: Debian's packaged
# generic kernels (bullseye 5.10, bookworm 6.1, bookworm-backports 6.12), each
# with a busybox initramfs that mounts this machine's root read-only over 9p,
# and qemu 10 from bookworm-backports. Idempotent; everything lands in
# $INGERO_VM_DIR (default target/vm). Needs root for apt (qemu, busybox).
#
# Why these kernels: 5.10 (Amazon Linux 2 and older EKS GPU node groups),
# 6.1 and 6.12 (Debian/Ubuntu-derived GPU images); the generic -amd64 flavour
# because -cloud has no 9p. Why qemu with TCG: /dev/kvm here is a nested
# paravirtual KVM that stock kernels cannot run on.
set -euo pipefail
cd "$(dirname "$0")/../.."
VM_DIR="$(realpath -m "${INGERO_VM_DIR:-target/vm}")"
SERIES="${INGERO_VM_KERNELS:-5.10 6.1 6.12}"
mkdir -p "$VM_DIR/apt/lists/partial" "$VM_DIR/debs"

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$VM_DIR/apt/sources.list" <<LIST
deb [signed-by=$KEYRING] http://deb.debian.org/debian bullseye main
deb [signed-by=$KEYRING] http://deb.debian.org/debian-security bullseye-security main
deb [signed-by=$KEYRING] http://deb.debian.org/debian bookworm main
deb [signed-by=$KEYRING] http://deb.debian.org/debian-security bookworm-security main
deb [signed-by=$KEYRING] http://deb.debian.org/debian bookworm-backports main
LIST
APT=(-o "Dir::Etc::SourceList=$VM_DIR/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$VM_DIR/apt/lists" -o Acquire::Check-Valid-Until=false -o APT::Sandbox::User=root)
apt-get -qq "${APT[@]}" update

command -v cpio >/dev/null && [ -x /sbin/depmod ] || DEBIAN_FRONTEND=noninteractive apt-get -y -qq install cpio kmod xz-utils zstd >/dev/null
if ! qemu-system-x86_64 --version 2>/dev/null | grep -q 'version 1[0-9]'; then
  echo "== qemu 10 (bookworm-backports)"
  DEBIAN_FRONTEND=noninteractive apt-get -y -qq "${APT[@]}" install --no-install-recommends \
    -t bookworm-backports qemu-system-x86 >/dev/null
fi
if [ ! -x "$VM_DIR/busybox" ]; then
  (cd "$VM_DIR/debs" && apt-get -qq "${APT[@]}" download busybox-static)
  rm -rf "$VM_DIR/bb" && dpkg-deb -x "$VM_DIR"/debs/busybox-static_*.deb "$VM_DIR/bb"
  cp "$VM_DIR/bb/bin/busybox" "$VM_DIR/busybox"
fi

# The newest generic image of a series, by package name.
newest() {
  apt-cache "${APT[@]}" search --names-only "^linux-image-$1[.-][0-9.+a-z-]*-amd64\$" \
    | awk '{print $1}' | grep -v -e cloud -e '-rt-' -e dbg -e unsigned | sort -V | tail -1
}

for s in $SERIES; do
  pkg="$(newest "$s")"
  [ -n "$pkg" ] || { echo "no linux-image package for $s" >&2; exit 1; }
  # The cache is of this package built by this initramfs script.
  pkg="$pkg $(sha256sum scripts/vm/initramfs.sh | cut -c1-12)"
  dest="$VM_DIR/$s"
  if [ -f "$dest/.ready" ] && [ "$(cat "$dest/.ready")" = "$pkg" ]; then
    echo "== $s: $pkg (cached)"; continue
  fi
  echo "== $s: $pkg"
  rm -rf "$dest" && mkdir -p "$dest/pkg"
  name="${pkg%% *}"
  (cd "$VM_DIR/debs" && rm -f "$name"_*.deb && apt-get -qq "${APT[@]}" download "$name")
  dpkg-deb -x "$VM_DIR"/debs/"$name"_*.deb "$dest/pkg"
  release="$(ls "$dest/pkg/lib/modules")"
  cp "$dest/pkg/boot/vmlinuz-$release" "$dest/vmlinuz"
  # The package ships no modules.dep (its postinst runs depmod).
  /sbin/depmod -b "$dest/pkg" "$release"
  scripts/vm/initramfs.sh "$dest/pkg/lib/modules/$release" "$VM_DIR/busybox" "$dest/initrd.gz"
  rm -rf "$dest/pkg" "$VM_DIR"/debs/"$name"_*.deb
  echo "$pkg" >"$dest/.ready"
done
