// SPDX-License-Identifier: Apache-2.0
//! Signal tier rows fed to the detector bin by bin, in time order, so only a
//! few bins are pending at once (a day of 10,000 nodes would not fit
//! otherwise). Job and node names are interned once per batch dictionary:
//! a 10,000-node hour is 3.6 M rows, and hashing two strings per row was a
//! third of the ranking.

use super::detector::Detector;
use super::overlap::Overlap;
use super::signals::{NodeWindowKey, Signals};
use crate::error::Result;
use arrow::array::{Array, RecordBatch};
use ingero_store::tiers::TierBatch;

/// The (job, node) pairs seen so far, numbered densely.
#[derive(Default)]
struct Names<'a> {
    jobs: Vec<&'a str>,
    nodes: Vec<&'a str>,
    /// Pair id by job id, then node id (`u32::MAX`: not seen yet).
    pair_of: Vec<Vec<u32>>,
    /// (job id, node id) of each pair.
    pairs: Vec<(u32, u32)>,
    job_ids: ahash::AHashMap<&'a str, u32>,
    node_ids: ahash::AHashMap<&'a str, u32>,
}

impl<'a> Names<'a> {
    fn id(ids: &mut ahash::AHashMap<&'a str, u32>, names: &mut Vec<&'a str>, name: &'a str) -> u32 {
        *ids.entry(name).or_insert_with(|| {
            names.push(name);
            names.len() as u32 - 1
        })
    }

    /// The pair id of each row of `t` (`None`: another job than `only`).
    fn rows(&mut self, t: &TierBatch<'a>, only: Option<&str>) -> Vec<Option<u32>> {
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
                let (j, n) = (job_ids[jk]?, node_ids[nk]);
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
                Some(row[n as usize])
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

/// Replays `batches` (one signal tier) over `range` into the detector at
/// `bin_us` bins.
pub(super) fn replay(
    det: &mut Detector,
    overlap: &mut Overlap,
    batches: &[RecordBatch],
    req: &Range<'_>,
    bin_us: i64,
) -> Result<()> {
    let first = req.start_us.div_euclid(bin_us);
    let bins = ((req.end_us - 1).div_euclid(bin_us) - first + 1).max(0) as usize;
    let views: Vec<TierBatch<'_>> = batches.iter().map(TierBatch::new).collect::<ingero_store::Result<_>>()?;
    let mut names = Names::default();
    let mut by_bin: Vec<Vec<(u32, u32, u32)>> = vec![Vec::new(); bins];
    for (bi, t) in views.iter().enumerate() {
        let pairs = names.rows(t, req.job);
        for (i, pair) in pairs.into_iter().enumerate() {
            let w = t.window_start(i);
            let Some(pair) = pair.filter(|_| w >= req.start_us && w < req.end_us) else { continue };
            by_bin[(w.div_euclid(bin_us) - first) as usize].push((pair, bi as u32, i as u32));
        }
    }
    let mut merged: Vec<Option<Signals>> = vec![None; names.pairs.len()];
    let mut touched: Vec<u32> = Vec::new();
    let mut by_job: Vec<Vec<&str>> = vec![Vec::new(); names.jobs.len()];
    for (k, rows) in by_bin.into_iter().enumerate() {
        let bin = (first + k as i64) * bin_us;
        for (pair, bi, i) in rows {
            let s = views[bi as usize].row(i as usize).signals;
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
        touched.sort_unstable();
        for &p in &touched {
            let (j, n) = names.pairs[p as usize];
            by_job[j as usize].push(names.nodes[n as usize]);
        }
        for (j, nodes) in by_job.iter_mut().enumerate().filter(|(_, n)| !n.is_empty()) {
            overlap.bin(names.jobs[j], nodes);
            nodes.clear();
        }
        for p in touched.drain(..) {
            let (j, n) = names.pairs[p as usize];
            let s = merged[p as usize].take().expect("touched pairs hold signals");
            let key = NodeWindowKey {
                job: names.jobs[j as usize].to_string(),
                node: names.nodes[n as usize].to_string(),
                window_start_us: bin,
            };
            det.add(key, &s);
        }
        det.evaluate(bin, 0);
    }
    det.drain();
    Ok(())
}
