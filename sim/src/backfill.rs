// SPDX-License-Identifier: Apache-2.0
//! `ingero simulate --backfill`: the fleet model over a past time range,
//! pushed through the real ingest path as fast as the server takes it.
//! History benchmarks use it, so what they read is what ingest writes.
//!
//! A generator thread builds and encodes the next chunk of windows while
//! the previous chunk is pushed; each node ships several windows per batch
//! (as an agent draining its spool after an outage does).

use std::time::{Duration, Instant};

use ingero_proto::client::{IngestClient, RetryPolicy, SendError, channel};
use ingero_proto::pb::PushRequest;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::fleet::{SimConfig, job_layout, node_name};
use crate::model::{RankId, Rng, RowSink, step_job};

/// The fleet model's settings (`duration`: the range ends now and starts
/// this long ago) and how many windows each node ships per batch.
#[derive(Debug, Clone)]
pub struct BackfillConfig {
    pub sim: SimConfig,
    pub windows_per_batch: usize,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct BackfillReport {
    pub nodes: usize,
    pub windows: u64,
    pub batches: u64,
    pub rows: u64,
    pub duplicates: u64,
    pub elapsed_secs: f64,
    pub rows_per_sec: f64,
    /// The simulated range (µs since the epoch), for `--since`/`--store` queries.
    pub start_us: i64,
    pub end_us: i64,
}

/// Progress after each chunk: (windows done, windows total, rows so far).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64, u64);

type Chunk = Vec<(IngestClient, PushRequest)>;

/// Runs the backfill; `progress` is called after every pushed chunk.
pub async fn run(cfg: &BackfillConfig, progress: Progress<'_>) -> Result<BackfillReport, SendError> {
    let ch = channel(&cfg.sim.server)?;
    let windows = cfg.sim.duration.as_secs().max(1);
    let now_us = chrono::Utc::now().timestamp_micros();
    let end_us = now_us - now_us.rem_euclid(1_000_000);
    let start_us = end_us - windows as i64 * 1_000_000;
    let policy = RetryPolicy { give_up_after: Duration::from_secs(60), ..Default::default() };
    let clients: Vec<IngestClient> =
        (0..cfg.sim.nodes).map(|i| IngestClient::with_channel(ch.clone(), &node_name(i), policy.clone())).collect();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Chunk, SendError>>(1);
    let gen_cfg = cfg.clone();
    let generator = std::thread::spawn(move || generate(&gen_cfg, clients, start_us, windows, tx));
    let mut report = BackfillReport { nodes: cfg.sim.nodes, windows, start_us, end_us, ..Default::default() };
    let started = Instant::now();
    let per = cfg.windows_per_batch.max(1) as u64;
    let mut done = 0u64;
    while let Some(chunk) = rx.recv().await {
        push_chunk(chunk?, &mut report).await?;
        done = (done + per).min(windows);
        progress(done, windows, report.rows);
    }
    generator.join().expect("backfill generator panicked");
    report.elapsed_secs = started.elapsed().as_secs_f64();
    report.rows_per_sec = report.rows as f64 / report.elapsed_secs.max(1e-9);
    Ok(report)
}

/// Builds every node's batch for each chunk of windows, in time order.
fn generate(
    cfg: &BackfillConfig,
    mut clients: Vec<IngestClient>,
    start_us: i64,
    windows: u64,
    tx: tokio::sync::mpsc::Sender<Result<Chunk, SendError>>,
) {
    let (members, job_names) = job_layout(&cfg.sim);
    let names: Vec<String> = (0..cfg.sim.nodes).map(node_name).collect();
    let mut rng = Rng::new(cfg.sim.seed);
    let per = cfg.windows_per_batch.max(1) as u64;
    let mut w0 = 0;
    while w0 < windows {
        let mut pending: Vec<RowSink> = (0..cfg.sim.nodes).map(|_| RowSink::default()).collect();
        for w in w0..(w0 + per).min(windows) {
            for (j, ranks) in members.iter().enumerate() {
                let win = step_job(ranks, Duration::from_secs(w), &cfg.sim.injections, cfg.sim.jitter, &mut rng);
                for (k, (&node, r)) in ranks.iter().zip(&win).enumerate() {
                    let id = RankId {
                        node: &names[node],
                        job: &job_names[j],
                        rank: k,
                        world: ranks.len(),
                        window_start_us: start_us + w as i64 * 1_000_000,
                    };
                    pending[node].append(&id, r, w == 0, &mut rng);
                }
            }
        }
        let chunk: Result<Chunk, SendError> = pending
            .into_iter()
            .enumerate()
            .map(|(n, sink)| {
                let req = clients[n].request(&sink.finish())?;
                Ok((clients[n].clone(), req))
            })
            .collect();
        if tx.blocking_send(chunk).is_err() {
            return; // the pusher stopped (an error): nothing more to do
        }
        w0 += per;
    }
}

/// Pushes one chunk, every node concurrently (their channel multiplexes).
async fn push_chunk(chunk: Chunk, report: &mut BackfillReport) -> Result<(), SendError> {
    let mut set = JoinSet::new();
    for (mut c, req) in chunk {
        set.spawn(async move { c.push(&req).await });
    }
    while let Some(r) = set.join_next().await {
        let resp = r.expect("push task panicked")?;
        report.batches += 1;
        report.rows += resp.rows;
        report.duplicates += resp.duplicate as u64;
    }
    Ok(())
}
