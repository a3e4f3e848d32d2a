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
}

impl StepTime {
    pub fn new(node_ns: f64, job_ns: f64) -> Option<StepTime> {
        (node_ns > 0.0 && job_ns > 0.0).then(|| StepTime {
            seconds: round4(node_ns / 1e9),
            job_seconds: round4(job_ns / 1e9),
            ratio: (node_ns / job_ns * 100.0).round() / 100.0,
        })
    }

    /// "step 0.48 s, 1.55× the job's 0.31 s".
    pub fn text(&self) -> String {
        format!("step {:.3} s, {:.2}× the job's {:.3} s", self.seconds, self.ratio, self.job_seconds)
    }
}

fn round4(v: f64) -> f64 {
    (v * 1e4).round() / 1e4
}

/// One node's recent step medians.
#[derive(Debug, Default)]
pub(crate) struct StepTrack {
    recent: VecDeque<u64>,
}

impl StepTrack {
    /// Takes a window's signals: the median of its processes' step medians.
    pub(crate) fn add(&mut self, s: &Signals) {
        let p50s: Vec<u64> = s.procs.iter().filter_map(|p| p.step_p50_ns).collect();
        if let Some(m) = median(p50s) {
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back(m);
        }
    }

    /// The node's step time (ns), if its agents found steps lately.
    pub(crate) fn ns(&self) -> Option<u64> {
        median(self.recent.iter().copied().collect())
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
}
