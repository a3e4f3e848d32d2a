// SPDX-License-Identifier: Apache-2.0
//! Runtime launches each thread counts in its own slot (calls.bpf.c,
//! `slot_count`: no shared aggregate, no atomic per launch), turned into
//! each window's counts per process and op.
//!
//! A slot holds running totals for its life; the window's count is what
//! grew since the last read. A slot removed at exit or exec is copied to
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
    /// Launches counted in slots since load (the kernel's `events` counter
    /// leaves them out).
    total: u64,
}

impl ThreadCounts {
    /// What the slots grew by since the last call: `retired` as read (and
    /// removed) from the kernel, then `live` as read after it (None: the read
    /// failed; the live slots' last reads are kept as they are, not aged).
    pub(crate) fn window(
        &mut self,
        retired: &[(RetiredKey, ThreadCall)],
        live: Option<&[(u32, ThreadCall)]>,
    ) -> Growth {
        let mut out = Growth::default();
        let mut gone = HashSet::new();
        for (k, slot) in retired {
            let before = self.seen.remove(&(k.tid, k.born));
            add_growth(&mut out, slot, before.as_ref());
            gone.insert((k.tid, k.born));
        }
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
            add_growth(&mut out, slot, self.seen.get(&key));
            self.seen.insert(key, Seen { counts: slot.counts, nested: slot.nested, absent: 0 });
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

/// Adds what each of the slot's counters grew since `before`. A slot's op
/// counters are claimed in order and keep their op for its life, so index i
/// is the same op in both reads (or unclaimed before).
fn add_growth(out: &mut Growth, slot: &ThreadCall, before: Option<&Seen>) {
    for (i, c) in slot.counts.iter().enumerate() {
        if c.op == 0 {
            break;
        }
        let prev = before.map(|b| b.counts[i]).filter(|b| b.op == c.op).map_or(0, |b| b.n);
        *out.calls.entry((slot.tgid, c.op - 1)).or_insert(0) += u64::from(c.n.wrapping_sub(prev));
    }
    let nested = slot.nested.wrapping_sub(before.map_or(0, |b| b.nested));
    *out.nested.entry(slot.tgid).or_insert(0) += u64::from(nested);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(tgid: u32, born: u64, counts: &[(u32, u32)]) -> ThreadCall {
        let mut s = ThreadCall { tgid, born, ..ThreadCall::default() };
        for (i, &(op, n)) in counts.iter().enumerate() {
            s.counts[i] = OpCount { op: op + 1, n };
        }
        s
    }

    fn rk(tid: u32, born: u64) -> RetiredKey {
        RetiredKey { tid, pad: 0, born }
    }

    #[test]
    fn live_slots_ship_their_growth_each_window() {
        let mut t = ThreadCounts::default();
        let w = t.window(&[], Some(&[(7, slot(1, 10, &[(3, 5)])), (8, slot(1, 11, &[(3, 2), (4, 1)]))]));
        assert_eq!(w.calls, HashMap::from([((1, 3), 7), ((1, 4), 1)]));
        let w = t.window(&[], Some(&[(7, slot(1, 10, &[(3, 9)])), (8, slot(1, 11, &[(3, 2), (4, 1)]))]));
        assert_eq!(w.calls, HashMap::from([((1, 3), 4)]));
        assert!(t.window(&[], Some(&[(7, slot(1, 10, &[(3, 9)]))])).calls.is_empty(), "no growth, no row");
        assert_eq!(t.total(), 12);
    }

    #[test]
    fn a_counter_that_wraps_still_ships_its_growth() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, u32::MAX - 1)]))]));
        let w = t.window(&[], Some(&[(7, slot(1, 10, &[(3, 3)]))]));
        assert_eq!(w.calls[&(1, 3)], 5);
    }

    #[test]
    fn an_exit_between_reads_is_counted_once_at_the_next_window() {
        let mut t = ThreadCounts::default();
        assert_eq!(t.window(&[], Some(&[(7, slot(1, 10, &[(3, 100)]))])).calls[&(1, 3)], 100);
        // Exited after this window's retired read: gone from the live read.
        assert_eq!(t.window(&[], Some(&[])), Growth::default());
        // Its retired copy arrives now: only what the agent had not seen.
        let w = t.window(&[(rk(7, 10), slot(1, 10, &[(3, 130)]))], Some(&[]));
        assert_eq!(w.calls, HashMap::from([((1, 3), 30)]));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_reused_tid_starts_from_zero_and_the_old_thread_keeps_its_tail() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, 100)]))]));
        // Thread 7 (born 10) exited with 120; a new thread 7 (born 50) has 4.
        let w = t.window(&[(rk(7, 10), slot(1, 10, &[(3, 120)]))], Some(&[(7, slot(2, 50, &[(3, 4)]))]));
        assert_eq!(w.calls, HashMap::from([((1, 3), 20), ((2, 3), 4)]));
        // The new thread goes on.
        let w = t.window(&[], Some(&[(7, slot(2, 50, &[(3, 6)]))]));
        assert_eq!(w.calls, HashMap::from([((2, 3), 2)]));
    }

    #[test]
    fn a_thread_born_and_gone_within_a_window_counts_whole() {
        let mut t = ThreadCounts::default();
        let w = t.window(&[(rk(9, 1), slot(4, 1, &[(3, 12), (5, 1)]))], Some(&[]));
        assert_eq!(w.calls, HashMap::from([((4, 3), 12), ((4, 5), 1)]));
    }

    #[test]
    fn a_slot_both_retired_and_still_listed_is_counted_once() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, 10)]))]));
        let w = t.window(&[(rk(7, 10), slot(1, 10, &[(3, 15)]))], Some(&[(7, slot(1, 10, &[(3, 15)]))]));
        assert_eq!(w.calls, HashMap::from([((1, 3), 5)]));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn slots_that_vanish_without_a_retired_copy_are_forgotten() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, 10)]))]));
        for _ in 0..=ABSENT_WINDOWS {
            t.window(&[], Some(&[]));
        }
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn nested_calls_grow_like_counts_and_keep_a_compat_slot_alive() {
        let mut t = ThreadCounts::default();
        let nested = |tgid, born, n| ThreadCall { tgid, born, nested: n, ..ThreadCall::default() };
        let w = t.window(&[], Some(&[(7, nested(1, 10, 4)), (8, slot(1, 11, &[(3, 2)]))]));
        assert_eq!(w.nested, HashMap::from([(1, 4)]));
        let w = t.window(&[(rk(7, 10), nested(1, 10, 9))], Some(&[]));
        assert_eq!(w.nested, HashMap::from([(1, 5)]));
        assert!(w.calls.is_empty());
    }

    #[test]
    fn a_failed_read_of_the_live_slots_ages_nothing() {
        let mut t = ThreadCounts::default();
        t.window(&[], Some(&[(7, slot(1, 10, &[(3, 10)]))]));
        for _ in 0..=ABSENT_WINDOWS + 1 {
            assert_eq!(t.window(&[], None), Growth::default());
        }
        assert_eq!(t.window(&[], Some(&[(7, slot(1, 10, &[(3, 14)]))])).calls, HashMap::from([((1, 3), 4)]));
    }
}
