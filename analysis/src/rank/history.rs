// SPDX-License-Identifier: Apache-2.0
//! Straggler ranking over stored history: the same detector, replayed over
//! node-windows aggregated by DataFusion at a resolution fitting the range.

use std::time::Duration;

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::{Float64Type, Int64Type};

use super::detector::{Detector, DetectorConfig};
use super::overlap::Overlap;
use super::replay::{Range, Replay};
use super::signals::{DEFAULT_JOB, NodeWindowKey, Signals};
use super::{Ranking, Timeline};
use crate::error::{Error, Result};
use crate::query::columns::Columns;
use crate::query::{QueryEngine, launch_predicate, quote, time_predicate, wait_predicates};
use ingero_model::table::names::{CALL_WINDOWS, HOST_EVENTS, IO_WINDOWS, NODE_WINDOWS, SCHED_WINDOWS};
use ingero_store::tier_read;
use ingero_store::tiers::{Tier, TierBatch};

#[derive(Debug, Clone)]
pub struct HistoryRequest {
    pub start_us: i64,
    pub end_us: i64,
    pub job: Option<String>,
    /// Bin width; default: the range / 360, at least 1 s.
    pub resolution: Option<Duration>,
}

impl HistoryRequest {
    pub fn bin_us(&self) -> i64 {
        match self.resolution {
            Some(r) => (r.as_micros() as i64).max(1),
            None => (((self.end_us - self.start_us) / 360).max(1_000_000) + 999_999) / 1_000_000 * 1_000_000,
        }
    }
}

/// One SQL per table, each grouped by (job, node, bin).
fn queries(req: &HistoryRequest) -> Vec<(&'static str, String)> {
    let bin = req.bin_us();
    let job_expr = format!("COALESCE(job, {})", quote(DEFAULT_JOB));
    let mut filter = time_predicate("window_start", req.start_us, req.end_us);
    if let Some(j) = &req.job {
        filter.push_str(&format!(" AND {job_expr} = {}", quote(j)));
    }
    let head = format!("SELECT {job_expr} AS job, node, (CAST(window_start AS BIGINT) / {bin}) * {bin} AS bin");
    let tail = format!("WHERE {filter} GROUP BY 1, 2, 3");
    let d = |e: &str| format!("SUM(CAST({e} AS DOUBLE))");
    let (copy, wait) = wait_predicates();
    vec![
        (
            "calls",
            format!(
                "{head}, {} AS copy_ns, {} AS wait_ns, {} AS launches FROM {CALL_WINDOWS} {tail}",
                d(&format!("CASE WHEN {copy} THEN total_ns ELSE 0 END")),
                d(&format!("CASE WHEN {wait} THEN total_ns ELSE 0 END")),
                d(&format!("CASE WHEN {} THEN count ELSE 0 END", launch_predicate())),
            ),
        ),
        (
            "sched",
            format!(
                "{head}, {} AS runq_ns, {} AS off_ns, {} AS on_ns, {} AS threads, {} AS off_call_ns FROM {SCHED_WINDOWS} {tail}",
                d("runq_wait_ns"),
                d("off_cpu_ns"),
                d("on_cpu_ns"),
                d("threads"),
                d("COALESCE(off_cpu_in_call_ns, 0)")
            ),
        ),
        ("io", format!("{head}, {} AS io_ns FROM {IO_WINDOWS} {tail}", d("total_ns"))),
        (
            "host",
            format!(
                "{head}, {} AS mem FROM {HOST_EVENTS} {tail}",
                d("CASE WHEN kind IN ('oom_kill', 'mem_pressure', 'swap') THEN 1 ELSE 0 END")
            ),
        ),
    ]
}

/// Ranks nodes over [start, end) from the store: from the signal tiers
/// written at ingest, or (stores written before them) by aggregating the
/// raw tables.
pub async fn rank(engine: &QueryEngine, req: &HistoryRequest, cfg: DetectorConfig) -> Result<Ranking> {
    if req.end_us <= req.start_us {
        return Err(Error::NoData("the time range is empty (start must be before end)".into()));
    }
    let store = engine.store();
    // The 60-s tier is 1/60 of the windows: cheap to read first, and it
    // gives the data's extent. Bins fit the data, not the asked range:
    // `--since` a month ago over an imported 90-second trace must still
    // give second-scale bins.
    let coarse = tier_read::read(store, Tier::Minute, req.start_us, req.end_us).await?;
    let Some((lo, hi)) = extent(&coarse, req.start_us, req.end_us)? else {
        return rank_raw(engine, req, cfg).await;
    };
    let mut req = req.clone();
    if req.resolution.is_none() {
        req.start_us = req.start_us.max(lo);
        req.end_us = req.end_us.min(hi);
    }
    let tier = Tier::for_bin(req.bin_us());
    let bin_us = match tier.width_us() {
        // Whole tier bins, as close to range / 360 as they come.
        Some(w) => (req.bin_us() / w).max(1) * w,
        None => req.bin_us(),
    };
    let stuck_after = cfg.stuck_after.as_nanos().min(u64::MAX as u128) as u64;
    let mut det = Detector::new(cfg);
    let mut overlap = Overlap::default();
    let range = Range { start_us: req.start_us, end_us: req.end_us, job: req.job.as_deref() };
    let mut replay = Replay::new(range, bin_us).watching_hangs(stuck_after);
    if tier == Tier::Minute {
        replay.push(&coarse)?;
        read_hung(engine, &mut replay, bin_us).await?;
    } else {
        drop(coarse);
        // File by file in time order, the next two decoding meanwhile: the
        // tier is never whole in memory, and both cores work.
        let mut pieces = tier_read::stream(store, tier, req.start_us, req.end_us, 2).await?;
        while let Some(piece) = pieces.next().await {
            let piece = piece?;
            replay.push(&piece.batches)?;
            read_hung(engine, &mut replay, bin_us).await?;
            replay.judge_before(&mut det, &mut overlap, piece.rest_from_us);
        }
    }
    replay.finish(&mut det, &mut overlap);
    finish_with_steps(engine, det, overlap, &req, bin_us).await
}

/// The processes of the job-bins the replay noted a long call in, before
/// it judges them (hung ranks, `super::hung`).
async fn read_hung(engine: &QueryEngine, replay: &mut Replay<'_>, bin_us: i64) -> Result<()> {
    let wanted = replay.take_wanted();
    if !wanted.is_empty() {
        replay.attach(super::hung::procs(engine, &wanted, bin_us).await?);
    }
    Ok(())
}

/// The ranking of a replayed range: standings, unranked jobs, the timeline
/// and the range's episodes, priced with the nodes' GPUs.
async fn finish(
    engine: &QueryEngine,
    mut det: Detector,
    overlap: Overlap,
    req: &HistoryRequest,
    bin_us: i64,
) -> Ranking {
    super::hosts::learn(engine, &mut det).await;
    let job = req.job.as_deref();
    let mut r = Ranking::from_detector(&det, job, "history");
    r.unranked = overlap.unranked();
    r.timeline = Timeline::from_detector(&det, job, req.start_us.div_euclid(bin_us) * bin_us, bin_us);
    r.episodes = det.episodes().into_iter().filter(|e| job.is_none_or(|j| j == e.job)).collect();
    r
}

/// [`finish`], then each listed node's step time against its job's.
async fn finish_with_steps(
    engine: &QueryEngine,
    det: Detector,
    overlap: Overlap,
    req: &HistoryRequest,
    bin_us: i64,
) -> Result<Ranking> {
    let mut r = finish(engine, det, overlap, req, bin_us).await;
    super::step_times::attach(engine, &mut r, req.start_us, req.end_us).await?;
    Ok(r)
}

/// First and last instant covered by tier rows in [start, end).
fn extent(batches: &[RecordBatch], start_us: i64, end_us: i64) -> Result<Option<(i64, i64)>> {
    let mut out: Option<(i64, i64)> = None;
    for b in batches {
        let t = TierBatch::new(b)?;
        for i in 0..t.len() {
            let w = t.window_start(i);
            // A 60-s bin overlapping the range starts up to a minute before it.
            if w + 60_000_000 > start_us && w < end_us {
                let (lo, hi) = out.get_or_insert((w, w + 60_000_000));
                *lo = (*lo).min(w);
                *hi = (*hi).max(w + 60_000_000);
            }
        }
    }
    Ok(out)
}

/// The raw-table path: DataFusion aggregates each table per (job, node, bin)
/// (stores written before the signal tiers; benchmarks and tests compare).
pub async fn rank_raw(engine: &QueryEngine, req: &HistoryRequest, cfg: DetectorConfig) -> Result<Ranking> {
    // Bins fit the data, not the asked range: `--since` a month ago over an
    // imported 90-second trace must still give second-scale bins.
    let mut req = req.clone();
    let extent = engine
        .sql(&format!(
            "SELECT MIN(CAST(window_start AS BIGINT)) AS lo, MAX(CAST(window_start AS BIGINT) + CAST(window_us AS BIGINT)) AS hi \
             FROM {NODE_WINDOWS} WHERE {}",
            time_predicate("window_start", req.start_us, req.end_us)
        ))
        .await?;
    if let Some(b) = extent.first().filter(|b| b.num_rows() == 1) {
        let (lo, hi) = (b.primitives::<Int64Type>("lo")?, b.primitives::<Int64Type>("hi")?);
        let (lo, hi) = if lo.is_null(0) { (0, 0) } else { (lo.value(0), hi.value(0)) };
        if req.resolution.is_none() && lo < hi {
            req.start_us = req.start_us.max(lo);
            req.end_us = req.end_us.min(hi);
        }
    }
    let req = &req;
    let bin_ns = req.bin_us() as f64 * 1e3;
    let mut det = Detector::new(cfg);
    let mut overlap = Overlap::default();
    for (kind, sql) in queries(req) {
        for b in engine.sql(&sql).await? {
            feed(&mut det, &mut overlap, kind, &b, bin_ns)?;
        }
    }
    det.drain();
    finish_with_steps(engine, det, overlap, req, req.bin_us()).await
}

/// The SUM columns each query of [`queries`] adds after job, node and bin.
fn signal_columns(kind: &str) -> &'static [&'static str] {
    match kind {
        "calls" => &["copy_ns", "wait_ns", "launches"],
        "sched" => &["runq_ns", "off_ns", "on_ns", "threads", "off_call_ns"],
        "io" => &["io_ns"],
        _ => &["mem"],
    }
}

fn feed(det: &mut Detector, overlap: &mut Overlap, kind: &str, b: &RecordBatch, bin_ns: f64) -> Result<()> {
    let (job, node, bin) = (b.strings("job")?, b.strings("node")?, b.primitives::<Int64Type>("bin")?);
    let cols = signal_columns(kind).iter().map(|c| b.primitives::<Float64Type>(c)).collect::<Result<Vec<_>>>()?;
    let v = |c: usize, i: usize| if cols[c].is_null(i) { 0.0 } else { cols[c].value(i) };
    for i in 0..b.num_rows() {
        let mut s = Signals { window_ns: bin_ns, measured: matches!(kind, "calls" | "sched"), ..Default::default() };
        match kind {
            "calls" => {
                s.copy_ns = v(0, i);
                s.wait_ns = v(1, i);
                s.launches = v(2, i);
            }
            "sched" => {
                s.runq_ns = v(0, i);
                s.offcpu_ns = v(1, i);
                s.oncpu_ns = v(2, i);
                s.threads = v(3, i);
                s.offcpu_call_ns = v(4, i);
            }
            "io" => s.io_ns = v(0, i),
            _ => s.mem_events = v(0, i),
        }
        overlap.add(job.value(i), node.value(i), bin.value(i));
        let key = NodeWindowKey {
            job: job.value(i).to_string(),
            node: node.value(i).to_string(),
            window_start_us: bin.value(i),
        };
        det.add(key, &s);
    }
    Ok(())
}
