// SPDX-License-Identifier: Apache-2.0
//! Scores a detector on a simulated fleet day: every flag onset is a hit
//! (a fault is active on the node, or ended under `TAIL_S` ago), a genuinely
//! slow node, or a false flag; every fault is detected or missed.

use std::collections::HashSet;

use serde::Serialize;

use crate::fleetday::Fault;

/// A flag that starts this soon after its fault ended still counts as the fault's.
const TAIL_S: u64 = 10;

#[derive(Debug)]
pub struct Scorer {
    faults: Vec<Fault>,
    by_node: Vec<Vec<usize>>,
    slow: Vec<bool>,
    detected: Vec<Option<u64>>,
    prev: HashSet<usize>,
    false_flags: Vec<(u64, usize)>,
    true_onsets: u64,
    slow_onsets: u64,
    slow_flagged: HashSet<usize>,
    /// Open false episodes: node → onset second.
    false_open: std::collections::HashMap<usize, u64>,
    /// False episodes that lasted at least `SUSTAINED_S` (what an alert's
    /// `for: 2m` or remediation's evidence would act on).
    false_sustained: usize,
}

/// A false flag held this long is one an alert or remediation would act on.
const SUSTAINED_S: u64 = 120;

/// What `ingero evaluate` publishes.
#[derive(Debug, Clone, Serialize)]
pub struct Score {
    pub nodes: usize,
    pub node_days: f64,
    pub false_flags: usize,
    pub false_flags_per_1000_node_days: f64,
    /// False flags that lasted 2 minutes or more (alerts fire after `for: 2m`).
    pub false_flags_over_2m: usize,
    pub faults: usize,
    pub detected: usize,
    pub recall: f64,
    pub flag_latency_p50_s: Option<u64>,
    pub flag_latency_p90_s: Option<u64>,
    pub flag_latency_max_s: Option<u64>,
    pub slow_nodes: usize,
    pub slow_nodes_flagged: usize,
    /// Flag onsets explained by a fault.
    pub true_onsets: u64,
    /// Missed faults: (node, kind, start s, end s).
    pub missed: Vec<(usize, String, u64, u64)>,
    /// The first false flags: (second, node).
    pub false_flag_examples: Vec<(u64, usize)>,
}

impl Scorer {
    pub fn new(faults: &[Fault], slow: Vec<bool>) -> Scorer {
        let mut by_node = vec![Vec::new(); slow.len()];
        for (i, f) in faults.iter().enumerate() {
            by_node[f.node].push(i);
        }
        Scorer {
            detected: vec![None; faults.len()],
            faults: faults.to_vec(),
            by_node,
            slow,
            prev: HashSet::new(),
            false_flags: Vec::new(),
            true_onsets: 0,
            slow_onsets: 0,
            slow_flagged: HashSet::new(),
            false_open: Default::default(),
            false_sustained: 0,
        }
    }

    /// The nodes flagged after second `t` was judged.
    pub fn observe(&mut self, t: u64, flagged: HashSet<usize>) {
        for &n in &flagged {
            let mut explained = false;
            for &fi in &self.by_node[n] {
                let f = &self.faults[fi];
                if f.start_s <= t && t <= f.end_s + TAIL_S {
                    explained = true;
                    self.detected[fi].get_or_insert(t - f.start_s);
                }
            }
            if self.prev.contains(&n) {
                continue;
            }
            if explained {
                self.true_onsets += 1;
            } else if self.slow[n] {
                self.slow_onsets += 1;
                self.slow_flagged.insert(n);
            } else {
                self.false_flags.push((t, n));
                self.false_open.insert(n, t);
            }
        }
        let mut sustained = 0;
        self.false_open.retain(|n, since| {
            let open = flagged.contains(n) && t - *since < SUSTAINED_S;
            if flagged.contains(n) && t - *since >= SUSTAINED_S {
                sustained += 1;
            }
            open
        });
        self.false_sustained += sustained;
        self.prev = flagged;
    }

    /// `in_job(fault)`: the fault's node ran a job for part of it (a fault
    /// on an idle or preempted node cannot be seen, and is not counted).
    pub fn finish(self, nodes: usize, seconds: u64, in_job: impl Fn(usize) -> bool) -> Score {
        let node_days = nodes as f64 * seconds as f64 / 86_400.0;
        let counted: Vec<usize> = (0..self.faults.len()).filter(|&i| in_job(i)).collect();
        let mut lat: Vec<u64> = counted.iter().filter_map(|&i| self.detected[i]).collect();
        lat.sort_unstable();
        let q = |p: f64| (!lat.is_empty()).then(|| lat[((lat.len() - 1) as f64 * p).round() as usize]);
        let missed = counted
            .iter()
            .filter(|&&i| self.detected[i].is_none())
            .map(|&i| {
                let f = &self.faults[i];
                (f.node, f.kind.name().to_string(), f.start_s, f.end_s)
            })
            .collect();
        Score {
            nodes,
            node_days,
            false_flags: self.false_flags.len(),
            false_flags_per_1000_node_days: self.false_flags.len() as f64 * 1000.0 / node_days.max(f64::MIN_POSITIVE),
            false_flags_over_2m: self.false_sustained,
            faults: counted.len(),
            detected: lat.len(),
            recall: if counted.is_empty() { 1.0 } else { lat.len() as f64 / counted.len() as f64 },
            flag_latency_p50_s: q(0.5),
            flag_latency_p90_s: q(0.9),
            flag_latency_max_s: lat.last().copied(),
            slow_nodes: self.slow.iter().filter(|s| **s).count(),
            slow_nodes_flagged: self.slow_flagged.len(),
            true_onsets: self.true_onsets,
            missed,
            false_flag_examples: self.false_flags.iter().take(20).copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::FaultKind;

    #[test]
    fn onsets_are_hits_slow_nodes_or_false_flags() {
        let faults = [
            Fault { node: 1, kind: FaultKind::Cpu, start_s: 100, end_s: 200 },
            Fault { node: 2, kind: FaultKind::Io, start_s: 100, end_s: 200 },
        ];
        let mut s = Scorer::new(&faults, vec![false, false, false, true]);
        let set = |v: &[usize]| v.iter().copied().collect::<HashSet<usize>>();
        s.observe(50, set(&[0])); // false
        s.observe(51, set(&[0])); // same episode
        s.observe(104, set(&[1, 3])); // hit after 4 s; slow node
        s.observe(205, set(&[1])); // still the fault's (tail)
        s.observe(300, set(&[1])); // continuing: not an onset
        s.observe(400, set(&[])); //
        s.observe(401, set(&[1])); // new onset, no fault: false
        let sc = s.finish(4, 86_400, |_| true);
        assert_eq!((sc.false_flags, sc.true_onsets, sc.slow_nodes_flagged), (2, 1, 1));
        assert_eq!((sc.faults, sc.detected), (2, 1));
        assert_eq!(sc.flag_latency_p50_s, Some(4));
        assert_eq!(sc.missed, [(2, "io".to_string(), 100, 200)]);
        assert!((sc.false_flags_per_1000_node_days - 500.0).abs() < 1e-9);
    }
}
