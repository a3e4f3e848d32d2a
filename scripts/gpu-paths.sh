#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every CUDA library path PyTorch takes (scripts/gpu_paths.py: cuBLAS,
# cuDNN, linalg, SDPA, NVRTC, cuFFT, cuRAND, NCCL, torch.compile), run
# without the agent and then with it at its default flags. Fails if a path
# that works without the agent fails with it.
#
#   sudo scripts/gpu-paths.sh [AGENT_BINARY]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
agent="${1:-$here/../target/release/ingero-agent}"
[ -x "$agent" ] || { echo "no agent binary at $agent" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "run as root (eBPF)" >&2; exit 1; }
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs nodev /sys/kernel/tracing
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
echo "== without the agent"
python3 "$here/gpu_paths.py" 2> "$work/off.err" | tee "$work/off.txt" || true
INGERO_LOG=info "$agent" run --aggregator http://127.0.0.1:9 --spool-dir "$work/spool" --window 1s \
  --kubernetes off 2> "$work/agent.log" &
ag=$!
for _ in $(seq 300); do grep -q "probe loop ready" "$work/agent.log" && break; sleep 0.1; done
echo "== with the agent (default flags)"
python3 "$here/gpu_paths.py" 2> "$work/on.err" | tee "$work/on.txt" || true
sleep 1.5
kill -TERM $ag; wait $ag || true
grep -E "library lookup held|attached|WARN|ERROR" "$work/agent.log" | sed 's/^/  agent: /' | head -30
if diff <(grep -E '^(ok|FAIL)' "$work/off.txt") <(grep -E '^(ok|FAIL)' "$work/on.txt"); then
  echo "same result with and without the agent"
else
  echo "DIFFERENT with the agent:"; cat "$work/on.err" | tail -30; exit 1
fi
