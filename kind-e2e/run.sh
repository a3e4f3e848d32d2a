#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end on a real (kind) cluster, for anyone with Docker, kind, kubectl
# and helm:
#   1. create a 3-node cluster with tracefs and a shared barrier directory,
#   2. build the agent, aggregator and workload images and load them,
#   3. helm install deploy/helm/ingero (default values, GPU label on nodes),
#   4. run one rank of a data-parallel job per node (ranks wait for each
#      other in ncclAllReduce), then give one rank's pod 5% of a CPU
#      (in-place resize of its CPU limit: real CFS throttling),
#   5. assert: events attributed to the pods, Parquet written,
#      `ingero stragglers` names the contended node, `ingero report --pod`
#      names CPU contention, remediation (on, with taint) marks that node
#      with the IngeroStraggler condition and taint and evicts nothing;
#      then tear down (KEEP=1 keeps the cluster).
# Usage: kind-e2e/run.sh      Env: CLUSTER (ingero-e2e), CONTENDED (rank 1),
#        FAULT_AFTER (20 s), KEEP (unset), SKIP_BUILD (unset).
set -euo pipefail
cd "$(dirname "$0")/.."
cluster="${CLUSTER:-ingero-e2e}"
contended="${CONTENDED:-1}"
fault_after="${FAULT_AFTER:-20}"
ns=ingero
say() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
for t in docker kind kubectl helm; do
  command -v "$t" >/dev/null || fail "$t is required (see kind-e2e/README.md)"
done
[ -e /sys/kernel/tracing/uprobe_events ] || fail "tracefs is not mounted on this host: sudo mount -t tracefs nodev /sys/kernel/tracing"

cleanup() {
  if [ -z "${KEEP:-}" ]; then kind delete cluster --name "$cluster" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

say "cluster"
mkdir -p /tmp/ingero-kind-barrier && rm -f /tmp/ingero-kind-barrier/llama
kind get clusters | grep -qx "$cluster" || kind create cluster --name "$cluster" --config kind-e2e/kind-config.yaml --wait 120s
ctx="kind-$cluster"
k() { kubectl --context "$ctx" "$@"; }
minor=$(k version -o json | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["serverVersion"]["minor"].rstrip("+")))')
[ "$minor" -ge 33 ] || fail "Kubernetes >= 1.33 is needed for in-place pod resize (kind node image is 1.$minor)"
nodes=($(k get nodes -o jsonpath='{.items[*].metadata.name}'))
[ "${#nodes[@]}" -eq 3 ] || fail "expected 3 nodes, found ${#nodes[@]}"
for n in "${nodes[@]}"; do
  # The chart's default nodeSelector: GPU nodes (as labelled by GPU Feature Discovery).
  k label node "$n" nvidia.com/gpu.present=true --overwrite >/dev/null
  k taint node "$n" node-role.kubernetes.io/control-plane- >/dev/null 2>&1 || true
done

if [ -z "${SKIP_BUILD:-}" ]; then
  say "images"
  docker build -q -f deploy/docker/agent.Dockerfile -t ghcr.io/ingero-io/ingero-agent:e2e .
  docker build -q -f deploy/docker/aggregator.Dockerfile -t ghcr.io/ingero-io/ingero:e2e .
  docker build -q -f kind-e2e/workload.Dockerfile -t ingero-e2e-workload:dev .
fi
for img in ghcr.io/ingero-io/ingero-agent:e2e ghcr.io/ingero-io/ingero:e2e ingero-e2e-workload:dev; do
  kind load docker-image --name "$cluster" "$img"
done

say "helm install (default values; images from this build)"
helm --kube-context "$ctx" upgrade --install ingero deploy/helm/ingero --namespace "$ns" --create-namespace \
  --set image.tag=e2e --set image.pullPolicy=Never \
  --set aggregator.flushAge=5s \
  --set aggregator.remediation.mode=on --set aggregator.remediation.taint=true \
  --set aggregator.remediation.after=10s --wait --timeout 5m
k -n "$ns" rollout status ds/ingero-agent --timeout 3m
k -n "$ns" exec ds/ingero-agent -- ingero-agent check || fail "ingero-agent check failed on a kind node"

say "the job: one rank per node"
k create namespace ml --dry-run=client -o yaml | k apply -f - >/dev/null
for i in 0 1 2; do
  RANK=$i NODE=${nodes[$i]} envsubst '$RANK $NODE' <kind-e2e/workload.yaml | k apply -f -
done
k -n ml wait --for=condition=Ready pod -l training.kubeflow.org/job-name=llama --timeout 2m
sleep "$fault_after"

ingero() { k -n "$ns" exec sts/ingero-aggregator -- ingero "$@" --server http://127.0.0.1:7070 --token-file /etc/ingero/token/token; }
flagged() { ingero stragglers --format json | python3 -c 'import json,sys; print(" ".join(s["node"] for s in json.load(sys.stdin)["stragglers"] if s["flagged"]))'; }
[ -z "$(flagged)" ] || fail "a node was flagged before any fault: $(flagged)"

say "fault: llama-worker-$contended (on ${nodes[$contended]}) gets 5% of a CPU"
k -n ml patch pod "llama-worker-$contended" --subresource resize --type merge -p \
  '{"spec":{"containers":[{"name":"pytorch","resources":{"requests":{"cpu":"50m"},"limits":{"cpu":"50m"}}}]}}'
t0=$(date +%s)
until [ "$(flagged)" = "${nodes[$contended]}" ]; do
  [ $(( $(date +%s) - t0 )) -lt 60 ] || { ingero stragglers; fail "${nodes[$contended]} not flagged within 60 s"; }
  sleep 1
done
echo "flagged ${nodes[$contended]} $(( $(date +%s) - t0 )) s after the fault"
ingero stragglers

say "assertions"
sleep 10 # a few more windows for the report, and a Parquet flush (flushAge 5s)
rows=$(ingero sql --format csv "SELECT pod, SUM(count) AS calls FROM call_windows WHERE namespace = 'ml' GROUP BY pod ORDER BY pod")
echo "$rows"
for i in 0 1 2; do
  echo "$rows" | grep -q "^llama-worker-$i," || fail "no calls attributed to ml/llama-worker-$i"
done
k -n "$ns" exec sts/ingero-aggregator -- ingero sql --store file:///var/lib/ingero/data \
  "SELECT COUNT(*) FROM call_windows" >/dev/null || fail "no Parquet dataset on the aggregator's volume"
report=$(ingero report --pod "ml/llama-worker-$contended")
echo "$report"
grep -q "CPU scheduling contention" <<<"$report" || fail "the pod report does not name CPU contention"

say "remediation: the node is marked (condition + taint), nothing is evicted"
cond() { k get node "${nodes[$contended]}" -o jsonpath='{.status.conditions[?(@.type=="IngeroStraggler")].status}'; }
t0=$(date +%s)
until [ "$(cond)" = "True" ]; do
  [ $(( $(date +%s) - t0 )) -lt 90 ] || { k -n "$ns" logs sts/ingero-aggregator | tail -20; fail "${nodes[$contended]} not marked within 90 s"; }
  sleep 2
done
k get node "${nodes[$contended]}" -o jsonpath='{.spec.taints[*].key}' | grep -q ingero.io/straggler || fail "no ingero.io/straggler taint"
k get events -n default --field-selector involvedObject.name="${nodes[$contended]}",reason=IngeroStraggler | grep -q IngeroStraggler \
  || fail "no IngeroStraggler event on the node"
[ "$(k -n ml get pods -l training.kubeflow.org/job-name=llama --field-selector status.phase=Running -o name | wc -l)" = 3 ] \
  || fail "a pod of the job is no longer running: remediation must never evict"
k -n "$ns" exec sts/ingero-aggregator -- ingero actions --store file:///var/lib/ingero/data --since 1h | grep -q "^20.* mark " \
  || fail "ingero actions does not list the mark"
say "kind e2e passed"
