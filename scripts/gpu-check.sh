#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The agent against a real PyTorch training loop on a real NVIDIA GPU:
# libcudart, libcuda and libnccl as PyTorch ships them. Compares the calls
# the agent counted per op with torch.profiler's CUDA runtime events for the
# same process, and prints the table (for BENCHMARKS.md).
#
#   sudo scripts/gpu-check.sh [AGENT_BINARY] [STEPS]
#
# Runs where the GPU machine has no network and no Rust: build the lean agent
# here and carry it (`cargo build --release -p ingero-node
# --no-default-features && strip`, ~19 MB). The agent ships to an address
# where nothing listens, so every window stays in its spool, which
# scripts/spool_counts.py reads with pyarrow alone.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
agent="${1:-$here/../target/release/ingero-agent}"
steps="${2:-3000}"
[ -x "$agent" ] || { echo "no agent binary at $agent" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "run as root (eBPF)" >&2; exit 1; }
python3 -c 'import torch, pyarrow; assert torch.cuda.is_available(), "no CUDA device"' \
  || { echo "needs PyTorch with a CUDA device, and pyarrow" >&2; exit 1; }
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
echo "work dir: $work"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
"$agent" check || true

# Every directory PyTorch loads CUDA libraries from, probed before it starts.
mapfile -t libdirs < <(python3 - <<'EOF'
import glob, os, torch
dirs = {os.path.join(os.path.dirname(torch.__file__), "lib")}
try:
    import nvidia
    for p in nvidia.__path__:
        dirs.update(d for d in glob.glob(os.path.join(p, "*", "lib")) if os.path.isdir(d))
        dirs.update(d for d in glob.glob(os.path.join(p, "cu*", "lib")) if os.path.isdir(d))
except ImportError:
    pass
print("\n".join(sorted(dirs)))
EOF
)
libargs=()
for d in "${libdirs[@]}"; do libargs+=("--lib=$d"); done
# Counts compared exactly: every probe on (TRAP_BUDGET=1% checks the
# duty cycle's estimates against the profiler instead).
INGERO_LOG=info "$agent" run --aggregator http://127.0.0.1:9 --spool-dir "$work/spool" --spool-max 4GiB \
  --window 1s --rescan 200ms --kubernetes off --trap-budget="${TRAP_BUDGET:-off}" "${libargs[@]}" 2> "$work/agent.log" &
ag=$!
for _ in $(seq 300); do grep -q "probe loop ready" "$work/agent.log" && break; sleep 0.1; done
sleep 1
grep -E "attached|BPF maps" "$work/agent.log" | sed 's/^/  agent: /' | head -20

python3 "$here/gpu_train.py" "$work/train.json" --steps "$steps"
sleep 2.5   # the last window is drained and spooled
kill -TERM $ag; wait $ag || true
grep -E "trap|of a CPU|WARN|ERROR" "$work/agent.log" | cut -c1-300 | sed 's/^/  agent: /' | head -20

python3 - "$work" "$here" <<'EOF'
import json, re, sys
work, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from spool_counts import counts
t = json.load(open(f"{work}/train.json"))
agent, files = counts(f"{work}/spool", t["pid"])
def base(op):  # per-thread-stream and versioned variants are one API
    return re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", op)
ours = {}
for (_, lib, op), v in agent.items():
    ours[base(op)] = ours.get(base(op), 0) + v[0]
prof = {}
for op, n in t["profiler"].items():
    prof[base(op)] = prof.get(base(op), 0) + n
print(f"\n{t['gpu']}, torch {t['torch']}, CUDA {t['cuda']}, NCCL {t['nccl']}: "
      f"{t['steps']} steps in {t['seconds']:.1f} s, {files} spooled windows")
print(f"| op | agent | torch.profiler | agent / profiler |\n|---|---|---|---|")
for op in sorted(set(ours) | set(prof), key=lambda o: -max(ours.get(o, 0), prof.get(o, 0))):
    a, p = ours.get(op, 0), prof.get(op, 0)
    r = f"{a / p:.3f}" if p else "—"
    print(f"| {op} | {a} | {p} | {r} |")

# By what the call does (model/src/signals.rs `op_kind`, mirrored): a launch
# the agent saw only at the driver (a runtime linked into cuBLAS or NCCL) is
# still a launch, so the launch totals must match where the names need not.
LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch",
          "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel")
def kind(op):
    if op.startswith(LAUNCH): return "launch"
    if "Synchronize" in op: return "sync"
    if "Memcpy" in op: return "copy"
    if "Memset" in op: return "memset"
    if "Event" in op: return "event"
    if any(p in op for p in ("Malloc", "Free", "MemAlloc", "MemFree")): return "memory"
    if op.startswith("nccl"):
        control = op in ("ncclGroupStart", "ncclGroupEnd") or op.startswith("ncclComm")
        return "nccl control" if control else "collective"
    return "other"
by = {}
for src, table in ((0, ours), (1, prof)):
    for op, n in table.items():
        by.setdefault(kind(op), [0, 0])[src] += n
print(f"\n| kind | agent | torch.profiler | agent / profiler |\n|---|---|---|---|")
for k, (a, p) in sorted(by.items(), key=lambda kv: -max(kv[1])):
    print(f"| {k} | {a} | {p} | {f'{a / p:.3f}' if p else '—'} |")
EOF
