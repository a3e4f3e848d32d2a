// SPDX-License-Identifier: Apache-2.0
//! A straggler episode: from the window its deviation began to the window
//! its flag cleared, with the job time it cost. The job time lost in a
//! window is how long the peers wait for the straggler, seen from its side:
//! a rank late from host-side trouble (CPU, IO, memory) waits *less* in its
//! syncs and collectives than the peers' median, a rank with a slow GPU
//! waits *more* for its own GPU (blocking copies) than they do. The larger
//! gap, as a share of the window, times the window; the whole window while
//! the job is stuck on it. The streak before the flag counts: the episode
//! began there.

use serde::{Deserialize, Serialize};

use super::cost::Cost;
use super::standing::Deviation;

/// One episode of one node (`ingero offenders`, history).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Episode {
    pub job: String,
    pub node: String,
    pub start_us: i64,
    /// End of the window its flag cleared in; None while still flagged.
    pub end_us: Option<i64>,
    /// How far the node's data shows it: `end_us` once cleared, else the
    /// end of its last judged window (history that ends mid-episode is
    /// flagged that long, not until now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_until_us: Option<i64>,
    /// The signal that deviated most (`runq_share`, `stuck`, …).
    pub cause: String,
    /// That signal's deviation, in words.
    pub text: String,
    pub peak_score: f64,
    /// Job time lost: seconds of the job's wall time spent waiting on this node.
    pub lost_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

/// What one judged window did to a node (input of [`Ledger::record`]).
pub(crate) struct Outcome<'a> {
    pub window_end_us: i64,
    /// Job seconds lost this window (see the module).
    pub lost_s: f64,
    /// Deviant or stuck this window.
    pub deviant: bool,
    pub was_flagged: bool,
    pub flagged: bool,
    /// Start of the episode (the flag's `since`), before the window.
    pub since: Option<i64>,
    pub score: f64,
    pub top: Option<&'a Deviation>,
}

/// A closed episode, without its job and node (the detector knows them).
#[derive(Debug, Clone)]
pub(crate) struct Closed {
    pub start_us: i64,
    pub end_us: i64,
    pub cause: String,
    pub text: String,
    pub peak_score: f64,
    pub lost_s: f64,
}

/// Per node: the job time lost in the current streak and episode, the
/// episode's worst deviation, and (history) the episodes closed so far.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    streak_lost: f64,
    pub lost_s: f64,
    pub peak: (f64, String, String),
    pub closed: Vec<Closed>,
}

impl Ledger {
    /// Books one window; `keep` keeps closed episodes (history).
    pub(crate) fn record(&mut self, o: &Outcome, keep: bool) {
        self.streak_lost = if o.deviant { self.streak_lost + o.lost_s } else { 0.0 };
        if o.flagged {
            self.lost_s = if o.was_flagged { self.lost_s + o.lost_s } else { self.streak_lost.max(o.lost_s) };
            if let Some(d) = o.top.filter(|_| o.score >= self.peak.0 || self.peak.1.is_empty()) {
                self.peak = (o.score, d.signal.clone(), d.text.clone());
            }
        } else if o.was_flagged {
            let (peak_score, cause, text) = std::mem::take(&mut self.peak);
            if keep {
                self.closed.push(Closed {
                    start_us: o.since.unwrap_or(o.window_end_us),
                    end_us: o.window_end_us,
                    cause,
                    text,
                    peak_score,
                    lost_s: self.lost_s + o.lost_s,
                });
            }
            self.lost_s = 0.0;
        }
    }
}

/// Medians of the (device-wait, copy-wait) shares of `peers`; None without peers.
pub(crate) fn medians(peers: &[(f64, f64)]) -> Option<(f64, f64)> {
    if peers.is_empty() {
        return None;
    }
    let med = |f: fn(&(f64, f64)) -> f64| ingero_model::time::median(&mut peers.iter().map(f).collect::<Vec<_>>());
    Some((med(|p| p.0), med(|p| p.1)))
}

/// Seconds of job time lost in a window of `window_s` by a node whose
/// (device-wait, copy-wait) shares are `own`, against its peers' medians.
pub(crate) fn lost_in_window(window_s: f64, own: (f64, f64), peers: Option<(f64, f64)>) -> f64 {
    let Some((wait, copy)) = peers else { return 0.0 };
    let waits_less = (wait - own.0).abs();
    let own_gpu_slower = own.1 - copy;
    window_s * waits_less.max(own_gpu_slower).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Deviation {
        Deviation { signal: "runq_share".into(), value: 0.4, job_median: 0.03, z: 9.0, text: "run-queue".into() }
    }

    /// Two streak windows, flagged on the third, one flagged calm window,
    /// cleared: the episode holds all four windows' loss.
    #[test]
    fn an_episode_counts_its_streak_and_closes_when_the_flag_clears() {
        let d = dev();
        let mut l = Ledger::default();
        let w = |lost_s, deviant, was_flagged, flagged| Outcome {
            window_end_us: 4_000_000,
            lost_s,
            deviant,
            was_flagged,
            flagged,
            since: Some(0),
            score: 9.0,
            top: Some(&d),
        };
        l.record(&w(0.25, true, false, false), true);
        l.record(&w(0.25, true, false, false), true);
        l.record(&w(0.25, true, false, true), true);
        assert_eq!(l.lost_s, 0.75);
        l.record(&w(0.125, false, true, true), true);
        l.record(&w(0.0, false, true, false), true);
        assert_eq!(l.closed.len(), 1);
        let c = &l.closed[0];
        assert_eq!((c.start_us, c.end_us, c.cause.as_str(), c.lost_s), (0, 4_000_000, "runq_share", 0.875));
        assert_eq!(l.lost_s, 0.0);
        // Late from the host: it waits 25% less than its peers.
        let peers = [(0.30, 0.02), (0.32, 0.02), (0.28, 0.02)];
        assert!((lost_in_window(2.0, (0.05, 0.02), medians(&peers)) - 0.5).abs() < 1e-9);
        // A slow GPU: the same device wait, 20% more of it on its own GPU.
        assert!((lost_in_window(1.0, (0.30, 0.22), medians(&peers)) - 0.2).abs() < 1e-9);
        assert_eq!(lost_in_window(1.0, (0.05, 0.0), medians(&[])), 0.0);
    }
}
