#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Time from injection to flag, recall per fault kind and false flags, with a
# release `ingero serve` and `ingero simulate` on this machine.
#   scripts/bench-flag.sh [NODES...]        (default: 16 256 1000)
#   INGERO_BIN=target/debug/ingero scripts/bench-flag.sh 256   (skip the release build)
# Writes one JSON line per run to target/bench-flag.jsonl and prints a summary.
# A slow link (net) paces every rank of a ring alike, so from the hosts it is
# noise, not a straggler: it runs with the noise-only run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${INGERO_BIN:-target/release/ingero}
[ -n "${INGERO_BIN:-}" ] || cargo build --release -p ingero >/dev/null
OUT=target/bench-flag.jsonl
: > "$OUT"
SIZES=("${@:-16 256 1000}")
[ $# -gt 0 ] || SIZES=(16 256 1000)
DIR=$(mktemp -d)
trap 'kill $SERVE 2>/dev/null || true; rm -rf "$DIR"' EXIT

start_server() {
  rm -rf "$DIR/data" "$DIR/wal"
  $BIN serve --store "file://$DIR/data" --wal-dir "$DIR/wal" --listen 127.0.0.1:17070 --http-listen 127.0.0.1:17071 2>"$DIR/serve.log" &
  SERVE=$!
  for _ in $(seq 50); do curl -sf 127.0.0.1:17071/readyz >/dev/null && return; sleep 0.1; done
  echo "server did not start" >&2; exit 1
}

for n in "${SIZES[@]}"; do
  for kind in cpu gpu io mem; do
    for seed in 1; do
      start_server
      a=$((n / 3)); b=$((2 * n / 3))
      $BIN simulate --server http://127.0.0.1:17070 --nodes "$n" --duration 22s --seed "$seed" \
        --inject "$kind@$a:6s" --inject "$kind@$b:12s" --json 2>/dev/null \
        | python3 -c "import sys,json; r=json.load(sys.stdin); r['kind']='$kind'; r['n']=$n; print(json.dumps(r))" >> "$OUT"
      ps -o rss=,time= -p $SERVE | awk -v n="$n" '{print "  server rss " $1/1024 " MiB, cpu time " $2 " (" n " nodes)"}' >&2
      kill $SERVE; wait $SERVE 2>/dev/null || true
    done
  done
  start_server
  $BIN simulate --server http://127.0.0.1:17070 --nodes "$n" --duration 22s --jitter 0.1 \
    --inject "jobslow@all:6s" --inject "blip@1:8s" --inject "blip@2:14s" --inject "net@3:10s" --json 2>/dev/null \
    | python3 -c "import sys,json; r=json.load(sys.stdin); r['kind']='noise'; r['n']=$n; print(json.dumps(r))" >> "$OUT"
  kill $SERVE; wait $SERVE 2>/dev/null || true
done

python3 - "$OUT" <<'PY'
import json, sys, collections
runs = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in runs:
    by[r["n"]].append(r)
print(f"{'nodes':>6} {'injections':>10} {'recall':>7} {'p50 s':>6} {'p90 s':>6} {'max s':>6} {'false flags':>11}")
for n, rs in sorted(by.items()):
    lat = sorted(i["flagged_after_secs"] for r in rs for i in r["injections"] if i["flagged_after_secs"] is not None)
    inj = sum(len(r["injections"]) for r in rs)
    ff = sum(len(r["false_flags"]) for r in rs)
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")
    print(f"{n:>6} {inj:>10} {len(lat)/max(inj,1):>7.2f} {q(0.5):>6.1f} {q(0.9):>6.1f} {lat[-1] if lat else float('nan'):>6.1f} {ff:>11}")
kinds = collections.defaultdict(lambda: [0, 0])
for r in runs:
    for i in r["injections"]:
        kinds[r["kind"]][0] += 1
        kinds[r["kind"]][1] += i["flagged_after_secs"] is not None
print("recall per kind: " + ", ".join(f"{k} {v[1]}/{v[0]}" for k, v in sorted(kinds.items())))
PY
