// SPDX-License-Identifier: Apache-2.0
//! Hung ranks. When a job stops progressing, every rank but one waits in a
//! device sync or a collective for its peers, while the one they wait for
//! is elsewhere: blocked in host code with no call in flight, inside a
//! different call, or gone. The agents ship, per process and window, the
//! call in flight longest and its age (`progress_windows`); once the
//! waiters' calls are older than the threshold, the node holding the rank
//! that is *not* waiting where they wait is named, with what it is doing.

use std::collections::BTreeMap;

pub use super::progress::ProcProgress;
use super::progress::secs;
use super::signals::Signals;
use super::standing::Deviation;

/// A node holding a rank the others wait for.
#[derive(Debug, Clone)]
pub struct Culprit {
    /// Index into the nodes given.
    pub node: usize,
    /// Read by the report's hung-rank chain.
    pub proc: ProcProgress,
    pub dev: Deviation,
}

/// The nodes of one job-window holding the ranks the others wait for, with
/// the explanation. Empty while nobody has waited `after_ns`, or when every
/// rank waits alike (nothing to name from the hosts).
pub fn culprits(after_ns: f64, nodes: &[(&String, &Signals)]) -> Vec<Culprit> {
    let mut ops: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for (_, s) in nodes {
        for p in &s.procs {
            if let (Some(op), Some(age)) = (p.op.as_deref(), p.age_ns)
                && age as f64 >= after_ns
            {
                let e = ops.entry(op).or_default();
                e.0 += 1;
                e.1 = e.1.max(age as f64);
            }
        }
    }
    // Where most of the ranks wait.
    let Some((op, (waiters, longest))) = ops.into_iter().max_by_key(|(_, (n, _))| *n) else { return vec![] };
    let waiting = |s: &Signals| !s.procs.is_empty() && s.procs.iter().all(|p| p.waits_in(op, after_ns));
    let waiting_nodes = nodes.iter().filter(|(_, s)| waiting(s)).count();
    if waiting_nodes == 0 {
        return vec![];
    }
    let mut out = Vec::new();
    for (i, (_, s)) in nodes.iter().enumerate() {
        if s.procs.is_empty() || waiting(s) {
            continue;
        }
        let Some(p) = s.procs.iter().find(|p| !p.waits_in(op, after_ns)) else { continue };
        let text = format!(
            "job stuck: {} is {}; {waiters} rank(s) on {waiting_nodes} other node(s) have waited up to {} in {op} for it",
            p.who(),
            p.doing(),
            secs(longest)
        );
        let dev = Deviation { signal: "stuck".into(), value: longest / 1e9, job_median: 0.0, z: 0.0, text };
        out.push(Culprit { node: i, proc: p.clone(), dev });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: u32, op: Option<&str>, age_s: f64) -> ProcProgress {
        ProcProgress {
            pid,
            rank: Some(pid as i32),
            comm: "python3".into(),
            threads_in_call: op.is_some() as u32,
            op: op.map(String::from),
            age_ns: op.map(|_| (age_s * 1e9) as u64),
            last_call_age_ns: Some(41_000_000_000),
            state: Some("S".into()),
            ..Default::default()
        }
    }

    fn sig(procs: Vec<ProcProgress>) -> Signals {
        Signals { procs, window_ns: 1e9, ..Default::default() }
    }

    #[test]
    fn names_the_rank_the_others_wait_for() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let sigs = [
            sig(vec![proc(0, Some("cudaStreamSynchronize"), 40.0)]),
            sig(vec![proc(1, None, 0.0)]),
            sig(vec![proc(2, Some("cudaStreamSynchronize"), 39.0)]),
        ];
        let nodes: Vec<(&String, &Signals)> = names.iter().zip(sigs.iter()).collect();
        let c = culprits(30e9, &nodes);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].node, c[0].proc.pid), (1, 1));
        let t = &c[0].dev.text;
        assert!(
            t.contains(
                "rank 1 (pid 1, python3) is in host code, no CUDA/NCCL call in flight, last call 41s ago (sleeping)"
            ),
            "{t}"
        );
        assert!(t.contains("2 rank(s) on 2 other node(s) have waited up to 40s in cudaStreamSynchronize"), "{t}");
        // Before the threshold, or when all wait alike, nobody is named.
        assert!(culprits(45e9, &nodes).is_empty());
        let all = [sigs[0].clone(), sigs[2].clone()];
        let nodes: Vec<(&String, &Signals)> = names.iter().zip(all.iter()).collect();
        assert!(culprits(30e9, &nodes).is_empty());
    }

    #[test]
    fn a_rank_inside_another_call_is_the_one_waited_for() {
        let names: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        let sigs =
            [sig(vec![proc(0, Some("cudaStreamSynchronize"), 35.0)]), sig(vec![proc(1, Some("cudaMemcpy"), 36.0)])];
        let nodes: Vec<(&String, &Signals)> = names.iter().zip(sigs.iter()).collect();
        let c = culprits(30e9, &nodes);
        // One waits in each: the tie goes to the op named first; either way
        // exactly one node is named and its text says what it is inside.
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].dev.text.contains("is inside"), "{:?}", c[0].dev.text);
    }
}
