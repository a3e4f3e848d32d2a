#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The layer rules, enforced on the real dependency graph (`cargo tree`), so
# that a crate reaching up a layer fails CI instead of growing unnoticed:
#   ingero-model    the tables, rows, histogram and signals: no I/O (no
#                   gRPC, async runtime or object store), no other ingero crate
#   ingero-proto    the wire: the model only
#   ingero-store    WAL, Parquet, Delta log, tiers: model and wire only; no
#                   serving, ranking, query engine or reports
#   ingero-server   ingest, live ranking, HTTP: store, wire and model; no
#                   query engine, reports, sim or CLI
#   ingero-action   remediation (Kubernetes API, journal): server, store,
#                   model; no query engine, reports, agent or sim
#   ingero-agent    the node agent library: the wire only; never storage,
#                   query, ranking or reports, in any build mode
#   ingero-node     the `ingero-agent` binary: as lean as the library by
#                   default (the DaemonSet build, and `cargo build --workspace`);
#                   feature `store` adds server and store for run --store
#   ingero-analysis query, reports, history, import: below the CLI, so no
#                   agent, node or simulator
# Usage: scripts/check-layers.sh   (exit 1 and the offending paths on a violation)
set -euo pipefail
cd "$(dirname "$0")/.."

STORAGE="ingero-analysis|ingero-server|ingero-store|ingero-sim|parquet|object_store|deltalake"
QUERY='datafusion|rusqlite|rmcp'
bad=0
LOCKED="${CHECK_LAYERS_LOCKED---locked}"   # empty: let cargo update Cargo.lock (trying a rule out)

# deny PACKAGE "FLAGS" REGEX WHY
deny() {
  local pkg="$1" flags="$2" re="$3" why="$4" tree hits
  # shellcheck disable=SC2086 # FLAGS is a word list
  tree="$(cargo tree $LOCKED -e normal --prefix none -p "$pkg" $flags)" \
    || { echo "check-layers: cargo tree -p $pkg $flags failed" >&2; exit 2; }
  # The first line is the package itself.
  hits="$(echo "$tree" | tail -n +2 | awk '{print $1}' | grep -E "^($re)$" | sort -u || true)"
  if [ -n "$hits" ]; then
    echo "layer violation: $pkg ${flags:-(default features)} depends on $(echo "$hits" | tr '\n' ' ')— $why" >&2
    echo "  see: cargo tree -e normal -p $pkg $flags -i $(echo "$hits" | head -1)" >&2
    bad=1
  fi
}

deny ingero-model "" "ingero|ingero-.*|tonic|tokio|prost|object_store|$STORAGE|$QUERY" "the data model does no I/O and sits below every crate"
deny ingero-proto "" "ingero-(agent|node|sim)|ingero|$STORAGE|$QUERY" "the wire format sits below everything but the model"
deny ingero-store "" "ingero-(agent|node|analysis|server|sim)|ingero|$QUERY" "storage sits below serving and analysis"
deny ingero-server "" "ingero-(agent|node|analysis|sim)|ingero|$QUERY" "serving links no query engine; it is added from above"
deny ingero-action "" "ingero-(agent|node|analysis|sim)|ingero|$QUERY" "remediation sits on serving; the CLI wires it in"
for flags in "" "--all-features" "--no-default-features"; do
  deny ingero-agent "$flags" "ingero|ingero-node|$STORAGE|$QUERY" "the agent library depends on the wire only"
done
deny ingero-node "" "$STORAGE|ingero-action|$QUERY" "the default (DaemonSet) build of ingero-agent links no storage"
deny ingero-node "--features store" "ingero-analysis|ingero-action|ingero-sim|ingero|$QUERY" "run --store embeds serving and storage, never the query engine"
deny ingero-analysis "" "ingero-(agent|node|sim)|ingero" "analysis sits below the CLI; the simulator is the CLI's"

[ "$bad" = 0 ] && echo "layers: ok (model < proto < {agent, store < server} < node, analysis < ingero)"
exit "$bad"
