// SPDX-License-Identifier: Apache-2.0
//! Counts of duty-cycled calls made estimates of the whole window's
//! (`probes::duty`). Seen for a share `r` of the window, a count divided by
//! `r` is unbiased only if the program runs as fast with the probes on as
//! with them off. A launch-bound loop does not: each launch's traps are on
//! its critical path, so it makes fewer launches a second while they are
//! on (measured here: 3× fewer through a stand-in library whose probes the
//! kernel single-steps), and `seen / r` would undercount it by as much.
//!
//! The timed calls (syncs, copies, collectives) are always probed, and each
//! one's return is marked with its time (the marks ring, as steps use): a
//! process's timed calls in the on part against all of them say how much
//! faster it ran with the probes off. A loop makes the same calls each step
//! however fast it runs, so `k` = (timed calls a second, whole window) /
//! (timed calls a second, on part) scales the time estimate: `seen / r × k`.
//! The window's own `k` where its on part holds enough timed calls (they
//! ended the very steps whose launches were seen, so their counts move
//! together); else `k` kept over recent windows (a loop of long steps);
//! without either (no timed calls, marks off or lost) `seen / r`.

use std::collections::HashMap;

use crate::probes::abi::{CallMark, MARK_DUTY_ON, MARK_HALF_B};
use crate::probes::drain::Drained;
use crate::probes::ops;

/// A ratio this close to 1 is the probes on throughout (clock reads apart).
const EXACT: f64 = 0.999;
/// Timed calls in the on parts (decayed sum) before their `k` is used.
const MIN_ON_CALLS: f64 = 16.0;
/// Timed calls in one window's on part before its own `k` is used (they
/// move with the launches seen, so fewer suffice than for the sums).
const MIN_OWN_ON_CALLS: f64 = 8.0;
/// What one window's marks weigh against the sums so far.
const DECAY: f64 = 0.75;
/// `k` beyond these is not a loop's speed-up but noise (a process whose
/// timed calls came in bursts): the time estimate is used instead.
const K_RANGE: (f64, f64) = (0.5, 8.0);

/// Per process, its timed calls in each window, in the on parts and in all.
#[derive(Debug, Default)]
pub(crate) struct Sampling {
    /// The half of the window being closed, once flipped away from: a mark
    /// of the other half is the next window's.
    flip: Option<u32>,
    /// pid → (timed calls while the probes were on, all of them).
    this: HashMap<u32, (u64, u64)>,
    next: HashMap<u32, (u64, u64)>,
    /// pid → decayed sums of (all × r, on) over recent sampled windows.
    speed: HashMap<u32, (f64, f64)>,
}

impl Sampling {
    /// Counts marks (each a timed call's return), in the on parts by the
    /// gate the kernel saw at the return (`MARK_DUTY_ON`): the very gate
    /// the launches were counted through, however late this agent's own
    /// clock reads around its writes were; and in the window whose half of
    /// the aggregates counted them (`MARK_HALF_B`), as the launches are.
    pub(crate) fn note(&mut self, marks: &[CallMark]) {
        for m in marks {
            let half = u32::from(m.flags & MARK_HALF_B != 0);
            let to = if self.flip.is_some_and(|idle| half != idle) { &mut self.next } else { &mut self.this };
            let c = to.entry(m.tgid).or_default();
            c.0 += u64::from(m.flags & MARK_DUTY_ON != 0);
            c.1 += 1;
        }
    }

    /// The window's flip away from half `idle`.
    pub(crate) fn flipped(&mut self, idle: u32) {
        self.flip = Some(idle);
    }

    pub(crate) fn forget(&mut self, pid: u32) {
        self.speed.remove(&pid);
    }

    /// Makes the window's counts of duty-cycled ops (and the driver calls
    /// nested in them) estimates of the whole window's, seen while the
    /// probes were on for `ratio` of it; `marks_whole`: no mark was lost.
    /// Returns, per process sampled, the share of its calls seen (counts are
    /// what was seen divided by it); empty when the probes were on throughout.
    pub(crate) fn estimate(&mut self, d: &mut Drained, ratio: f64, marks_whole: bool) -> HashMap<u32, f64> {
        let timed = std::mem::replace(&mut self.this, std::mem::take(&mut self.next));
        self.flip = None;
        if ratio >= EXACT {
            return HashMap::new();
        }
        for (&pid, &(on, all)) in timed.iter().filter(|_| marks_whole) {
            let s = self.speed.entry(pid).or_default();
            *s = (s.0 * DECAY + all as f64 * ratio, s.1 * DECAY + on as f64);
        }
        let probed = ops::all();
        let mut shares: HashMap<u32, f64> = HashMap::new();
        let speed = &self.speed;
        let mut share_of = |pid: u32| {
            *shares.entry(pid).or_insert_with(|| {
                // The window's own timed calls, where it has enough: the
                // launches seen came in the very steps those calls ended.
                let own = timed.get(&pid).filter(|t| marks_whole && t.0 as f64 >= MIN_OWN_ON_CALLS);
                let k = match own {
                    Some(&(on, all)) => all as f64 * ratio / on as f64,
                    None => speed.get(&pid).filter(|s| s.1 >= MIN_ON_CALLS).map_or(1.0, |s| s.0 / s.1),
                };
                let share = if (K_RANGE.0..=K_RANGE.1).contains(&k) { ratio / k } else { ratio };
                tracing::debug!(pid, ratio, ?own, k, share, marks_whole, "sampled share");
                share
            })
        };
        for (key, v) in &mut d.calls {
            if probed.get(key.op as usize).is_some_and(|o| o.duty_cycled()) {
                v.count = scaled(v.count, share_of(key.tgid));
            }
        }
        for (&pid, n) in &mut d.nested {
            *n = scaled(*n, share_of(pid));
        }
        shares
    }
}

/// `n` seen of a share `share`: the estimate of all. None seen at all (a
/// flip held off past a whole cycle) estimates nothing.
fn scaled(n: u64, share: f64) -> u64 {
    if share > 0.0 { (n as f64 / share).round() as u64 } else { n }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::abi::{CallKey, CallVal, HIST_BUCKETS};

    fn row(tgid: u32, op: &str, count: u64) -> (CallKey, CallVal) {
        let op = ops::all().iter().find(|o| o.symbol == op).unwrap().id as u32;
        (CallKey { tgid, op }, CallVal { count, errors: 0, total_ns: 0, max_ns: 0, hist: [0; HIST_BUCKETS] })
    }

    /// A timed call's return; `on`: the gate was open then. Windows of 1 s
    /// from 0, counted in halves a, b, a, …
    fn mark(tgid: u32, ts_ns: u64, on: bool) -> CallMark {
        let half = if (ts_ns / 1_000_000_000) % 2 == 1 { MARK_HALF_B } else { 0 };
        CallMark { ts_ns, dur_ns: 0, tgid, tid: tgid, op: 0, flags: half | if on { MARK_DUTY_ON } else { 0 } }
    }

    fn window(launches: u64, nested: u64) -> Drained {
        Drained {
            calls: vec![
                row(7, "cudaLaunchKernel", launches),
                row(7, "cudaStreamSynchronize", 100),
                row(7, "ncclGroupStart", 3),
            ],
            nested: [(7, nested)].into(),
            ..Drained::default()
        }
    }

    #[test]
    fn only_duty_cycled_counts_are_scaled_and_on_throughout_is_exact() {
        let mut s = Sampling::default();
        let mut d = window(250, 251);
        assert!(s.estimate(&mut d, 1.0, true).is_empty());
        assert_eq!(d.calls[0].1.count, 250, "on throughout: exact, untouched");
        // No timed calls marked: the time estimate.
        let shares = s.estimate(&mut d, 0.25, true);
        assert_eq!(shares, [(7, 0.25)].into());
        let counts: Vec<u64> = d.calls.iter().map(|c| c.1.count).collect();
        assert_eq!(counts, [1000, 100, 3]);
        assert_eq!(d.nested[&7], 1004);
    }

    #[test]
    fn a_loop_slowed_by_its_probes_is_estimated_at_the_pace_it_keeps_without_them() {
        // On for the middle quarter of each 1-s window. Running, the loop
        // makes a sync every 10 ms; with the probes on, every 30 ms (its
        // launches' traps), so the quarter sees 8 syncs, not 25, and a
        // third of the launches the same time makes off.
        let mut s = Sampling::default();
        let on = |ts: u64| (ts % 1_000_000_000) >= 375_000_000 && (ts % 1_000_000_000) < 625_000_000;
        let mut est = Vec::new();
        for w in 0..6u64 {
            let base = w * 1_000_000_000;
            let m = |ts| mark(7, ts, on(ts));
            let mut marks: Vec<CallMark> = (0..8).map(|i| m(base + 380_000_000 + i * 30_000_000)).collect();
            // Off: a sync every 10 ms; the one at the window's start was
            // read before the last window closed.
            marks.extend((1..100).map(|i| m(base + i * 10_000_000)).filter(|m| !on(m.ts_ns)));
            s.note(&marks);
            s.flipped((w % 2) as u32);
            s.note(&[m(base + 1_000_000_000)]);
            // 8 steps seen of 83 made, 100 launches each.
            let mut d = window(800, 0);
            let shares = s.estimate(&mut d, 0.25, true);
            est.push((d.calls[0].1.count, shares[&7]));
        }
        // Real: 83 steps × 100 = 8,300; the time estimate says 3,200.
        let (n, share) = *est.last().unwrap();
        assert!((n as f64 / 8300.0 - 1.0).abs() < 0.03, "{est:?}");
        assert!((share - 800.0 / 8300.0).abs() < 0.005, "{est:?}");
        // A lost mark keeps what was learnt, and learns nothing from the window.
        let mut d = window(800, 0);
        s.note(&[mark(7, 6_400_000_000, true)]);
        assert!(s.estimate(&mut d, 0.25, false)[&7] < 0.1);
        s.forget(7);
        let mut d = window(800, 0);
        assert_eq!(s.estimate(&mut d, 0.25, true)[&7], 0.25, "forgotten: the time estimate");
    }

    #[test]
    fn a_mark_is_the_window_whose_half_counted_it_however_late_it_is_read() {
        let mut s = Sampling::default();
        s.flipped(0);
        // Returned in half a, read after the flip: this window's; half b: the next's.
        let late = CallMark { flags: MARK_DUTY_ON, ..mark(7, 1_300_000_000, true) };
        s.note(&[late, mark(7, 1_300_000_000, false)]);
        assert_eq!((s.this[&7], s.next[&7]), ((1, 1), (0, 1)));
    }

    #[test]
    fn the_pace_comes_from_the_gate_the_kernel_saw_not_from_the_share_of_time() {
        // The agent's clock said the probes were on for half the window (a
        // read after a gate's write came late); the kernel's marks say 10
        // of the 100 steps ended with the gate open, and those steps' 1,000
        // launches were all that was counted: the estimate is 10,000.
        let mut s = Sampling::default();
        let marks: Vec<CallMark> = (0..100).map(|i| mark(7, i * 10_000_000, (40..50).contains(&i))).collect();
        s.note(&marks);
        s.flipped(0);
        let mut d = window(1000, 0);
        let shares = s.estimate(&mut d, 0.5, true);
        assert_eq!(d.calls[0].1.count, 10_000, "{shares:?}");
    }
}
