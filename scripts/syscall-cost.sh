#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What off-CPU call sites (--offcpu-site-min, ebpf/sched.bpf.c on_sys_exit)
# cost every syscall on the node: a loop of getppid syscalls (no vDSO) with
# no agent, with the agent and sites off (--offcpu-site-min=0: the exit
# program is not attached), and with the agent's defaults (attached; with no
# episode pending it is one array lookup). Rounds interleave so drift hits
# every variant alike; medians are printed, then the program's own time per
# run (BPF_STATS_RUN_TIME).
#
#   sudo scripts/syscall-cost.sh [AGENT_BINARY] [SYSCALLS] [ROUNDS]
set -euo pipefail
agent="${1:-target/release/ingero-agent}"
n="${2:-2000000}"
rounds="${3:-5}"
[ -x "$agent" ] || { echo "no agent binary at $agent (cargo build --release -p ingero-node)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; sysctl -qw kernel.bpf_stats_enabled=0; rm -rf "$work"' EXIT
gcc -O2 -o "$work/loop" "$(dirname "$0")/../node/tests/native/syscall_loop.c"
cpu=$(( $(nproc) - 1 ))
. "$(dirname "$0")/lib/agent-bench.sh"
run() { taskset -c "$cpu" "$work/loop" "$n"; }

declare -a none off on
for r in $(seq "$rounds"); do
  none+=("$(run)")
  start_agent --offcpu-site-min=0
  off+=("$(run)")
  stop_agent
  start_agent
  on+=("$(run)")
  stop_agent
  echo "round $r: none ${none[-1]}, sites off ${off[-1]}, sites on ${on[-1]} ns/syscall" >&2
done
m0=$(median "${none[@]}"); m1=$(median "${off[@]}"); m2=$(median "${on[@]}")
echo "getppid syscall, median of $rounds x $n:"
echo "  no agent                   $m0 ns"
echo "  agent, off-CPU sites off   $m1 ns   (+$(awk -v a="$m1" -v b="$m0" 'BEGIN {printf "%.1f", a - b}') ns a syscall)"
echo "  agent, off-CPU sites on    $m2 ns   (+$(awk -v a="$m2" -v b="$m0" 'BEGIN {printf "%.1f", a - b}') ns a syscall)"

sysctl -qw kernel.bpf_stats_enabled=1
start_agent
before="$(bpftool prog show -j)"
run > /dev/null
after="$(bpftool prog show -j)"
stop_agent
run_time "sites on" "$before" "$after" on_sys_exit
