#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Per-call cost of Ingero's probe on NVIDIA's real libcudart, side by side in
# one run with no probe and with a bare empty uprobe (bpftrace `{}`), using
# the agent binary as deployed (not a test harness). Rounds are interleaved so
# drift on a shared machine hits every variant alike; medians are printed.
#
#   sudo scripts/probe-cost.sh [AGENT_BINARY] [CALLS] [ROUNDS]
#
# Needs root, bpftrace (apt), gcc, and pip nvidia-cuda-runtime-cu12.
set -euo pipefail
agent="${1:-target/release/ingero-agent}"
calls="${2:-2000000}"
rounds="${3:-5}"
sym=cudaLaunchKernel
lib="$(python3 -c 'import nvidia.cuda_runtime as m; print(list(m.__path__)[0])')/lib/libcudart.so.12"
[ -f "$lib" ] || { echo "no $lib: pip install nvidia-cuda-runtime-cu12" >&2; exit 1; }
command -v bpftrace >/dev/null || { echo "bpftrace not found: apt-get install bpftrace" >&2; exit 1; }
[ -x "$agent" ] || { echo "no agent binary at $agent (cargo build --release -p ingero-node)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
gcc -O2 -o "$work/callbench" "$(dirname "$0")/../node/tests/native/callbench.c" -ldl
bench() { "$work/callbench" "$lib" "$sym" "$calls"; }
wait_for() { for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "timeout: $2 in $1" >&2; cat "$1" >&2; exit 1; }

declare -a none bare ingero
for r in $(seq "$rounds"); do
  none+=("$(bench)")
  bpftrace -e "uprobe:$lib:$sym {}" > "$work/bt.log" 2>&1 &
  bt=$!
  wait_for "$work/bt.log" "Attaching"
  sleep 0.5
  bare+=("$(bench)")
  kill -INT $bt; wait $bt 2>/dev/null || true
  # Every probe on: the cost of a traced call, not of a duty-cycled one.
  INGERO_LOG=info "$agent" run --aggregator http://127.0.0.1:9 --spool-dir "$work/spool" --lib "$lib" \
    --kubernetes off --trap-budget=off 2> "$work/agent.log" &
  ag=$!
  wait_for "$work/agent.log" "attached ahead of use"
  ingero+=("$(bench)")
  kill -TERM $ag; wait $ag 2>/dev/null || true
  echo "round $r: none ${none[-1]} ns, bare ${bare[-1]} ns, ingero ${ingero[-1]} ns" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
n=$(median "${none[@]}"); b=$(median "${bare[@]}"); i=$(median "${ingero[@]}")
echo "$sym on $(basename "$lib"), median of $rounds x $calls calls:"
echo "  no probe     $n ns"
echo "  bare uprobe  $b ns"
echo "  ingero       $i ns   (ingero / bare = $(awk -v i="$i" -v b="$b" 'BEGIN {printf "%.3f", i / b}')x, goal <= 1.15x)"
