// SPDX-License-Identifier: Apache-2.0
//! The benchmarks' dataset: a simulated data-parallel job of `nodes` ranks
//! written through the store's in-process writer (`flush::write_segment`,
//! tiers included), one segment per 300 windows as the flush writes it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use ingero_model::Table;
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::tables::{CallRow, Common, SchedRow};
use ingero_sim::faults::Injection;
use ingero_sim::model::{Rng, step_job};
use ingero_store::Store;
use ingero_store::flush;

/// A numeric setting from the environment, or `default`.
pub(crate) fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The dataset's shape and where it is written.
pub(crate) struct Shape {
    pub(crate) nodes: usize,
    pub(crate) secs: usize,
    pub(crate) start_us: i64,
    pub(crate) end_us: i64,
}

/// Writes the simulated job, one committed segment (tiers included) every
/// 300 windows as the flush writes it; returns the rows written.
pub(crate) async fn generate(store: &Store, shape: &Shape) -> usize {
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
                sample_ratio: None,
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
