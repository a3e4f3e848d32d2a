// SPDX-License-Identifier: Apache-2.0
//! Other engines as co-owners of the store: delta-rs compacts, vacuums,
//! appends and checkpoints a table while `ingero serve` commits to it.
//! Then ingero's own maintenance compacts and vacuums the same table.
//! Nothing is lost or duplicated, both sides keep working, and delta-rs,
//! Polars and DuckDB count what ingero counts.

use std::process::Command;
use std::time::Duration;

use crate::fixtures::*;
use ingero_analysis::query::QueryEngine;
use ingero_model::Table;
use ingero_proto::client::{IngestClient, RetryPolicy};
use ingero_server::Server;
use ingero_sim::loadgen::synth_tables;
use ingero_store::StoreOptions;
use ingero_store::read::read_table;
use ingero_store::retention::Retention;
use ingero_store::upkeep;

const NODES: usize = 3;
const ROWS: usize = 16;
const ROUNDS: usize = 6;
/// `store::delta::maintain::MIN_FILES`: small files a settled partition needs before it is compacted.
const COMPACT_MIN_FILES: usize = 8;

/// One window of every node, pushed and committed; returns call_windows rows acknowledged.
async fn push_round(server: &Server, clients: &mut [IngestClient], t0: i64, w: usize) -> usize {
    for (n, c) in clients.iter_mut().enumerate() {
        let node = format!("gpu-{n}");
        let req = c.request(&synth_tables(&node, t0 + w as i64 * 1_000_000, ROWS, w as u64)).unwrap();
        c.push(&req).await.unwrap();
    }
    server.committer.flush().await.unwrap();
    clients.len() * ROWS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delta_rs_compacts_vacuums_and_appends_while_ingero_commits() {
    let py = Command::new("python3").args(["-c", "import deltalake, polars, duckdb"]).status();
    if !require("python3 with deltalake, polars and duckdb (pip)", py.is_ok_and(|s| s.success())) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let url = format!("file://{}", data.display());
    let server = Server::start(serve_config(&url, &dir.path().join("wal"), StoreOptions::default())).await.unwrap();
    let mut clients: Vec<IngestClient> = (0..NODES)
        .map(|n| IngestClient::new(&server.grpc_url(), &format!("gpu-{n}"), RetryPolicy::default()).unwrap())
        .collect();
    let now = chrono::Utc::now().timestamp_micros();
    // Two hours back: a settled hour, which ingero's own compaction takes
    // on after delta-rs (reading the files delta-rs wrote).
    let t0 = now - now % 3_600_000_000 - 2 * 3_600_000_000;
    let (mut acked, mut w) = (0, 0);
    for _ in 0..4 {
        acked += push_round(&server, &mut clients, t0, w).await;
        w += 1;
    }

    // delta-rs works on call_windows while ingero keeps committing to it.
    let done = dir.path().join("coowner.done");
    let args = [
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/coowner.py").to_string(),
        data.join("call_windows").display().to_string(),
        ROUNDS.to_string(),
        done.display().to_string(),
    ];
    let other = tokio::task::spawn_blocking(move || Command::new("python3").args(args).output().unwrap());
    while !done.exists() {
        acked += push_round(&server, &mut clients, t0, w).await;
        w += 1;
    }
    let out = other.await.unwrap();
    assert!(out.status.success(), "coowner.py: {}", String::from_utf8_lossy(&out.stderr));
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("delta-rs did: {theirs}");
    assert_eq!(theirs["failed"], serde_json::json!([]), "delta-rs kept working: {theirs}");
    assert!(theirs["files_compacted"].as_u64().unwrap() > 0, "delta-rs compacted ingero's files: {theirs}");
    let appended = theirs["appended_rows"].as_u64().unwrap();
    assert_eq!(appended, 3 * ROUNDS as u64, "{theirs}");
    // ingero keeps working after them too: enough windows that its own
    // compaction has a partition to take on (8 small files) however many
    // rounds fitted after delta-rs's last compaction (on a loaded machine,
    // none).
    for _ in 0..COMPACT_MIN_FILES {
        acked += push_round(&server, &mut clients, t0, w).await;
        w += 1;
    }
    server.shutdown().await.unwrap();

    let store = ingero_store::Store::open(&ingero_store::StoreUrl::parse(&url).unwrap(), &Default::default()).unwrap();
    let u = upkeep::run(&store, Duration::ZERO, &Retention::FOREVER, |t| t == "call_windows").await.unwrap();
    eprintln!("ingero did: {u:?}");
    assert!(
        u.compacted_files >= COMPACT_MIN_FILES && u.deleted_files > 0,
        "ingero compacted and vacuumed after delta-rs: {u:?}"
    );
    let rows = read_table(&store, Table::CallWindows).await.unwrap();
    let mut keys = call_keys(&rows);
    assert_eq!(keys.len() as u64, acked as u64 + appended, "ours {acked} + delta-rs's {appended} ({w} windows)");
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len() as u64, acked as u64 + appended, "a row was stored twice");
    let engine = QueryEngine::open(&store, Default::default()).await.unwrap();
    let ours = sql_u64(&engine, "SELECT count(*) FROM call_windows WHERE node LIKE 'gpu-%'").await;
    let outside = sql_u64(&engine, "SELECT count(*) FROM call_windows WHERE node LIKE 'outside-%'").await;
    assert_eq!((ours, outside), (acked as u64, appended));

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/delta_read.py");
    let out = Command::new("python3").args([script, data.to_str().unwrap(), "call_windows", "count"]).output().unwrap();
    assert!(out.status.success(), "delta_read.py: {}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sum = sql_u64(&engine, "SELECT sum(count) FROM call_windows").await;
    for e in ["deltalake", "polars", "duckdb"] {
        assert_eq!(got["call_windows"][e], acked as u64 + appended, "{e}: {got}");
        assert_eq!(got["call_windows"][format!("{e}_sum")], sum, "{e}: {got}");
    }
}
