// SPDX-License-Identifier: Apache-2.0
//! History ranking over 1,000 nodes × 1 h of 1-s windows, from the signal
//! tiers and from the raw tables side by side in one run:
//! `cargo bench -p ingero --bench history`
//! (INGERO_BENCH_NODES / INGERO_BENCH_SECS change the shape;
//! INGERO_BENCH_RAW=0 skips the raw-table path).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use ingero_analysis::query::QueryEngine;
use ingero_analysis::rank::history::{self, HistoryRequest};
use ingero_model::Table;
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::tables::{CallRow, Common, SchedRow};
use ingero_server::rank::detector::DetectorConfig;
use ingero_sim::faults::Injection;
use ingero_sim::model::{Rng, step_job};
use ingero_store::flush;
use ingero_store::{Store, StoreUrl};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The dataset's shape and where it is written.
struct Shape {
    nodes: usize,
    secs: usize,
    start_us: i64,
    end_us: i64,
}

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

/// Writes the simulated job, one committed segment (tiers included) every
/// 300 windows as the flush writes it; returns the rows written.
async fn generate(store: &Store, shape: &Shape) -> usize {
    let (nodes, secs) = (shape.nodes, shape.secs);
    let faults = vec![Injection::parse(&format!("cpu@{}:{}s", nodes / 3, secs / 2), nodes).unwrap()];
    let ranks: Vec<usize> = (0..nodes).collect();
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    let mut rng = Rng::new(3);
    let generating = Instant::now();
    let mut buffered: BTreeMap<Table, Vec<RecordBatch>> = BTreeMap::new();
    let mut rows_total = 0usize;
    let mut segment = 1u64;
    for w in 0..secs {
        let win = step_job(&ranks, Duration::from_secs(w as u64), &faults, 0.05, &mut rng);
        let window_start = TimestampUs(shape.start_us + w as i64 * 1_000_000);
        for mut b in window_batches(&win, &names, window_start) {
            rows_total += b.len();
            let t = b.table();
            buffered.entry(t).or_default().push(b.finish().unwrap());
        }
        if (w + 1) % 300 == 0 || w + 1 == secs {
            flush::write_segment(store, "bench", segment, std::mem::take(&mut buffered)).await.unwrap();
            segment += 1;
            eprintln!(
                "generated {}/{secs} s of {nodes} nodes ({rows_total} rows, {:.0?})",
                w + 1,
                generating.elapsed()
            );
        }
    }
    rows_total
}

/// One builder per table and window for all nodes (the simulator's
/// per-node batches are too slow for 3.6 M node-windows).
fn window_batches(win: &[ingero_sim::model::RankWindow], names: &[String], start: TimestampUs) -> [BatchBuilder; 2] {
    let nodes = names.len();
    let mut calls = BatchBuilder::new(Table::CallWindows);
    let mut sched = BatchBuilder::new(Table::SchedWindows);
    for (i, r) in win.iter().enumerate() {
        let c = Common {
            node: names[i].clone(),
            namespace: Some("ml".into()),
            pod: Some(format!("bench-worker-{i}")),
            job: Some("bench".into()),
            rank: Some(i as i32),
            world_size: Some(nodes as i32),
            pid: 4242,
            comm: "python3".into(),
            window_start_us: start,
            window_us: 1_000_000,
            ..Default::default()
        };
        let s = r.steps;
        for (lib, op, count, ms) in [
            ("cudart", "cudaLaunchKernel", s * 150.0, 0.0),
            ("cudart", "cudaMemcpyAsync", s * 4.0, 0.2),
            ("cudart", "cudaMemcpy", s, r.copy_ms),
            ("cudart", "cudaStreamSynchronize", s, r.sync_ms.max(0.01)),
            ("nccl", "ncclAllReduce", s, 0.02),
        ] {
            let n = count.round() as u64;
            let per = (ms * 1e6) as u64;
            let b = [ingero_model::hist::bucket(per)];
            let hc = [n];
            let row = CallRow {
                library: lib,
                op,
                count: n,
                errors: 0,
                total_ns: per * n,
                max_ns: per,
                sampled: false,
                hist_bucket: &b,
                hist_count: &hc,
            };
            calls.append(&c, &row).unwrap();
        }
        sched.append(&c, &sched_row(r)).unwrap();
    }
    [calls, sched]
}

fn sched_row(r: &ingero_sim::model::RankWindow) -> SchedRow {
    let s = r.steps;
    let runq = (s * r.runq_ms * 1e6).min(0.9e9);
    let off = (40e6 + s * r.blocked_ms * 1e6).min(1e9 - runq);
    let on = 1e9 - runq - off;
    SchedRow {
        threads: 1,
        on_cpu_ns: on as u64,
        off_cpu_ns: off as u64,
        runq_wait_ns: runq as u64,
        runq_max_ns: 0,
        voluntary_switches: 0,
        involuntary_switches: 0,
        wakeups: 0,
        off_cpu_in_call_ns: None,
        runq_wait_in_call_ns: None,
    }
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
