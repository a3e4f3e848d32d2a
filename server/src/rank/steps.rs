// SPDX-License-Identifier: Apache-2.0
//! Step time per node against its job's: the agents find each process's
//! training steps without code changes and ship, per window, the steps that
//! ended and their median (`progress_windows`). A node's step time is the
//! median of its recent windows' medians; its job's is the median of its
//! nodes'. Shown, not scored: ranks in lockstep step alike, and the signals
//! say why a node is slow; this says what it costs each step.

use std::collections::VecDeque;

use serde::Serialize;

use super::signals::Signals;

/// Windows of step medians kept per node (a minute of 1-s windows).
const RECENT: usize = 60;

/// A node's step time against its job's.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct StepTime {
    /// The node's median step time (s).
    pub seconds: f64,
    /// The median of its job's nodes' step times (s).
    pub job_seconds: f64,
    /// seconds / job_seconds: 1.5 means each step takes half as long again.
    pub ratio: f64,
    /// The job's step time before this node's deviation began and since:
    /// in lockstep every rank steps at the slowest one's pace (ratio 1),
    /// and this is what the deviation costs each step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_shift: Option<StepShift>,
}

/// A job's step time (s) in the minutes before a node deviated, and since.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq)]
pub struct StepShift {
    pub before_seconds: f64,
    pub since_seconds: f64,
}

/// How far back "before" looks: a straggler's effect against the job's
/// recent pace, not last hour's.
pub const SHIFT_LOOKBACK_US: i64 = 300_000_000;

/// Windows needed on each side of the deviation's start for a shift.
const SHIFT_MIN_WINDOWS: usize = 3;

/// The median of `series` values with start in `[from, to)`; None with
/// fewer than [`SHIFT_MIN_WINDOWS`].
fn side(series: impl IntoIterator<Item = (i64, u64)>, (from, to): (i64, i64)) -> Option<u64> {
    let v: Vec<u64> = series.into_iter().filter(|&(t, _)| t >= from && t < to).map(|(_, ns)| ns).collect();
    if v.len() < SHIFT_MIN_WINDOWS { None } else { median(v) }
}

/// The job's pace (step ns per window start µs) in the lookback before a
/// deviation began at `since_us`.
fn pace_before(series: impl IntoIterator<Item = (i64, u64)>, since_us: i64) -> Option<u64> {
    side(series, (since_us.saturating_sub(SHIFT_LOOKBACK_US), since_us))
}

/// The job's step time before a deviation began at `since_us` and from it
/// on, from (window start µs, job step ns) pairs; None without
/// [`SHIFT_MIN_WINDOWS`] on each side.
pub fn shift(series: &[(i64, u64)], since_us: i64) -> Option<StepShift> {
    let before = pace_before(series.iter().copied(), since_us)?;
    StepShift::new(before, side(series.iter().copied(), (since_us, i64::MAX))?)
}

impl StepShift {
    /// How much slower (+) or faster (−) the job steps since, in percent.
    pub fn change_pct(&self) -> f64 {
        (self.since_seconds / self.before_seconds - 1.0) * 100.0
    }

    fn new(before_ns: u64, since_ns: u64) -> Option<StepShift> {
        (before_ns > 0).then(|| StepShift {
            before_seconds: round4(before_ns as f64 / 1e9),
            since_seconds: round4(since_ns as f64 / 1e9),
        })
    }
}

impl StepTime {
    pub fn new(node_ns: f64, job_ns: f64) -> Option<StepTime> {
        (node_ns > 0.0 && job_ns > 0.0).then(|| StepTime {
            seconds: round4(node_ns / 1e9),
            job_seconds: round4(job_ns / 1e9),
            ratio: (node_ns / job_ns * 100.0).round() / 100.0,
            job_shift: None,
        })
    }

    pub fn with_shift(self, job_shift: Option<StepShift>) -> StepTime {
        StepTime { job_shift, ..self }
    }

    /// "step 0.48 s, 1.55× the job's 0.31 s", and where known "; the job
    /// stepped in 0.30 s before it deviated, 0.31 s since (+3%)".
    pub fn text(&self) -> String {
        let mut t = format!("step {:.3} s, {:.2}× the job's {:.3} s", self.seconds, self.ratio, self.job_seconds);
        if let Some(s) = self.job_shift {
            t += &format!(
                "; the job stepped in {:.3} s before it deviated, {:.3} s since ({:+.0}%)",
                s.before_seconds,
                s.since_seconds,
                s.change_pct()
            );
        }
        t
    }
}

fn round4(v: f64) -> f64 {
    (v * 1e4).round() / 1e4
}

/// One node's recent step medians.
#[derive(Debug, Default)]
pub(crate) struct StepTrack {
    recent: VecDeque<u64>,
    /// Its job's pace before this node's current deviation began, taken
    /// when it began: a deviation may outlast the job's kept windows.
    pub(crate) job_before: Option<u64>,
}

impl StepTrack {
    /// Takes a window's signals: the median of its processes' step medians
    /// (returned: the node's step time that window).
    pub(crate) fn add(&mut self, s: &Signals) -> Option<u64> {
        let p50s: Vec<u64> = s.procs.iter().filter_map(|p| p.step_p50_ns).collect();
        let m = median(p50s)?;
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(m);
        Some(m)
    }

    /// The node's step time (ns), if its agents found steps lately.
    pub(crate) fn ns(&self) -> Option<u64> {
        median(self.recent.iter().copied().collect())
    }
}

/// A job's step time per window (the median of its nodes'), the last ten
/// minutes of 1-s windows: its pace before a node deviated, and since.
#[derive(Debug, Default)]
pub(crate) struct JobSteps {
    windows: VecDeque<(i64, u64)>,
}

impl JobSteps {
    const KEPT: usize = 600;

    /// Window `w`'s node step times.
    pub(crate) fn add(&mut self, w: i64, nodes: Vec<u64>) {
        let Some(m) = median(nodes) else { return };
        if self.windows.len() == Self::KEPT {
            self.windows.pop_front();
        }
        self.windows.push_back((w, m));
    }

    pub(crate) fn before(&self, since_us: i64) -> Option<u64> {
        pace_before(self.windows.iter().copied(), since_us)
    }

    /// From `before` (taken when the deviation began) to the job's pace
    /// since `since_us` (its last ten minutes, for an older deviation).
    pub(crate) fn shift(&self, before: Option<u64>, since_us: i64) -> Option<StepShift> {
        StepShift::new(before?, side(self.windows.iter().copied(), (since_us, i64::MAX))?)
    }
}

/// The median (the lower one of an even count); None when empty.
pub fn median(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len().checked_sub(1)? / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::progress::ProcProgress;

    fn window(p50s: &[u64]) -> Signals {
        let procs = p50s.iter().map(|&p| ProcProgress { step_p50_ns: Some(p), ..Default::default() }).collect();
        Signals { procs, ..Default::default() }
    }

    #[test]
    fn a_node_steps_at_the_median_of_its_windows_and_processes() {
        let mut t = StepTrack::default();
        assert_eq!(t.ns(), None);
        t.add(&window(&[300, 310, 900]));
        t.add(&Signals::default()); // no steps found: nothing
        t.add(&window(&[320]));
        t.add(&window(&[5000]));
        assert_eq!(t.ns(), Some(320));
        for _ in 0..RECENT {
            t.add(&window(&[480]));
        }
        assert_eq!(t.ns(), Some(480), "only the last {RECENT} windows count");
        let s = StepTime::new(480e6, 310e6).unwrap();
        assert_eq!((s.seconds, s.job_seconds, s.ratio), (0.48, 0.31, 1.55));
        assert_eq!(s.text(), "step 0.480 s, 1.55× the job's 0.310 s");
        assert_eq!(StepTime::new(0.0, 1.0), None);
    }

    #[test]
    fn the_jobs_pace_before_a_deviation_and_since() {
        let s = |t: i64| t * 1_000_000;
        // An hour-old window is outside the lookback; 10 windows at 100 ms,
        // then 10 at 150 ms from the deviation's start at t = 1000 s.
        let mut series = vec![(s(-2600), 900_000_000)];
        series.extend((990..1000).map(|t| (s(t), 100_000_000)));
        series.extend((1000..1010).map(|t| (s(t), 150_000_000)));
        let shift = shift(&series, s(1000)).unwrap();
        assert_eq!((shift.before_seconds, shift.since_seconds), (0.1, 0.15));
        let t = StepTime::new(150e6, 150e6).unwrap().with_shift(Some(shift)).text();
        assert_eq!(
            t,
            "step 0.150 s, 1.00× the job's 0.150 s; the job stepped in 0.100 s before it deviated, 0.150 s since (+50%)"
        );
        // Too few windows on a side: no claim.
        assert_eq!(super::shift(&series, s(1008)), None);
        assert_eq!(super::shift(&series, s(992)), None);
        // The job's history keeps its last ten minutes; a deviation older
        // than that keeps the pace taken when it began.
        let mut j = JobSteps::default();
        (0..JobSteps::KEPT as i64 + 10).for_each(|t| j.add(s(t), vec![100_000_000, 300_000_000, 1_000_000_000]));
        j.add(s(5000), vec![]);
        assert_eq!(
            (j.windows.len(), j.windows.front(), j.windows.back()),
            (JobSteps::KEPT, Some(&(s(10), 300_000_000)), Some(&(s(609), 300_000_000)))
        );
        assert_eq!(j.before(s(5)), None, "forgotten");
        let shift = j.shift(Some(100_000_000), s(5)).unwrap();
        assert_eq!((shift.before_seconds, shift.since_seconds), (0.1, 0.3));
    }
}
