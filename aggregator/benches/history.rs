//! History ranking over 1,000 nodes × 1 h of 1-s windows, straight from
//! Parquet: `cargo bench -p ingero-aggregator --bench history`
//! (INGERO_BENCH_NODES / INGERO_BENCH_SECS change the shape).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use ingero_aggregator::query::QueryEngine;
use ingero_aggregator::rank::detector::DetectorConfig;
use ingero_aggregator::rank::history::{self, HistoryRequest};
use ingero_aggregator::store::parquet;
use ingero_aggregator::store::{Store, StoreUrl};
use ingero_proto::Table;
use ingero_proto::rows::{BatchBuilder, TimestampUs};
use ingero_proto::tables::{CallRow, Common, SchedRow};
use ingero_sim::faults::Injection;
use ingero_sim::model::{Rng, step_job};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let nodes = env("INGERO_BENCH_NODES", 1000);
    let secs = env("INGERO_BENCH_SECS", 3600);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::open(&StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap(), &Default::default())
                .unwrap();
        let end_us = chrono::Utc::now().timestamp_micros() / 1_000_000 * 1_000_000;
        let start_us = end_us - secs as i64 * 1_000_000;
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
            // One builder per table and window for all nodes (the simulator's
            // per-node batches are too slow for 3.6 M node-windows).
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
                    window_start_us: TimestampUs(start_us + w as i64 * 1_000_000),
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
                    let b = [ingero_proto::hist::bucket(per)];
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
                let runq = (s * r.runq_ms * 1e6).min(0.9e9);
                let off = (40e6 + s * r.blocked_ms * 1e6).min(1e9 - runq);
                let on = 1e9 - runq - off;
                let row = SchedRow {
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
                };
                sched.append(&c, &row).unwrap();
            }
            for mut b in [calls, sched] {
                rows_total += b.len();
                let t = b.table();
                buffered.entry(t).or_default().push(b.finish().unwrap());
            }
            if (w + 1) % 300 == 0 || w + 1 == secs {
                for (t, batches) in std::mem::take(&mut buffered) {
                    for (part, batch) in parquet::partition(t, &batches).unwrap() {
                        for (chunk, off) in (0..batch.num_rows()).step_by(parquet::FILE_ROWS).enumerate() {
                            let slice = batch.slice(off, parquet::FILE_ROWS.min(batch.num_rows() - off));
                            store
                                .put_durable(&part.file(segment, chunk), parquet::encode(&slice).unwrap().into())
                                .await
                                .unwrap();
                        }
                    }
                }
                segment += 1;
                eprintln!(
                    "generated {}/{secs} s of {nodes} nodes ({rows_total} rows, {:.0?})",
                    w + 1,
                    generating.elapsed()
                );
            }
        }
        let files = ingero_aggregator::store::read::list_files(&store, Table::CallWindows).await.unwrap();
        let bytes: u64 = files.iter().map(|f| f.1).sum();
        println!(
            "dataset: {nodes} nodes x {secs} s, {rows_total} rows, call_windows {} files {:.1} MB",
            files.len(),
            bytes as f64 / 1e6
        );
        for run in 0..3 {
            let t = Instant::now();
            let engine = QueryEngine::open(&store, Default::default()).await.unwrap();
            let req = HistoryRequest { start_us, end_us, job: None, resolution: None };
            let r = history::rank(&engine, &req, DetectorConfig::default()).await.unwrap();
            let top = r
                .stragglers
                .first()
                .map(|s| format!("{} flagged={} score={:.1}", s.node, s.flagged, s.score))
                .unwrap_or_default();
            println!(
                "history ranking run {run}: {:.2?} (resolution {} s), top: {top}",
                t.elapsed(),
                req.bin_us() / 1_000_000
            );
        }
    });
}
