#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the Grafana dashboard from the panel list below: edit here, run,
commit. It has one home, the chart's deploy/helm/ingero/dashboards/ingero.json
(Helm reads files inside the chart only); deploy/grafana/ingero.json is a
link to it for importing by hand. `--check` (CI) fails when the committed file
is not what this script writes.
Lines stay under ~150 characters (yamllint reads the chart's ConfigMap).
Every metric a query names is checked against the real /metrics of
`ingero serve` (cli/tests/it/dashboard.rs) and `ingero-agent`
(node/tests/dashboard.rs)."""

import json
import pathlib
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
JOB = 'training_job=~"$training_job"'
NODE = 'node=~"$node"'


def panel(title, desc, targets, kind="timeseries", unit="short", w=12, h=8, extra=None):
    p = {
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"datasource": DS, "refId": chr(65 + i), "expr": e, "legendFormat": legend, **(t or {})}
            for i, (e, legend, t) in enumerate(targets)
        ],
    }
    p.update(extra or {})
    return p


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "gridPos": {"w": 24, "h": 1}, "panels": []}


INSTANT_TABLE = {"instant": True, "format": "table"}

PANELS = [
    row("Stragglers (live ranking of ingero serve)"),
    panel("Flagged nodes", "Nodes the detector flags now: they hold their training job back.",
          [(f"sum(ingero_straggler_flagged{{{JOB}}})", "flagged", None)], kind="stat", w=4,
          extra={"options": {"colorMode": "background", "reduceOptions": {"calcs": ["lastNotNull"]}},
                 "fieldConfig": {"defaults": {"unit": "short", "thresholds": {"mode": "absolute", "steps": [
                     {"color": "green", "value": None}, {"color": "red", "value": 1}]}}, "overrides": []}}),
    panel("Straggler score per node",
          "Robust deviation of each node from its job (MAD units); above the threshold (4 by default) for "
          "3 windows the node is flagged.",
          [(f"ingero_straggler_score{{{JOB},{NODE}}}", "{{training_job}} {{node}}", None)], w=20),
    panel("Flagged nodes and their top signals",
          "Signals of flagged nodes: robust z and value. `ingero report --node NODE` explains them.",
          [(f"ingero_straggler_signal_z{{{NODE}}} and on(training_job, node) "
            f"(ingero_straggler_flagged{{{JOB}}} == 1)", "", INSTANT_TABLE),
           (f"ingero_straggler_signal_value{{{JOB},{NODE}}}", "", INSTANT_TABLE)],
          kind="table", w=12,
          extra={"transformations": [
              {"id": "merge"},
              {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True},
                                             "renameByName": {"Value #A": "z", "Value #B": "value"}}},
              {"id": "sortBy", "options": {"sort": [{"field": "z", "desc": True}]}}]}),
    panel("Signal z per node", "Robust z of every deviating signal, per node and signal.",
          [(f"topk(10, ingero_straggler_signal_z{{{JOB},{NODE}}})", "{{node}} {{signal}}", None)], w=12),
    panel("Ranking queue drops", "Batches not ranked because the live ranking's queue was full (ingest kept them).",
          [("rate(ingero_ranking_dropped_total[5m])", "{{instance}}", None)], unit="ops", w=8),

    row("Agents (one per GPU node)"),
    panel("Ring-buffer drops", "Outlier/stall events lost because a ring buffer was full; should be 0.",
          [("sum by (instance) (rate(ingero_agent_ringbuf_drops_total[5m]))", "{{instance}}", None)],
          unit="ops", w=8),
    panel("Kernel map full", "Aggregate updates lost to a full kernel map (raise --max-threads / memory).",
          [("sum by (instance) (rate(ingero_agent_map_full_total[5m]))", "{{instance}}", None)], unit="ops", w=8),
    panel("Probe CPU", "CPU the eBPF programs spend (BPF_STATS run time), in cores.",
          [("sum by (instance) (rate(ingero_agent_probe_run_ns_total[5m])) / 1e9", "{{instance}}", None)],
          unit="short", w=8),
    panel("Spool depth", "Batches waiting on the node for the aggregator; grows while it is unreachable.",
          [("ingero_agent_spool_depth", "{{instance}}", None)], w=8),
    panel("Batches shipped / refused / dropped",
          "Acknowledged by the aggregator, refused by it, and dropped from a full spool (data lost).",
          [("sum(rate(ingero_agent_batches_sent_total[5m]))", "sent", None),
           ("sum(rate(ingero_agent_batches_rejected_total[5m]))", "refused", None),
           ("sum(rate(ingero_agent_spool_dropped_total[5m]))", "dropped from spool", None)], unit="ops", w=8),
    panel("Kernel map memory", "Memory of the agent's eBPF maps (counts against the node, not the pod limit).",
          [("ingero_agent_kernel_map_bytes", "{{instance}}", None)], unit="bytes", w=8),
    panel("Probe hits", "CUDA/NCCL calls and scheduler events aggregated in the kernel.",
          [("sum by (instance) (rate(ingero_agent_events_total[5m]))", "{{instance}}", None)], unit="ops", w=12),
    panel("Attach failures and invalid rows",
          "Libraries that could not be probed, and rows the agent refused to ship.",
          [("sum by (instance) (rate(ingero_agent_attach_failures_total[5m]))", "attach {{instance}}", None),
           ("sum by (instance) (rate(ingero_agent_rows_invalid_total[5m]))", "invalid {{instance}}", None)],
          unit="ops", w=12),

    row("Aggregator (ingero serve)"),
    panel("Rows ingested by table", "Rows acknowledged, per table.",
          [("sum by (table) (rate(ingero_ingest_rows_total[5m]))", "{{table}}", None)], unit="rowsps", w=8),
    panel("Batches by outcome", "Stored, duplicate (a retried batch, dropped once), rejected.",
          [("sum by (outcome) (rate(ingero_ingest_batches_total[5m]))", "{{outcome}}", None)], unit="ops", w=8),
    panel("Rejects by reason", "Why batches were refused (the agent keeps and retries rate_limited ones).",
          [("sum by (reason) (rate(ingero_ingest_rejects_total[5m]))", "{{reason}}", None)], unit="ops", w=8),
    panel("Flush latency", "Time to write one segment to the store (Parquet on object storage).",
          [("histogram_quantile(0.5, sum by (le) (rate(ingero_flush_seconds_bucket[5m])))", "p50", None),
           ("histogram_quantile(0.99, sum by (le) (rate(ingero_flush_seconds_bucket[5m])))", "p99", None),
           ("rate(ingero_flush_errors_total[5m])", "errors/s (retried)", None)], unit="s", w=8),
    panel("WAL group commit", "Write + fsync of one WAL group commit: batches are acknowledged after it.",
          [("histogram_quantile(0.99, sum by (le) (rate(ingero_wal_sync_seconds_bucket[5m])))", "p99", None)],
          unit="s", w=8),
    panel("Buffered rows", "Acknowledged, in the WAL, not yet in Parquet.",
          [("ingero_buffered_rows", "{{instance}}", None)], w=8),
]


def layout(panels):
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        p["id"] = i
        g = p["gridPos"]
        if p["type"] == "row" or x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g["x"], g["y"] = x, y
        x += g["w"]
        row_h = max(row_h, g["h"])
        if p["type"] == "row":
            x, y, row_h = 0, y + 1, 0
    return panels


def variable(name, label, query):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query,
            "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"text": "All", "value": "$__all"}, "sort": 1}


DASHBOARD = {
    "uid": "ingero-fleet",
    "title": "Ingero: GPU fleet stragglers",
    "description": "Stragglers of GPU training jobs and why; health of Ingero's agents and aggregator.",
    "tags": ["ingero", "gpu", "kubernetes"],
    "editable": True,
    "schemaVersion": 39,
    "time": {"from": "now-1h", "to": "now"},
    "refresh": "30s",
    "templating": {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0},
        variable("training_job", "Job", "label_values(ingero_straggler_score, training_job)"),
        variable("node", "Node", f"label_values(ingero_straggler_score{{{JOB}}}, node)"),
    ]},
    "panels": layout(PANELS),
}

if __name__ == "__main__":
    out = pathlib.Path(__file__).resolve().parent.parent / "helm/ingero/dashboards/ingero.json"
    text = json.dumps(DASHBOARD, indent=2) + "\n"
    if sys.argv[1:] == ["--check"]:
        if not out.exists() or out.read_text() != text:
            sys.exit(f"{out} is not what deploy/grafana/make-dashboard.py writes: run it and commit the result")
        print(f"{out}: as generated")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
