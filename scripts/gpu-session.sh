#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every GPU check in one run, for a lent GPU machine (minutes of device time):
# most valuable first, each under its own time limit, each step's output in
# its own log under $OUT (or ./gpu-out). The agent is the lean build carried
# over (`cargo build --release -p ingero-node --no-default-features`, strip).
#
#   scripts/gpu-session.sh [AGENT_BINARY]
#
# Steps: info (kernel, driver, `ingero-agent check` with the trap cost),
# prologues (first bytes of every probed function), paths (every CUDA
# library path with and without the agent), mlp and transformer (step time
# with and without the agent, one process), counts (agent vs torch.profiler).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
agent="$(realpath "${1:-.gpu/ingero-agent}")"
out="${OUT:-$PWD/gpu-out}"
mkdir -p "$out"
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs nodev /sys/kernel/tracing
run_step() {
  local name="$1" limit="$2"; shift 2
  echo "=== $name (limit ${limit}s) $(date +%T)"
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  cat "$out/$name.log"
  echo "=== $name rc=$rc $(date +%T)"
  pkill -f "ingero-agent run" 2>/dev/null && sleep 1   # a step cut off leaves no agent behind
  return 0
}
only="${ONLY:-info prologues paths mlp counts transformer}"   # a subset: ONLY="mlp transformer"
step() {
  case " $only " in *" $1 "*) run_step "$@" ;; esac
}
step info 40 bash -c "uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; \
  python3 -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda)'; \
  nproc; '$agent' check"
step prologues 45 python3 "$here/gpu_prologues.py" "$here/../agent/src/probes/ops.rs"
step paths 150 "$here/gpu-paths.sh" "$agent"
step mlp 150 env PYTHONUNBUFFERED=1 python3 "$here/gpu_steps.py" mlp --agent "$agent" --pairs "${MLP_PAIRS:-12}" --steps 1000
step counts 100 "$here/gpu-check.sh" "$agent" 1500
step transformer 130 env PYTHONUNBUFFERED=1 python3 "$here/gpu_steps.py" transformer --agent "$agent" --pairs "${TF_PAIRS:-8}" --steps 60
