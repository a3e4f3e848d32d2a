// SPDX-License-Identifier: Apache-2.0
//! The store's Delta Lake tables: two aggregators committing to one store at
//! once, a node failing over from one to the other with batches re-sent,
//! every batch stored exactly once, and the tables read back by engines
//! ingero does not contain (delta-rs, Polars, DuckDB) with the same counts
//! as `ingero`'s own SQL — through the checkpoint written at version 100;
//! and a replica that commits late (cut off, or replaying its WAL) leaving
//! out what its nodes' new replica stored first.

use std::collections::BTreeMap;
use std::process::Command;

use arrow::array::RecordBatch;

use crate::fixtures::*;
use ingero_analysis::query::QueryEngine;
use ingero_model::Table;
use ingero_proto::client::{IngestClient, RetryPolicy};
use ingero_proto::pb::PushRequest;
use ingero_server::Server;
use ingero_sim::loadgen::synth_tables;
use ingero_store::delta::Snapshot;
use ingero_store::read::read_table;
use ingero_store::retention::Retention;
use ingero_store::{StoreOptions, StoreUrl};
use ingero_store::{flush, upkeep};

const NODES: usize = 8;
const BATCHES: usize = 14;
const ROWS: usize = 64;

/// Every node's batches, prepared once (so a re-send is the same node and sequence).
fn batches() -> Vec<Vec<PushRequest>> {
    batches_where(|_, _| true)
}

/// Every node's batches, with only the tables `keep(node index, table)` takes.
fn batches_where(keep: impl Fn(usize, Table) -> bool) -> Vec<Vec<PushRequest>> {
    let now = chrono::Utc::now().timestamp_micros();
    let t0 = now - now % 1_000_000 - 60_000_000;
    (0..NODES)
        .map(|n| {
            let node = format!("gpu-{n}");
            let mut c = IngestClient::new("http://127.0.0.1:1", &node, RetryPolicy::default()).unwrap();
            (0..BATCHES)
                .map(|w| {
                    let mut tables = synth_tables(&node, t0 + w as i64 * 1_000_000, ROWS, w as u64);
                    tables.retain(|(t, _)| keep(n, *t));
                    c.request(&tables).unwrap()
                })
                .collect()
        })
        .collect()
}

/// Pushes `reqs` to `server`, committing after each (so the two servers race for log versions).
async fn push_each_and_commit(server: &Server, node: &str, reqs: &[PushRequest]) {
    let mut c = IngestClient::new(&server.grpc_url(), node, RetryPolicy::default()).unwrap();
    for r in reqs {
        c.push(r).await.unwrap();
        server.committer.flush().await.unwrap();
    }
}

async fn two_writers(store: &str, opts: StoreOptions) -> (tempfile::TempDir, Vec<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(serve_config(store, &dir.path().join("wal-a"), opts.clone())).await.unwrap();
    let b = Server::start(serve_config(store, &dir.path().join("wal-b"), opts)).await.unwrap();
    let all = batches();
    // Even nodes on A, odd on B, all at once: both commit to the same tables.
    let mut tasks = Vec::new();
    for (n, reqs) in all.iter().enumerate() {
        let server = if n % 2 == 0 { &a } else { &b };
        tasks.push(push_each_and_commit(server, &reqs[0].node, &reqs[..BATCHES / 2]));
    }
    futures::future::join_all(tasks).await;
    // A goes away; its nodes move to B and re-send their last two batches
    // (acknowledged by A, so B must find them in the store, not store them again).
    a.shutdown().await.unwrap();
    let mut tasks = Vec::new();
    for (n, reqs) in all.iter().enumerate() {
        let from = if n % 2 == 0 { BATCHES / 2 - 2 } else { BATCHES / 2 };
        tasks.push(push_each_and_commit(&b, &reqs[0].node, &reqs[from..]));
    }
    futures::future::join_all(tasks).await;
    b.shutdown().await.unwrap();
    (dir, all.iter().map(|r| r.last().unwrap().sequence).collect())
}

async fn check_exactly_once(store_url: &str, opts: &StoreOptions, last: &[u64]) {
    let store = ingero_store::Store::open(&StoreUrl::parse(store_url).unwrap(), opts).unwrap();
    let calls = read_table(&store, Table::CallWindows).await.unwrap();
    let expected = NODES * BATCHES * ROWS;
    if total_rows(&calls) != expected {
        let engine = QueryEngine::open(&store, Default::default()).await.unwrap();
        let q = "SELECT node, writer, segment, first_sequence % 1000000 AS f, last_sequence % 1000000 AS l, batches \
                 FROM ingest_batches ORDER BY node, first_sequence";
        let b = engine.sql(q).await.unwrap();
        eprintln!("{}", arrow::util::pretty::pretty_format_batches(&b).unwrap());
    }
    assert_eq!(total_rows(&calls), expected);
    let mut keys = call_keys(&calls);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), expected, "a row was stored twice");
    let engine = QueryEngine::open(&store, Default::default()).await.unwrap();
    assert_eq!(sql_u64(&engine, "SELECT count(*) FROM call_windows").await, expected as u64);
    let batches = sql_u64(&engine, "SELECT sum(batches) FROM ingest_batches").await;
    assert_eq!(batches, (NODES * BATCHES) as u64, "ingest_batches lists each batch once");
    let snap = Snapshot::load(&store, "call_windows").await.unwrap();
    assert_eq!(snap.rows(), Some(expected as u64), "numRecords of the live files");
    // Maintenance folds the completed segments' high-waters into node versions.
    let u = upkeep::run(&store, std::time::Duration::ZERO, &Retention::FOREVER, |t| t == "ingest_batches").await;
    assert_eq!(u.unwrap().folded_nodes, NODES as u64);
    let b = Snapshot::load(&store, "ingest_batches").await.unwrap();
    for (n, &seq) in last.iter().enumerate() {
        assert_eq!(b.txns[&format!("node:gpu-{n}")], seq as i64, "high-water of gpu-{n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_aggregators_share_a_local_store_exactly_once_and_other_engines_agree() {
    let data = tempfile::tempdir().unwrap();
    let url = format!("file://{}", data.path().display());
    let (_wal, last) = two_writers(&url, StoreOptions::default()).await;
    check_exactly_once(&url, &StoreOptions::default(), &last).await;
    let store = ingero_store::Store::open(&StoreUrl::parse(&url).unwrap(), &Default::default()).unwrap();
    // More commits, one segment each, until the log passes a checkpoint
    // and one settled hour holds at least 64 small files.
    let mut seg = 1;
    while seg <= 64 || Snapshot::load(&store, "call_windows").await.unwrap().version.unwrap() < 101 {
        let t: BTreeMap<Table, Vec<RecordBatch>> =
            synth_tables("tool-node", 1_795_000_000_000_000 + seg as i64 * 1_000_000, 8, seg)
                .into_iter()
                .map(|(t, b)| (t, vec![b]))
                .collect();
        flush::write_segment(&store, "tool", seg, t).await.unwrap();
        seg += 1;
    }
    assert!(data.path().join("call_windows/_delta_log/00000000000000000100.checkpoint.parquet").exists());
    let from_checkpoint = Snapshot::load(&store, "call_windows").await.unwrap();
    assert_eq!(
        from_checkpoint.rows(),
        Some((NODES * BATCHES * ROWS) as u64 + 8 * (seg - 1)),
        "rows through the checkpoint"
    );
    // Those 100 one-window files sit in one settled hour: compaction merges
    // them in one commit, vacuum deletes the merged-away files.
    let files_before = from_checkpoint.files.len();
    let u = upkeep::run(&store, std::time::Duration::ZERO, &Retention::FOREVER, |_| true).await.unwrap();
    assert!(u.compacted_files >= 100 && u.written_files >= 1, "{u:?}");
    // Also deleted: files a writer wrote for a version another one took
    // first (each attempt writes new names; none is ever rewritten).
    assert!(u.deleted_files >= u.compacted_files, "{u:?}");
    let after = Snapshot::load(&store, "call_windows").await.unwrap();
    let mut on_disk = Vec::new();
    let mut dirs = vec![data.path().join("call_windows")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() && !p.ends_with("_delta_log") {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") && !p.to_string_lossy().contains("_delta_log") {
                on_disk.push(p.strip_prefix(data.path().join("call_windows")).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    on_disk.sort();
    assert_eq!(on_disk, after.files.keys().cloned().collect::<Vec<_>>(), "vacuum left exactly the live files");
    let hours = |s: &Snapshot| {
        let mut m = std::collections::BTreeMap::new();
        for a in s.files.values() {
            *m.entry(format!("{:?}", a.partition_values)).or_insert(0) += 1;
        }
        m
    };
    let (b, a) = (hours(&from_checkpoint), hours(&after));
    let settled = b.keys().find(|k| k.contains("2026-11-18")).unwrap().clone();
    assert!(b[&settled] >= 60 && a[&settled] == 1, "the settled hour in one file: {b:?} → {a:?}");
    assert_eq!(after.files.len(), files_before - b[&settled] + 1, "other hours untouched: {b:?} → {a:?}");
    assert_eq!(after.rows(), from_checkpoint.rows(), "compaction kept every row");
    let again = upkeep::run(&store, std::time::Duration::ZERO, &Retention::FOREVER, |_| true).await.unwrap();
    assert_eq!(again, Default::default(), "nothing left to do");

    let py = Command::new("python3").args(["-c", "import deltalake, polars, duckdb"]).status();
    if !require("python3 with deltalake, polars and duckdb (pip)", py.is_ok_and(|s| s.success())) {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/delta_read.py");
    let out = Command::new("python3")
        .args([
            script,
            data.path().to_str().unwrap(),
            "call_windows,sched_windows,ingest_batches,signal_windows",
            "count",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "delta_read.py: {}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let engine = QueryEngine::open(&store, Default::default()).await.unwrap();
    for table in ["call_windows", "sched_windows", "ingest_batches", "signal_windows"] {
        let ours = sql_u64(&engine, &format!("SELECT count(*) FROM {table}")).await;
        assert!(ours > 0, "{table} is empty");
        for engine_name in ["deltalake", "polars", "duckdb"] {
            assert_eq!(got[table][engine_name], ours, "{engine_name} counts {table}: {got}");
        }
    }
    let sum = sql_u64(&engine, "SELECT sum(count) FROM call_windows").await;
    for k in ["deltalake_sum", "polars_sum", "duckdb_sum"] {
        assert_eq!(got["call_windows"][k], sum, "{k}: {got}");
    }
    assert_eq!(got["call_windows"]["checkpoint"], true);
    // Every file, compacted ones included, carries min/max/null statistics
    // that delta-rs parses into true bounds (integers exact).
    for table in ["call_windows", "sched_windows", "ingest_batches", "signal_windows"] {
        let (stats, files) = (&got[table]["stats"], got[table]["files"].as_u64().unwrap());
        assert_eq!(stats["files"].as_u64(), Some(files), "{table}: every file has statistics: {stats}");
        assert!(stats["checked"].as_u64().unwrap() >= 3 * files, "{table}: {stats}");
        assert_eq!(stats["wrong"], serde_json::json!([]), "{table}: statistics delta-rs reads: {stats}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_aggregators_share_an_s3_store_exactly_once() {
    let Some(s3) = Seaweed::start() else { return };
    let opts = StoreOptions { s3_endpoint: Some(s3.with_credentials()) };
    let url = format!("s3://ingero/delta-{}", std::process::id());
    let (_wal, last) = two_writers(&url, opts.clone()).await;
    check_exactly_once(&url, &opts, &last).await;
}

/// Pushes `reqs` to `server` without committing (they wait in its buffer).
async fn push_only(server: &Server, reqs: &[PushRequest]) {
    let mut c = IngestClient::new(&server.grpc_url(), &reqs[0].node, RetryPolicy::default()).unwrap();
    for r in reqs {
        assert!(!c.push(r).await.unwrap().duplicate, "{} #{} is new here", r.node, r.sequence);
    }
}

/// What a store holds, table by table, in numbers that do not depend on
/// how rows were split into segments.
async fn contents(url: &str) -> BTreeMap<String, u64> {
    let store = ingero_store::Store::open(&StoreUrl::parse(url).unwrap(), &Default::default()).unwrap();
    let engine = QueryEngine::open(&store, Default::default()).await.unwrap();
    let mut out = BTreeMap::new();
    for t in Table::ALL.iter().map(|t| t.name()).chain(["signal_windows"]) {
        out.insert(t.to_string(), Snapshot::load(&store, t).await.unwrap().rows().expect("numRecords of every file"));
    }
    for t in ["signal_windows_10s", "signal_windows_60s"] {
        out.insert(format!("{t} windows"), sql_u64(&engine, &format!("SELECT sum(windows) FROM {t}")).await);
    }
    for c in ["batches", "rows"] {
        out.insert(
            format!("ingest_batches {c}"),
            sql_u64(&engine, &format!("SELECT sum({c}) FROM ingest_batches")).await,
        );
    }
    out
}

/// A replica cut off (alive) or restarted with its WAL commits batches its
/// nodes already re-sent to another replica: whichever writer commits
/// second leaves them out, table by table, and keeps the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_commits_late_stores_nothing_twice_and_loses_nothing() {
    let (data, wal) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = format!("file://{}", data.path().join("shared").display());
    let a = Server::start(serve_config(&url, &wal.path().join("a"), Default::default())).await.unwrap();
    let b = Server::start(serve_config(&url, &wal.path().join("b"), Default::default())).await.unwrap();
    let all = batches_where(|n, t| n != 1 || t != Table::SchedWindows);
    let (n0, n1) = (&all[0], &all[1]);
    let half = BATCHES / 2;
    // Acknowledged, not committed: gpu-0 on A, gpu-1 on B.
    push_only(&a, &n0[..half]).await;
    push_only(&b, &n1[..half]).await;
    // Both nodes move, re-sending what was not committed, and go on.
    push_only(&b, n0).await;
    push_only(&a, n1).await;
    // B commits first (everything new), then A (gpu-0 dropped whole, gpu-1
    // cut at the half B stored); the other way round for the tiers' sake.
    b.committer.flush().await.unwrap();
    a.committer.flush().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();

    // The same batches once, through one writer.
    let reference = format!("file://{}", data.path().join("reference").display());
    let r = Server::start(serve_config(&reference, &wal.path().join("r"), Default::default())).await.unwrap();
    push_only(&r, n0).await;
    push_only(&r, n1).await;
    r.shutdown().await.unwrap();

    let (got, want) = (contents(&url).await, contents(&reference).await);
    assert_eq!(got, want, "shared store vs every batch once");
    assert_eq!(want["ingest_batches batches"], 2 * BATCHES as u64);
    assert_eq!(want["call_windows"], (2 * BATCHES * ROWS) as u64);
    let store = ingero_store::Store::open(&StoreUrl::parse(&url).unwrap(), &Default::default()).unwrap();
    let mut keys = call_keys(&read_table(&store, Table::CallWindows).await.unwrap());
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "a row was stored twice");
    upkeep::run(&store, std::time::Duration::ZERO, &Retention::FOREVER, |t| t == "ingest_batches").await.unwrap();
    let s = Snapshot::load(&store, "ingest_batches").await.unwrap();
    for (i, reqs) in all[..2].iter().enumerate() {
        let last = reqs.last().unwrap().sequence as i64;
        assert_eq!(s.txns.get(&format!("node:gpu-{i}")), Some(&last), "ingest_batches knows gpu-{i}'s high-water");
    }
    let sched = Snapshot::load(&store, "sched_windows").await.unwrap();
    assert!(want["sched_windows"] > 0);
    let meta = sched.metadata.unwrap();
    assert_eq!(ingero_store::delta::txn_retention(&meta.configuration).map(|d| d.as_secs()), Some(7 * 86_400));
}

/// Data retention: hours older than the raw TTL leave every raw table in one
/// DELETE commit (delta-rs sees them gone), newer hours stay whole, the
/// signal tiers keep theirs under their own TTL, and vacuum deletes the
/// removed files.
#[tokio::test]
async fn retention_removes_expired_hours_and_keeps_the_rest() {
    let data = tempfile::tempdir().unwrap();
    let url = format!("file://{}", data.path().display());
    let store = ingero_store::Store::open(&StoreUrl::parse(&url).unwrap(), &Default::default()).unwrap();
    let now = chrono::Utc::now().timestamp_micros();
    let day = 86_400_000_000i64;
    // Segments 1-3: 40 days old; 4-6: an hour ago.
    for seg in 1..=6u64 {
        let at = if seg <= 3 { now - 40 * day } else { now - 3_600_000_000 } + seg as i64 * 1_000_000;
        let t: BTreeMap<Table, Vec<RecordBatch>> =
            synth_tables("ret-node", at, 8, seg).into_iter().map(|(t, b)| (t, vec![b])).collect();
        flush::write_segment(&store, "ret", seg, t).await.unwrap();
    }
    let before = read_table(&store, Table::CallWindows).await.unwrap();
    assert_eq!(total_rows(&before), 6 * 8);

    let keep_tiers = Retention { raw: Some(std::time::Duration::from_secs(30 * 86_400)), tiers: None };
    let u = upkeep::run(&store, std::time::Duration::ZERO, &keep_tiers, |_| true).await.unwrap();
    assert!(u.expired.files > 0 && u.expired.rows >= 3 * 8 && u.expired.bytes > 0, "{u:?}");
    assert!(u.deleted_files >= u.expired.files, "vacuum deletes what expired: {u:?}");
    let after = read_table(&store, Table::CallWindows).await.unwrap();
    assert_eq!(total_rows(&after), 3 * 8, "only the recent hour's rows remain");
    let minute = Snapshot::load(&store, "signal_windows_60s").await.unwrap();
    assert!(
        minute.rows().is_some_and(|r| r > 0)
            && minute.files.values().any(|a| a.partition_values.values().flatten().any(|v| {
                chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d")
                    .is_ok_and(|d| d < chrono::Utc::now().date_naive() - chrono::Days::new(35))
            })),
        "the tiers keep their old hours (their own TTL: for ever here)"
    );

    let again = upkeep::run(&store, std::time::Duration::ZERO, &keep_tiers, |_| true).await.unwrap();
    assert_eq!(again.expired, Default::default(), "nothing left to expire: {again:?}");

    let py = Command::new("python3").args(["-c", "import deltalake, polars, duckdb"]).status();
    if !require("python3 with deltalake, polars and duckdb (pip)", py.is_ok_and(|s| s.success())) {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/delta_read.py");
    let out = Command::new("python3").args([script, data.path().to_str().unwrap(), "call_windows", "count"]).output();
    let out = out.unwrap();
    assert!(out.status.success(), "delta_read.py: {}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for engine in ["deltalake", "polars"] {
        assert_eq!(got["call_windows"][engine], 3 * 8, "{engine} sees the expired rows gone: {got}");
    }
}
