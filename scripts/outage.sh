#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Long-outage drill (RELIABILITY.md): an agent traces a workload while the
# aggregator is down for OUTAGE seconds (default 600); then the aggregator
# comes back and the agent drains its spool. Checks: every call counted once,
# no window missing, spool empty at the end. Needs root and a built workspace.
# Usage: sudo scripts/outage.sh    Env: OUTAGE (600), BIN (target/debug)
set -euo pipefail
cd "$(dirname "$0")/.."
outage="${OUTAGE:-600}"
bin="${BIN:-target/debug}"
dir="$(mktemp -d)"
cg=/sys/fs/cgroup; [ -e $cg/cgroup.controllers ] || cg=/sys/fs/cgroup/unified
cgdir="$cg/ingero-outage-$$"
mkdir -p "$cgdir"
cleanup() { kill $(jobs -p) 2>/dev/null || true; sleep 1; rmdir "$cgdir" 2>/dev/null || true; }
trap cleanup EXIT
gcc -shared -fPIC -O1 -o "$dir/libcudart.so.12" node/tests/native/fakecuda.c
gcc -O2 -o "$dir/workload" node/tests/native/workload.c -ldl
port=$((20000 + RANDOM % 20000))
serve() {
  "$bin/ingero" serve --store "file://$dir/data" --wal-dir "$dir/wal" --listen "127.0.0.1:$port" \
    --http-listen 127.0.0.1:0 --flush-age 5s >/dev/null 2>>"$dir/serve.log" &
  echo $!
}
s=$(serve)
sleep 2
"$bin/ingero-agent" run --aggregator "http://127.0.0.1:$port" --node outage-node --kubernetes off \
  --spool-dir "$dir/spool" --cgroup-root "$cgdir" --rescan 200ms >/dev/null 2>"$dir/agent.log" &
agent=$!
sleep 3
steps=$(( (outage + 90) * 10 ))   # 10 steps/s, 20 calls each
sh -c "echo \$\$ > $cgdir/cgroup.procs; exec $dir/workload $dir/libcudart.so.12 open sleep:800 repeat:$steps call:cudaLaunchKernel:20:0 sleep:100" >/dev/null &
wl=$!
sleep 30
echo "$(date -u +%T) aggregator down for ${outage}s"
kill -9 "$s"; wait "$s" 2>/dev/null || true
sleep "$outage"
spooled=$(ls "$dir/spool/batches" | wc -l)
echo "$(date -u +%T) aggregator back; spool holds $spooled batches ($(du -sh "$dir/spool/batches" | cut -f1))"
t0=$(date +%s)
s=$(serve)
while [ "$(ls "$dir/spool/batches" | wc -l)" -gt 2 ]; do sleep 1; done
echo "drained in $(( $(date +%s) - t0 )) s"
while kill -0 "$wl" 2>/dev/null; do sleep 1; done
sleep 2
kill -TERM "$agent"; wait "$agent" || true
kill -TERM "$s"; wait "$s" || true
grep "ingero-agent stopped" "$dir/agent.log"
want=$(( steps * 20 ))
"$bin/ingero" sql --store "$dir/data" --format csv \
  "SELECT SUM(count) AS calls, $want AS made FROM call_windows WHERE op = 'cudaLaunchKernel'"
"$bin/ingero" sql --store "$dir/data" --format csv \
  "SELECT COUNT(*) AS windows, COUNT(DISTINCT window_start) AS distinct_windows, \
   (MAX(CAST(window_start AS BIGINT)) - MIN(CAST(window_start AS BIGINT))) / 1000000 + 1 AS span_s FROM node_windows"
