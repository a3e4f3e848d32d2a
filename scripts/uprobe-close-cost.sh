#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What closing uprobes costs the agent's stop and detaches, by how they were
# made: N perf-event uprobes on glibc's functions closed from 1 and from 8
# threads, against one uprobe_multi link of the same N offsets (Linux 6.6+).
#
#   sudo scripts/uprobe-close-cost.sh [N]      default 60 (libcudart's ~60 probes)
set -euo pipefail
n="${1:-60}"
libc="$(ldd /bin/true | awk '/libc.so/ {print $3}')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
gcc -O2 -pthread -o "$work/uprobe_close" "$(dirname "$0")/native/uprobe_close.c"
nm -D --defined-only "$libc" | awk '$2 == "T" {print $1}' | sort -u | sed -n "1,${n}p" > "$work/offsets"
"$work/uprobe_close" perf "$libc" "$n" 1 < "$work/offsets"
"$work/uprobe_close" perf "$libc" "$n" 8 < "$work/offsets"
"$work/uprobe_close" multi "$libc" "$n" < "$work/offsets"
