// SPDX-License-Identifier: Apache-2.0
//! Synthetic load: many nodes pushing realistic call and scheduler windows
//! through the real ingest protocol. Used by `ingero load`, the benchmarks
//! and the tests.

use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use ingero_model::hist::Histogram;
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::tables::{CallRow, Common, SchedRow};
use ingero_model::{Table, Tables};
use ingero_proto::client::{RetryPolicy, SendError};
use ingero_proto::pb::PushRequest;
use ingero_proto::routed::RoutedClient;

const OPS: [(&str, &str); 8] = [
    ("cudart", "cudaLaunchKernel"),
    ("cudart", "cudaMemcpyAsync"),
    ("cudart", "cudaStreamSynchronize"),
    ("cudart", "cudaMalloc"),
    ("cuda", "cuLaunchKernel"),
    ("cuda", "cuMemcpyHtoDAsync_v2"),
    ("nccl", "ncclAllReduce"),
    ("nccl", "ncclAllGather"),
];

/// Rows of one node for one window: `rows` call-window rows over
/// `rows / OPS.len()` processes plus one scheduler row per process.
pub fn synth_tables(node: &str, window_start_us: i64, rows: usize, seed: u64) -> Tables {
    let mut calls = BatchBuilder::new(Table::CallWindows);
    let mut sched = BatchBuilder::new(Table::SchedWindows);
    let procs = rows.div_ceil(OPS.len()).max(1);
    let mut x = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut emitted = 0;
    for p in 0..procs {
        let common = Common {
            node: node.to_string(),
            namespace: Some("ml".into()),
            pod: Some(format!("trainer-{p}")),
            container: Some("pytorch".into()),
            job: Some("llama-ft".into()),
            rank: Some(p as i32),
            world_size: Some(procs as i32),
            pid: 1000 + p as u32,
            comm: "python3".into(),
            cgroup_id: 5000 + p as u64,
            window_start_us: TimestampUs(window_start_us),
            window_us: 1_000_000,
        };
        for (lib, op) in OPS {
            if emitted == rows {
                break;
            }
            emitted += 1;
            let count = 100 + rnd() % 900;
            let mut h = Histogram::default();
            let mut total = 0u64;
            let mut max = 0u64;
            for _ in 0..8 {
                let d = 2_000 + rnd() % 50_000;
                h.add(ingero_model::hist::bucket(d), count / 8);
                total += d * (count / 8);
                max = max.max(d);
            }
            let (b, c) = h.sparse();
            let row = CallRow {
                library: lib,
                op,
                count,
                errors: 0,
                total_ns: total,
                max_ns: max,
                sampled: false,
                hist_bucket: &b,
                hist_count: &c,
                sample_ratio: None,
            };
            calls.append(&common, &row).expect("synthetic row fits the schema");
        }
        let on = 200_000_000 + rnd() % 600_000_000;
        let row = SchedRow {
            threads: 8,
            on_cpu_ns: on,
            off_cpu_ns: 1_000_000_000 - on,
            runq_wait_ns: rnd() % 5_000_000,
            runq_max_ns: rnd() % 1_000_000,
            voluntary_switches: rnd() % 2000,
            involuntary_switches: rnd() % 200,
            wakeups: rnd() % 2000,
            off_cpu_in_call_ns: Some((1_000_000_000 - on) / 2),
            runq_wait_in_call_ns: Some(0),
        };
        sched.append(&common, &row).expect("synthetic row fits the schema");
    }
    vec![
        (Table::CallWindows, calls.finish().expect("valid batch")),
        (Table::SchedWindows, sched.finish().expect("valid batch")),
    ]
}

#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub server: String,
    pub nodes: usize,
    pub batches_per_node: usize,
    pub rows_per_batch: usize,
}

#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub batches: u64,
    pub rows: u64,
    pub wire_bytes: u64,
    pub duplicates: u64,
    pub elapsed: Duration,
}

impl LoadReport {
    pub fn rows_per_sec(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Pushes `batches_per_node` batches from each of `nodes` nodes concurrently.
/// Requests are encoded before the clock starts, so the figure measures the
/// aggregator, not the generator.
pub async fn run(cfg: &LoadConfig) -> Result<LoadReport, SendError> {
    let now = chrono::Utc::now().timestamp_micros();
    let window0 = now - now % 1_000_000 - cfg.batches_per_node as i64 * 1_000_000;
    let mut per_node = Vec::new();
    for n in 0..cfg.nodes {
        let node = format!("node-{n}");
        // With several replicas (comma-separated) each node goes to its own, as agents do.
        let urls: Vec<String> = cfg.server.split(',').map(|u| u.trim().to_string()).collect();
        let mut client = RoutedClient::new(&urls, &node, RetryPolicy::default(), &Default::default())?;
        let mut reqs: Vec<PushRequest> = Vec::with_capacity(cfg.batches_per_node);
        for b in 0..cfg.batches_per_node {
            let tables = synth_tables(&node, window0 + b as i64 * 1_000_000, cfg.rows_per_batch, (n * 7919 + b) as u64);
            reqs.push(client.request(&tables)?);
        }
        per_node.push((client, reqs));
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (mut client, reqs) in per_node {
        tasks.push(tokio::spawn(async move {
            let mut r = LoadReport::default();
            for req in reqs {
                let resp = client.push(&req).await?;
                r.batches += 1;
                r.rows += resp.rows;
                r.duplicates += resp.duplicate as u64;
                r.wire_bytes += req.tables.iter().map(|t| t.arrow_ipc.len() as u64).sum::<u64>();
            }
            Ok::<_, SendError>(r)
        }));
    }
    let mut total = LoadReport::default();
    for t in tasks {
        let r = t.await.expect("load task panicked")?;
        total.batches += r.batches;
        total.rows += r.rows;
        total.wire_bytes += r.wire_bytes;
        total.duplicates += r.duplicates;
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

/// Bytes of the same rows as newline-delimited JSON (what a naive agent would send).
pub fn json_bytes(tables: &[(Table, RecordBatch)]) -> usize {
    let mut total = 0;
    for (_, b) in tables {
        let mut w = arrow::json::LineDelimitedWriter::new(Vec::new());
        w.write(b).expect("JSON encoding of a valid batch");
        w.finish().expect("JSON encoding of a valid batch");
        total += w.into_inner().len();
    }
    total
}
