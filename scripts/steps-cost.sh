#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What finding steps costs a return-probed call: cudaStreamSynchronize on
# NVIDIA's real libcudart (no GPU: it returns at once, so the probes are all
# there is to time) with no agent, with the agent and --no-steps, and with
# its defaults (every return also writes a 32-byte mark to the marks ring).
# Rounds interleave so drift hits every variant alike; medians are printed.
#
#   sudo scripts/steps-cost.sh [AGENT_BINARY] [CALLS] [ROUNDS]
#
# Needs root, gcc, and pip nvidia-cuda-runtime-cu12.
set -euo pipefail
agent="${1:-target/release/ingero-agent}"
calls="${2:-1000000}"
rounds="${3:-5}"
sym=cudaStreamSynchronize
. "$(dirname "$0")/lib/agent-bench.sh"
bench_setup "cargo build --release -p ingero-node"
bench() { "$work/callbench" "$lib" "$sym" "$calls"; }

declare -a none off on
for r in $(seq "$rounds"); do
  none+=("$(bench)")
  start_agent --lib "$lib" --no-steps
  off+=("$(bench)")
  stop_agent
  start_agent --lib "$lib"
  on+=("$(bench)")
  stop_agent
  echo "round $r: none ${none[-1]}, steps off ${off[-1]}, steps on ${on[-1]} ns/call" >&2
done
m0=$(median "${none[@]}"); m1=$(median "${off[@]}"); m2=$(median "${on[@]}")
echo "$sym on $(basename "$lib"), median of $rounds x $calls calls:"
echo "  no agent               $m0 ns"
echo "  agent, --no-steps      $m1 ns"
echo "  agent (steps, default) $m2 ns   (+$(awk -v a="$m2" -v b="$m1" 'BEGIN {printf "%.1f", a - b}') ns a call for the mark)"

# The return program's own time per run, with and without the mark
# (BPF_STATS_RUN_TIME): finer than the call's time, which drifts.
sysctl -qw kernel.bpf_stats_enabled=1
trap 'kill $(jobs -p) 2>/dev/null || true; sysctl -qw kernel.bpf_stats_enabled=0; rm -rf "$work"' EXIT
for variant in --no-steps ""; do
  start_agent --lib "$lib" $variant
  before="$(bpftool prog show -j)"
  bench > /dev/null
  after="$(bpftool prog show -j)"
  stop_agent
  run_time "${variant:-default}" "$before" "$after" call_return
done
