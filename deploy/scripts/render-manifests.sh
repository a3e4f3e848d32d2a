#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Renders deploy/manifests/ingero.yaml from the chart with default values.
# The generated auth token is replaced by an empty one: the aggregator refuses
# to start until you put a real token in Secret ingero-token (see README).
# Usage: deploy/scripts/render-manifests.sh [OUT]   (default: deploy/manifests/ingero.yaml)
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-deploy/manifests/ingero.yaml}"
{
  echo "# Rendered from deploy/helm/ingero with default values by"
  echo "# deploy/scripts/render-manifests.sh; do not edit (CI fails if stale)."
  echo "# Before applying: kubectl create namespace ingero, then set the token:"
  echo "#   kubectl -n ingero create secret generic ingero-token --from-literal=token=\"\$(openssl rand -hex 24)\""
  echo "# and drop the Secret below (or fill it in)."
  helm template ingero deploy/helm/ingero --namespace ingero \
    | sed -E 's/^(  token: ).*/\1""/' \
    | grep -v '^  *helm.sh/chart: '
} > "$out"
