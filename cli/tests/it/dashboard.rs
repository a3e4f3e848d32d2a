// SPDX-License-Identifier: Apache-2.0
//! The Grafana dashboard (deploy/grafana/ingero.json) queries only metrics
//! `ingero serve` really exports: read from its /metrics while a simulated
//! fleet with a straggler runs. The agent's metrics are checked by
//! node/tests/nodes.rs against a running agent.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::time::Duration;

use crate::fixtures::*;
use ingero_sim::faults::Injection;
use ingero_sim::fleet::{self, SimConfig};
use serde_json::Value;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn dashboard() -> Value {
    // The one file (deploy/grafana/ingero.json links to it); CI checks it is
    // what deploy/grafana/make-dashboard.py writes.
    let text = std::fs::read_to_string(format!("{ROOT}/deploy/helm/ingero/dashboards/ingero.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every `ingero_…` metric name a query or a variable of the dashboard uses.
fn queried(d: &Value) -> BTreeSet<String> {
    let mut exprs: Vec<String> = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_string());
        }
    }
    let mut names = BTreeSet::new();
    for e in exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("ingero_") {
            let name: String =
                rest[i..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
            rest = &rest[i + name.len()..];
            names.insert(name);
        }
    }
    names
}

/// Sample names (with their labels' keys) in a Prometheus text exposition.
fn exported(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_string))
        .collect()
}

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: ingero\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

#[test]
fn panels_are_laid_out_and_every_query_is_well_formed() {
    let d = dashboard();
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id: {p}");
        let g = &p["gridPos"];
        assert!(g["x"].as_u64().unwrap() + g["w"].as_u64().unwrap() <= 24, "panel wider than the grid: {p}");
        if p["type"] != "row" {
            assert!(!p["description"].as_str().unwrap().is_empty(), "panel without a description: {}", p["title"]);
            for t in p["targets"].as_array().unwrap() {
                let e = t["expr"].as_str().unwrap();
                let depth = e.chars().try_fold(0i32, |d, c| match c {
                    '(' | '{' | '[' => Some(d + 1),
                    ')' | '}' | ']' => (d > 0).then_some(d - 1),
                    _ => Some(d),
                });
                assert_eq!(depth, Some(0), "unbalanced brackets in {e}");
                assert_eq!(e.matches('"').count() % 2, 0, "unbalanced quotes in {e}");
            }
        }
    }
    let names = queried(&d);
    assert!(names.iter().any(|n| n.starts_with("ingero_agent_")) && names.len() >= 15, "{names:?}");
    // The training job is `training_job`: a `job` label would collide with Prometheus's own.
    assert!(!d.to_string().contains("{job") && !d.to_string().contains(",job"), "a `job` label is queried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_aggregator_metric_the_dashboard_queries_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let cfg = SimConfig {
        server: server.grpc_url(),
        nodes: 8,
        jobs: 1,
        duration: Duration::from_secs(8),
        injections: vec![Injection::parse("cpu@2:2s", 8).unwrap()],
        jitter: 0.05,
        seed: 7,
        job_prefix: "train".into(),
    };
    let r = fleet::run(&cfg, |_| {}).await.unwrap();
    assert!(r.injections[0].flagged_after_secs.is_some(), "the straggler was not flagged: {r:?}");
    server.committer.flush().await.unwrap();
    let metrics = get(server.http_addr, "/metrics");
    let have = exported(&metrics);
    let want: Vec<String> = queried(&dashboard()).into_iter().filter(|n| !n.starts_with("ingero_agent_")).collect();
    let missing: Vec<&String> = want.iter().filter(|n| !have.contains(*n)).collect();
    assert!(missing.is_empty(), "the dashboard queries {missing:?}, not in /metrics:\n{metrics}");
    // The labels the panels group by and the variables read.
    assert!(metrics.contains("ingero_straggler_score{training_job=\"train\",node=\"node-2\"}"), "{metrics}");
    assert!(
        metrics.contains("ingero_straggler_signal_z{training_job=\"train\",node=\"node-2\",signal=\"runq_share\"}")
    );
    assert!(metrics.contains("ingero_ingest_rejects_total{reason=\"rate_limited\"} 0"), "{metrics}");
    server.shutdown().await.unwrap();
}
