#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Chart checks run by CI: helm lint, helm template with default / S3 / all-on
# values, Kubernetes schema validation (kubernetes-validate, strict), yamllint,
# and the deploy/manifests drift check.
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

echo "bad values are refused"
if helm template ingero "$chart" --set aggregator.storage.type=gcs >/dev/null 2>"$tmp/err"; then
  echo "storage.type=gcs was accepted" >&2; exit 1
fi
grep -q "storage/type" "$tmp/err"

echo "kubernetes-validate (strict)"
for f in default s3 all; do
  kubernetes-validate --strict --quiet "$tmp/$f.yaml"
done

echo "yamllint"
yamllint -c deploy/.yamllint.yaml "$tmp/default.yaml" "$tmp/s3.yaml" "$tmp/all.yaml" \
  "$chart/values.yaml" "$chart/Chart.yaml" deploy/helm/ci deploy/manifests

echo "manifests drift"
deploy/scripts/render-manifests.sh "$tmp/manifests.yaml"
if ! diff -u deploy/manifests/ingero.yaml "$tmp/manifests.yaml"; then
  echo "deploy/manifests/ingero.yaml is stale: run deploy/scripts/render-manifests.sh" >&2
  exit 1
fi
echo "chart checks passed"
