// SPDX-License-Identifier: Apache-2.0
//! Finds the step cycle in one thread's sequence of return-probed calls
//! (syncs, copies, collectives, allocations). A training loop makes the
//! same few such calls in the same order every iteration: the sequence of
//! their ops repeats with a period of one step. Pure functions: the state
//! around them lives in `super`.

use super::kinds::{LONG, Split, kind_of, split};
use super::mark::Mark;

/// The longest cycle looked for, in calls: FSDP makes a few collectives per
/// layer, so a step of a deep model can hold hundreds.
pub(crate) const MAX_PERIOD: usize = 256;
/// Cycles needed before a period is believed.
const MIN_CYCLES: usize = 3;
/// Share of calls that must repeat the call one period earlier. A call made
/// every k steps only (logging, a checkpoint) breaks about 1.5 periods in
/// k, so this tolerates extras every 4th step and up; a sequence of ops in
/// no order repeats 1 in (distinct ops).
const MIN_MATCH: f64 = 0.6;
/// Share of a candidate's time that its typical intervals must hold: the
/// copies at the start of a step repeat once per call but leave the step's
/// time to one long gap; a step's end splits time evenly.
const EVEN_TIME: f64 = 0.6;

/// Share of calls that repeat the call `p` calls earlier.
fn repeats(ops: &[u16], p: usize) -> f64 {
    let same = (p..ops.len()).filter(|&i| ops[i] == ops[i - p]).count();
    same as f64 / (ops.len() - p) as f64
}

/// The periods (in calls) the op sequence repeats with, shortest first.
pub(crate) fn periods(ops: &[u16]) -> Vec<usize> {
    let max = (ops.len() / MIN_CYCLES).min(MAX_PERIOD);
    (1..=max).filter(|&p| repeats(ops, p) >= MIN_MATCH).collect()
}

/// True when the time between an op's returns is spread evenly: most of it
/// lies in intervals within 2x of the median interval. One slow step does
/// not undo that (a loop seen for a few steps whose one step was slow): the
/// longest interval is set aside when the calls within it are as many as
/// within the median interval — a step like the others, only longer. The
/// long gap of an op that is not the step's end (the copies at a step's
/// start) holds other calls than its short ones, and is never set aside.
fn splits_time_evenly(marks: &[Mark], op: u16) -> bool {
    // (time to the next return of `op`, calls made in between)
    let at: Vec<(usize, u64)> =
        marks.iter().enumerate().filter(|(_, m)| m.op == op).map(|(i, m)| (i, m.ts_ns)).collect();
    let mut gaps: Vec<(u64, usize)> = at.windows(2).map(|w| (w[1].1.saturating_sub(w[0].1), w[1].0 - w[0].0)).collect();
    if gaps.is_empty() {
        return false;
    }
    gaps.sort_unstable();
    if even(&gaps) {
        return true;
    }
    let mut calls: Vec<usize> = gaps.iter().map(|g| g.1).collect();
    calls.sort_unstable();
    let (longest, median_calls) = (gaps[gaps.len() - 1], calls[(calls.len() - 1) / 2]);
    gaps.len() >= 3 && longest.1 == median_calls && even(&gaps[..gaps.len() - 1])
}

/// `gaps` sorted: at least EVEN_TIME of their time, and of their number,
/// within 2x of their median. By number too: two copies a step alternate a
/// gap of microseconds with one of the whole step, and half of the gaps
/// near a median that fell on the long ones is no even split.
fn even(gaps: &[(u64, usize)]) -> bool {
    let total: u64 = gaps.iter().map(|g| g.0).sum();
    let median = gaps[(gaps.len() - 1) / 2].0;
    let near = |g: u64| g >= median / 2 && g <= median.saturating_mul(2);
    let typical: u64 = gaps.iter().map(|g| g.0).filter(|&g| near(g)).sum();
    let count = gaps.iter().filter(|g| near(g.0)).count();
    total > 0 && typical as f64 >= EVEN_TIME * total as f64 && count as f64 >= EVEN_TIME * gaps.len() as f64
}

/// The op that ends each step at period `period`: among the ops made once
/// per cycle (give or take one call) that split time evenly, those whose
/// count fits the cycles best, give or take one call (the copy that starts
/// a step and the sync that ends it are both once a step, and where the
/// history starts and ends decides which is made once more), then the one
/// that takes longest (the sync that waits for the step's GPU work), then
/// the one made last.
pub(crate) fn anchor(marks: &[Mark], period: usize) -> Option<u16> {
    // Counted from where the calls start to repeat: a job's setup before
    // its loop (allocations, a weight upload) is no part of any cycle.
    let start = periodic_from(marks, period);
    let cycles = (marks.len() - start) as f64 / period as f64;
    let mut stats: std::collections::BTreeMap<u16, (usize, u64, usize)> = Default::default();
    for (i, m) in marks.iter().enumerate().skip(start) {
        let s = stats.entry(m.op).or_insert((0, 0, 0));
        s.0 += 1;
        s.1 = s.1.saturating_add(m.dur_ns);
        s.2 = i;
    }
    // Calls more or fewer than the cycles: within a fifth of them, or one
    // (a short history's first or last step cut by where it starts or ends).
    let off = |n: usize| (n as f64 - cycles).abs();
    let fits: Vec<(f64, u64, usize, u16)> = stats
        .into_iter()
        .filter(|(op, (n, _, _))| off(*n) <= (0.2 * cycles).max(1.0) && splits_time_evenly(marks, *op))
        .map(|(op, (n, total, last))| (off(n), total / n as u64, last, op))
        .collect();
    let best = fits.iter().map(|f| f.0).fold(f64::INFINITY, f64::min);
    fits.into_iter().filter(|f| f.0 <= best + 1.5).map(|(_, dur, last, op)| (dur, last, op)).max().map(|(.., op)| op)
}

/// The first call from which one period of ops repeats in the next; 0
/// when none does.
fn periodic_from(marks: &[Mark], period: usize) -> usize {
    let ops = |i: usize| marks[i..i + period].iter().map(|m| m.op);
    (0..marks.len().saturating_sub(2 * period - 1)).find(|&i| ops(i).eq(ops(i + period))).unwrap_or(0)
}

/// A step cycle: its period in calls and the op whose return ends a step
/// (`op | LONG`: the long kind of an op split by duration, `kinds.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cycle {
    pub period: usize,
    pub op: u16,
    pub split: Option<Split>,
}

impl Cycle {
    /// The op of `m` as this cycle tells calls apart.
    pub(crate) fn op_of(&self, m: &Mark) -> u16 {
        kind_of(self.split, m)
    }

    /// The op that ends a step, as the probes name it.
    pub(crate) fn probe_op(&self) -> u16 {
        self.op & !LONG
    }
}

/// The cycle of this sequence: its shortest period with an op that ends
/// each step; where the ops as named make none, the same with one op split
/// in two kinds by duration. None: no cycle.
pub(crate) fn find(marks: &[Mark]) -> Option<Cycle> {
    find_with(marks, None).or_else(|| split(marks).and_then(|s| find_with(marks, Some(s))))
}

fn find_with(marks: &[Mark], split: Option<Split>) -> Option<Cycle> {
    let kinds: Vec<Mark>;
    let marks = match split {
        None => marks,
        Some(_) => {
            kinds = marks.iter().map(|m| Mark { op: kind_of(split, m), ..*m }).collect();
            &kinds
        }
    };
    let ops: Vec<u16> = marks.iter().map(|m| m.op).collect();
    periods(&ops).into_iter().find_map(|period| anchor(marks, period).map(|op| Cycle { period, op, split }))
}

/// The op that ends each step of this sequence (`find`'s).
#[cfg(test)]
pub(crate) fn step_op(marks: &[Mark]) -> Option<u16> {
    find(marks).map(|c| c.op)
}

/// True when the last `new` calls (at least `MIN_CYCLES` periods of them,
/// at most the history kept) still follow `c`: they repeat at its period and make its op once a
/// cycle. O(new) where `find` is O(history x MAX_PERIOD), so a steady loop
/// is not searched again every window; a loop that changes is.
pub(crate) fn still_holds(marks: &[Mark], c: Cycle, new: usize) -> bool {
    // As `find` asks: at least MIN_CYCLES periods of calls in all.
    let len = (new.max(MIN_CYCLES * c.period) + c.period).min(marks.len());
    if len < MIN_CYCLES * c.period {
        return false;
    }
    let ops: Vec<u16> = marks[marks.len() - len..].iter().map(|m| c.op_of(m)).collect();
    let cycles = (len - c.period) as f64 / c.period as f64;
    let made = ops[c.period..].iter().filter(|&&op| op == c.op).count() as f64;
    repeats(&ops, c.period) >= MIN_MATCH && (made / cycles - 1.0).abs() <= 0.2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of `cycle` (op, duration) repeated `n` times, 100 ms apart.
    fn steps(cycle: &[(u16, u64)], n: usize) -> Vec<Mark> {
        let mut out = Vec::new();
        for s in 0..n {
            for (i, &(op, dur_ns)) in cycle.iter().enumerate() {
                out.push(Mark { op, ts_ns: s as u64 * 100_000_000 + i as u64 * 1000, dur_ns });
            }
        }
        out
    }

    #[test]
    fn a_copy_launches_and_a_sync_end_at_the_sync() {
        let m = steps(&[(1, 10_000), (2, 40_000_000)], 10);
        assert_eq!(periods(&m.iter().map(|m| m.op).collect::<Vec<_>>())[0], 2);
        assert_eq!(step_op(&m), Some(2));
    }

    #[test]
    fn nine_copies_and_a_sync_are_one_cycle_not_nine() {
        let mut cycle = vec![(1, 1000); 9];
        cycle.push((2, 1000));
        let m = steps(&cycle, 5);
        // Period 1 repeats 90%, but the copies leave the step's time to one gap.
        assert_eq!(periods(&m.iter().map(|m| m.op).collect::<Vec<_>>())[0], 1);
        assert_eq!(step_op(&m), Some(2));
    }

    #[test]
    fn one_slow_step_is_set_aside_but_the_copies_long_gap_is_not() {
        // Five steps, the third 20x longer: most of the time is in one step.
        let mut m = steps(&[(1, 10_000), (2, 40_000_000)], 5);
        for x in &mut m[5..] {
            x.ts_ns += 2_000_000_000;
        }
        assert_eq!(step_op(&m), Some(2));
        // Two steps of nine copies and a sync: the copies' long gap holds
        // the sync, unlike their short ones. Not a cycle of copies.
        let mut cycle = vec![(1, 1000); 9];
        cycle.push((2, 1000));
        assert_eq!(step_op(&steps(&cycle, 2)), None);
    }

    #[test]
    fn two_copies_a_step_do_not_each_end_one() {
        // Two copies 10 µs apart a step, 30 ms between steps, no sync; the
        // history begins and ends between a step's copies, so the long gaps
        // are one more than the short ones and their median is long.
        let mut m: Vec<Mark> = (0..=40u64)
            .flat_map(|s| (0..2).map(move |i| Mark { op: 1, ts_ns: s * 30_000_000 + i * 10_000, dur_ns: 5000 }))
            .collect();
        m.remove(0);
        m.pop();
        assert_eq!(find(&m), None, "each copy a step of alternately 10 µs and 30 ms");
    }

    #[test]
    fn the_sync_ends_the_step_though_the_copy_is_made_once_more() {
        // Ten steps of a copy and a sync, an allocation in the 4th, and the
        // next step's copy: 11 copies, 10 syncs in 11 cycles of two calls.
        let mut m = Vec::new();
        for s in 0..10u64 {
            let t = s * 41_000_000;
            m.push(Mark { op: 9, ts_ns: t, dur_ns: 300_000 });
            if s == 3 {
                m.push(Mark { op: 15, ts_ns: t + 30_000, dur_ns: 10_000 });
            }
            m.push(Mark { op: 11, ts_ns: t + 40_500_000, dur_ns: 40_000_000 });
        }
        m.push(Mark { op: 9, ts_ns: 410_000_000, dur_ns: 300_000 });
        assert_eq!(find(&m), Some(Cycle { period: 2, op: 11, split: None }));
    }

    #[test]
    fn in_three_steps_and_the_next_ones_copy_the_sync_ends_the_step() {
        // c s c s c s c A: 4 copies, 3 syncs, 4 cycles of two calls. The
        // sync is one call short of once a cycle, and still ends the step.
        let mut m = Vec::new();
        for s in 0..3u64 {
            m.push(Mark { op: 9, ts_ns: s * 41_000_000, dur_ns: 300_000 });
            m.push(Mark { op: 11, ts_ns: s * 41_000_000 + 40_500_000, dur_ns: 40_000_000 });
        }
        m.push(Mark { op: 9, ts_ns: 123_000_000, dur_ns: 300_000 });
        m.push(Mark { op: 15, ts_ns: 123_030_000, dur_ns: 10_000 });
        assert_eq!(find(&m), Some(Cycle { period: 2, op: 11, split: None }));
    }

    #[test]
    fn a_sync_alone_is_a_cycle_of_one() {
        assert_eq!(step_op(&steps(&[(7, 5)], 6)), Some(7));
    }

    #[test]
    fn a_logging_call_every_fifth_step_keeps_the_cycle() {
        let mut m = Vec::new();
        for s in 0..40u64 {
            m.push(Mark { op: 1, ts_ns: s * 10, dur_ns: 1 });
            if s % 5 == 4 {
                m.push(Mark { op: 3, ts_ns: s * 10 + 1, dur_ns: 1 });
            }
            m.push(Mark { op: 2, ts_ns: s * 10 + 2, dur_ns: 9 });
        }
        // It repeats exactly every 11 calls (5 steps), and 73% every 2.
        assert_eq!(periods(&m.iter().map(|m| m.op).collect::<Vec<_>>())[0], 2);
        assert_eq!(step_op(&m), Some(2));
    }

    #[test]
    fn no_cycle_in_noise_or_in_too_few_calls() {
        // A linear congruential sequence of 5 ops: no period repeats 75%.
        let mut x = 7u32;
        let ops: Vec<u16> = (0..300)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                ((x >> 16) % 5) as u16
            })
            .collect();
        assert!(periods(&ops).is_empty(), "{:?}", periods(&ops));
        assert!(periods(&[1, 2, 1, 2, 1]).is_empty(), "two cycles and a half");
        assert!(periods(&[]).is_empty());
    }

    #[test]
    fn a_steady_loop_still_holds_and_a_changed_one_does_not() {
        let m = steps(&[(1, 10_000), (2, 40_000_000)], 20);
        let c = find(&m).unwrap();
        assert_eq!(c, Cycle { period: 2, op: 2, split: None });
        assert!(still_holds(&m, c, 10));
        // The loop turns to 3 calls a step, the sync now the second: a search again.
        let mut changed = m.clone();
        changed.extend(steps(&[(1, 1), (2, 1), (3, 1)], 6));
        assert!(!still_holds(&changed, c, 18));
        assert_eq!(find(&changed[changed.len() - 18..]).map(|c| c.period), Some(3));
        // Too few calls to tell: a search.
        assert!(!still_holds(&m[..5], c, 5));
    }

    #[test]
    fn a_cycle_without_a_once_per_step_op_has_no_anchor() {
        // A B A B B: A twice, B three times a cycle.
        let m = steps(&[(1, 1), (2, 1), (1, 1), (2, 1), (2, 1)], 8);
        assert!(periods(&m.iter().map(|m| m.op).collect::<Vec<_>>()).contains(&5));
        assert_eq!(step_op(&m), None);
    }
}
