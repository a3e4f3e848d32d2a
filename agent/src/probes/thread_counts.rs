// SPDX-License-Identifier: Apache-2.0
//! Runtime launches each thread counts in its own slot (calls.bpf.c,
//! `slot_count`: no shared aggregate, no atomic per launch), turned into
//! each window's counts per process and op.
//!
//! A slot holds running totals for its life, one per half of the
//! aggregates (the launch counts into the half `Config::active` names, as
//! the shared maps do); the window's count is what the half just drained
//! grew since its last read. So launches split between windows at the flip
//! itself, as syncs do, however late after it the slots are read. A slot removed at exit or exec is copied to
//! `retired` first (proc.bpf.c) and read here before the live slots: a
//! thread that exits between the two reads is still remembered when its
//! retired copy arrives at the next window. Slots are known by tid and
//! birth, so a reused tid starts from zero.

use std::collections::{HashMap, HashSet};

use super::abi::{OpCount, RetiredKey, THREAD_COUNTS, ThreadCall};

/// Windows a known slot may be missing (neither live nor retired) before it
/// is forgotten: its retired copy arrives at most one window late; a slot
/// evicted from the kernel's LRU map never does.
const ABSENT_WINDOWS: u8 = 2;

#[derive(Debug)]
struct Seen {
    counts: [OpCount; THREAD_COUNTS],
    nested: u32,
    absent: u8,
}

/// What the slots grew by in one window.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Growth {
    /// Launches per (tgid, op id).
    pub calls: HashMap<(u32, u32), u64>,
    /// Probed calls made inside traced calls, per tgid (trapped, not counted as calls).
    pub nested: HashMap<u32, u64>,
}

/// What was last read of each thread slot.
#[derive(Debug, Default)]
pub(crate) struct ThreadCounts {
    seen: HashMap<(u32, u64), Seen>,
    /// What retired slots counted in the active half: the next window's.
    pending: HashMap<(u32, u32), u64>,
    /// Launches counted in slots since load (the kernel's `events` counter
    /// leaves them out).
    total: u64,
}

impl ThreadCounts {
    /// What the slots' half `idle` (the one flipped away from) grew by since
    /// it was last read: `retired` as read (and removed) from the kernel,
    /// then `live` as read after it (None: the read failed; the live slots'
    /// last reads are kept as they are, not aged). What a retired slot
    /// counted in the other half ships with the next window, its own.
    pub(crate) fn window(
        &mut self,
        retired: &[(RetiredKey, ThreadCall)],
        live: Option<&[(u32, ThreadCall)]>,
        idle: usize,
    ) -> Growth {
        let mut out = Growth { calls: std::mem::take(&mut self.pending), ..Growth::default() };
        let mut gone = HashSet::new();
        for (k, slot) in retired {
            let before = self.seen.remove(&(k.tid, k.born));
            add_half(&mut out.calls, slot, before.as_ref(), idle);
            add_half(&mut self.pending, slot, before.as_ref(), 1 - idle);
            add_nested(&mut out.nested, slot, before.as_ref());
            gone.insert((k.tid, k.born));
        }
        self.pending.retain(|_, n| *n > 0);
        let Some(live) = live else {
            self.total += out.calls.values().sum::<u64>();
            return out;
        };
        let mut now_live = HashSet::new();
        for (tid, slot) in live {
            let key = (*tid, slot.born);
            // Retired in this very read (copied, not yet removed): counted above.
            if (slot.counts[0].op == 0 && slot.nested == 0) || gone.contains(&key) {
                continue;
            }
            let before = self.seen.get(&key);
            add_half(&mut out.calls, slot, before, idle);
            add_nested(&mut out.nested, slot, before);
            let seen = Seen { counts: read_half(slot, before, idle), nested: slot.nested, absent: 0 };
            self.seen.insert(key, seen);
            now_live.insert(key);
        }
        self.seen.retain(|k, s| {
            if !now_live.contains(k) {
                s.absent += 1;
            }
            s.absent <= ABSENT_WINDOWS
        });
        out.calls.retain(|_, n| *n > 0);
        out.nested.retain(|_, n| *n > 0);
        self.total += out.calls.values().sum::<u64>();
        out
    }

    /// Launches counted in slots since load.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Slots remembered (bounded by the threads alive with launches).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

/// The counter `i` of `before` if it counted the same op (a slot's op
/// counters are claimed in order and keep their op for its life, so index i
/// is the same op in both reads, or unclaimed before: all zero then).
fn prev(before: Option<&Seen>, i: usize, op: u32) -> [u32; 2] {
    before.map(|b| b.counts[i]).filter(|b| b.op == op).map_or([0; 2], |b| b.n)
}

/// What is known of a live slot after reading its half `idle`: that half as
/// read, the other as last read (it is still counting).
fn read_half(slot: &ThreadCall, before: Option<&Seen>, idle: usize) -> [OpCount; THREAD_COUNTS] {
    let mut out = slot.counts;
    for (i, c) in out.iter_mut().enumerate() {
        c.n[1 - idle] = prev(before, i, c.op)[1 - idle];
    }
    out
}

/// Adds what the slot's counters grew in half `h` since `before`.
fn add_half(out: &mut HashMap<(u32, u32), u64>, slot: &ThreadCall, before: Option<&Seen>, h: usize) {
    for (i, c) in slot.counts.iter().enumerate().take_while(|(_, c)| c.op != 0) {
        let grew = c.n[h].wrapping_sub(prev(before, i, c.op)[h]);
        *out.entry((slot.tgid, c.op - 1)).or_insert(0) += u64::from(grew);
    }
}

/// Adds what the slot's nested calls grew since `before` (one running total:
/// they are the agent's cost, not counts a window ships).
fn add_nested(out: &mut HashMap<u32, u64>, slot: &ThreadCall, before: Option<&Seen>) {
    let nested = slot.nested.wrapping_sub(before.map_or(0, |b| b.nested));
    *out.entry(slot.tgid).or_insert(0) += u64::from(nested);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(tgid: u32, born: u64, counts: &[(u32, u32)]) -> ThreadCall {
        let mut s = ThreadCall { tgid, born, ..ThreadCall::default() };
        for (i, &(op, n)) in counts.iter().enumerate() {
            s.counts[i] = OpCount { op: op + 1, n: [n, 0] };
        }
        s
    }

    fn rk(tid: u32, born: u64) -> RetiredKey {
        RetiredKey { tid, pad: 0, born }
    }

    #[test]
    fn live_slots_ship_their_growth_each_window() {
        let mut t = ThreadCounts::default();
        let w = t.window(&[], Some(&[(7, slot(1, 10, &[(3, 5)])), (8, slot(1, 11, &[(3, 2), (4, 1)]))]), 0);
        assert_eq!(w.calls, HashMap::from([((1, 3), 7), ((1, 4), 1)]));
        let w = t.window(&[], Some(&[(7, slot(1, 10, &[(3, 9)])), (8, slot(1, 11, &[(3, 2), (4, 1)]))]), 0);
        assert_eq!(w.calls, HashMap::from([((1, 3), 4)]));
        assert!(t.window(&[], Some(&[(7, slot(1, 10, &[(3, 9)]))]), 0).calls.is_empty(), "no growth, no row");
        assert_eq!(t.total(), 12);
    }

    #[test]
    fn a_window_ships_the_half_it_flipped_away_from_an_exited_threads_too() {
        // Launches made after a flip count in the other half: a read of the
        // slots late after the flip does not move them into the window
        // before (CI: a read preempted for 1/3 s took 1/3 of a window).
        let mut t = ThreadCounts::default();
        let s = |a, b| {
            let mut s = slot(1, 10, &[(3, 0)]);
            s.counts[0].n = [a, b];
            s
        };
        assert_eq!(t.window(&[], Some(&[(7, s(10, 5))]), 0).calls[&(1, 3)], 10);
        // a's 2 after its read wait for a's next drain.
        assert_eq!(t.window(&[], Some(&[(7, s(12, 9))]), 1).calls[&(1, 3)], 9, "half b from zero");
        assert_eq!(t.window(&[], Some(&[(7, s(12, 11))]), 0).calls[&(1, 3)], 2);
        assert_eq!(t.window(&[], Some(&[(7, s(13, 11))]), 1).calls[&(1, 3)], 2, "b's 2 after its read");
        // Gone: a's 3 since its read now, b's 1 with the next window, b's.
        let w = t.window(&[(rk(7, 10), s(15, 12))], Some(&[]), 0);
        assert_eq!(w.calls[&(1, 3)], 3);
        assert_eq!(t.window(&[], Some(&[]), 1).calls[&(1, 3)], 1);
        assert_eq!(t.window(&[], Some(&[]), 0), Growth::default());
        assert_eq!(t.total(), 27);
    }

    #[test]
    fn a_counter_that_wraps_still_ships_its_growth() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, u32::MAX - 1)]))]), 0);
        let w = t.window(&[], Some(&[(7, slot(1, 10, &[(3, 3)]))]), 0);
        assert_eq!(w.calls[&(1, 3)], 5);
    }

    #[test]
    fn an_exit_between_reads_is_counted_once_at_the_next_window() {
        let mut t = ThreadCounts::default();
        assert_eq!(t.window(&[], Some(&[(7, slot(1, 10, &[(3, 100)]))]), 0).calls[&(1, 3)], 100);
        // Exited after this window's retired read: gone from the live read.
        assert_eq!(t.window(&[], Some(&[]), 0), Growth::default());
        // Its retired copy arrives now: only what the agent had not seen.
        let w = t.window(&[(rk(7, 10), slot(1, 10, &[(3, 130)]))], Some(&[]), 0);
        assert_eq!(w.calls, HashMap::from([((1, 3), 30)]));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_reused_tid_starts_from_zero_and_the_old_thread_keeps_its_tail() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, 100)]))]), 0);
        // Thread 7 (born 10) exited with 120; a new thread 7 (born 50) has 4.
        let w = t.window(&[(rk(7, 10), slot(1, 10, &[(3, 120)]))], Some(&[(7, slot(2, 50, &[(3, 4)]))]), 0);
        assert_eq!(w.calls, HashMap::from([((1, 3), 20), ((2, 3), 4)]));
        // The new thread goes on.
        let w = t.window(&[], Some(&[(7, slot(2, 50, &[(3, 6)]))]), 0);
        assert_eq!(w.calls, HashMap::from([((2, 3), 2)]));
    }

    #[test]
    fn a_thread_born_and_gone_within_a_window_counts_whole() {
        let mut t = ThreadCounts::default();
        let w = t.window(&[(rk(9, 1), slot(4, 1, &[(3, 12), (5, 1)]))], Some(&[]), 0);
        assert_eq!(w.calls, HashMap::from([((4, 3), 12), ((4, 5), 1)]));
    }

    #[test]
    fn a_slot_both_retired_and_still_listed_is_counted_once() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, 10)]))]), 0);
        let w = t.window(&[(rk(7, 10), slot(1, 10, &[(3, 15)]))], Some(&[(7, slot(1, 10, &[(3, 15)]))]), 0);
        assert_eq!(w.calls, HashMap::from([((1, 3), 5)]));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn slots_that_vanish_without_a_retired_copy_are_forgotten() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, 10)]))]), 0);
        for _ in 0..=ABSENT_WINDOWS {
            t.window(&[], Some(&[]), 0);
        }
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn nested_calls_grow_like_counts_and_keep_a_compat_slot_alive() {
        let mut t = ThreadCounts::default();
        let nested = |tgid, born, n| ThreadCall { tgid, born, nested: n, ..ThreadCall::default() };
        let w = t.window(&[], Some(&[(7, nested(1, 10, 4)), (8, slot(1, 11, &[(3, 2)]))]), 0);
        assert_eq!(w.nested, HashMap::from([(1, 4)]));
        let w = t.window(&[(rk(7, 10), nested(1, 10, 9))], Some(&[]), 0);
        assert_eq!(w.nested, HashMap::from([(1, 5)]));
        assert!(w.calls.is_empty());
    }

    #[test]
    fn a_failed_read_of_the_live_slots_ages_nothing() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, 10)]))]), 0);
        for _ in 0..=ABSENT_WINDOWS + 1 {
            assert_eq!(t.window(&[], None, 0), Growth::default());
        }
        assert_eq!(t.window(&[], Some(&[(7, slot(1, 10, &[(3, 14)]))]), 0).calls, HashMap::from([((1, 3), 4)]));
    }
}
