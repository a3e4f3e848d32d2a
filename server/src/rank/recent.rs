// SPDX-License-Identifier: Apache-2.0
//! The newest windows' signals of every job a replica ranks or stands by
//! for: what a job's next owner starts from, so a replica change costs the
//! detector none of its recent memory (warm-up, streaks, flags).

use std::collections::{BTreeMap, HashMap};

use super::signals::{NodeWindowKey, Signals};

/// How much of a job's recent past is kept: more than the detector needs to
/// rebuild a node's state (warm-up, a flag's streak, a clear's calm run).
pub const KEEP_US: i64 = 30_000_000;
/// A job with no window for this long is dropped (it ended or moved away).
const IDLE_US: i64 = 120_000_000;

/// window → node → the pieces received (a window may arrive in pieces),
/// each with whether the detector has it.
type Windows = BTreeMap<i64, HashMap<String, Vec<(Signals, bool)>>>;

#[derive(Debug, Default)]
pub struct Recent {
    jobs: HashMap<String, Windows>,
    swept_at: i64,
}

impl Recent {
    /// Keeps one piece of a node-window, `ranked` when it goes to the
    /// detector now. True when the detector should take it: false for a
    /// piece it already has (a batch sent again, or the same window from two
    /// replicas in a hand-over), which must not count twice.
    pub fn record(&mut self, k: &NodeWindowKey, s: &Signals, ranked: bool) -> bool {
        let job = self.jobs.entry(k.job.clone()).or_default();
        let newest = job.keys().next_back().copied().unwrap_or(i64::MIN);
        if k.window_start_us < newest.saturating_sub(KEEP_US) {
            return ranked; // older than kept: nothing to compare with, let the detector decide
        }
        let pieces = job.entry(k.window_start_us).or_default().entry(k.node.clone()).or_default();
        if let Some((_, had)) = pieces.iter_mut().find(|(p, _)| p == s) {
            // Kept as standby before, ranked now (its owner moved here): take it.
            let take = ranked && !*had;
            *had |= ranked;
            return take;
        }
        pieces.push((s.clone(), ranked));
        if k.window_start_us > newest {
            let floor = k.window_start_us - KEEP_US;
            while job.first_key_value().is_some_and(|(&w, _)| w < floor) {
                job.pop_first();
            }
        }
        ranked
    }

    /// Every kept piece of `job`, oldest window first.
    pub fn windows(&self, job: &str) -> Vec<(NodeWindowKey, Signals)> {
        let Some(windows) = self.jobs.get(job) else { return Vec::new() };
        let mut out = Vec::new();
        for (&w, nodes) in windows {
            for (node, pieces) in nodes {
                let key = NodeWindowKey { job: job.to_string(), node: node.clone(), window_start_us: w };
                out.extend(pieces.iter().map(|(s, _)| (key.clone(), s.clone())));
            }
        }
        out
    }

    /// Every kept piece of `job` for the detector to start from (all of
    /// them, marked ranked), oldest window first.
    pub fn replay(&mut self, job: &str) -> Vec<(NodeWindowKey, Signals)> {
        for nodes in self.jobs.get_mut(job).into_iter().flat_map(|w| w.values_mut()) {
            nodes.values_mut().flatten().for_each(|(_, had)| *had = true);
        }
        self.windows(job)
    }

    /// Drops jobs idle for two minutes (checked at most every 10 s).
    pub fn sweep(&mut self, now_us: i64) {
        if now_us < self.swept_at.saturating_add(10_000_000) {
            return;
        }
        self.swept_at = now_us;
        self.jobs.retain(|_, w| w.keys().next_back().is_some_and(|&n| n >= now_us - IDLE_US));
    }

    /// Jobs kept.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(node: &str, w: i64) -> NodeWindowKey {
        NodeWindowKey { job: "j".into(), node: node.into(), window_start_us: w }
    }

    fn sig(launches: f64) -> Signals {
        Signals { launches, window_ns: 1e9, measured: true, ..Default::default() }
    }

    #[test]
    fn the_same_piece_twice_is_a_duplicate_another_piece_is_not() {
        let mut r = Recent::default();
        assert!(r.record(&key("a", 0), &sig(1.0), true));
        assert!(!r.record(&key("a", 0), &sig(1.0), true), "sent again");
        assert!(r.record(&key("a", 0), &sig(2.0), true), "a second piece of the window");
        assert!(!r.record(&key("a", 0), &sig(1.0), true), "the first piece again, after the second");
        assert!(r.record(&key("b", 0), &sig(1.0), true), "another node");
        assert_eq!(r.windows("j").len(), 3);
    }

    #[test]
    fn a_piece_kept_as_standby_is_ranked_once_when_its_job_moves_here() {
        let mut r = Recent::default();
        assert!(!r.record(&key("a", 0), &sig(1.0), false), "standby: kept, not ranked");
        assert!(r.record(&key("a", 0), &sig(1.0), true), "re-routed here as owner: ranked");
        assert!(!r.record(&key("a", 0), &sig(1.0), true), "and only once");
        r.record(&key("a", 1), &sig(1.0), false);
        assert_eq!(r.replay("j").len(), 2);
        assert!(!r.record(&key("a", 1), &sig(1.0), true), "replayed: the detector has it");
    }

    #[test]
    fn keeps_the_newest_thirty_seconds_oldest_first() {
        let mut r = Recent::default();
        for w in (0..60).rev().chain(0..60) {
            r.record(&key("a", w * 1_000_000), &sig(w as f64), true);
        }
        let ws: Vec<i64> = r.windows("j").iter().map(|(k, _)| k.window_start_us / 1_000_000).collect();
        assert_eq!(ws, (29..60).collect::<Vec<_>>());
        r.sweep(59_000_000 + IDLE_US);
        assert_eq!(r.len(), 1, "idle exactly two minutes: kept");
        r.sweep(59_000_001 + IDLE_US + 10_000_000);
        assert!(r.is_empty(), "idle longer: dropped");
    }
}
