// SPDX-License-Identifier: Apache-2.0
//! Outlier thresholds: the duration past which a call's stack is captured.
//!
//! Per process and op: `--outlier-factor` × the process's own median for
//! that op, never below `--outlier-min`. The median is a quantile of the
//! process's latency histogram over its last ~10–20k calls, so a handful of
//! slow calls cannot move it, and no process's calls move another's. A
//! process without a baseline yet (fewer than `MIN_BASELINE` calls of the op)
//! is held to the floor alone: its first slow calls are caught too, whichever
//! process started first. `--outlier-abs` replaces all of it with one value.

use std::collections::HashMap;

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use ingero_model::hist::Histogram;

use crate::loop_config::LoopConfig;
use crate::probes::abi::CallKey;
use crate::probes::drain;
use crate::probes::load::{Probes, map};
use crate::probes::ops;
use crate::probes::unpreempted::Unpreempted;

/// Calls of an op a process makes before its own median counts.
const MIN_BASELINE: u64 = 20;
/// A baseline past this many calls is halved: it follows the process's
/// recent calls (a phase change moves it within ~10–20k calls).
const HALVE_AT: u64 = 20_000;
/// Processes × ops with a baseline (the kernel map holds 8192; the rest
/// stay on the floor). Each is a dense histogram of ~2 KiB.
const MAX_BASELINES: usize = 4096;

/// What the agent keeps to set each process's thresholds.
#[derive(Default)]
pub(crate) struct Baselines {
    hist: HashMap<CallKey, Histogram>,
    /// The value in the kernel map, per key (written only when it changes).
    written: HashMap<CallKey, u64>,
    /// The per-op floor is in the kernel's array.
    floor_written: bool,
}

impl Baselines {
    /// Adds a window's latency histograms and sets the thresholds they imply.
    pub(crate) fn update(&mut self, probes: &mut Probes, d: &drain::Drained, cfg: &LoopConfig) {
        let _rt = Unpreempted::for_maps(&probes.features);
        let floor = cfg.outlier_min.as_nanos() as u64;
        if !self.floor_written {
            let per_op = cfg.outlier_abs.map_or(floor, |a| a.as_nanos() as u64);
            let Ok(mut thr): Result<Array<&mut MapData, u64>, _> = map(&mut probes.ebpf, "thresholds") else {
                return;
            };
            for op in ops::all().iter().filter(|o| o.timed) {
                let _ = thr.set(op.id as u32, per_op, 0);
            }
            self.floor_written = true;
        }
        if cfg.outlier_abs.is_some() {
            return;
        }
        let timed: Vec<bool> = ops::all().iter().map(|o| o.timed).collect();
        let Ok(mut m): Result<BpfHashMap<&mut MapData, CallKey, u64>, _> = map(&mut probes.ebpf, "proc_thresholds")
        else {
            return;
        };
        for (k, v) in &d.calls {
            if !timed.get(k.op as usize).copied().unwrap_or(false) {
                continue;
            }
            let key = CallKey { tgid: k.tgid, op: k.op };
            let Some(t) = self.add(key, &v.hist, cfg.outlier_factor, floor) else { continue };
            if self.written.get(&key) != Some(&t) && m.insert(key, t, 0).is_ok() {
                self.written.insert(key, t);
            }
        }
    }

    /// Adds one window's histogram of a process's op; its threshold once
    /// the process has a baseline.
    fn add(&mut self, key: CallKey, window: &[u32], factor: f64, floor: u64) -> Option<u64> {
        if !self.hist.contains_key(&key) && self.hist.len() >= MAX_BASELINES {
            return None;
        }
        let h = self.hist.entry(key).or_default();
        for (i, &n) in window.iter().enumerate() {
            if n > 0 {
                h.add(i as u8, n as u64);
            }
        }
        if h.total() > HALVE_AT {
            *h = halved(h);
        }
        if h.total() < MIN_BASELINE {
            return None;
        }
        h.quantile(0.5).map(|m| ((m as f64 * factor) as u64).max(floor))
    }

    /// Drops a process's baselines and its thresholds in the kernel (exit,
    /// exec: a new image is a new program).
    pub(crate) fn forget(&mut self, ebpf: &mut aya::Ebpf, tgid: u32) {
        self.hist.retain(|k, _| k.tgid != tgid);
        let gone: Vec<CallKey> = self.written.keys().filter(|k| k.tgid == tgid).copied().collect();
        if gone.is_empty() {
            return;
        }
        if let Ok(mut m) = map::<BpfHashMap<&mut MapData, CallKey, u64>>(ebpf, "proc_thresholds") {
            for k in &gone {
                let _ = m.remove(k);
            }
        }
        for k in gone {
            self.written.remove(&k);
        }
    }

    /// Processes × ops with a baseline now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.hist.len()
    }
}

fn halved(h: &Histogram) -> Histogram {
    let (b, c) = h.sparse();
    let c: Vec<u64> = c.iter().map(|n| n.div_ceil(2)).collect();
    Histogram::from_sparse(&b, &c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingero_model::hist::{BUCKETS, bucket};

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    fn window(calls: &[(u64, u32)]) -> Vec<u32> {
        let mut w = vec![0u32; BUCKETS];
        for &(d, n) in calls {
            w[bucket(d) as usize] += n;
        }
        w
    }

    fn key(tgid: u32) -> CallKey {
        CallKey { tgid, op: 7 }
    }

    #[test]
    fn no_threshold_of_its_own_before_a_baseline_then_n_times_its_median() {
        let mut b = Baselines::default();
        assert_eq!(b.add(key(1), &window(&[(100 * US, 19)]), 10.0, MS), None, "19 calls: the floor holds");
        let t = b.add(key(1), &window(&[(100 * US, 1)]), 10.0, MS).unwrap();
        assert!((1_000 * US..=1_100 * US).contains(&t), "10 x ~100 us: {t}");
    }

    #[test]
    fn a_handful_of_slow_calls_do_not_move_a_process_baseline() {
        let mut b = Baselines::default();
        b.add(key(1), &window(&[(200 * US, 500)]), 10.0, MS);
        let t = b.add(key(1), &window(&[(700 * MS, 16), (200 * US, 10)]), 10.0, MS).unwrap();
        assert!(t < 2_300 * US, "16 calls of 700 ms among 510: still ~10 x 200 us, got {t}");
    }

    #[test]
    fn one_process_never_moves_another_ones_threshold() {
        let mut b = Baselines::default();
        let slow = b.add(key(1), &window(&[(60 * MS, 50)]), 10.0, MS).unwrap();
        assert!(slow >= 600 * MS);
        let fast = b.add(key(2), &window(&[(50 * US, 50)]), 10.0, MS).unwrap();
        assert_eq!(fast, MS, "10 x 50 us is under the floor: the floor");
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn a_long_baseline_follows_recent_calls() {
        let mut b = Baselines::default();
        b.add(key(1), &window(&[(100 * US, 30_000)]), 10.0, 0);
        // After a phase change the process's calls take 10 ms: within a few
        // halvings (~40k calls) its median is the new one.
        let mut t = 0;
        for _ in 0..8 {
            t = b.add(key(1), &window(&[(10 * MS, 10_000)]), 10.0, 0).unwrap();
        }
        assert!(t >= 90 * MS, "{t}");
        assert!(b.hist[&key(1)].total() <= HALVE_AT);
    }
}
