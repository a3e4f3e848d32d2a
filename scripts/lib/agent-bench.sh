# SPDX-License-Identifier: Apache-2.0
# Sourced by the cost scripts (switch-cost.sh, syscall-cost.sh,
# steps-cost.sh, stop-cost.sh): an agent started and stopped around a measurement, and
# the median of a round's results. Needs $agent (the binary) and $work (a
# scratch directory).

# wait_for FILE TEXT: until FILE holds TEXT (20 s at most).
wait_for() {
  for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "timeout: $2 in $1" >&2; cat "$1" >&2; exit 1
}

# start_agent [FLAGS...]: an agent with no aggregator to reach (it spools),
# once its probes are in place; its pid in $ag.
start_agent() {
  INGERO_LOG=info "$agent" run --aggregator http://127.0.0.1:9 --spool-dir "$work/spool" --kubernetes off "$@" \
    > /dev/null 2> "$work/agent.log" &
  ag=$!
  wait_for "$work/agent.log" "probe loop ready"
  sleep 1
}

stop_agent() { kill -TERM "$ag"; wait "$ag" 2>/dev/null || true; }

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# run_time LABEL BEFORE AFTER PROGRAM...: each named BPF program's own time
# per run between two `bpftool prog show -j` snapshots (BPF_STATS_RUN_TIME,
# which kernel.bpf_stats_enabled=1 turns on).
run_time() {
  python3 - "$@" <<'PY'
import json, sys
label, before, after, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
a = {p["id"]: p for p in json.loads(before)}
for p in json.loads(after):
    if p.get("name") not in names:
        continue
    o = a.get(p["id"], {})
    runs = p.get("run_cnt", 0) - o.get("run_cnt", 0)
    if runs:
        ns = (p.get("run_time_ns", 0) - o.get("run_time_ns", 0)) / runs
        print(f"  {p['name']} ({label}) {ns:6.1f} ns a run over {runs} runs (BPF_STATS_RUN_TIME)")
PY
}

# bench_setup HINT: $lib (NVIDIA's libcudart from pip nvidia-cuda-runtime-cu12),
# $work (removed at exit, with any agent still running) and $work/callbench;
# HINT says how to build $agent where it is missing.
bench_setup() {
  lib="$(python3 -c 'import nvidia.cuda_runtime as m; print(list(m.__path__)[0])')/lib/libcudart.so.12"
  [ -f "$lib" ] || { echo "no $lib: pip install nvidia-cuda-runtime-cu12" >&2; exit 1; }
  [ -x "$agent" ] || { echo "no agent binary at $agent ($1)" >&2; exit 1; }
  work="$(mktemp -d)"
  trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
  gcc -O2 -o "$work/callbench" "$(dirname "${BASH_SOURCE[0]}")/../../node/tests/native/callbench.c" -ldl
}
