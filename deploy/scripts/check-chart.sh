#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Chart checks run by CI: helm lint, helm template with default / S3 / all-on
# / TLS values, refusals of values that cannot work, the Grafana ConfigMap,
# Kubernetes schema validation (kubernetes-validate, strict), yamllint, and
# the deploy/manifests drift check.
set -euo pipefail
cd "$(dirname "$0")/../.."
chart=deploy/helm/ingero
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "helm lint"
helm lint --strict "$chart"
helm lint --strict "$chart" -f deploy/helm/ci/s3-values.yaml

echo "helm template: default, S3, everything on"
helm template ingero "$chart" --namespace ingero >"$tmp/default.yaml"
helm template ingero "$chart" --namespace ingero -f deploy/helm/ci/s3-values.yaml >"$tmp/s3.yaml"
helm template ingero "$chart" --namespace ingero -f deploy/helm/ci/all-values.yaml >"$tmp/all.yaml"
# TLS without client certificates, and a NetworkPolicy with ingress rules only.
helm template ingero "$chart" --namespace ingero --set tls.enabled=true --set networkPolicy.enabled=true \
  --set auth.existingSecret=my-token --set auth.secretKey=bearer >"$tmp/tls.yaml"
grep -q 'value: "https://ingero-aggregator.ingero.svc:7070"' "$tmp/tls.yaml"
grep -q 'value: /etc/ingero/token/bearer' "$tmp/tls.yaml"
if grep -q 'INGERO_TLS_CLIENT_CA\|policyTypes: \[Ingress, Egress\]' "$tmp/tls.yaml"; then
  echo "mutual TLS or agent egress rendered without being asked for" >&2; exit 1
fi
grep -q 'INGERO_TLS_CLIENT_CA' "$tmp/all.yaml"
grep -q 'policyTypes: \[Ingress, Egress\]' "$tmp/all.yaml"

# Three replicas on S3: each knows the set and itself, agents get the same list.
urls="http://ingero-aggregator-0.ingero-aggregator-headless.ingero.svc:7070"
urls="$urls,http://ingero-aggregator-1.ingero-aggregator-headless.ingero.svc:7070"
urls="$urls,http://ingero-aggregator-2.ingero-aggregator-headless.ingero.svc:7070"
[ "$(grep -c "value: \"$urls\"" "$tmp/s3.yaml")" = 2 ] || { echo "replica list not rendered for both sides" >&2; exit 1; }
grep -q 'http://$(POD_NAME).ingero-aggregator-headless.ingero.svc:7070' "$tmp/s3.yaml"
grep -q 'clusterIP: None' "$tmp/s3.yaml"
if grep -q 'INGERO_REPLICAS' "$tmp/default.yaml"; then
  echo "one aggregator rendered as a replica set" >&2; exit 1
fi

echo "the chart's Grafana dashboard is deploy/grafana/ingero.json"
python3 - "$tmp/all.yaml" <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "ConfigMap"]
cm = [d for d in docs if d["metadata"]["name"].endswith("-dashboard")]
assert len(cm) == 1 and cm[0]["metadata"]["labels"].get("grafana_dashboard") == "1", cm
assert json.loads(cm[0]["data"]["ingero.json"]) == json.load(open("deploy/grafana/ingero.json"))
PY

echo "the chart's PrometheusRule is deploy/helm/ingero/alerts/ingero.rules.yaml"
python3 - "$tmp/all.yaml" "$tmp/default.yaml" <<'PY'
import sys, yaml
rules = lambda f: [d for d in yaml.safe_load_all(open(f)) if d and d.get("kind") == "PrometheusRule"]
pr = rules(sys.argv[1])
assert len(pr) == 1 and pr[0]["metadata"]["labels"].get("release") == "prometheus", pr
assert pr[0]["spec"] == yaml.safe_load(open("deploy/helm/ingero/alerts/ingero.rules.yaml")), "the rendered rules differ"
assert not rules(sys.argv[2]), "a PrometheusRule rendered without being asked for"
PY

echo "bad values are refused"
if helm template ingero "$chart" --set aggregator.storage.type=gcs >/dev/null 2>"$tmp/err"; then
  echo "storage.type=gcs was accepted" >&2; exit 1
fi
grep -q "storage/type" "$tmp/err"
if helm template ingero "$chart" --set tls.mutual.enabled=true >/dev/null 2>"$tmp/err"; then
  echo "mutual TLS without TLS was accepted" >&2; exit 1
fi
grep -q "needs tls.enabled" "$tmp/err"
if helm template ingero "$chart" --set networkPolicy.enabled=true --set networkPolicy.agentEgress.enabled=true \
  >/dev/null 2>"$tmp/err"; then
  echo "agent egress without the API server's addresses was accepted" >&2; exit 1
fi
grep -q "apiServerCIDRs" "$tmp/err"

if helm template ingero "$chart" --set aggregator.replicas=2 >/dev/null 2>"$tmp/err"; then
  echo "two replicas on per-pod PVCs were accepted" >&2; exit 1
fi
grep -q "needs aggregator.storage.type=s3" "$tmp/err"

echo "remediation: off by default, least privilege when on"
if grep -q -- '-remediation\|INGERO_REMEDIATE' "$tmp/default.yaml"; then
  echo "remediation rendered without being asked for" >&2; exit 1
fi
grep -q 'automountServiceAccountToken: false' "$tmp/default.yaml"
python3 - "$tmp/all.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
role = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-remediation")]
assert len(role) == 1, "no remediation ClusterRole"
rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role[0]["rules"]}
assert rules == {
    (("",), ("nodes",)): {"get", "list", "patch"},
    (("",), ("nodes/status",)): {"patch"},
    (("",), ("pods",)): {"list"},
    (("",), ("events",)): {"create"},
}, rules
sts = [d for d in docs if d["kind"] == "StatefulSet"][0]["spec"]["template"]["spec"]
assert sts["automountServiceAccountToken"] is True
env = {e["name"]: e.get("value") for e in sts["containers"][0]["env"]}
assert env["INGERO_REMEDIATE"] == "on" and env["INGERO_REMEDIATE_TAINT"] == "true", env
assert env["INGERO_REPORT_URL"].endswith("var-node={node}"), env
PY
if helm template ingero "$chart" --set aggregator.remediation.mode=always >/dev/null 2>"$tmp/err"; then
  echo "remediation.mode=always was accepted" >&2; exit 1
fi
grep -q "remediation/mode" "$tmp/err"

# GPU-hour prices reach the aggregator as --gpu-price rules; a malformed one is refused.
helm template ingero "$chart" --set 'aggregator.cost.gpuHourPrice={model:H100=4.10,default=2.5}' \
  --set aggregator.cost.gpusPerNode=4 >"$tmp/cost.yaml"
grep -A1 "name: INGERO_GPU_PRICE" "$tmp/cost.yaml" | grep -q 'value: "model:H100=4.10,default=2.5"'
grep -A1 "name: INGERO_GPUS_PER_NODE" "$tmp/cost.yaml" | grep -q 'value: "4"'
if helm template ingero "$chart" --set 'aggregator.cost.gpuHourPrice={H100}' >/dev/null 2>"$tmp/err"; then
  echo "cost.gpuHourPrice without a price was accepted" >&2; exit 1
fi

echo "kubernetes-validate (strict)"
for f in default s3 all tls; do
  kubernetes-validate --strict --quiet "$tmp/$f.yaml"
done

echo "yamllint"
yamllint -c deploy/.yamllint.yaml "$tmp/default.yaml" "$tmp/s3.yaml" "$tmp/all.yaml" "$tmp/tls.yaml" \
  "$chart/values.yaml" "$chart/Chart.yaml" "$chart/alerts" deploy/helm/ci deploy/manifests

echo "manifests drift"
deploy/scripts/render-manifests.sh "$tmp/manifests.yaml"
if ! diff -u deploy/manifests/ingero.yaml "$tmp/manifests.yaml"; then
  echo "deploy/manifests/ingero.yaml is stale: run deploy/scripts/render-manifests.sh" >&2
  exit 1
fi
echo "chart checks passed"
