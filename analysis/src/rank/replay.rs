// SPDX-License-Identifier: Apache-2.0
//! Signal tier rows fed to the detector bin by bin, in time order. Pieces of
//! the tier arrive one file at a time ([`Replay::push`]); a bin is judged as
//! soon as no later piece can hold rows of it ([`Replay::judge_before`]), so
//! only a file's bins are pending at once (a 10,000-node hour is 3.6 M rows).
//! Job and node names are interned once per batch dictionary: hashing two
//! strings per row was a third of the ranking.

use std::collections::{BTreeSet, HashSet};

use super::detector::Detector;
use super::hung::Procs;
use super::overlap::Overlap;
use super::signals::Signals;
use crate::error::Result;
use arrow::array::{Array, RecordBatch};
use ingero_store::tiers::{RawSignals, TierBatch};

/// The (job, node) pairs seen so far, numbered densely.
#[derive(Default)]
struct Names {
    jobs: Vec<String>,
    nodes: Vec<String>,
    /// Pair id by job id, then node id (`u32::MAX`: not seen yet).
    pair_of: Vec<Vec<u32>>,
    /// (job id, node id) of each pair.
    pairs: Vec<(u32, u32)>,
    job_ids: ahash::AHashMap<String, u32>,
    node_ids: ahash::AHashMap<String, u32>,
}

impl Names {
    fn id(ids: &mut ahash::AHashMap<String, u32>, names: &mut Vec<String>, name: &str) -> u32 {
        if let Some(&id) = ids.get(name) {
            return id;
        }
        names.push(name.to_string());
        ids.insert(name.to_string(), names.len() as u32 - 1);
        names.len() as u32 - 1
    }

    fn pair(&mut self, j: u32, n: u32) -> u32 {
        if self.pair_of.len() <= j as usize {
            self.pair_of.resize(j as usize + 1, Vec::new());
        }
        let row = &mut self.pair_of[j as usize];
        if row.len() <= n as usize {
            row.resize(n as usize + 1, u32::MAX);
        }
        if row[n as usize] == u32::MAX {
            row[n as usize] = self.pairs.len() as u32;
            self.pairs.push((j, n));
        }
        row[n as usize]
    }

    /// The pair id of each row of `t` (`None`: another job than `only`).
    fn rows(&mut self, t: &TierBatch<'_>, only: Option<&str>) -> Vec<Option<u32>> {
        let (jobs, nodes) = t.names();
        let job_ids: Vec<Option<u32>> = (0..jobs.len())
            .map(|k| Some(jobs.value(k)).filter(|j| only.is_none_or(|o| o == *j)))
            .map(|j| j.map(|j| Self::id(&mut self.job_ids, &mut self.jobs, j)))
            .collect();
        let node_ids: Vec<u32> =
            (0..nodes.len()).map(|k| Self::id(&mut self.node_ids, &mut self.nodes, nodes.value(k))).collect();
        (0..t.len())
            .map(|i| {
                let (jk, nk) = t.name_keys(i);
                Some(self.pair(job_ids[jk]?, node_ids[nk]))
            })
            .collect()
    }
}

/// What a replay covers: rows in [start, end), of one job or all.
pub(super) struct Range<'r> {
    pub(super) start_us: i64,
    pub(super) end_us: i64,
    pub(super) job: Option<&'r str>,
}

/// A replay of one signal tier over a range at `bin_us` bins.
pub(super) struct Replay<'r> {
    range: Range<'r>,
    bin_us: i64,
    /// Index of the range's first bin (bin start / `bin_us`).
    first: i64,
    bins: usize,
    /// Bins before this one are judged.
    next: usize,
    names: Names,
    /// Rows of each bin not yet judged, copied out in row order: a bin's
    /// rows are strided across its batch (rows are sorted by node), so
    /// reading them bin by bin from the batch missed the cache every row.
    pending: Vec<Vec<(u32, RawSignals)>>,
    hangs: Hangs,
}

/// Job-bins in which a call had been in flight `after_ns` (hung-rank
/// candidates, `super::hung`), and the processes read for them.
struct Hangs {
    after_ns: u64,
    /// (job id, bin start) to read, not read yet.
    wanted: BTreeSet<(u32, i64)>,
    asked: HashSet<(u32, i64)>,
    procs: Procs,
}

impl<'r> Replay<'r> {
    pub(super) fn new(range: Range<'r>, bin_us: i64) -> Self {
        let first = range.start_us.div_euclid(bin_us);
        let bins = ((range.end_us - 1).div_euclid(bin_us) - first + 1).max(0) as usize;
        let pending = vec![Vec::new(); bins];
        let hangs = Hangs { after_ns: u64::MAX, wanted: BTreeSet::new(), asked: HashSet::new(), procs: Procs::new() };
        Replay { range, bin_us, first, bins, next: 0, names: Names::default(), pending, hangs }
    }

    /// Notes the job-bins in which a call had been in flight `after_ns`
    /// ([`Self::take_wanted`]).
    pub(super) fn watching_hangs(mut self, after_ns: u64) -> Self {
        self.hangs.after_ns = after_ns;
        self
    }

    /// The (job, bin start) pairs noted since the last call.
    pub(super) fn take_wanted(&mut self) -> BTreeSet<(String, i64)> {
        let h = &mut self.hangs;
        h.asked.extend(h.wanted.iter().copied());
        std::mem::take(&mut h.wanted).into_iter().map(|(j, bin)| (self.names.jobs[j as usize].clone(), bin)).collect()
    }

    /// Processes to judge with their node's signals in their bin.
    pub(super) fn attach(&mut self, procs: Procs) {
        self.hangs.procs.extend(procs);
    }

    /// Takes the range's rows of `batches` (any order; a row of a judged
    /// bin is too late and is dropped, as live).
    pub(super) fn push(&mut self, batches: &[RecordBatch]) -> Result<()> {
        for b in batches {
            let t = TierBatch::new(b)?;
            let pairs = self.names.rows(&t, self.range.job);
            let bins: Vec<Option<usize>> = (0..t.len())
                .map(|i| {
                    let w = t.window_start(i);
                    let k = (w.div_euclid(self.bin_us) - self.first) as usize;
                    (pairs[i].is_some() && w >= self.range.start_us && w < self.range.end_us && k >= self.next)
                        .then_some(k)
                })
                .collect();
            // Sized first: growing a 10,000-row bin by doubling moved it twice.
            let lo = bins.iter().flatten().copied().min().unwrap_or(0);
            let mut counts = vec![0usize; bins.iter().flatten().map(|k| k + 1 - lo).max().unwrap_or(0)];
            bins.iter().flatten().for_each(|&k| counts[k - lo] += 1);
            for (k, n) in counts.into_iter().enumerate().filter(|c| c.1 > 0) {
                self.pending[lo + k].reserve(n);
            }
            for (i, k) in bins.into_iter().enumerate() {
                if let (Some(k), Some(pair)) = (k, pairs[i]) {
                    self.pending[k].push((pair, t.raw(i)));
                    if t.in_call_age(i).is_some_and(|a| a >= self.hangs.after_ns) {
                        let key = (self.names.pairs[pair as usize].0, (self.first + k as i64) * self.bin_us);
                        if !self.hangs.asked.contains(&key) {
                            self.hangs.wanted.insert(key);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Judges, in order, every bin that ends by `until_us`.
    pub(super) fn judge_before(&mut self, det: &mut Detector, overlap: &mut Overlap, until_us: i64) {
        let mut merged: Vec<Option<Signals>> = vec![None; self.names.pairs.len()];
        let mut touched: Vec<u32> = Vec::new();
        let mut by_job: Vec<Vec<&str>> = vec![Vec::new(); self.names.jobs.len()];
        while self.next < self.bins {
            let bin = (self.first + self.next as i64) * self.bin_us;
            if bin.saturating_add(self.bin_us) > until_us {
                break;
            }
            for (pair, raw) in std::mem::take(&mut self.pending[self.next]) {
                let s = raw.signals();
                match &mut merged[pair as usize] {
                    Some(e) => {
                        // Rows of one node-bin cover parts of it: their windows add up.
                        let covered = e.window_ns + s.window_ns;
                        e.merge(&s);
                        e.window_ns = covered;
                    }
                    slot @ None => {
                        *slot = Some(s);
                        touched.push(pair);
                    }
                }
            }
            self.next += 1;
            touched.sort_unstable();
            let names = &self.names;
            for &p in &touched {
                let (j, n) = names.pairs[p as usize];
                by_job[j as usize].push(&names.nodes[n as usize]);
            }
            for (j, nodes) in by_job.iter_mut().enumerate().filter(|(_, n)| !n.is_empty()) {
                overlap.bin(&names.jobs[j], nodes);
                nodes.clear();
            }
            for p in touched.drain(..) {
                let (j, n) = names.pairs[p as usize];
                let mut s = merged[p as usize].take().expect("touched pairs hold signals");
                let (job, node) = (&names.jobs[j as usize], &names.nodes[n as usize]);
                if !self.hangs.procs.is_empty()
                    && let Some(procs) = self.hangs.procs.remove(&(job.clone(), node.clone(), bin))
                {
                    s.procs = procs;
                }
                det.add_signals(job, node.clone(), bin, s);
            }
            det.evaluate(bin, 0);
        }
    }

    /// Judges every bin left, then everything the detector holds.
    pub(super) fn finish(mut self, det: &mut Detector, overlap: &mut Overlap) {
        self.judge_before(det, overlap, i64::MAX);
        det.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::detector::DetectorConfig;
    use crate::rank::signals::NodeWindowKey;
    use ingero_store::tiers::{self, Tier};

    /// 1-s tier rows of a 6-node job over `secs`, node-3 waiting far less
    /// in its syncs than its peers from 20 s on (a straggler), as one batch
    /// per 15 s.
    fn pieces(secs: i64) -> Vec<(i64, RecordBatch)> {
        let t0 = 1_795_870_800_000_000;
        let mut out = Vec::new();
        for from in (0..secs).step_by(15) {
            let sigs: Vec<(NodeWindowKey, Signals)> = (from..(from + 15).min(secs))
                .flat_map(|t| (0..6).map(move |n| (t, n)))
                .map(|(t, n)| {
                    let key = NodeWindowKey {
                        job: "j".into(),
                        node: format!("node-{n}"),
                        window_start_us: t0 + t * 1_000_000,
                    };
                    let wait = if n == 3 && t >= 20 { 0.05e9 } else { 0.5e9 + n as f64 * 1e6 };
                    let s = Signals {
                        window_ns: 1e9,
                        wait_ns: wait,
                        oncpu_ns: 0.4e9,
                        threads: 1.0,
                        measured: true,
                        ..Default::default()
                    };
                    (key, s)
                })
                .collect();
            let b = tiers::build(&sigs).unwrap().into_iter().find(|(t, _, _)| *t == Tier::Window).unwrap().2;
            out.push((t0 + (from + 15) * 1_000_000, b));
        }
        out
    }

    fn outcome(det: &Detector) -> (Vec<(String, bool, i64)>, usize) {
        let st = det.standings(None, 0.0).into_iter().map(|s| (s.node, s.flagged, (s.score * 10.0) as i64)).collect();
        (st, det.timelines(None).iter().map(|t| t.2.len()).sum())
    }

    #[test]
    fn a_replay_fed_file_by_file_judges_as_one_fed_whole() {
        let batches = pieces(90);
        let (start_us, end_us) = (batches[0].0 - 15_000_000, batches.last().unwrap().0);
        let cfg = DetectorConfig { timeline: true, ..Default::default() };
        let range = || Range { start_us, end_us, job: None };

        let (mut whole, mut ov) = (Detector::new(cfg.clone()), Overlap::default());
        let mut r = Replay::new(range(), 1_000_000);
        r.push(&batches.iter().map(|b| b.1.clone()).collect::<Vec<_>>()).unwrap();
        r.finish(&mut whole, &mut ov);

        let (mut piecewise, mut ov) = (Detector::new(cfg), Overlap::default());
        let mut r = Replay::new(range(), 1_000_000);
        for (until, b) in &batches {
            r.push(std::slice::from_ref(b)).unwrap();
            r.judge_before(&mut piecewise, &mut ov, *until);
            // Everything before this piece's end is judged already.
            assert_eq!(r.next as i64, (until - start_us) / 1_000_000);
        }
        r.finish(&mut piecewise, &mut ov);

        let (st, points) = outcome(&whole);
        assert_eq!(points, 6 * 90, "every node-second judged once");
        assert_eq!(st[0].0, "node-3", "{st:?}");
        assert!(st[0].1, "the straggler is flagged: {st:?}");
        assert_eq!(outcome(&piecewise), (st, points));
    }
}
