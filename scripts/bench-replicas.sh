#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Several `ingero serve` replicas over one SeaweedFS S3 store, on this machine:
#  1. ingest throughput of 3 replicas vs 1, side by side in one run
#     (`ingero load`, the same nodes and batches, routed as agents route them);
#  2. 600 simulated nodes on 3 replicas, replica 1 SIGKILLed at 20 s, two CPU
#     stragglers injected (one before, one after the kill): time to flag, time
#     for the moved nodes to reach their new replica, every replica's
#     `ingero stragglers`, and exactly-once counted by delta-rs (PyPI
#     deltalake): batches, and rows of every data table.
#   scripts/bench-replicas.sh            (INGERO_BIN=… to skip the release build)
#   NODES=900 REPLICAS=4 KILL=0 KILL_AT=25 RESTART_AT=31 FLUSH_AGE=30s SKIP_LOAD=1 scripts/bench-replicas.sh
#     (the fleet run only, another shape: the killed replica restarts on its WAL)
#   FREEZE=2 FREEZE_AT=40 THAW_AT=52 INJECT="cpu@node-100:12s io@node-7:33s" DURATION=70s …
#   (INJECT=spread: 30 faults around the times of the hand-over runs in BENCHMARKS.md)
#     (also SIGSTOP replica 2 from 40 s to 52 s; faults as `ingero simulate --inject`;
#     prints fault->flag p50/p90 over every injection)
#   KILL=none ROLL_AT=20 …   (a rolling restart from 20 s: each replica in turn stopped
#     (SIGTERM) and started again, 8 s apart, as a chart upgrade does)
# Prints the figures BENCHMARKS.md and RELIABILITY.md quote.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${INGERO_BIN:-target/release/ingero}
[ -n "${INGERO_BIN:-}" ] || cargo build --release --workspace >/dev/null
NODES=${NODES:-600}
REPLICAS=${REPLICAS:-3}
KILL=${KILL:-1}
KILL_AT=${KILL_AT:-20}
RESTART_AT=${RESTART_AT:-}
FLUSH_AGE=${FLUSH_AGE:-2s}
INJECT=${INJECT:-cpu@node-100:12s cpu@node-401:35s}
# INJECT=spread: 30 faults, 5 per job (cpu in even jobs, io in odd ones) at
# 14, 27, 33, 48 and 61 s: around the kill, restart and freeze times above.
if [ "$INJECT" = spread ]; then
  INJECT=""
  for j in 0 1 2 3 4 5; do
    k=$([ $((j % 2)) = 0 ] && echo cpu || echo io)
    INJECT="$INJECT $k@node-$((102 + j)):14s $k@node-$((204 + j)):27s $k@node-$((300 + j)):33s"
    INJECT="$INJECT $k@node-$((402 + j)):48s $k@node-$((504 + j)):61s"
  done
fi
DURATION=${DURATION:-60s}
FREEZE=${FREEZE:-}
DIR=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}" ${WEED:-}; do kill -9 "$p" 2>/dev/null || true; done; [ -n "${KEEP:-}" ] && echo "logs kept in $DIR" || rm -rf "$DIR"; }
trap cleanup EXIT
export AWS_ACCESS_KEY_ID=ingero AWS_SECRET_ACCESS_KEY=ingero-secret AWS_REGION=us-east-1
weed mini -ip=127.0.0.1 -ip.bind=127.0.0.1 -bucket=ingero -admin.ui=false -webdav=false -dir="$DIR/s3" >/dev/null 2>&1 &
WEED=$!
for _ in $(seq 300); do curl -sf "http://127.0.0.1:8333/ingero?list-type=2&max-keys=1" >/dev/null && break; sleep 0.2; done
S3=http://127.0.0.1:8333

# serve NAME PORT [REPLICA-URLS SELF]
serve() {
  local name=$1 port=$2
  local extra=()
  [ $# -gt 2 ] && extra=(--replicas "$3" --replica-self "$4")
  $BIN serve --store "s3://ingero/$STORE" --s3-endpoint $S3 --wal-dir "$DIR/wal-$name" \
    --listen "127.0.0.1:$port" --http-listen 127.0.0.1:0 --flush-age "$FLUSH_AGE" "${extra[@]}" 2>>"$DIR/$name.log" &
  PIDS+=($!)
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && return; sleep 0.1; done
  echo "replica $name did not start" >&2; exit 1
}
R=$(seq -s, -f "http://127.0.0.1:%g" 27070 $((27069 + REPLICAS)))
URLS=(${R//,/ })
all_replicas() {
  local i=0
  for u in "${URLS[@]}"; do serve "$1-$i" "${u##*:}" "$R" "$u"; i=$((i + 1)); done
}
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; PIDS=(); }

if [ -z "${SKIP_LOAD:-}" ]; then
  echo "== ingest: 1 replica vs $REPLICAS (load: 60 nodes x 20 batches x 5,000 rows)"
  for round in 1 2; do
    STORE=load1-$round; serve one 27069
    echo "1 replica:  $($BIN load --server http://127.0.0.1:27069 --nodes 60 --batches 20 --rows 5000)"
    stop_all
    STORE=load3-$round; all_replicas load
    echo "$REPLICAS replicas: $($BIN load --server "$R" --nodes 60 --batches 20 --rows 5000)"
    stop_all
  done
fi

echo "== $NODES nodes on $REPLICAS replicas; replica $KILL killed at ${KILL_AT} s${ROLL_AT:+; rolling restart from $ROLL_AT s}${RESTART_AT:+, restarted at $RESTART_AT s}${FREEZE:+; replica $FREEZE frozen ${FREEZE_AT}-${THAW_AT} s}"
STORE=fleet; all_replicas fleet
INJ=(); for i in $INJECT; do INJ+=(--inject "$i"); done
$BIN simulate --server "$R" --nodes "$NODES" --jobs 6 --duration "$DURATION" "${INJ[@]}" --json >"$DIR/sim.json" 2>/dev/null &
SIM=$!
T0=$(date +%s.%N)
# at SECONDS-SINCE-START: waits until then
at() { local d; d=$(echo "$1 + 1 - ($(date +%s.%N) - $T0)" | bc); [ "${d:0:1}" = "-" ] || sleep "$d"; }
EVENTS=()
[ "$KILL" != none ] && EVENTS+=("$KILL_AT kill")
[ -n "$RESTART_AT" ] && EVENTS+=("$RESTART_AT restart")
[ -n "$FREEZE" ] && EVENTS+=("$FREEZE_AT freeze" "$THAW_AT thaw")
[ -n "${ROLL_AT:-}" ] && for i in $(seq 0 $((REPLICAS - 1))); do EVENTS+=("$((ROLL_AT + 8 * i)) roll $i"); done
while read -r t what arg; do
  at "$t"
  case $what in
    roll) kill "${PIDS[$arg]}"; wait "${PIDS[$arg]}" 2>/dev/null || true
      u=${URLS[$arg]}; serve "fleet-$arg-rolled" "${u##*:}" "$R" "$u"; PIDS[$arg]=${PIDS[-1]}; unset 'PIDS[-1]' ;;
    kill) kill -9 "${PIDS[$KILL]}" ;;
    restart) u=${URLS[$KILL]}; serve "fleet-$KILL" "${u##*:}" "$R" "$u"; PIDS[$KILL]=${PIDS[-1]}; unset 'PIDS[-1]' ;;
    freeze) kill -STOP "${PIDS[$FREEZE]}" ;;
    thaw) kill -CONT "${PIDS[$FREEZE]}" ;;
  esac
done < <(printf '%s\n' "${EVENTS[@]}" | sort -n)
wait $SIM
for u in "${URLS[@]}"; do
  echo "-- ingero stragglers --server $u"
  $BIN stragglers --server "$u" || true
done
stop_all
echo "table commits that left out batches another replica had stored first: $(cat "$DIR"/fleet-*.log | grep -c 'leaving them out' || true)"
python3 - "$DIR/sim.json" <<'PY'
import json, sys
from deltalake import DeltaTable
r = json.load(open(sys.argv[1]))
opts = {"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "ingero",
        "AWS_SECRET_ACCESS_KEY": "ingero-secret", "AWS_REGION": "us-east-1", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
b = DeltaTable("s3://ingero/fleet/ingest_batches", storage_options=opts).to_pyarrow_table()
stored = sum(b.column("batches").to_pylist())
rows = {}
for (n, f, l) in zip(b.column("node").to_pylist(), b.column("first_sequence").to_pylist(), b.column("last_sequence").to_pylist()):
    rows.setdefault(n, []).append((f, l))
overlaps = sum(1 for v in rows.values() for i, a in enumerate(sorted(v)) for c in sorted(v)[i + 1:] if c[0] <= a[1])
secs = sorted(f["secs"] for f in r["failovers"])
print(f"injections: " + ", ".join(f"{i['injection']} at {i['at_secs']:.0f}s flagged after "
      f"{i['flagged_after_secs'] if i['flagged_after_secs'] is None else round(i['flagged_after_secs'], 1)}s" for i in r["injections"]))
after = sorted(i["flagged_after_secs"] if i["flagged_after_secs"] is not None else float("inf") for i in r["injections"])
pct = lambda q: after[min(len(after) - 1, int(q * len(after)))]
print(f"fault->flag over {len(after)} injections: p50 {pct(0.5):.1f}s, p90 {pct(0.9):.1f}s, max {after[-1]:.1f}s")
print(f"false flags: {r['false_flags'] or 'none'}")
if secs:
    print(f"failovers: {len(secs)} nodes, median {secs[len(secs)//2]:.1f}s, max {secs[-1]:.1f}s, "
          f"{sum(f['resent'] for f in r['failovers'])} uncommitted batches sent again")
else:
    print("failovers: none")
print(f"batches: {r['batches']} sent, {r['acknowledged']} acknowledged; in the Delta table (delta-rs): {stored}; "
      f"overlapping ranges: {overlaps}")
from deltalake.exceptions import TableNotFoundError
tables = ["call_windows", "sched_windows", "cgroup_windows", "io_windows", "host_events", "stall_events",
          "process_meta", "node_windows", "progress_windows", "stacks"]
def count(t):
    try:
        return DeltaTable(f"s3://ingero/fleet/{t}", storage_options=opts).count()
    except TableNotFoundError:  # a table no batch had rows for
        return 0
data_rows = sum(count(t) for t in tables)
print(f"rows: {r['acknowledged_rows']} acknowledged; ingest_batches says {sum(b.column('rows').to_pylist())}; "
      f"in the data tables (delta-rs): {data_rows}")
PY
