// SPDX-License-Identifier: Apache-2.0
//! Training steps: how long each took, the median, and the slowest, so a
//! stall can be read against steps. As the job labelled them where it did
//! (`annotation` host events of an imported trace, labels `step` and
//! `epoch`): a step's time is its span where the job wrote spans, else the
//! time to the next step's mark of the same process (the last mark has no
//! end). Else as the agents found them without code changes, from the
//! cycle of each process's syncs, copies and collectives (the `steps`
//! columns of `progress_windows`): per window, the steps that ended, their
//! median and the longest.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::Array;
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use serde::Serialize;

use super::data::ReportData;
use crate::error::Result;
use crate::query::columns::Columns;
use crate::query::{QueryEngine, time_predicate};
use ingero_model::table::names::{HOST_EVENTS, PROGRESS_WINDOWS};
use ingero_model::time::rfc3339;

/// Steps shown as the slowest: at most 3, each at least 1.5× the median.
const SLOWEST: usize = 3;
const SLOW_X: f64 = 1.5;

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Steps {
    pub count: usize,
    pub median_s: f64,
    /// Epoch labels seen, in order of first appearance.
    pub epochs: Vec<String>,
    /// When each of `epochs` first appears (µs since epoch).
    #[serde(default)]
    pub epoch_starts_us: Vec<i64>,
    /// The slowest steps that took at least 1.5× the median, slowest first.
    pub slowest: Vec<StepTime>,
    /// Found by the agents (no labels): the call whose return ends each
    /// step. Each of `slowest` is then the longest step of its window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<String>,
    /// Found by the agents: a step that had not ended when the data ends,
    /// at least 1.5× the median long (a loop that stopped: a hang shorter
    /// than --stuck-after). `start` is the window its last step ended in,
    /// `seconds` a lower bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfinished: Option<StepTime>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct StepTime {
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    pub start: String,
    #[serde(default)]
    pub start_us: i64,
    pub seconds: f64,
}

/// (pid, start µs, span ns, labels) of one annotation.
type Mark = (u32, i64, i64, BTreeMap<String, String>);

/// The steps of the report's processes (and the job-wide marks) on its nodes.
pub(crate) async fn collect(engine: &QueryEngine, d: &ReportData, start_us: i64, end_us: i64) -> Result<Option<Steps>> {
    if d.nodes.is_empty() {
        return Ok(None);
    }
    let nodes = d.nodes.iter().map(|n| crate::query::quote(n)).collect::<Vec<_>>().join(", ");
    let pids = d.pids.iter().map(|p| p.to_string()).chain(["0".to_string()]).collect::<Vec<_>>().join(", ");
    let q = format!(
        "SELECT pid, CAST(event_time AS BIGINT) AS t, value, detail FROM {HOST_EVENTS} \
         WHERE kind = 'annotation' AND node IN ({nodes}) AND pid IN ({pids}) AND {} ORDER BY t",
        time_predicate("event_time", start_us, end_us)
    );
    let mut marks: Vec<Mark> = Vec::new();
    for b in engine.sql(&q).await? {
        let (pid, t, v, detail) = (
            b.primitives::<UInt32Type>("pid")?,
            b.primitives::<Int64Type>("t")?,
            b.primitives::<Int64Type>("value")?,
            b.strings("detail")?,
        );
        for i in 0..b.num_rows() {
            let labels = (!detail.is_null(i)).then(|| serde_json::from_str(detail.value(i)).ok()).flatten();
            marks.push((pid.value(i), t.value(i), v.value(i), labels.unwrap_or_default()));
        }
    }
    match summarize(&marks) {
        Some(s) => Ok(Some(s)),
        None => found(engine, &nodes, &pids, start_us, end_us).await,
    }
}

/// One window's steps as an agent found them: (start µs, steps, median ns, longest ns, op).
type Found = (i64, u64, Option<u64>, Option<u64>, String);

/// The steps the agents found for these processes.
async fn found(engine: &QueryEngine, nodes: &str, pids: &str, start_us: i64, end_us: i64) -> Result<Option<Steps>> {
    let q = format!(
        "SELECT CAST(window_start AS BIGINT) AS t, CAST(steps AS BIGINT) AS n, step_p50_ns, step_max_ns, step_op \
         FROM {PROGRESS_WINDOWS} WHERE steps > 0 AND node IN ({nodes}) AND pid IN ({pids}) AND {} ORDER BY t",
        time_predicate("window_start", start_us, end_us)
    );
    let mut windows: Vec<Found> = Vec::new();
    for b in engine.sql(&q).await? {
        let (t, n, p50, max, op) = (
            b.primitives::<Int64Type>("t")?,
            b.primitives::<Int64Type>("n")?,
            b.primitives::<UInt64Type>("step_p50_ns")?,
            b.primitives::<UInt64Type>("step_max_ns")?,
            b.strings("step_op")?,
        );
        let at = |c: &arrow::array::PrimitiveArray<UInt64Type>, i| c.is_valid(i).then(|| c.value(i));
        for i in 0..b.num_rows() {
            let op = if op.is_valid(i) { op.value(i).to_string() } else { String::new() };
            windows.push((t.value(i), n.value(i).max(0) as u64, at(p50, i), at(max, i), op));
        }
    }
    let mut steps = summarize_found(&windows);
    if let Some(s) = steps.as_mut() {
        s.unfinished =
            open_step(engine, nodes, pids, start_us, end_us).await?.filter(|o| o.seconds >= s.median_s * SLOW_X);
    }
    Ok(steps)
}

/// The longest time, of these processes, from the last window a step
/// ended in to their last window with a cycle (steps 0: their loop still
/// followed, no step ended): a step open when the data ends.
async fn open_step(
    engine: &QueryEngine,
    nodes: &str,
    pids: &str,
    start_us: i64,
    end_us: i64,
) -> Result<Option<StepTime>> {
    let q = format!(
        "SELECT CAST(MAX(CASE WHEN steps > 0 THEN window_start END) AS BIGINT) AS ended, \
         CAST(MAX(window_start) AS BIGINT) AS last FROM {PROGRESS_WINDOWS} \
         WHERE steps IS NOT NULL AND node IN ({nodes}) AND pid IN ({pids}) AND {} GROUP BY node, pid",
        time_predicate("window_start", start_us, end_us)
    );
    let mut open: Option<(i64, i64)> = None;
    for b in engine.sql(&q).await? {
        let (ended, last) = (b.primitives::<Int64Type>("ended")?, b.primitives::<Int64Type>("last")?);
        for i in (0..b.num_rows()).filter(|&i| ended.is_valid(i) && last.is_valid(i)) {
            let (from, span) = (ended.value(i), last.value(i) - ended.value(i));
            if span > 0 && open.is_none_or(|o| span > o.1) {
                open = Some((from, span));
            }
        }
    }
    Ok(open.map(|(t, span)| StepTime {
        step: String::new(),
        epoch: None,
        start: rfc3339(t),
        start_us: t,
        seconds: span as f64 / 1e6,
    }))
}

/// Steps from the windows' counts: the median is the windows' medians
/// weighted by their steps; the slowest are the windows' longest.
pub(crate) fn summarize_found(windows: &[Found]) -> Option<Steps> {
    let count: u64 = windows.iter().map(|w| w.1).sum();
    let mut medians: Vec<(u64, u64)> = windows.iter().filter_map(|w| Some((w.2?, w.1))).collect();
    if count == 0 || medians.is_empty() {
        return None;
    }
    medians.sort_unstable();
    let half = medians.iter().map(|m| m.1).sum::<u64>().div_ceil(2);
    let mut seen = 0;
    let median_ns = medians.iter().find(|m| {
        seen += m.1;
        seen >= half
    })?;
    let median_s = median_ns.0 as f64 / 1e9;
    let mut ops: BTreeMap<&str, u64> = BTreeMap::new();
    for w in windows {
        *ops.entry(w.4.as_str()).or_default() += w.1;
    }
    let ended_by = ops.into_iter().max_by_key(|(_, n)| *n).map(|(op, _)| op.to_string());
    let mut slowest: Vec<StepTime> = windows
        .iter()
        .filter_map(|w| Some((w.0, w.3? as f64 / 1e9)))
        .filter(|(_, s)| *s >= median_s * SLOW_X)
        .map(|(t, seconds)| StepTime { step: String::new(), epoch: None, start: rfc3339(t), start_us: t, seconds })
        .collect();
    slowest.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    slowest.truncate(SLOWEST);
    Some(Steps {
        count: count as usize,
        median_s,
        epochs: vec![],
        epoch_starts_us: vec![],
        slowest,
        ended_by,
        unfinished: None,
    })
}

/// Step times from marks sorted by time.
pub(crate) fn summarize(marks: &[Mark]) -> Option<Steps> {
    let (mut epochs, mut epoch_starts_us): (Vec<String>, Vec<i64>) = (Vec::new(), Vec::new());
    for (t, e) in marks.iter().filter_map(|m| Some((m.1, m.3.get("epoch")?))) {
        if !epochs.contains(e) {
            epochs.push(e.clone());
            epoch_starts_us.push(t);
        }
    }
    let steps: Vec<&Mark> = marks.iter().filter(|m| m.3.contains_key("step")).collect();
    let mut times: Vec<StepTime> = Vec::new();
    let pids: BTreeSet<u32> = steps.iter().map(|m| m.0).collect();
    for pid in pids {
        let mine: Vec<&&Mark> = steps.iter().filter(|m| m.0 == pid).collect();
        for (k, m) in mine.iter().enumerate() {
            let ns = if m.2 > 0 { Some(m.2) } else { mine.get(k + 1).map(|n| (n.1 - m.1) * 1000) };
            if let Some(ns) = ns.filter(|ns| *ns > 0) {
                times.push(StepTime {
                    step: m.3["step"].clone(),
                    epoch: m.3.get("epoch").cloned(),
                    start: rfc3339(m.1),
                    start_us: m.1,
                    seconds: ns as f64 / 1e9,
                });
            }
        }
    }
    if times.is_empty() {
        return None;
    }
    let mut secs: Vec<f64> = times.iter().map(|t| t.seconds).collect();
    secs.sort_by(f64::total_cmp);
    let median_s = secs[secs.len() / 2];
    let count = times.len();
    times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    times.retain(|t| t.seconds >= median_s * SLOW_X);
    times.truncate(SLOWEST);
    Some(Steps { count, median_s, epochs, epoch_starts_us, slowest: times, ended_by: None, unfinished: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(pid: u32, t_s: i64, span_s: i64, labels: &[(&str, &str)]) -> Mark {
        let l = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        (pid, t_s * 1_000_000, span_s * 1_000_000_000, l)
    }

    #[test]
    fn step_times_run_to_the_next_mark_of_the_same_process_or_are_spans() {
        let mut m = Vec::new();
        // pid 7: steps 1-4 two seconds apart, step 3 takes six.
        for (s, t) in [("1", 0), ("2", 2), ("3", 4), ("4", 10)] {
            m.push(mark(7, t, 0, &[("step", s), ("epoch", "0")]));
        }
        // pid 8 interleaved: its own marks, never paired with pid 7's.
        m.push(mark(8, 1, 0, &[("step", "1")]));
        m.push(mark(8, 3, 0, &[("step", "2")]));
        // A span, and a mark with no step.
        m.push(mark(9, 20, 5, &[("step", "x"), ("epoch", "1")]));
        m.push(mark(0, 0, 30, &[("epoch", "0")]));
        m.sort_by_key(|x| x.1);
        let s = summarize(&m).unwrap();
        assert_eq!(s.count, 5, "{s:?}"); // 3 of pid 7, 1 of pid 8, 1 span
        assert_eq!(s.epochs, vec!["0", "1"]);
        assert_eq!(s.epoch_starts_us, vec![0, 20_000_000]);
        assert_eq!(s.slowest[0].step, "3");
        assert_eq!(s.slowest[0].seconds, 6.0);
        assert_eq!(s.slowest[1].seconds, 5.0);
        assert_eq!(s.slowest.len(), 2, "2-s steps are the median, not slow: {s:?}");
        assert_eq!(s.median_s, 2.0);
        assert!(summarize(&[mark(0, 0, 0, &[("epoch", "0")])]).is_none());
    }

    #[test]
    fn found_steps_weigh_each_window_by_its_steps_and_name_slow_windows() {
        let op = || "cudaStreamSynchronize".to_string();
        let w = |t_s: i64, n: u64, p50_ms: u64, max_ms: u64| {
            (t_s * 1_000_000, n, Some(p50_ms * 1_000_000), Some(max_ms * 1_000_000), op())
        };
        // 24 steps of ~40 ms, a window of 2 slow ones, one with a 343-ms step.
        let s = summarize_found(&[w(0, 10, 41, 41), w(1, 14, 40, 42), w(2, 17, 41, 343), w(3, 2, 300, 310)]).unwrap();
        assert_eq!(s.count, 43);
        assert_eq!(s.median_s, 0.041, "{s:?}");
        assert_eq!(s.ended_by.as_deref(), Some("cudaStreamSynchronize"));
        assert_eq!(
            s.slowest.iter().map(|t| (t.start_us, t.seconds)).collect::<Vec<_>>(),
            [(2_000_000, 0.343), (3_000_000, 0.31)]
        );
        // A first window whose steps have no known start yet: counted, no median.
        assert!(summarize_found(&[(0, 2, None, None, op())]).is_none());
    }
}
