// SPDX-License-Identifier: Apache-2.0
//! Two kinds of one op, told apart by how long its calls take. A loop that
//! copies its batch in and reads its loss back with the same blocking
//! `cudaMemcpy` makes one op twice a step: its returns alternate a gap of
//! the step's work with one of microseconds, so no op of the sequence ends
//! each step. The copy in returns at once, the copy back waits for the
//! step's kernels: split by duration, the long kind ends the step. Tried
//! only where the ops as named make no cycle, so a loop found without it
//! is found as before.

use super::mark::Mark;

/// The bit that marks an op's long kind (op ids are far below it).
pub(crate) const LONG: u16 = 0x8000;
/// How far apart the two kinds' durations must lie.
const APART: u64 = 10;
/// Share of the op's calls each kind must hold.
const MIN_SHARE: f64 = 0.25;
/// Calls of each kind needed: as many as the cycles a period needs.
const MIN_CALLS: usize = 3;

/// Calls of `op` at least `at_ns` long are its long kind, `op | LONG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Split {
    pub op: u16,
    pub at_ns: u64,
}

/// The op of `m` with `split` applied.
pub(crate) fn kind_of(split: Option<Split>, m: &Mark) -> u16 {
    match split {
        Some(s) if m.op == s.op && m.dur_ns >= s.at_ns => m.op | LONG,
        _ => m.op,
    }
}

/// The op of these marks with the most calls whose durations fall in two
/// groups `APART` times apart or more, each with a fair share of the
/// calls, split at the widest gap of its sorted durations. One op only:
/// each split is one more search of a thread that has no cycle
/// (`steps_window` bench).
pub(crate) fn split(marks: &[Mark]) -> Option<Split> {
    let mut durs: std::collections::BTreeMap<u16, Vec<u64>> = Default::default();
    for m in marks {
        durs.entry(m.op).or_default().push(m.dur_ns);
    }
    let mut by_calls: Vec<(u16, Vec<u64>)> = durs.into_iter().collect();
    by_calls.sort_by_key(|(op, d)| (std::cmp::Reverse(d.len()), *op));
    for (op, mut d) in by_calls {
        d.sort_unstable();
        let least = ((d.len() as f64 * MIN_SHARE).ceil() as usize).max(MIN_CALLS);
        if d.len() < 2 * least {
            continue;
        }
        // The widest ratio between neighbours, each side holding `least` calls.
        let widest = (least..=d.len() - least)
            .map(|i| (d[i] as f64 / d[i - 1].max(1) as f64, i))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((ratio, i)) = widest
            && ratio >= APART as f64
        {
            // Between the two: the geometric mean, as far from each.
            let at_ns = ((d[i - 1].max(1) as f64 * d[i] as f64).sqrt()) as u64;
            return Some(Split { op, at_ns });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(op: u16, dur_ns: u64) -> Mark {
        Mark { op, ts_ns: 0, dur_ns }
    }

    #[test]
    fn a_quick_copy_in_and_a_waiting_copy_back_are_two_kinds() {
        let mut m: Vec<Mark> = (0..10).flat_map(|_| [mark(4, 12_000), mark(4, 40_000_000), mark(9, 5)]).collect();
        m.push(mark(4, 340_000_000));
        let s = split(&m).expect("op 4 in two kinds");
        assert_eq!(s.op, 4);
        assert!((12_000..40_000_000).contains(&s.at_ns), "{s:?}");
        assert_eq!(kind_of(Some(s), &mark(4, 340_000_000)), 4 | LONG);
        assert_eq!(kind_of(Some(s), &mark(4, 11_000)), 4);
        assert_eq!(kind_of(Some(s), &mark(9, 340_000_000)), 9);
    }

    #[test]
    fn durations_that_spread_or_one_slow_call_are_no_split() {
        // Evenly spread over three decades: no gap of 10x.
        let spread: Vec<Mark> = (0..60).map(|i| mark(4, 1_000 * (1 + i * 20))).collect();
        assert_eq!(split(&spread), None);
        // One slow call in thirty is not a kind of its own.
        let mut one: Vec<Mark> = (0..30).map(|_| mark(4, 40_000_000)).collect();
        one[17].dur_ns = 900_000_000;
        assert_eq!(split(&one), None);
    }
}
