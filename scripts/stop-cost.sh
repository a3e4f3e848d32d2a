#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What uprobe_multi links (Linux 6.6+) change: the agent probes NVIDIA's real
# libcudart ahead of use, then is stopped, with its default (a link of entry
# probes and one of return probes per file) and with --no-uprobe-multi (a
# perf event per probe). Per variant: the probes placed, seconds from start
# to "probe loop ready", seconds from SIGTERM to exit, and what a traced
# cudaStreamSynchronize costs (the programs are the same; only how they are
# attached differs). Rounds interleave; medians are printed.
#
#   sudo scripts/stop-cost.sh [AGENT_BINARY] [ROUNDS] [CALLS]
#
# Needs root, gcc, pip nvidia-cuda-runtime-cu12, and an agent built with
# `--features store` (it writes to a local store: nothing to wait for at the stop).
set -euo pipefail
agent="${1:-target/release/ingero-agent}"
rounds="${2:-5}"
calls="${3:-200000}"
. "$(dirname "$0")/lib/agent-bench.sh"
bench_setup "cargo build --release -p ingero-node --features store"

now() { date +%s.%N; }
# one VARIANT_FLAGS...: prints "probes start_s stop_s ns_per_call". The agent
# writes to its embedded store (no aggregator to wait for at the stop).
one() {
  local t0 t1 t2 probes ns
  rm -rf "$work/data" "$work/spool"
  t0=$(now)
  INGERO_LOG=info "$agent" run --store "file://$work/data" --spool-dir "$work/spool" --kubernetes off \
    --lib "$lib" "$@" > /dev/null 2> "$work/agent.log" &
  ag=$!
  wait_for "$work/agent.log" "probe loop ready"
  t1=$(now)
  probes=$(grep "library=$lib" "$work/agent.log" | grep -o 'probes=[0-9]*' | head -1 | cut -d= -f2)
  ns=$("$work/callbench" "$lib" cudaStreamSynchronize "$calls")
  t2=$(now)
  stop_agent
  awk -v p="$probes" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$(now)" -v n="$ns" \
    'BEGIN {printf "%s %.2f %.2f %s\n", p, b - a, d - c, n}'
}

declare -a m_start m_stop m_ns p_start p_stop p_ns
for r in $(seq "$rounds"); do
  read -r pm sm tm nm < <(one)
  read -r pp sp tp np < <(one --no-uprobe-multi)
  m_start+=("$sm"); m_stop+=("$tm"); m_ns+=("$nm")
  p_start+=("$sp"); p_stop+=("$tp"); p_ns+=("$np")
  echo "round $r: multi ${pm} probes start ${sm} s stop ${tm} s ${nm} ns/call | per-probe ${pp} probes start ${sp} s stop ${tp} s ${np} ns/call" >&2
done
echo "$(basename "$lib") probed ahead of use, median of $rounds rounds:"
printf '  %-22s %8s %8s %14s\n' "" "start s" "stop s" "ns/sync call"
printf '  %-22s %8s %8s %14s\n' "uprobe_multi (default)" "$(median "${m_start[@]}")" "$(median "${m_stop[@]}")" "$(median "${m_ns[@]}")"
printf '  %-22s %8s %8s %14s\n' "--no-uprobe-multi" "$(median "${p_start[@]}")" "$(median "${p_stop[@]}")" "$(median "${p_ns[@]}")"
