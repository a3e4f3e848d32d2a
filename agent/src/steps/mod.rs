// SPDX-License-Identifier: Apache-2.0
//! Training steps without code changes: each thread's return-probed calls
//! (the `marks` ring) are kept for a while; once their ops repeat with a
//! period ([`cycle`]), every return of the op that ends a cycle ends a
//! step, and the time between two such returns is the step's time. A
//! process's steps are those of its thread with the clearest cycle.
//!
//! Where it cannot: a process that makes no return-probed call in its loop
//! (launches only, never a sync or copy) or whose calls follow no cycle
//! ships no steps (null), never a guess.

mod cycle;
mod ends;
mod kinds;
mod mark;

use std::collections::{HashMap, VecDeque};

use mark::Mark;

use crate::probes::abi::CallMark;

/// Calls kept per thread: three cycles of the longest period looked for.
const HISTORY: usize = 3 * cycle::MAX_PERIOD + cycle::MAX_PERIOD / 2;
/// Threads followed at once; the ones quiet longest go first.
const MAX_THREADS: usize = 4096;
/// A thread with no call this long is forgotten (ns).
const QUIET_NS: u64 = 600 * 1_000_000_000;

/// One process's steps in one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepStats {
    /// Steps that ended in the window.
    pub steps: u32,
    /// Median and longest of those whose start is known (ns).
    pub p50_ns: Option<u64>,
    pub max_ns: Option<u64>,
    /// The op whose return ends each step.
    pub op: u16,
}

#[derive(Debug, Default)]
struct Thread {
    tgid: u32,
    marks: VecDeque<Mark>,
    /// Returns before this (monotonic ns) are counted in a closed window.
    counted_to: u64,
    /// The last window closed with a cycle: the steps since are all new.
    steady: bool,
    /// Calls since the cycle was last looked at.
    new_marks: usize,
    cycle: Option<cycle::Cycle>,
}

/// The step state of every thread that makes return-probed calls.
#[derive(Debug, Default)]
pub struct Steps {
    threads: HashMap<u32, Thread>,
}

impl Steps {
    /// Takes calls as the ring gives them.
    pub(crate) fn push(&mut self, marks: impl IntoIterator<Item = CallMark>) {
        for m in marks {
            let Ok(op) = u16::try_from(m.op) else { continue };
            self.push_call(m.tgid, m.tid, op, m.ts_ns, m.dur_ns);
        }
    }

    /// One call of thread `tid` of process `tgid`: op `op` returned at
    /// `ts_ns` (monotonic) after `dur_ns`.
    pub fn push_call(&mut self, tgid: u32, tid: u32, op: u16, ts_ns: u64, dur_ns: u64) {
        if !self.threads.contains_key(&tid) && self.threads.len() >= MAX_THREADS {
            self.evict_quietest();
        }
        let t = self.threads.entry(tid).or_default();
        if t.tgid != tgid {
            // A new thread, or a reused tid: nothing of the old one holds.
            *t = Thread { tgid, ..Thread::default() };
        }
        if t.marks.len() == HISTORY {
            t.marks.pop_front();
        }
        t.marks.push_back(Mark { op, ts_ns, dur_ns });
        t.new_marks += 1;
    }

    fn evict_quietest(&mut self) {
        let last = |t: &Thread| t.marks.back().map_or(0, |m| m.ts_ns);
        if let Some(tid) = self.threads.iter().min_by_key(|(_, t)| last(t)).map(|(&tid, _)| tid) {
            self.threads.remove(&tid);
        }
    }

    /// Closes a window ending at `end_ns` (monotonic): each process's steps
    /// that ended in it. Processes with no cycle are absent.
    pub fn window(&mut self, end_ns: u64) -> HashMap<u32, StepStats> {
        self.threads.retain(|_, t| t.marks.back().is_some_and(|m| m.ts_ns + QUIET_NS > end_ns));
        let mut best: HashMap<u32, (u32, StepStats)> = HashMap::new();
        let mut tids: Vec<u32> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            let t = self.threads.get_mut(&tid).expect("listed");
            let Some(s) = t.close(end_ns) else { continue };
            // The thread with the most steps; the first (lowest tid) on a tie.
            if best.get(&t.tgid).is_none_or(|(_, b)| s.steps > b.steps) {
                best.insert(t.tgid, (tid, s));
            }
        }
        best.into_iter().map(|(pid, (_, s))| (pid, s)).collect()
    }

    /// Forgets the threads of processes that exited.
    pub fn forget(&mut self, pid: u32) {
        self.threads.retain(|_, t| t.tgid != pid);
    }
}

impl Thread {
    fn close(&mut self, end_ns: u64) -> Option<StepStats> {
        let new = std::mem::take(&mut self.new_marks);
        if new > 0 {
            let marks = self.marks.make_contiguous();
            // The known cycle is kept while the new calls follow it.
            if !self.cycle.is_some_and(|c| cycle::still_holds(marks, c, new)) {
                self.cycle = cycle::find(marks);
            }
        }
        let Some(c) = self.cycle else {
            // Not counted yet: once a cycle is believed, these steps are.
            self.steady = false;
            return None;
        };
        let marks = self.marks.make_contiguous();
        // Steady: the returns before this window were decided in the last.
        let since = if self.steady { marks.partition_point(|m| m.ts_ns < self.counted_to) } else { 0 };
        let ends = ends::step_ends(marks, c, since);
        // A return that may be half of a step is counted once the next
        // one tells (`ends.rs`): this window stops short of it.
        let to = ends.pending.map_or(end_ns, |i| marks[i].ts_ns.clamp(self.counted_to, end_ns));
        let from = std::mem::replace(&mut self.counted_to, to);
        // A loop's first steps (a cycle is believed after three) and those
        // of windows without one count in this window, from the first step
        // of the run (a job's setup ends none).
        let first =
            if std::mem::replace(&mut self.steady, true) { 0 } else { ends::first_step_end(marks, c, &ends.at) };
        let run = ends.at.iter().filter(|&&i| i >= first).map(|&i| marks[i].ts_ns);
        let mut prev = run.clone().rfind(|&ts| ts < from);
        let mut steps = 0u32;
        let mut times = Vec::new();
        for ts in run.filter(|&ts| ts >= from && ts < to) {
            steps += 1;
            if let Some(p) = prev {
                times.push(ts - p);
            }
            prev = Some(ts);
        }
        times.sort_unstable();
        Some(StepStats {
            steps,
            p50_ns: times.get(times.len().saturating_sub(1) / 2).copied(),
            max_ns: times.last().copied(),
            op: c.probe_op(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A loop on thread `tid` of `pid`: a copy, then a sync `step_ms` later,
    /// from `start_ms`; step `slow` takes `extra_ms` more.
    fn loop_marks(pid: u32, tid: u32, start_ms: u64, step_ms: u64, n: u64, slow: u64, extra_ms: u64) -> Vec<CallMark> {
        let mut t = start_ms * MS;
        let mut out = Vec::new();
        for s in 0..n {
            let len = (step_ms + if s == slow { extra_ms } else { 0 }) * MS;
            out.push(CallMark { ts_ns: t + MS, dur_ns: 10_000, tgid: pid, tid, op: 3, flags: 0 });
            t += len;
            out.push(CallMark { ts_ns: t, dur_ns: len - 2 * MS, tgid: pid, tid, op: 5, flags: 0 });
        }
        out
    }

    #[test]
    fn steps_their_median_and_the_slow_one_per_window() {
        let mut s = Steps::default();
        // 100-ms steps from t=0; the 15th step (ending in 1..2 s) takes 250 ms more.
        s.push(loop_marks(10, 10, 0, 100, 30, 14, 250));
        let w1 = s.window(1000 * MS);
        // Ends at 100, ..., 900: the first one's start is not known.
        assert_eq!(w1[&10], StepStats { steps: 9, p50_ns: Some(100 * MS), max_ns: Some(100 * MS), op: 5 });
        let w2 = s.window(2000 * MS);
        // Ends at 1000, ..., 1400, 1750 (the slow one), 1850, 1950.
        assert_eq!(w2[&10].steps, 8);
        assert_eq!(w2[&10].max_ns, Some(350 * MS));
        assert_eq!(w2[&10].p50_ns, Some(100 * MS));
        let w3 = s.window(4000 * MS);
        assert_eq!(w3[&10].steps, 13);
    }

    /// A slow step before the cycle is known does not hide it: the first
    /// window already has its steps, the slow one among them.
    #[test]
    fn a_slow_step_among_the_first_few_is_counted() {
        let mut s = Steps::default();
        // 50-ms steps; the 3rd takes 500 ms more (more than half the window's time).
        let marks = loop_marks(10, 10, 0, 50, 30, 2, 500);
        let (first, rest): (Vec<CallMark>, Vec<CallMark>) = marks.into_iter().partition(|m| m.ts_ns < 1000 * MS);
        s.push(first);
        let w1 = s.window(1000 * MS);
        // Ends at 50, 100, 650, 700, ..., 950: 9, the first one's start unknown.
        assert_eq!(w1[&10], StepStats { steps: 9, p50_ns: Some(50 * MS), max_ns: Some(550 * MS), op: 5 });
        s.push(rest);
        assert_eq!(s.window(2000 * MS)[&10].steps, 20);
    }

    /// Steps counted over windows of `window_ms` up to `until_ms`, each
    /// window given the calls that returned in it (as the ring does), and
    /// the longest step shipped.
    fn count(marks: Vec<CallMark>, pid: u32, window_ms: u64, until_ms: u64) -> (u32, Option<u64>) {
        let (mut s, mut ws) = (Steps::default(), Vec::new());
        for w in 1..=until_ms / window_ms {
            let (from, to) = ((w - 1) * window_ms * MS, w * window_ms * MS);
            s.push(marks.iter().copied().filter(|m| m.ts_ns >= from && m.ts_ns < to));
            ws.extend(s.window(to).remove(&pid));
        }
        (ws.iter().map(|w| w.steps).sum(), ws.iter().filter_map(|w| w.max_ns).max())
    }

    /// 1-s steps: the cycle is believed after three, in the third window;
    /// the two steps before count then, and no step twice.
    #[test]
    fn a_loops_first_steps_count_once_its_cycle_is_believed() {
        // 20 steps of 1 s from t=0; the 9th takes 5 s more.
        assert_eq!(count(loop_marks(10, 10, 0, 1000, 20, 8, 5000), 10, 1000, 26_000), (20, Some(6000 * MS)));
    }

    /// A job's setup (syncs and copies in no order) before its loop: none
    /// of its syncs is a step.
    #[test]
    fn setup_calls_before_the_loop_are_no_steps() {
        let setup = [(5u32, 40u64), (3, 90), (3, 95), (5, 300), (7, 310), (5, 700), (5, 720)];
        let mut marks: Vec<CallMark> = setup
            .iter()
            .map(|&(op, ms)| CallMark { ts_ns: ms * MS, tgid: 10, tid: 10, op, ..Default::default() })
            .collect();
        // Then 12 steps of 500 ms from t=1 s.
        marks.extend(loop_marks(10, 10, 1000, 500, 12, 99, 0));
        assert_eq!(count(marks, 10, 1000, 8000), (12, Some(500 * MS)));
    }

    /// Allocations before the loop ride with its first step: every step is
    /// counted, the first with them.
    #[test]
    fn setup_allocations_do_not_cost_the_first_step() {
        let mut marks: Vec<CallMark> = [(9u32, 100u64), (9, 120)]
            .map(|(op, ms)| CallMark { ts_ns: ms * MS, tgid: 10, tid: 10, op, ..Default::default() })
            .to_vec();
        marks.extend(loop_marks(10, 10, 1000, 500, 12, 5, 300));
        assert_eq!(count(marks, 10, 1000, 9000), (12, Some(800 * MS)));
    }

    /// A blocking copy in and a blocking copy back, the same op: the copy
    /// back (it waits for the step's kernels) ends each step.
    #[test]
    fn a_copy_in_and_a_copy_back_of_one_op_end_steps_at_the_copy_back() {
        let mut marks = vec![CallMark { ts_ns: 50 * MS, dur_ns: 20_000, tgid: 10, tid: 10, op: 15, flags: 0 }];
        let mut t = 100 * MS;
        for s in 0..60u64 {
            let len = if s == 30 { 340 * MS } else { 41 * MS };
            marks.push(CallMark { ts_ns: t + 30_000, dur_ns: 12_000, tgid: 10, tid: 10, op: 4, flags: 0 });
            t += len;
            marks.push(CallMark { ts_ns: t, dur_ns: len - MS, tgid: 10, tid: 10, op: 4, flags: 0 });
        }
        let (mut s, mut ws) = (Steps::default(), Vec::new());
        for w in 1..=6u64 {
            s.push(marks.iter().copied().filter(|m| m.ts_ns >= (w - 1) * 1000 * MS && m.ts_ns < w * 1000 * MS));
            ws.extend(s.window(w * 1000 * MS).remove(&10));
        }
        assert_eq!(ws.iter().map(|w| w.steps).sum::<u32>(), 60, "{ws:?}");
        assert_eq!(ws.iter().filter_map(|w| w.max_ns).max(), Some(340 * MS), "{ws:?}");
        assert!(ws.iter().all(|w| w.op == 4 && w.p50_ns.is_none_or(|p| p == 41 * MS)), "{ws:?}");
    }

    /// A copy in and a copy back of one op, 41-ms steps; the copy in of
    /// step `late` returns after `late_ms` (its thread preempted), as long
    /// as a step's end to the split by duration.
    fn copy_in_copy_back(late: u64, late_ms: u64) -> Vec<CallMark> {
        let mut marks = Vec::new();
        let mut t = 100 * MS;
        for s in 0..60u64 {
            let copy_in = if s == late { late_ms * MS } else { 80_000 };
            marks.push(CallMark { ts_ns: t + copy_in, dur_ns: copy_in, tgid: 10, tid: 10, op: 4, flags: 0 });
            t += 41 * MS;
            marks.push(CallMark { ts_ns: t, dur_ns: 38 * MS, tgid: 10, tid: 10, op: 4, flags: 0 });
        }
        marks
    }

    /// A late copy in ends no step, in whichever window it falls, however
    /// the windows cut the steps around it.
    #[test]
    fn a_late_copy_in_ends_no_step() {
        for late in [2, 19, 24, 25, 40, 58] {
            for window_ms in [250, 1000] {
                let (steps, max) = count(copy_in_copy_back(late, 3), 10, window_ms, 3000);
                assert_eq!((steps, max), (60, Some(41 * MS)), "copy in of step {late} late, {window_ms}-ms windows");
            }
        }
    }

    /// A step that syncs twice is one step, not two.
    #[test]
    fn a_step_that_syncs_twice_is_one_step() {
        let mut marks = Vec::new();
        for s in 0..40u64 {
            let t = s * 30 * MS;
            for i in 0..3 {
                marks.push(CallMark { ts_ns: t + i * 1000, dur_ns: 1000, tgid: 10, tid: 10, op: 3, flags: 0 });
                if s == 17 && i == 1 {
                    // Between the second and third copies.
                    marks.push(CallMark { ts_ns: t + 1500, dur_ns: 400, tgid: 10, tid: 10, op: 5, flags: 0 });
                }
            }
            marks.push(CallMark { ts_ns: t + 29 * MS, dur_ns: 28 * MS, tgid: 10, tid: 10, op: 5, flags: 0 });
        }
        assert_eq!(count(marks, 10, 480, 1500), (40, Some(30 * MS)));
    }

    /// Three copies and a sync a step, an allocation every 7th step: the
    /// steps before the cycle is believed count, allocating ones included.
    #[test]
    fn steps_that_also_allocate_count_from_the_first() {
        let mut marks = Vec::new();
        for s in 0..40u64 {
            let t = s * 30 * MS;
            for i in 0..3 {
                marks.push(CallMark { ts_ns: t + i * 1000, dur_ns: 1000, tgid: 10, tid: 10, op: 3, flags: 0 });
            }
            if s % 7 == 3 {
                marks.push(CallMark { ts_ns: t + 5000, dur_ns: 1000, tgid: 10, tid: 10, op: 9, flags: 0 });
            }
            marks.push(CallMark { ts_ns: t + 29 * MS, dur_ns: 28 * MS, tgid: 10, tid: 10, op: 5, flags: 0 });
        }
        // The cycle is believed in the first window, which ends after 16 steps.
        assert_eq!(count(marks, 10, 480, 1500), (40, Some(30 * MS)));
    }

    #[test]
    fn a_process_without_a_cycle_has_no_steps() {
        let mut s = Steps::default();
        let mut x = 11u32;
        let marks = (0..200u64).map(|i| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            CallMark { ts_ns: i * MS, tgid: 7, tid: 7, op: (x >> 16) % 6, ..Default::default() }
        });
        s.push(marks.collect::<Vec<_>>());
        assert!(s.window(100 * MS).is_empty());
    }

    #[test]
    fn the_thread_with_the_most_steps_speaks_for_its_process() {
        let mut s = Steps::default();
        s.push(loop_marks(20, 21, 0, 200, 5, 99, 0));
        s.push(loop_marks(20, 22, 0, 50, 20, 99, 0));
        let w = s.window(1000 * MS);
        assert_eq!(w[&20].steps, 19);
        assert_eq!(w[&20].p50_ns, Some(50 * MS));
        s.forget(20);
        assert!(s.window(2000 * MS).is_empty());
    }

    #[test]
    fn a_reused_tid_starts_afresh() {
        let mut s = Steps::default();
        s.push(loop_marks(30, 31, 0, 100, 9, 99, 0));
        s.push(loop_marks(40, 31, 900, 100, 2, 99, 0));
        // Two steps of the new process: too few for a cycle.
        assert!(s.window(2000 * MS).is_empty());
    }
}
