// SPDX-License-Identifier: Apache-2.0
//! Steps of a loop whose calls close no cycle by op alone: a loop that
//! syncs only every few hundred steps (a loss logged every 500 steps, as
//! Hugging Face's Trainer does) or makes several of each op a step (a copy
//! per input, collectives per gradient bucket). Its calls still come in
//! bursts, one a step (the inputs' copies, then the step's GPU work), so
//! each op is told apart by whether a long gap came before it: the copy
//! that starts a burst then happens once a step, and ends the one before.

use std::borrow::Cow;

use super::cycle::{self, Cycle, Mark};

/// Set on an op that follows a gap longer than the cycle's `gap_ns`.
pub(crate) const AFTER_GAP: u16 = 0x8000;
/// Gaps between bursts are at least this many times those within them:
/// a call's return to the next call is microseconds within a burst, the
/// step's GPU work between two.
const SPLIT: u64 = 8;
/// Bursts end steps this many times as often as the op cycle's call: its
/// steps are of several bursts each (one extra burst now and then is not).
const FINER: f64 = 1.8;

/// The loop's cycle: by op ([`cycle::find`]), unless its bursts end steps
/// at least `FINER` times as often. A loop that syncs only every few steps
/// (a loss logged every 10th) makes one burst a step, and a step of ten
/// would hide which one was slow. Alike, gradient accumulation that syncs
/// once an optimizer step makes one burst a micro-batch: its steps are
/// micro-batches (the two cannot be told apart from the calls).
pub(crate) fn find_cycle(marks: &[Mark]) -> Option<Cycle> {
    let (by_op, by_bursts) = (cycle::find(marks), find(marks));
    let ends = |c: Cycle| view(marks, c).iter().filter(|m| m.op == c.op).count();
    match (by_op, by_bursts) {
        (Some(o), Some(b)) if ends(b) as f64 >= FINER * ends(o) as f64 => Some(b),
        (Some(o), _) => Some(o),
        (None, b) => b,
    }
}

/// The cycle of the calls' bursts, where the gaps between calls fall in two
/// groups far apart. None: no such split, or no cycle in it.
fn find(marks: &[Mark]) -> Option<Cycle> {
    let gap_ns = split(marks)?;
    let c = cycle::find(&tagged(marks, gap_ns))?;
    Some(Cycle { gap_ns: Some(gap_ns), ..c })
}

/// The marks as `c` reads them: with [`AFTER_GAP`] set where it was found
/// in bursts, as they are otherwise.
pub(crate) fn view(marks: &[Mark], c: Cycle) -> Cow<'_, [Mark]> {
    match c.gap_ns {
        Some(gap_ns) => Cow::Owned(tagged(marks, gap_ns)),
        None => Cow::Borrowed(marks),
    }
}

/// The op a step ends at, as shipped.
pub(crate) fn op(c: Cycle) -> u16 {
    c.op & !AFTER_GAP
}

fn tagged(marks: &[Mark], gap_ns: u64) -> Vec<Mark> {
    let mut prev = None;
    marks
        .iter()
        .map(|m| {
            // The history's first call: its gap is not known, and one of
            // the kind that ends no step would count once too often.
            let after_gap = prev.is_none_or(|p| m.ts_ns.saturating_sub(p) > gap_ns);
            prev = Some(m.ts_ns);
            Mark { op: if after_gap { m.op | AFTER_GAP } else { m.op }, ..*m }
        })
        .collect()
}

/// The gap that splits calls into bursts: between the two neighbouring
/// gaps (sorted) farthest apart, when they are `SPLIT` times apart and at
/// least three gaps are the long kind (three steps).
fn split(marks: &[Mark]) -> Option<u64> {
    // Under a microsecond apart is one call after another: no ratio there.
    let mut gaps: Vec<u64> = marks.windows(2).map(|w| w[1].ts_ns.saturating_sub(w[0].ts_ns).max(1000)).collect();
    gaps.sort_unstable();
    let at = (1..gaps.len().saturating_sub(2)).max_by(|&a, &b| {
        // a[i]/a[i-1] > b[i]/b[i-1], without division.
        (u128::from(gaps[a]) * u128::from(gaps[b - 1])).cmp(&(u128::from(gaps[b]) * u128::from(gaps[a - 1])))
    })?;
    let (low, high) = (gaps[at - 1], gaps[at]);
    (high >= low.saturating_mul(SPLIT)).then(|| low.saturating_mul(high).isqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Steps of `step_ms`, each starting with `copies` copies (op 3) 10 µs
    /// apart, then every `sync_every`th step a copy back and a sync (op 5)
    /// that waits `wait_ms`.
    fn bursts(n: u64, step_ms: u64, copies: u64, sync_every: u64) -> Vec<Mark> {
        let mut out = Vec::new();
        let mut t = 0;
        for s in 0..n {
            for i in 0..copies {
                out.push(Mark { op: 3, ts_ns: t + i * 10_000, dur_ns: 5000 });
            }
            t += step_ms * MS;
            if s % sync_every == sync_every - 1 {
                out.push(Mark { op: 3, ts_ns: t - 2 * MS, dur_ns: 5000 });
                out.push(Mark { op: 5, ts_ns: t, dur_ns: 2 * MS });
            }
        }
        out
    }

    #[test]
    fn copies_that_start_each_step_end_the_one_before() {
        // Two inputs copied a step, a loss logged every 500 steps: no op
        // closes a cycle, the bursts do.
        let m = bursts(60, 30, 2, 500);
        assert_eq!(cycle::find(&m), None);
        let c = find(&m).expect("a cycle of bursts");
        assert_eq!((c.period, op(c)), (2, 3));
        assert!(c.op & AFTER_GAP != 0, "the copy that starts a burst ends the step before: {c:?}");
        assert!(c.gap_ns.is_some_and(|g| g > 10_000 && g < 28 * MS), "{c:?}");
        let v = view(&m, c);
        let ends = v.iter().filter(|m| m.op == c.op).count();
        assert_eq!(ends, 60, "every step starts with one");
    }

    #[test]
    fn collectives_per_bucket_and_no_sync() {
        // DDP without a per-step sync: two copies, then four all-reduces
        // (op 9) 5 ms apart as backward fills the buckets.
        let mut m = Vec::new();
        for s in 0..40u64 {
            let t = s * 50 * MS;
            m.push(Mark { op: 3, ts_ns: t, dur_ns: 5000 });
            m.push(Mark { op: 3, ts_ns: t + 10_000, dur_ns: 5000 });
            for b in 0..4 {
                m.push(Mark { op: 9, ts_ns: t + (20 + 5 * b) * MS, dur_ns: 20_000 });
            }
        }
        assert_eq!(cycle::find(&m), None);
        let c = find(&m).expect("a cycle of bursts");
        assert_eq!(c.period, 6);
        assert_eq!(view(&m, c).iter().filter(|m| m.op == c.op).count(), 40, "{c:?}");
    }

    #[test]
    fn a_sync_every_tenth_step_is_no_step_of_ten() {
        // Two copies a step; every 10th a copy back and a sync that waits
        // for the queued work: the sync closes a cycle of ten steps, the
        // bursts one of one.
        let m = bursts(40, 30, 2, 10);
        assert_eq!(cycle::find(&m).map(|c| c.op), Some(5));
        let c = find_cycle(&m).expect("a cycle");
        assert_eq!((c.period, op(c)), (2, 3), "{c:?}");
        // Each step's first copy, but that of a step right after a sync;
        // the copy back before that sync instead (the last one too).
        assert_eq!(view(&m, c).iter().filter(|m| m.op == c.op).count(), 40 - 3 + 4);
        // A sync each step: the bursts step no more often, the sync stays.
        let m = bursts(40, 30, 2, 1);
        assert_eq!(find_cycle(&m).map(|c| (c.op, c.gap_ns)), Some((5, None)));
    }

    #[test]
    fn calls_evenly_apart_make_no_bursts() {
        let m: Vec<Mark> = (0..100).map(|i| Mark { op: 3, ts_ns: i * MS + (i % 3) * 1000, dur_ns: 1 }).collect();
        assert_eq!(split(&m), None);
        assert_eq!(find(&m), None);
        assert_eq!(split(&[]), None);
    }
}
