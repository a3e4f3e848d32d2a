#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Per-switch cost of Ingero's scheduler probe (ebpf/sched.bpf.c, on_switch):
# two threads hand a turn back and forth through a futex, pinned to one CPU
# (every hand-over a context switch: ~460k switches/s on a 2-core VM), with
# no agent, with the agent running (the threads not traced: every switch
# still pays the cgroup accounting), and with the agent tracing the process
# (--pid: off-CPU and run-queue time per thread). Rounds interleave so drift
# hits every variant alike; medians are printed. Then the programs' own time
# per run (BPF_STATS_RUN_TIME) in the traced case.
#
#   sudo scripts/switch-cost.sh [AGENT_BINARY] [HANDOVERS] [ROUNDS]
set -euo pipefail
agent="${1:-target/release/ingero-agent}"
n="${2:-300000}"
rounds="${3:-5}"
[ -x "$agent" ] || { echo "no agent binary at $agent (cargo build --release -p ingero-node)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; sysctl -qw kernel.bpf_stats_enabled=0; rm -rf "$work"' EXIT
gcc -O2 -pthread -o "$work/pingpong" "$(dirname "$0")/../node/tests/native/pingpong.c"
cpu=$(( $(nproc) - 1 ))
. "$(dirname "$0")/lib/agent-bench.sh"
# A pingpong that waits for a go (its pid is known before it runs); the
# agent stays up (stop_agent) and the result is in $work/out.
traced_run() {
  mkfifo "$work/go"
  ( read -r _ < "$work/go"; exec taskset -c "$cpu" "$work/pingpong" "$n" ) > "$work/out" &
  local p=$!
  start_agent --pid "$p"
  echo go > "$work/go"
  wait "$p"; rm -f "$work/go"
}

declare -a none untraced traced
for r in $(seq "$rounds"); do
  none+=("$(taskset -c "$cpu" "$work/pingpong" "$n")")
  start_agent
  untraced+=("$(taskset -c "$cpu" "$work/pingpong" "$n")")
  stop_agent
  traced_run
  stop_agent
  traced+=("$(cat "$work/out")")
  echo "round $r: none ${none[-1]}, agent (untraced) ${untraced[-1]}, agent (traced) ${traced[-1]} ns/switch" >&2
done
m0=$(median "${none[@]}"); m1=$(median "${untraced[@]}"); m2=$(median "${traced[@]}")
echo "context switch (futex hand-over, one CPU), median of $rounds x $((2 * n)) switches:"
echo "  no agent          $m0 ns"
echo "  agent, untraced   $m1 ns   (+$(awk -v a="$m1" -v b="$m0" 'BEGIN {printf "%.0f", a - b}') ns a switch)"
echo "  agent, traced     $m2 ns   (+$(awk -v a="$m2" -v b="$m0" 'BEGIN {printf "%.0f", a - b}') ns a switch)"

sysctl -qw kernel.bpf_stats_enabled=1
before="$(bpftool prog show -j)"
traced_run
after="$(bpftool prog show -j)"
stop_agent
run_time traced "$before" "$after" on_switch on_wakeup
