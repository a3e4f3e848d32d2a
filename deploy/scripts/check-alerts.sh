#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The chart's alert rules: promtool checks their syntax and runs their unit
# tests (each alert fires on the series Ingero exports, for the right node
# and cause, with its runbook, and stays quiet otherwise). Which metrics
# exist is checked against real /metrics by cli/tests/it/remediate.rs and
# node/tests/nodes.rs. promtool: PATH, or Debian's prometheus package
# unpacked under /opt/prometheus (.ci/run does that).
set -euo pipefail
cd "$(dirname "$0")/../.."
promtool="$(command -v promtool || echo /opt/prometheus/usr/bin/promtool)"
[ -x "$promtool" ] || { echo "promtool not found (apt-get download prometheus; dpkg-deb -x prometheus_*.deb /opt/prometheus)" >&2; exit 1; }
"$promtool" check rules deploy/helm/ingero/alerts/ingero.rules.yaml
"$promtool" test rules deploy/prometheus/ingero.rules.test.yaml
