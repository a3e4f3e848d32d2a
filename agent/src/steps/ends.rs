// SPDX-License-Identifier: Apache-2.0
//! Which returns of a cycle's op end a step, and from which one a thread's
//! run of steps begins. Every return of the op ends a step but an odd one:
//! a copy in that a preempted thread returned from late looks like the
//! copy back that ends the step (`kinds.rs` splits one op by duration),
//! and a step that syncs twice returns the op twice. Either cuts one step
//! in two halves that each lack calls of a step and together make one; so
//! the return between them ends none.

use super::cycle::Cycle;
use super::mark::Mark;

/// Steps looked at to tell what a step's calls are.
const TYPICAL_OF: usize = 8;

/// The calls that end a step, and a last one not yet told.
pub(crate) struct Ends {
    pub at: Vec<usize>,
    pub pending: Option<usize>,
}

/// The calls of `marks` that end a step of `c`, in order: each return of
/// its op, less the odd ones (module doc). A last return whose step lacks
/// calls may be one: it is left out until the next one tells
/// (`pending` is then its index). Returns before call `since` are taken
/// as they are (a window before decided them).
pub(crate) fn step_ends(marks: &[Mark], c: Cycle, since: usize) -> Ends {
    let raw: Vec<usize> = (0..marks.len()).filter(|&i| c.op_of(&marks[i]) == c.op).collect();
    // The step before the first new one: a late return may have ended it.
    let decided = raw.partition_point(|&i| i < since).saturating_sub(1);
    // Each step's ops from the first looked at on: those the typical step
    // is told from, and those to decide (this runs every window for every
    // thread, so no further).
    let first = decided.saturating_sub(1).min(raw.len().saturating_sub(TYPICAL_OF));
    let steps = segments(marks, c, &raw, first);
    let typical = typical_step(&steps[steps.len().saturating_sub(TYPICAL_OF)..]);
    let lacks = |k: usize| differ(&steps[k - first], &typical).1 > 0;
    let len = |k: usize| steps[k - first].len();
    let mut at: Vec<usize> = raw[..decided].to_vec();
    let mut pending = None;
    for k in decided..raw.len() {
        if k + 1 == raw.len() {
            // Its next half, if it is one, has not returned yet.
            if k > first && lacks(k) && !lacks(k - 1) && len(k) < typical.len() {
                pending = Some(raw[k]);
                continue;
            }
        } else if lacks(k) && lacks(k + 1) && halves(marks, c, &raw, k, &typical) {
            continue;
        }
        at.push(raw[k]);
    }
    Ends { at, pending }
}

/// Step `k`'s ops into `buf`, sorted: the calls after end `k - 1` up to
/// end `k` (from the first call for the first).
fn segment_into(marks: &[Mark], c: Cycle, ends: &[usize], k: usize, buf: &mut Vec<u16>) {
    let from = if k == 0 { 0 } else { ends[k - 1] + 1 };
    buf.clear();
    buf.extend(marks[from..=ends[k]].iter().map(|m| c.op_of(m)));
    buf.sort_unstable();
}

/// Each step's ops from step `from` on, sorted (`segment_into`).
fn segments(marks: &[Mark], c: Cycle, ends: &[usize], from: usize) -> Vec<Vec<u16>> {
    (from..ends.len())
        .map(|k| {
            let mut ops = Vec::new();
            segment_into(marks, c, ends, k, &mut ops);
            ops
        })
        .collect()
}

/// True when steps `k` and `k + 1` less the return between them (the odd
/// one) make one step: about the typical calls, one more or fewer (the odd
/// return may have been a call of the step: a late copy in).
fn halves(marks: &[Mark], c: Cycle, ends: &[usize], k: usize, typical: &[u16]) -> bool {
    let from = if k == 0 { 0 } else { ends[k - 1] + 1 };
    let mut joined: Vec<u16> = (from..=ends[k + 1]).filter(|&i| i != ends[k]).map(|i| c.op_of(&marks[i])).collect();
    joined.sort_unstable();
    let (extra, missing) = differ(&joined, typical);
    extra + missing <= c.period / 4 + 1
}

/// The first call that ends a step of `c`'s run, of `ends` (the calls
/// that end one): back from the last one step at a time while each step
/// makes about the cycle's calls. About: within a quarter of the period,
/// so a step that also allocates or logs, or an evaluation batch that
/// makes one copy fewer, is still a step; one step unlike the cycle
/// between two like it is too. Two in a row end the run: calls before
/// them (a job's setup) end no step. `marks.len()` when none does.
pub(crate) fn first_step_end(marks: &[Mark], c: Cycle, ends: &[usize]) -> usize {
    let Some(&last) = ends.last() else { return marks.len() };
    let steps = segments(marks, c, ends, 0);
    let typical = typical_step(&steps[steps.len().saturating_sub(TYPICAL_OF)..]);
    // The earliest step holds whatever came before it too: it is a step
    // when it makes every call of one (a job's setup allocations ride with
    // the loop's first step), not when calls of one are missing (a setup
    // sync alone).
    let like = |k: usize| {
        let (extra, missing) = differ(&steps[k], &typical);
        extra + missing <= c.period / 4 || (k == 0 && missing == 0)
    };
    let mut first = last;
    for k in (0..ends.len()).rev() {
        if like(k) || (k > 0 && like(k - 1)) {
            first = ends[k];
        } else {
            break;
        }
    }
    first
}

/// The most frequent of these steps' sorted ops; the latest on a tie.
fn typical_step(steps: &[Vec<u16>]) -> Vec<u16> {
    let count = |s: &Vec<u16>| steps.iter().filter(|t| *t == s).count();
    steps.iter().rev().max_by_key(|s| count(s)).cloned().unwrap_or_default()
}

/// Calls of sorted op list `a` that `b` lacks, and of `b` that `a` lacks.
fn differ(a: &[u16], b: &[u16]) -> (usize, usize) {
    let (mut i, mut j, mut only_a, mut only_b) = (0, 0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Equal => (i, j) = (i + 1, j + 1),
            std::cmp::Ordering::Less => (i, only_a) = (i + 1, only_a + 1),
            std::cmp::Ordering::Greater => (j, only_b) = (j + 1, only_b + 1),
        }
    }
    (only_a + a.len() - i, only_b + b.len() - j)
}

#[cfg(test)]
mod tests {
    use super::super::kinds::{LONG, Split};
    use super::*;

    /// Copy (op 4, short) and copy back (op 4, long) a step; `kinds` as
    /// `(short?, ts_ms)`.
    fn marks(kinds: &[(bool, u64)]) -> Vec<Mark> {
        kinds
            .iter()
            .map(|&(short, ms)| Mark { op: 4, ts_ns: ms * 1_000_000, dur_ns: if short { 80_000 } else { 38_000_000 } })
            .collect()
    }

    const C: Cycle = Cycle { period: 2, op: 4 | LONG, split: Some(Split { op: 4, at_ns: 1_000_000 }) };

    fn steady(n: u64) -> Vec<(bool, u64)> {
        (0..n).flat_map(|s| [(true, s * 41), (false, s * 41 + 40)]).collect()
    }

    #[test]
    fn a_step_without_its_copy_in_is_still_a_step() {
        // The 6th step makes no copy in; the next one does: both end.
        let mut k = steady(10);
        k.remove(10);
        let e = step_ends(&marks(&k), C, 0);
        assert_eq!(e.at.len(), 10);
        assert_eq!(e.pending, None);
    }

    #[test]
    fn a_late_copy_in_last_waits_for_the_next_return() {
        // Eight steps, then the 9th's copy in returned late: its own step
        // lacks the copy in, and what follows has not come yet.
        let mut k = steady(8);
        k.push((false, 8 * 41 + 3));
        let m = marks(&k);
        let e = step_ends(&m, C, 0);
        assert_eq!((e.at.len(), e.pending), (8, Some(16)));
        // Its copy back comes: the late copy in ends nothing.
        k.push((false, 8 * 41 + 40));
        let e = step_ends(&marks(&k), C, 0);
        assert_eq!((e.at.len(), e.pending), (9, None));
        assert_eq!(e.at.last(), Some(&17));
        assert_eq!(first_step_end(&marks(&k), C, &e.at), 1);
    }
}
