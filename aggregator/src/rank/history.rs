//! Straggler ranking over stored history: the same detector, replayed over
//! node-windows aggregated by DataFusion at a resolution fitting the range.

use std::time::Duration;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int64Type};

use super::Ranking;
use super::detector::{Detector, DetectorConfig};
use super::signals::{DEFAULT_JOB, NodeWindowKey, Signals};
use crate::error::{Error, Result};
use crate::query::{QueryEngine, quote, time_predicate, wait_predicates};

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
                "{head}, {} AS copy_ns, {} AS wait_ns, {} AS launches FROM call_windows {tail}",
                d(&format!("CASE WHEN {copy} THEN total_ns ELSE 0 END")),
                d(&format!("CASE WHEN {wait} THEN total_ns ELSE 0 END")),
                d(
                    "CASE WHEN op LIKE 'cudaLaunchKernel%' OR op LIKE 'cuLaunchKernel%' OR op = 'cudaGraphLaunch' THEN count ELSE 0 END"
                ),
            ),
        ),
        (
            "sched",
            format!(
                "{head}, {} AS runq_ns, {} AS off_ns, {} AS on_ns, {} AS threads, {} AS off_call_ns FROM sched_windows {tail}",
                d("runq_wait_ns"),
                d("off_cpu_ns"),
                d("on_cpu_ns"),
                d("threads"),
                d("COALESCE(off_cpu_in_call_ns, 0)")
            ),
        ),
        ("io", format!("{head}, {} AS io_ns FROM io_windows {tail}", d("total_ns"))),
        (
            "host",
            format!(
                "{head}, {} AS mem FROM host_events {tail}",
                d("CASE WHEN kind IN ('oom_kill', 'mem_pressure', 'swap') THEN 1 ELSE 0 END")
            ),
        ),
    ]
}

/// Ranks nodes over [start, end) from the store.
pub async fn rank(engine: &QueryEngine, req: &HistoryRequest, cfg: DetectorConfig) -> Result<Ranking> {
    if req.end_us <= req.start_us {
        return Err(Error::NoData("the time range is empty (start must be before end)".into()));
    }
    // Bins fit the data, not the asked range: `--since` a month ago over an
    // imported 90-second trace must still give second-scale bins.
    let mut req = req.clone();
    let extent = engine
        .sql(&format!(
            "SELECT MIN(CAST(window_start AS BIGINT)), MAX(CAST(window_start AS BIGINT) + CAST(window_us AS BIGINT)) \
             FROM node_windows WHERE {}",
            time_predicate("window_start", req.start_us, req.end_us)
        ))
        .await?;
    if let Some(b) = extent.first().filter(|b| b.num_rows() == 1 && !b.column(0).is_null(0)) {
        let (lo, hi) =
            (b.column(0).as_primitive::<Int64Type>().value(0), b.column(1).as_primitive::<Int64Type>().value(0));
        if req.resolution.is_none() && lo < hi {
            req.start_us = req.start_us.max(lo);
            req.end_us = req.end_us.min(hi);
        }
    }
    let req = &req;
    let bin_ns = req.bin_us() as f64 * 1e3;
    let mut det = Detector::new(cfg);
    for (kind, sql) in queries(req) {
        for b in engine.sql(&sql).await? {
            feed(&mut det, kind, &b, bin_ns);
        }
    }
    det.drain();
    Ok(Ranking::from_detector(&det, req.job.as_deref(), "history"))
}

fn feed(det: &mut Detector, kind: &str, b: &RecordBatch, bin_ns: f64) {
    let job = b.column(0).as_string::<i32>();
    let node = b.column(1).as_string::<i32>();
    let bin = b.column(2).as_primitive::<Int64Type>();
    let f = |i: usize| b.column(i).as_primitive::<Float64Type>().clone();
    let cols: Vec<_> = (3..b.num_columns()).map(f).collect();
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
        let key = NodeWindowKey {
            job: job.value(i).to_string(),
            node: node.value(i).to_string(),
            window_start_us: bin.value(i),
        };
        det.add(key, &s);
    }
}
