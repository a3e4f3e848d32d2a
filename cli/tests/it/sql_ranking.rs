// SPDX-License-Identifier: Apache-2.0
//! The fleet history ranking as plain SQL (`analysis/sql/stragglers.sql`),
//! run unchanged by an outside engine (DuckDB over the files delta-rs lists)
//! on a store `ingero simulate --backfill` wrote through the real ingest
//! path: the same nodes flagged, since the same bins, with the same causes
//! and peak scores, and the same closed episodes, as `ingero stragglers`.

use std::path::Path;
use std::process::Command;

use crate::fixtures::*;
use serde_json::Value;

fn run(args: &[String]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Whether python3 has deltalake and duckdb (fails in CI when not).
fn has_engines() -> bool {
    let py = Command::new("python3").args(["-c", "import deltalake, duckdb"]).status();
    require("python3 with deltalake and duckdb (pip)", py.is_ok_and(|s| s.success()))
}

/// `ingero simulate --backfill` of an hour with these nodes, jobs and
/// faults, then the ranking and episodes from `ingero stragglers` and from
/// the SQL file on DuckDB (`None`: no deltalake/duckdb outside CI).
async fn both(nodes: usize, jobs: usize, faults: &[&str]) -> Option<(Value, Value)> {
    if !has_engines() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let mut args: Vec<String> = vec![
        "simulate".into(),
        format!("--server={}", server.grpc_url()),
        format!("--nodes={nodes}"),
        format!("--jobs={jobs}"),
        "--duration=3600s".into(),
        "--backfill".into(),
        "--json".into(),
    ];
    args.extend(faults.iter().map(|f| format!("--inject={f}")));
    let o = tokio::task::spawn_blocking(move || run(&args)).await.unwrap();
    assert!(o.status.success(), "backfill failed: {}", String::from_utf8_lossy(&o.stderr));
    server.shutdown().await.unwrap();
    Some(rank_both(&dir.path().join("data")))
}

/// The ranking and episodes of the store at `data`, from `ingero
/// stragglers` (default settings) and from the SQL file on DuckDB.
fn rank_both(data: &Path) -> (Value, Value) {
    let args: Vec<String> = [
        "stragglers",
        &format!("--store=file://{}", data.display()),
        "--since=2020-01-01T00:00:00Z",
        "--resolution=10s",
        "--format=json",
    ]
    .map(String::from)
    .to_vec();
    let o = run(&args);
    assert!(o.status.success(), "stragglers: {}", String::from_utf8_lossy(&o.stderr));
    let ours: Value = serde_json::from_slice(&o.stdout).unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sql_ranking.py");
    let sql = concat!(env!("CARGO_MANIFEST_DIR"), "/../analysis/sql/stragglers.sql");
    let o = Command::new("python3").args([script, data.to_str().unwrap(), sql]).output().unwrap();
    assert!(o.status.success(), "sql_ranking.py: {}", String::from_utf8_lossy(&o.stderr));
    let theirs: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(theirs["files"].as_u64().unwrap() > 0);
    (ours, theirs)
}

/// The nodes flagged at the range's end (node, since, score), in order.
type Ranking = Vec<(String, i64, f64)>;
/// Every episode: node, since, until, peak score and cause (sorted).
type Episodes = Vec<(String, i64, Option<i64>, f64, String)>;

/// The ranking and the episodes of both, each checked equal; returns ingero's.
fn agree(ours: &Value, theirs: &Value) -> (Ranking, Episodes) {
    let rows = theirs["rows"].as_array().unwrap();

    // The ranking: the nodes flagged at the range's end, in order, since when, how deviant.
    let ranking_sql: Vec<(String, i64, f64)> = rows
        .iter()
        .filter(|r| r["flagged_now"] == true)
        .map(|r| {
            (r["node"].as_str().unwrap().into(), r["since_us"].as_i64().unwrap(), r["score_now"].as_f64().unwrap())
        })
        .collect();
    let ranking_ours: Vec<(String, i64, f64)> = ours["stragglers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["flagged"] == true)
        .map(|s| (s["node"].as_str().unwrap().into(), s["since_us"].as_i64().unwrap(), s["score"].as_f64().unwrap()))
        .collect();
    assert_eq!(ranking_sql, ranking_ours, "the ranking\nSQL: {theirs}\ningero: {ours}");
    let flagged = ranking_ours.len();
    assert!(rows.iter().take(flagged).all(|r| r["flagged_now"] == true), "flagged first: {theirs}");

    // Every episode: node, since, until, peak score and cause.
    let mut eps_sql: Episodes = rows
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap().to_string();
            (
                s("node"),
                r["since_us"].as_i64().unwrap(),
                r["until_us"].as_i64(),
                r["peak_score"].as_f64().unwrap(),
                s("cause"),
            )
        })
        .collect();
    let mut eps: Episodes = ours["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_string();
            (
                s("node"),
                e["start_us"].as_i64().unwrap(),
                e["end_us"].as_i64(),
                e["peak_score"].as_f64().unwrap(),
                s("cause"),
            )
        })
        .collect();
    eps_sql.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    eps.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    assert_eq!(eps_sql, eps, "episodes\nSQL: {theirs}\ningero: {ours}");
    (ranking_ours, eps)
}

fn flagged(ranking: &Ranking) -> Vec<&str> {
    let mut f: Vec<&str> = ranking.iter().map(|r| r.0.as_str()).collect();
    f.sort();
    f
}

/// Two jobs of 12 nodes; a CPU straggler to the end, an IO straggler that
/// recovers (a closed episode), a slow GPU in the other job, two short
/// faults around the 4-bin streak that flags a node (25 s, 45 s), and a
/// rank that hangs its job for 2 minutes (`stuck` once its peers have
/// waited 30 s, cleared when the job steps again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ranking_in_plain_sql_on_duckdb_matches_ingero_stragglers() {
    let faults =
        ["cpu@3:900s", "io@9:1800s+600s", "gpu@20:2400s", "cpu@15:3000s+25s", "cpu@6:3200s+45s", "hang@10:1200s+120s"];
    let Some((ours, theirs)) = both(24, 2, &faults).await else { return };
    let (ranking, eps) = agree(&ours, &theirs);
    assert_eq!(flagged(&ranking), ["node-20", "node-3"], "{ours}");
    assert!(eps.iter().any(|e| e.0 == "node-9" && e.2.is_some()), "node-9 recovered: {ours}");
    let hang: Vec<_> = eps.iter().filter(|e| e.0 == "node-10").collect();
    assert_eq!(hang.len(), 1, "{ours}");
    assert_eq!((hang[0].3, hang[0].4.as_str()), (1000.0, "stuck"), "{ours}");
    assert!(hang[0].2.is_some(), "the hang ended: {ours}");
}

/// Three jobs of 4 nodes: each node is compared with its 3 peers, not with
/// a median it is part of (leave-one-out); a CPU straggler to the end, an
/// IO straggler that recovers, a slow GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_jobs_are_ranked_leave_one_out_in_sql_as_in_ingero() {
    let faults = ["cpu@4:900s", "io@5:1800s+600s", "gpu@9:2400s"];
    let Some((ours, theirs)) = both(12, 3, &faults).await else { return };
    let (ranking, eps) = agree(&ours, &theirs);
    assert_eq!(flagged(&ranking), ["node-4", "node-9"], "{ours}");
    assert!(eps.iter().any(|e| e.0 == "node-5" && e.2.is_some()), "node-5 recovered: {ours}");
}

/// A job of 6 nodes whose ranks hang twice, written through the store's
/// segment path. The culprit's CPU is taken for 50 s first (flagged after 4
/// bins), the job hangs on it for 90 s (the episode goes on, `stuck` from
/// the bin its peers had waited the default 30 s), progress resumes with
/// its CPU taken 30 s more (3 bins: the streak before the hang does not
/// count, no flag), then the job hangs again to the end. The SQL gives the
/// episodes and the ranking `ingero stragglers` gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_ranks_are_ranked_in_plain_sql_as_in_ingero() {
    if !has_engines() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hangs = vec![60..150, 200..300];
    Hang { nodes: 6, windows: 300, hangs, culprit: 3, starved: vec![30..80, 150..180] }.write(dir.path(), 10).await;
    let (ours, theirs) = rank_both(dir.path());
    let (ranking, eps) = agree(&ours, &theirs);
    let s = |secs: i64| T0 + secs * 1_000_000;
    assert_eq!(ranking, [("node-3".to_string(), s(220), 1000.0)], "{ours}");
    let want = [
        ("node-3".to_string(), s(30), Some(s(160)), 1000.0, "stuck".to_string()),
        ("node-3".to_string(), s(220), None, 1000.0, "stuck".to_string()),
    ];
    assert_eq!(eps, want, "{ours}");
}
