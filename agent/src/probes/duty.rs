// SPDX-License-Identifier: Apache-2.0
//! The duty cycle of the hot probes (issue: under 1%). A uprobe costs its
//! trap whatever the program does, so the only way to spend less on a call
//! is to have no breakpoint there: when the agent's traps would cost a
//! process more than `--trap-budget`, the entry-only probes a program hits
//! once per kernel (`Op::duty_cycled`: launches, event records, memsets)
//! are attached for a share `r` of each cycle and detached for the rest.
//! Their counts are then a sample, and the window's count is what was seen
//! divided by the share of the window they were attached: an unbiased
//! estimate of a rate that does not follow the cycle (a training step is
//! milliseconds, the cycle a second). Timed calls (syncs, copies,
//! collectives) stay probed, so durations, outliers and steps come from
//! every call.
//!
//! Each file's hot probes are one uprobe_multi link of their own (Linux
//! 6.6+; a perf-event uprobe takes ~80 ms to close, a link one wait for all
//! of its probes), re-created from a held fd (`OpenLib::fd_path`). The on
//! part sits in the middle of each cycle, and cycles divide the window (a
//! late on part may run to the cycle's end: launches and marks are split at
//! the flip exactly, by the aggregates' half they counted in). The
//! probes count only while a gate in the kernel is open (`duty_gate`,
//! checked by the entry program on these probes alone), opened once the
//! links are placed and shut before they are closed. The estimates learn a
//! loop's pace from the timed calls that returned while the gate was open,
//! as the kernel saw it (`MARK_DUTY_ON` in each mark), not from this
//! thread's clock: a first CI run saw estimates 2.3x too high while the
//! share came from placing and closing the links, a later one -61% where
//! a clock read after a gate's write was late.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use aya::maps::{Array, MapData};

use super::abi::COOKIE_DUTY;
use super::files::{FileId, OpenLib};
use super::link::MultiLink;
use super::ops::Lib;
use super::plan::Planned;
use crate::detacher::HoldPause;

/// The least share of a cycle the probes stay on: below it the on part
/// (125 ms of a 1-s cycle) is not long against the few milliseconds a
/// link takes to place, and the estimate would be noisy.
pub(crate) const MIN_RATIO: f64 = 0.125;

/// The longest cycle: a window is divided into cycles of at most this.
const MAX_CYCLE: Duration = Duration::from_secs(1);

/// The shortest on part: placing a file's links takes 5-15 ms here, and an
/// on part not long against that would be mostly placing (a 100-ms window's
/// 12.5 ms would be).
const MIN_ON: Duration = Duration::from_millis(50);

/// One file's hot probes: the groups of offsets the kernel took as one
/// link each (normally one), and the links while they are on.
#[derive(Debug)]
struct HotFile {
    /// Keeps `path` reaching the file after the process that mapped it exits.
    _open: OpenLib,
    path: PathBuf,
    lib: Lib,
    groups: Vec<Group>,
    links: Vec<MultiLink>,
}

/// A link's file offsets and their cookies.
type Group = (Vec<u64>, Vec<u64>);

struct State {
    /// The kernel's gate (ebpf/calls.bpf.c `duty_gate`): duty-cycled
    /// probes count only while it is 1.
    gate: Array<MapData, u32>,
    files: HashMap<FileId, HotFile>,
    /// Share of each cycle the probes are to be on (1: always).
    ratio: f64,
    /// Whether the hot probes are on now (a new file follows).
    on: bool,
    /// When they were on (monotonic ns): (start, end; None while on).
    intervals: Vec<(u64, Option<u64>)>,
    stop: bool,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("files", &self.files.len()).field("on", &self.on).finish_non_exhaustive()
    }
}

impl State {
    /// Opens or shuts the gate; returns when (monotonic ns): the middle of
    /// clock reads on either side of the write, which a preemption between
    /// them can leave far apart. Only the time share (`window_ratio`) reads
    /// it; marks carry the gate as the kernel saw it.
    fn gate(&mut self, open: bool) -> u64 {
        let before = mono_ns();
        if let Err(e) = self.gate.set(0, u32::from(open), 0) {
            tracing::warn!(error = %e, open, "setting the duty gate");
        }
        let after = mono_ns();
        if after - before > 5_000_000 {
            tracing::debug!(open, ms = (after - before) as f64 / 1e6, "the duty gate's write took long");
        }
        before + (after - before) / 2
    }
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// The hot probes of every probed file, and the thread that turns them on
/// and off.
#[derive(Debug)]
pub(crate) struct Duty {
    shared: Shared,
    prog: Arc<OwnedFd>,
    /// The last window's end (monotonic ns).
    last_flip: u64,
    cycle: Duration,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    s.0.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Duty {
    /// `prog`: the entry program loaded for multi links (`call_entry`);
    /// `window`: the agent's window, which the cycles divide.
    /// `gate`: the kernel's `duty_gate` map (opened here).
    pub(crate) fn start(
        prog: OwnedFd,
        gate: Array<MapData, u32>,
        window: Duration,
        pause: Arc<HoldPause>,
    ) -> std::io::Result<Duty> {
        let mut state = State { gate, files: HashMap::new(), ratio: 1.0, on: true, intervals: vec![], stop: false };
        let now = state.gate(true);
        state.intervals.push((now, None));
        let shared: Shared = Arc::new((Mutex::new(state), Condvar::new()));
        let prog = Arc::new(prog);
        let (s, p) = (shared.clone(), prog.clone());
        let window = window.as_nanos().max(1) as u64;
        let parts = cycles_of(Duration::from_nanos(window));
        let cycle = Duration::from_nanos(window / parts);
        let thread = std::thread::Builder::new()
            .name("ingero-duty".into())
            .spawn(move || run(&s, &p, (window, parts), &pause))?;
        Ok(Duty { shared, prog, last_flip: now, cycle, thread: Some(thread) })
    }

    /// Takes `hot` (the duty-cycled ops of one file) and places them now
    /// (the kernel's answer decides which go in); they follow the cycle from
    /// then on. Returns the symbols probed.
    pub(crate) fn add(&self, id: FileId, open: OpenLib, lib: Lib, hot: &[Planned]) -> Vec<&'static str> {
        let path = open.fd_path();
        let group = |ps: &[Planned]| -> Group { ps.iter().map(|p| (p.offset, p.cookie | COOKIE_DUTY)).unzip() };
        let mut placed: Vec<(Group, MultiLink, &[Planned])> = Vec::new();
        match self.link(&path, &group(hot)) {
            Ok(l) => placed.push((group(hot), l, hot)),
            // One offset the kernel refuses: each probe a link of its own.
            Err(_) => {
                for p in hot.chunks(1) {
                    match self.link(&path, &group(p)) {
                        Ok(l) => placed.push((group(p), l, p)),
                        Err(e) => {
                            tracing::debug!(symbol = p[0].op.symbol, path = %path.display(), error = %e, "symbol not probed");
                        }
                    }
                }
            }
        }
        let done: Vec<&'static str> = placed.iter().flat_map(|g| g.2.iter().map(|p| p.op.symbol)).collect();
        if placed.is_empty() {
            return done;
        }
        let (groups, links) = placed.into_iter().map(|(g, l, _)| (g, l)).unzip();
        let mut st = lock(&self.shared);
        // Placed while the gate is shut: they count nothing, and the thread
        // closes them (`wait_until` sees a link it did not make).
        st.files.insert(id, HotFile { _open: open, path, lib, groups, links });
        if !st.on {
            self.shared.1.notify_all();
        }
        done
    }

    fn link(&self, path: &std::path::Path, (offsets, cookies): &Group) -> std::io::Result<MultiLink> {
        super::multi::attach(self.prog.as_fd(), path, offsets, cookies, false)
    }

    /// Forgets a file (no process maps it): its links, for the caller to close.
    pub(crate) fn remove(&self, id: &FileId) -> Vec<MultiLink> {
        lock(&self.shared).files.remove(id).map_or_else(Vec::new, |f| f.links)
    }

    /// The least share of a cycle the probes can be on: `MIN_RATIO`, or
    /// more where cycles are short (a window under 400 ms); 1: no cycling.
    pub(crate) fn floor(&self) -> f64 {
        floor_of(self.cycle)
    }

    /// The share of each cycle the probes are to be on from the next cycle.
    pub(crate) fn set_ratio(&self, ratio: f64) {
        let mut st = lock(&self.shared);
        let ratio = if ratio >= 1.0 { 1.0 } else { ratio.max(self.floor()) };
        if st.ratio != ratio {
            st.ratio = ratio;
            self.shared.1.notify_all();
        }
    }

    /// The share of the time since the last call that the hot probes were
    /// on (1 exactly when they were on throughout), at a window's flip.
    pub(crate) fn window_ratio(&mut self, now: u64) -> f64 {
        let start = std::mem::replace(&mut self.last_flip, now);
        let mut st = lock(&self.shared);
        let r = on_share(&st.intervals, start, now);
        st.intervals.retain(|&(_, e)| e.is_none_or(|e| e > now));
        r
    }
}

impl Drop for Duty {
    fn drop(&mut self) {
        lock(&self.shared).stop = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The least power-of-two share of `cycle` that is `MIN_ON` long, and at
/// least `MIN_RATIO`.
fn floor_of(cycle: Duration) -> f64 {
    let floor = (MIN_ON.as_nanos() as f64 / cycle.as_nanos().max(1) as f64).max(MIN_RATIO);
    let mut r = 1.0;
    while r / 2.0 >= floor {
        r /= 2.0;
    }
    r
}

/// Cycles per window: parts of at most `MAX_CYCLE`.
fn cycles_of(window: Duration) -> u64 {
    window.as_nanos().div_ceil(MAX_CYCLE.as_nanos()).max(1) as u64
}

/// How much of [start, end) the intervals cover, as a share of it.
fn on_share(intervals: &[(u64, Option<u64>)], start: u64, end: u64) -> f64 {
    if end <= start {
        return 1.0;
    }
    let covered: u64 = intervals
        .iter()
        .map(|&(s, e)| {
            let e = e.unwrap_or(end).min(end);
            e.saturating_sub(s.max(start))
        })
        .sum();
    if covered >= end - start { 1.0 } else { covered as f64 / (end - start) as f64 }
}

/// Where the on part of the cycle around `now` lies (wall clock, ns since
/// the epoch, as windows are aligned): its start and end, and the cycle's
/// end. Cycles divide each window, counted from the window's start.
fn on_part(now: u64, window: u64, parts: u64, ratio: f64) -> (u64, u64, u64) {
    let w0 = now - now % window;
    let k = (now - w0) * parts / window;
    let (c0, c1) = (w0 + k * window / parts, w0 + (k + 1) * window / parts);
    let off = ((1.0 - ratio) / 2.0 * (c1 - c0) as f64) as u64;
    (c0 + off, c1 - off, c1)
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The thread: probes on throughout at ratio 1, else on for the middle
/// `ratio` of each cycle.
fn run(shared: &Shared, prog: &OwnedFd, (window, parts): (u64, u64), pause: &HoldPause) {
    loop {
        let ratio = {
            let st = lock(shared);
            if st.stop {
                return;
            }
            st.ratio
        };
        if ratio >= 1.0 {
            set_on(shared, prog, true, pause);
            wait_until(shared, None, |st| st.ratio < 1.0);
            continue;
        }
        let now = wall_ns();
        let (on_at, off_at, next) = on_part(now, window, parts, ratio);
        if now < on_at {
            set_on(shared, prog, false, pause);
            if wait_until(shared, Some(on_at), |st| st.ratio != ratio) {
                continue;
            }
        }
        if wall_ns() < off_at {
            set_on(shared, prog, true, pause);
            wait_until(shared, Some(shut_at(wall_ns(), (on_at, off_at), next)), |_| false);
        }
        set_on(shared, prog, false, pause);
        wait_until(shared, Some(next), |st| st.ratio != ratio);
    }
}

/// When to shut a gate opened at `opened` for the on part `(on_at, off_at)`
/// of a cycle ending at `next`: the on part's full length after the gate
/// opened, however late (placing the links took 145 ms of a 125-ms on part
/// beside another agent's churn of uprobes: an on part of a few steps, whose
/// estimate was off by a third), within the cycle. Launches and marks split
/// at the flip exactly, so an on part may end at the cycle's end.
fn shut_at(opened: u64, (on_at, off_at): (u64, u64), next: u64) -> u64 {
    (opened + (off_at - on_at)).max(off_at).min(next)
}

/// Sleeps until the wall clock reaches `until` (None: forever), the agent
/// stops, or `wake` holds; returns whether it woke early.
fn wait_until(shared: &Shared, until: Option<u64>, wake: impl Fn(&State) -> bool) -> bool {
    let mut st = lock(shared);
    loop {
        if st.stop || wake(&st) || (!st.on && st.files.values().any(|f| !f.links.is_empty())) {
            return true;
        }
        let left = match until {
            Some(u) => match u.checked_sub(wall_ns()) {
                Some(l) if l > 0 => Duration::from_nanos(l),
                _ => return false,
            },
            None => Duration::from_millis(200),
        };
        st = shared.1.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
    }
}

/// Turns every file's hot probes on: their links placed, then the gate
/// opened (runtimes before the driver, as the driver's entry tells its
/// runtime's calls by them); or off: the gate shut, then the links closed
/// at once (each close waits out its grace periods). The gate's times are
/// the on part's: placing and closing take milliseconds, more on a busy node.
fn set_on(shared: &Shared, prog: &OwnedFd, on: bool, pause: &HoldPause) {
    let closing: Vec<MultiLink> = {
        let mut st = lock(shared);
        if on {
            if st.on {
                return;
            }
            let t0 = mono_ns();
            let mut files: Vec<&mut HotFile> = st.files.values_mut().collect();
            files.sort_by_key(|f| f.lib == Lib::Cuda);
            for f in files {
                for g in &f.groups {
                    match super::multi::attach(prog.as_fd(), &f.path, &g.0, &g.1, false) {
                        Ok(l) => f.links.push(l),
                        Err(e) => tracing::warn!(path = %f.path.display(), error = %e, "re-attaching sampled probes"),
                    }
                }
            }
            let t = st.gate(true);
            tracing::debug!(placed_ms = (t - t0) as f64 / 1e6, "duty gate open");
            st.intervals.push((t, None));
            st.on = true;
            return;
        }
        if st.on {
            let t = st.gate(false);
            tracing::debug!("duty gate shut");
            if let Some(last) = st.intervals.last_mut().filter(|i| i.1.is_none()) {
                last.1 = Some(t);
            }
        }
        st.on = false;
        let mut files: Vec<&mut HotFile> = st.files.values_mut().collect();
        files.sort_by_key(|f| f.lib != Lib::Cuda);
        files.into_iter().flat_map(|f| std::mem::take(&mut f.links)).collect()
    };
    if closing.is_empty() {
        return;
    }
    // Closed one after another, a later file's breakpoints would trap (and
    // count nothing) through the earlier ones' waits.
    pause.during(|| {
        std::thread::scope(|s| {
            for l in closing {
                s.spawn(move || drop(l));
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_counts_only_the_window_and_an_interval_still_open() {
        // On 0-100 and 300-?: a window of 0-1000 is 100 + 700 of 1000 on.
        let iv = [(0, Some(100)), (300, None)];
        assert!((on_share(&iv, 0, 1000) - 0.8).abs() < 1e-12);
        // Part of an interval before the window does not count.
        assert!((on_share(&[(0, Some(600))], 500, 1500) - 0.1).abs() < 1e-12);
        // On throughout: exactly 1, never a rounding below it.
        assert_eq!(on_share(&[(0, None)], 123, 1_000_000_123), 1.0);
        assert_eq!(on_share(&[], 0, 1000), 0.0);
    }

    #[test]
    fn a_gate_opened_late_stays_open_the_on_parts_length_within_the_cycle() {
        let (on, off, next) = on_part(7_000_000_000, 1_000_000_000, 1, 0.125);
        assert_eq!(shut_at(on + 1_000_000, (on, off), next), off + 1_000_000, "placed in 1 ms");
        assert_eq!(shut_at(on + 145_000_000, (on, off), next), off + 145_000_000, "placed in 145 ms");
        assert_eq!(shut_at(off + 400_000_000, (on, off), next), next, "not past the cycle");
        assert_eq!(shut_at(on - 5, (on, off), next), off, "never shorter than planned");
    }

    #[test]
    fn the_on_part_sits_mid_cycle_so_window_edges_fall_off() {
        let s = 1_000_000_000;
        let (on, off, next) = on_part(s * 7 + 3, s, 1, 0.25);
        assert_eq!((on, off, next), (7_375_000_000, 7_625_000_000, 8 * s));
        // Cycles divide the window, counted from its start: a 2.5-s window
        // is three cycles of 833 ms, the last ending with the window.
        assert_eq!(cycles_of(Duration::from_millis(2500)), 3);
        assert_eq!(cycles_of(Duration::from_secs(1)), 1);
        assert_eq!(cycles_of(Duration::from_millis(500)), 1);
        // On parts of 50 ms at least: a 100-ms window's half, a second's eighth.
        assert_eq!(floor_of(Duration::from_millis(100)), 0.5);
        assert_eq!(floor_of(Duration::from_millis(400)), MIN_RATIO);
        assert_eq!(floor_of(Duration::from_secs(1)), MIN_RATIO);
        assert_eq!(floor_of(Duration::from_millis(40)), 1.0);
        let w = 2_500_000_000;
        let (on, off, next) = on_part(w * 11 + 2_400_000_000, w, 3, 0.5);
        assert_eq!(next, w * 12);
        assert_eq!((on, off), (w * 11 + 1_666_666_666 + 208_333_333, w * 12 - 208_333_333));
    }
}
