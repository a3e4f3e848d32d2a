// SPDX-License-Identifier: Apache-2.0
//! Fleet history as a user gets it: `ingero simulate --backfill` through the
//! real gRPC ingest path, the signal tiers it writes, history ranking from
//! them (same answer as from the raw tables), and the fleet page in Chromium.

use std::path::Path;
use std::process::Command;

use crate::fixtures::*;
use ingero_analysis::query::QueryEngine;
use ingero_analysis::rank::history::{self, HistoryRequest};
use ingero_server::rank::detector::DetectorConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_writes_tiers_and_history_flags_the_injected_node() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let (nodes, secs) = (12u64, 480u64);
    let args: Vec<String> = [
        "simulate",
        &format!("--server={}", server.grpc_url()),
        &format!("--nodes={nodes}"),
        &format!("--duration={secs}s"),
        "--inject=cpu@5:200s",
        "--backfill",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let o = tokio::task::spawn_blocking(move || ingero(&args)).await.unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "backfill failed: {err}");
    assert!(err.contains("100%") && err.contains("M rows/s"), "no progress shown: {err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["backfill"]["windows"], secs, "{v}");
    assert!(v["backfill"]["rows"].as_u64().unwrap() >= nodes * secs * 8, "{v}");
    assert_eq!((v["top"][0]["node"].as_str(), v["top"][0]["flagged"].as_bool()), (Some("node-5"), Some(true)), "{v}");

    // Every agent window is in the tiers once, at every resolution.
    let engine = QueryEngine::open(&server.store, Default::default()).await.unwrap();
    let node_windows = nodes * secs;
    let raw = "SELECT COUNT(*) FROM (SELECT DISTINCT node, window_start FROM sched_windows)";
    assert_eq!(sql_u64(&engine, raw).await, node_windows);
    assert_eq!(sql_u64(&engine, "SELECT COUNT(*) FROM signal_windows").await, node_windows);
    for t in ["signal_windows_10s", "signal_windows_60s"] {
        assert_eq!(sql_u64(&engine, &format!("SELECT SUM(windows) FROM {t}")).await, node_windows, "{t}");
        let covered = sql_u64(&engine, &format!("SELECT SUM(window_us) FROM {t}")).await;
        assert_eq!(covered, node_windows * 1_000_000, "{t}");
    }

    // The tiers give the same answer as aggregating the raw tables.
    let start_us = v["backfill"]["start_us"].as_i64().unwrap();
    let end_us = v["backfill"]["end_us"].as_i64().unwrap();
    for res in [None, Some(std::time::Duration::from_secs(10))] {
        let req = HistoryRequest { start_us, end_us, job: None, resolution: res };
        let tiers = history::rank(&engine, &req, DetectorConfig::default()).await.unwrap();
        let raw = history::rank_raw(&engine, &req, DetectorConfig::default()).await.unwrap();
        let flagged = |r: &ingero_server::rank::Ranking| -> Vec<String> {
            r.stragglers.iter().filter(|s| s.flagged).map(|s| s.node.clone()).collect()
        };
        assert_eq!(flagged(&tiers), vec!["node-5".to_string()], "{res:?}: {:?}", tiers.stragglers);
        assert_eq!(flagged(&tiers), flagged(&raw), "{res:?}");
        assert_eq!(tiers.stragglers[0].since, raw.stragglers[0].since, "{res:?}");
    }

    // A range of years lists the tier once instead of day by day.
    let store = format!("--store=file://{}", dir.path().join("data").display());
    let args: Vec<String> =
        ["stragglers", &store, "--since=2020-01-01T00:00:00Z", "--format=json"].map(String::from).to_vec();
    let o = tokio::task::spawn_blocking(move || ingero(&args)).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["stragglers"][0]["node"].as_str(), v["stragglers"][0]["flagged"].as_bool()),
        (Some("node-5"), Some(true))
    );

    // Repeat offenders and what they cost: 12 nodes × 8 GPUs (the sim's
    // agents read no driver: --gpus-per-node) at $3.
    let since = format!("--since={}", ingero_model::time::rfc3339(start_us));
    let args: Vec<String> =
        ["offenders", &store, &since, "--min-episodes=1", "--gpu-price=default=3", "--json"].map(String::from).to_vec();
    let o = tokio::task::spawn_blocking(move || ingero(&args)).await.unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = &v[0];
    assert_eq!((f["node"].as_str(), f["causes"][0][0].as_str()), (Some("node-5"), Some("runq_share")), "{v}");
    let (hours, usd) = (f["gpu_hours"].as_f64().unwrap(), f["usd"].as_f64().unwrap());
    // The contended node is flagged for ~280 s; its peers wait for it a
    // fraction of each window: between 1% and 100% of 96 GPUs × 280 s.
    assert!(hours > 0.01 * 96.0 * 280.0 / 3600.0 && hours < 96.0 * 300.0 / 3600.0, "{v}");
    assert!((usd - hours * 3.0).abs() < 0.02, "dollars are GPU-hours × $3: {v}");
    let args: Vec<String> = ["offenders", &store, &since, "--min-episodes=1"].map(String::from).to_vec();
    let o = tokio::task::spawn_blocking(move || ingero(&args)).await.unwrap();
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.lines().nth(1).is_some_and(|l| l.starts_with("node-5 ") && l.contains(" - ")),
        "no price, no dollars:\n{t}"
    );
    assert!(t.lines().all(|l| l.chars().count() <= 80), "wider than 80 columns:\n{t}");

    // A price rule that covers no node of the job says so.
    let args: Vec<String> = ["stragglers", &store, &since, "--gpu-price=node:gke-typo-*=3"].map(String::from).to_vec();
    let o = tokio::task::spawn_blocking(move || ingero(&args)).await.unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("costs of job llama-pretrain are in GPU-hours only"), "{err}");

    // The fleet page, as a person sees it.
    let page = dir.path().join("fleet.html");
    let out = format!("--out={}", page.display());
    let args: Vec<String> =
        ["stragglers", &store, &since, "--format=html", &out, "--gpu-price=default=3"].map(String::from).to_vec();
    let o = tokio::task::spawn_blocking(move || ingero(&args)).await.unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains(r#"id="n-llama-pretrain-node-5""#), "no detail section for the flagged node");
    assert!(html.contains("11 node(s) never deviated"), "healthy rows not folded");
    assert!(html.contains("Straggler episodes: ") && html.contains("GPU-hours ($"), "episodes and their cost missing");
    check_in_chromium(&page, dir.path());
}

/// Renders the fleet page headless and checks what is on screen.
fn check_in_chromium(page: &Path, tmp: &Path) {
    let chromium = which("chromium").or_else(|| which("chromium-browser"));
    if !require("Debian chromium (apt-get install chromium)", chromium.is_some()) {
        return;
    }
    let common = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"];
    let profile = format!("--user-data-dir={}", tmp.join("chromium").display());
    let url = format!("file://{}", page.display());
    let run = |extra: &[String]| {
        Command::new(chromium.as_ref().unwrap()).args(common).arg(&profile).args(extra).arg(&url).output().unwrap()
    };
    let dom = run(&["--dump-dom".into()]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("Fleet view"), "page did not render");
    assert!(dom.contains("node-5") && dom.contains(">YES<"), "flagged node not in the ranking table");
    assert!(dom.matches("<svg").count() >= 3, "heatmaps missing (job, folded rows, node detail)");
    let shot = tmp.join("fleet.png");
    let o = run(&["--window-size=1300,900".into(), format!("--screenshot={}", shot.display())]);
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 20_000, "screenshot missing or blank ({size} bytes): {}", String::from_utf8_lossy(&o.stderr));
}
