// SPDX-License-Identifier: Apache-2.0
//! History ranking over 1,000 nodes × 1 h of 1-s windows, from the signal
//! tiers and from the raw tables side by side in one run:
//! `cargo bench -p ingero --bench history`
//! (INGERO_BENCH_NODES / INGERO_BENCH_SECS change the shape;
//! INGERO_BENCH_RAW=0 skips the raw-table path).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;

use std::time::Instant;

use common::{Shape, env, generate};
use ingero_analysis::query::QueryEngine;
use ingero_analysis::rank::history::{self, HistoryRequest};
use ingero_model::Table;
use ingero_server::rank::detector::DetectorConfig;
use ingero_store::{Store, StoreUrl};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let nodes = env("INGERO_BENCH_NODES", 1000);
    let secs = env("INGERO_BENCH_SECS", 3600);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // INGERO_BENCH_DIR keeps the dataset (DIR/data) and writes the stamp
        // `scripts/bench-history.sh NODES <SECS>s` reads to time DuckDB on it.
        let tmp = tempfile::tempdir().unwrap();
        let keep = std::env::var("INGERO_BENCH_DIR").ok().map(std::path::PathBuf::from);
        let data = keep.as_ref().map_or(tmp.path().to_path_buf(), |d| d.join("data"));
        let store =
            Store::open(&StoreUrl::parse(&format!("file://{}", data.display())).unwrap(), &Default::default()).unwrap();
        let end_us = chrono::Utc::now().timestamp_micros() / 1_000_000 * 1_000_000;
        let shape = Shape { nodes, secs, start_us: end_us - secs as i64 * 1_000_000, end_us };
        let generating = Instant::now();
        let rows_total = generate(&store, &shape).await;
        let files = ingero_store::read::list_files(&store, Table::CallWindows).await.unwrap();
        let bytes: u64 = files.iter().map(|f| f.1).sum();
        println!(
            "dataset: {nodes} nodes x {secs} s, {rows_total} rows, call_windows {} files {:.1} MB",
            files.len(),
            bytes as f64 / 1e6
        );
        if let Some(dir) = &keep {
            let stamp = serde_json::json!({"backfill": {"nodes": nodes, "windows": secs, "rows": rows_total,
                "elapsed_secs": generating.elapsed().as_secs_f64(),
                "rows_per_sec": rows_total as f64 / generating.elapsed().as_secs_f64(),
                "start_us": shape.start_us, "end_us": end_us, "source": "cargo bench --bench history (in-process writer)"}});
            std::fs::write(dir.join(format!("backfill-{nodes}-{secs}s.json")), stamp.to_string()).unwrap();
        }
        rank_runs(&store, &shape).await;
    });
}

/// History ranking from the tiers and from the raw tables, three times.
async fn rank_runs(store: &Store, shape: &Shape) {
    let raw = std::env::var("INGERO_BENCH_RAW").map_or(true, |v| v != "0");
    for run in 0..3 {
        let engine = QueryEngine::open(store, Default::default()).await.unwrap();
        let req = HistoryRequest { start_us: shape.start_us, end_us: shape.end_us, job: None, resolution: None };
        let t = Instant::now();
        let r = history::rank(&engine, &req, DetectorConfig::default()).await.unwrap();
        let tiers_s = t.elapsed();
        let t = Instant::now();
        let r_raw =
            if raw { Some(history::rank_raw(&engine, &req, DetectorConfig::default()).await.unwrap()) } else { None };
        let raw_s = t.elapsed();
        let top = |r: &ingero_server::rank::Ranking| {
            r.stragglers
                .first()
                .map(|s| format!("{} flagged={} score={:.1}", s.node, s.flagged, s.score))
                .unwrap_or_default()
        };
        println!("history ranking run {run}: signal tiers {tiers_s:.2?}, top: {}", top(&r));
        if let Some(r_raw) = r_raw {
            println!(
                "                      raw tables   {raw_s:.2?}, top: {} (tiers {:.1}x faster)",
                top(&r_raw),
                raw_s.as_secs_f64() / tiers_s.as_secs_f64()
            );
        }
    }
}
