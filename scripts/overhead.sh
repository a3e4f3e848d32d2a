#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The agent's overhead on a training loop's step time, runs with and without
# the agent interleaved (drift on a shared machine hits both alike); the
# median of the per-pair ratios is the figure.
#
#   sudo scripts/overhead.sh [AGENT_BINARY] [PAIRS]
#   sudo INGERO_TRAP_BUDGET=off scripts/overhead.sh ...   (every probe always on)
#   PROXY_CALLS=1000000: a longer proxy run (default 200000, ~4 s; the trap
#   budget cycles probes only after 2 s over it)
#
# With a CUDA device and PyTorch: real loops (scripts/gpu_steps.py: a
# launch-bound MLP and a 12-layer bf16 transformer), the agent probing every
# directory PyTorch loads CUDA libraries from, started and stopped between
# phases of one training process (separate processes differ by more than
# the agent costs: +-15% seen on the H100 VM). Without: the no-GPU proxy, a
# launch-bound loop on NVIDIA's real libcudart (pip nvidia-cuda-runtime-cu12)
# where every call returns at once, the worst case: 20 us of host work per
# step and one cudaLaunchKernel (~50k launches/s).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
agent="${1:-$here/../target/release/ingero-agent}"
pairs="${2:-5}"
calls="${PROXY_CALLS:-200000}"
[ -x "$agent" ] || { echo "no agent binary at $agent (cargo build --release -p ingero-node)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "run as root (eBPF)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
wait_for() { for _ in $(seq 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "timeout: $2 in $1" >&2; cat "$1" >&2; exit 1; }

if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  mode=gpu
  libdirs=()   # gpu_steps.py --agent lists PyTorch's library directories itself
  models=(mlp transformer)
else
  mode=proxy
  lib="$(python3 -c 'import nvidia.cuda_runtime as m; print(list(m.__path__)[0])')/lib/libcudart.so.12"
  [ -f "$lib" ] || { echo "no $lib: pip install nvidia-cuda-runtime-cu12" >&2; exit 1; }
  gcc -O2 -o "$work/callbench" "$here/../node/tests/native/callbench.c" -ldl
  libdirs=("$lib")
  models=(proxy)
fi
libargs=()
for d in "${libdirs[@]}"; do libargs+=("--lib=$d"); done

# One run of a model: prints its median step time in ms.
run_model() {
  case "$1" in
    proxy) "$work/callbench" "$lib" cudaLaunchKernel "$calls" 20 | awk -v n="$calls" '{printf "%.6f\n", $1 * 1000 / n}' ;;
    mlp) python3 "$here/gpu_steps.py" mlp --steps "${MLP_STEPS:-3000}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])' ;;
    transformer) python3 "$here/gpu_steps.py" transformer --steps "${TF_STEPS:-200}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])' ;;
  esac
}
start_agent() {
  rm -rf "$work/spool"
  INGERO_LOG=info "$agent" run --aggregator http://127.0.0.1:9 --spool-dir "$work/spool" --window 1s \
    --kubernetes off "${libargs[@]}" 2> "$work/agent.log" &
  ag=$!
  wait_for "$work/agent.log" "probe loop ready"
  sleep 0.5
}
stop_agent() { kill -TERM "$ag"; wait "$ag" 2>/dev/null || true; }

echo "mode: $mode, $pairs pairs per model" >&2
if [ "$mode" = gpu ]; then
  for m in "${models[@]}"; do
    steps=$([ "$m" = mlp ] && echo "${MLP_STEPS:-2000}" || echo "${TF_STEPS:-100}")
    python3 "$here/gpu_steps.py" "$m" --agent "$agent" --pairs "$pairs" --steps "$steps" 2>&1 | grep -v -e UserWarning -e _warn_once
  done
  exit 0
fi
for m in "${models[@]}"; do
  ratios=()
  for p in $(seq "$pairs"); do
    # Alternate which run goes first, so warm caches favour neither.
    if (( p % 2 )); then
      off=$(run_model "$m"); start_agent; on=$(run_model "$m"); stop_agent
    else
      start_agent; on=$(run_model "$m"); stop_agent; off=$(run_model "$m")
    fi
    r=$(awk -v a="$on" -v b="$off" 'BEGIN {printf "%.4f", a / b}')
    ratios+=("$r")
    echo "$m pair $p: without $off ms, with $on ms, ratio $r" >&2
  done
  med=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf '%s: median step-time ratio with/without the agent %s (%+.1f%%) over %s pairs [%s]\n' \
    "$m" "$med" "$(awk -v r="$med" 'BEGIN {print (r - 1) * 100}')" "$pairs" "$(echo "${ratios[@]}" | tr ' ' ',')"
done
