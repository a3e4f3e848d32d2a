#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# History ranking over what ingest really writes, timed against DuckDB on the
# same files in the same run.
#   scripts/bench-history.sh NODES DURATION [INJECT]
#   e.g. scripts/bench-history.sh 1000 1h            (inject cpu@NODES/3 half-way)
#        INGERO_BIN=target/debug/ingero scripts/bench-history.sh 50 10m
#        INGERO_BENCH_DIR=/var/tmp/h1 …  (keep the store; a second run with the
#        same NODES/DURATION reuses it and only times the queries)
#        INGERO_BENCH_DIR=/var/tmp/d INGERO_BENCH_NODES=1000 INGERO_BENCH_SECS=86400 INGERO_BENCH_RAW=0 \
#          cargo bench -p ingero --bench history && \
#          INGERO_BENCH_DIR=/var/tmp/d scripts/bench-history.sh 1000 86400s
#          (a day written in-process by the same tier writer: a day through
#          gRPC would take ~40 min at this machine's backfill rate)
# Steps: `ingero serve` on a local store, `ingero simulate --backfill` through
# real gRPC (ingest rows/s), stop the server (flush), then 3 × `ingero
# stragglers --store … --since START` and 3 × DuckDB's per-node, per-bin
# aggregation of call_windows and sched_windows over the raw Parquet. Needs
# `pip install duckdb`.
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${1:?NODES}
DUR=${2:?DURATION like 1h}
SECS=$(python3 -c "import re,sys; m=re.fullmatch(r'(\d+)([smhd])','$DUR'); print(int(m[1])*{'s':1,'m':60,'h':3600,'d':86400}[m[2]])")
INJECT=${3:-cpu@$((NODES / 3)):$((SECS / 2))s}
BIN=${INGERO_BIN:-target/release/ingero}
[ -n "${INGERO_BIN:-}" ] || cargo build --release -p ingero --bin ingero >/dev/null
python3 -c 'import duckdb' 2>/dev/null || { echo "needs DuckDB: pip install duckdb" >&2; exit 1; }
DIR=${INGERO_BENCH_DIR:-$(mktemp -d)}
mkdir -p "$DIR"
SERVE=
trap '[ -z "$SERVE" ] || kill $SERVE 2>/dev/null || true; [ -n "${INGERO_BENCH_DIR:-}" ] || rm -rf "$DIR"' EXIT
STAMP="$DIR/backfill-$NODES-$DUR.json"

if [ ! -s "$STAMP" ]; then
  rm -rf "$DIR/data" "$DIR/wal"
  $BIN serve --store "file://$DIR/data" --wal-dir "$DIR/wal" --listen 127.0.0.1:17270 \
    --http-listen 127.0.0.1:17271 --flush-rows 2000000 2>"$DIR/serve.log" &
  SERVE=$!
  for _ in $(seq 100); do curl -sf 127.0.0.1:17271/readyz >/dev/null && break; sleep 0.1; done
  $BIN simulate --server http://127.0.0.1:17270 --nodes "$NODES" --duration "$DUR" --backfill \
    --inject "$INJECT" --json > "$STAMP.tmp"
  ps -o rss=,time= -p $SERVE | awk '{print "server rss " int($1/1024) " MiB, cpu time " $2}'
  kill -INT $SERVE; wait $SERVE 2>/dev/null || true
  SERVE=
  mv "$STAMP.tmp" "$STAMP"
fi
python3 - "$STAMP" "$DIR/data" "$BIN" "$INJECT" <<'EOF'
import json, subprocess, sys, time, duckdb
stamp, data, binary, inject = sys.argv[1:5]
r = json.load(open(stamp))
b = r["backfill"]
how = b.get("source", "ingero simulate --backfill through ingero serve; generator and server share the machine")
print(f"dataset: {b['nodes']} nodes x {b['windows']} s, {b['rows']:,} rows, written in {b['elapsed_secs']:.1f} s, "
      f"{b['rows_per_sec']/1e6:.2f} M rows/s ({how})")
du = subprocess.run(["du", "-sh", data], capture_output=True, text=True).stdout.split()[0]
print(f"store: {du}")
start, end = b["start_us"], b["end_us"]
since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start // 1_000_000))
want = "node-" + inject.split("@")[1].split(":")[0]
ours = []
for run in range(3):
    t = time.perf_counter()
    out = subprocess.run([binary, "stragglers", f"--store=file://{data}", f"--since={since}", "--format=json"],
                         capture_output=True, text=True, check=True).stdout
    ours.append(time.perf_counter() - t)
    top = json.loads(out)["stragglers"][0]
    assert top["node"] == want and top["flagged"], f"expected {want} flagged first, got {top}"
print(f"ingero stragglers --store: {min(ours):.2f} s best of 3 ({', '.join(f'{x:.2f}' for x in ours)}); "
      f"top {top['node']} flagged, score {top['score']}")
bin_us = max(1_000_000, -(-(end - start) // 360) // 1_000_000 * 1_000_000)
copies = ["cudaMemcpy", "cudaMemcpy_ptds", "cudaMemcpyPeer", "cuMemcpy", "cuMemcpy_ptds", "cuMemcpyDtoH_v2",
          "cuMemcpyDtoH_v2_ptds", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"]
copy = "op IN (" + ", ".join(f"'{c}'" for c in copies) + ")"
wait = (f"op LIKE '%Synchronize%' OR {copy} OR (library = 'nccl' AND op NOT IN ('ncclGroupStart', 'ncclGroupEnd') "
        "AND op NOT LIKE 'ncclComm%')")
rng = f"window_start >= make_timestamp({start}) AND window_start < make_timestamp({end})"
head = f"SELECT COALESCE(job, '(unlabelled)') AS job, node, epoch_us(window_start) // {bin_us} * {bin_us} AS bin"
calls = (f"{head}, SUM(CASE WHEN {copy} THEN total_ns ELSE 0 END) AS copy_ns, "
         f"SUM(CASE WHEN {wait} THEN total_ns ELSE 0 END) AS wait_ns, "
         "SUM(CASE WHEN op LIKE 'cudaLaunchKernel%' OR op LIKE 'cuLaunchKernel%' OR op = 'cudaGraphLaunch' "
         "THEN count ELSE 0 END) AS launches "
         f"FROM read_parquet('{data}/call_windows/*/*/*.parquet', hive_partitioning = true) WHERE {rng} GROUP BY ALL")
sched = (f"{head}, SUM(runq_wait_ns), SUM(off_cpu_ns), SUM(on_cpu_ns), SUM(threads), "
         "SUM(COALESCE(off_cpu_in_call_ns, 0)) "
         f"FROM read_parquet('{data}/sched_windows/*/*/*.parquet', hive_partitioning = true) WHERE {rng} GROUP BY ALL")
con = duckdb.connect()
theirs = []
for run in range(3):
    t = time.perf_counter()
    n = len(con.execute(calls).fetchall()) + len(con.execute(sched).fetchall())
    theirs.append(time.perf_counter() - t)
print(f"DuckDB {duckdb.__version__} per-node aggregation of the raw tables ({n:,} groups, bins of "
      f"{bin_us // 1_000_000} s): {min(theirs):.2f} s best of 3 ({', '.join(f'{x:.2f}' for x in theirs)})")
print(f"ratio ours / DuckDB: {min(ours) / min(theirs):.2f}")
EOF
