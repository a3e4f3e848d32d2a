// SPDX-License-Identifier: Apache-2.0
//! The probe loop (probe → window → attribute) on its own thread: process
//! events as they come, a drained window every `--window`, tables to the
//! shipper on the async runtime.

mod attach;

use crate::watchdog::Step;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ingero_model::Tables;
use tokio::sync::mpsc;

use crate::attribution::Attributor;
use crate::attribution::cgroup::Scope;
use crate::detacher::Detacher;
use crate::error::Result;
use crate::host::HostFacts;
use crate::probes::abi::{
    Counters, PROC_COMM_INIT, PROC_DLOPEN, PROC_EXEC, PROC_EXIT, PROC_FORK, PROC_LIB_LOOKUP, ProcEvent,
};
use crate::probes::drain::{self, Rings, StallRings};
use crate::probes::grace::Grace;
use crate::probes::libs;
use crate::probes::load::Probes;
use crate::probes::ops::Lib;
use crate::probes::statics::StaticRuntimes;
use crate::probes::thread_counts::ThreadCounts;
use crate::probes::unpreempted::Unpreempted;
use crate::stacks::Stall;
use crate::stacks::worker::Stacks;
use crate::window::{WindowBuilder, WindowCtx};

pub use crate::loop_config::{LoopConfig, LoopStats};

/// Holds in a row that outlast their probing before the hold is turned off.
const HOLDS_OUTLASTED_OFF: u32 = 3;

/// The probe thread's state: the loaded probes, what it knows of each
/// process, and the window being filled.
pub struct ProbeLoop {
    probes: Probes,
    rings: Rings,
    cfg: LoopConfig,
    stats: Arc<LoopStats>,
    /// Batches the shipper dropped from a full spool (shown in node_windows).
    spool_dropped: Arc<AtomicU64>,
    attr: Attributor,
    host: HostFacts,
    statics: StaticRuntimes,
    /// The stacks worker: outlier calls resolved as they arrive (a process
    /// that exits at once keeps its frames).
    stacks: Stacks,
    /// Outlier calls of the current window, resolved.
    stalls: Vec<Stall>,
    pid_filter: HashSet<u32>,
    /// `--cgroup-root`, checked again before a process is probed.
    scope: Option<Scope>,
    cg_paths: HashMap<u64, String>,
    baselines: crate::thresholds::Baselines,
    /// pid → what its last process_meta row said (ProcInfo::meta_key).
    described: HashMap<u32, u64>,
    /// pid → end of the last window in which it made a traced call (µs).
    last_call_us: HashMap<u32, i64>,
    /// Process events of the current window (exec, exit, fork, OOM).
    events: Vec<ProcEvent>,
    /// Processes that exited in the last window, forgotten after the next:
    /// the calls a process makes between a window's flip and its exit land
    /// in the next window's half, after its exit event was handled.
    exited: Vec<u32>,
    /// Processes to scan again shortly after an exec or fork.
    follow_ups: Vec<(Instant, u32)>,
    next_scan: Instant,
    last_counters: Counters,
    run_time: crate::run_time::RunTimeSampler,
    /// Closes the probes of library files no process maps any more.
    detacher: Detacher,
    /// Holds in a row whose probing took the whole hold (`hold_outlasted`).
    holds_outlasted: u32,
    /// Tells when the half flipped away from is no longer written.
    grace: Grace,
    /// What was last read of the launches threads count themselves.
    per_thread: ThreadCounts,
    over_goal: crate::cost::OverGoal,
    budget: crate::budget::Budget,
    /// Timed calls in and out of the duty cycle's on parts: the estimates' pace.
    sampling: crate::sampling::Sampling,
    /// The share of the window just flipped that the duty-cycled probes were on.
    flip_ratio: f64,
    /// Each thread's recent syncs, copies and collectives: its step cycle.
    steps: crate::steps::Steps,
    guard: crate::probes::guard::AttachGuard,
}

impl std::fmt::Debug for ProbeLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeLoop").finish_non_exhaustive()
    }
}

impl ProbeLoop {
    /// Applies the rest of the configuration to the kernel side and probes
    /// what is already there, so the first window is complete. `probes`
    /// were loaded with this configuration's scope, pids and hold
    /// ([`crate::probes::load::Settings`]).
    pub fn start(
        mut probes: Probes,
        cfg: LoopConfig,
        stats: Arc<LoopStats>,
        spool_dropped: Arc<AtomicU64>,
        kube: crate::attribution::KubeSources,
    ) -> Result<ProbeLoop> {
        let rings = Rings::take(&mut probes)?;
        let stacks = Stacks::start(StallRings::take(&mut probes)?)?;
        stats.watchdog.set_limit(cfg.watchdog);
        probes.set_call_marks(cfg.steps)?;
        if !probes.set_offcpu_sites(cfg.offcpu_site_min)? && !cfg.offcpu_site_min.is_zero() {
            tracing::warn!(
                "off-CPU call sites need the full object on x86-64 (`ingero-agent check`): episodes ship without them"
            );
        }
        crate::probes::memory::log_map_memory(&stats);
        // Before any library is probed: the hot probes of each go to it.
        let pause = Arc::new(crate::detacher::HoldPause::new(probes.take_holds_paused()));
        let duty = cfg.trap_budget.is_some() && probes.start_duty(cfg.window, pause.clone());
        tracing::info!(budget = ?cfg.trap_budget, duty, "trap budget");
        stats.sample_ratio_ppm.store(1_000_000, Ordering::Relaxed);
        stats.trap_ns.store(probes.trap_ns.map_or(0, |t| t.round() as u64), Ordering::Relaxed);
        let mut l = ProbeLoop {
            rings,
            attr: Attributor::new(cfg.cgroup_mount.clone()).with_kubernetes(kube.watch, kube.gpus),
            host: HostFacts::read(),
            statics: StaticRuntimes::default(),
            stacks,
            stalls: Vec::new(),
            pid_filter: cfg.pids.iter().copied().collect(),
            scope: cfg.cgroup_root.as_deref().map(|d| Scope::new(d, &cfg.cgroup_mount)),
            cg_paths: crate::attribution::cgroup::paths(&cfg.cgroup_mount, cfg.cgroup_root.as_deref()),
            baselines: Default::default(),
            described: HashMap::new(),
            last_call_us: HashMap::new(),
            events: Vec::new(),
            exited: Vec::new(),
            follow_ups: Vec::new(),
            next_scan: Instant::now() + cfg.rescan,
            last_counters: Counters::default(),
            run_time: crate::run_time::RunTimeSampler::new(cfg.probe_time_every),
            detacher: Detacher::start(stats.clone(), pause),
            holds_outlasted: 0,
            grace: Grace::start()?,
            per_thread: ThreadCounts::default(),
            over_goal: Default::default(),
            budget: crate::budget::Budget::new(cfg.trap_budget, cfg.window),
            sampling: Default::default(),
            flip_ratio: 1.0,
            steps: Default::default(),
            guard: crate::probes::guard::AttachGuard::new(cfg.max_libraries, cfg.max_libraries_per_process),
            probes,
            cfg,
            stats,
            spool_dropped,
        };
        l.scan(&libs::pids(l.cfg.cgroup_root.as_deref()), "start");
        // A fixed outlier threshold applies from the first call, not the first window.
        l.baselines.update(&mut l.probes, &drain::Drained::default(), &l.cfg);
        l.attach_well_known();
        Ok(l)
    }

    /// Runs until `stop` is set; every window's tables go to `tx`.
    pub fn run(mut self, tx: mpsc::Sender<Tables>, stop: &AtomicBool) -> Result<()> {
        let window_us = self.cfg.window.as_micros() as i64;
        let now_us = chrono::Utc::now().timestamp_micros();
        let mut window_start = now_us - now_us % window_us;
        // Tests and scripts start workloads on this line: every library is probed.
        tracing::info!(window = ?self.cfg.window, libraries = self.stats.libraries.load(Ordering::Relaxed), "probe loop ready");
        loop {
            let window_end = window_start + window_us;
            self.poll_until(window_end, stop);
            crate::watchdog::note_late(
                &self.stats.window_late_max_us,
                chrono::Utc::now().timestamp_micros() - window_end,
            );
            // Read before the drain: a stop that arrives while a window is
            // being built or sent gets one more drain, so the calls made
            // after this one (a workload that ends just before SIGTERM) ship.
            let last = stop.load(Ordering::Relaxed);
            let stats = self.stats.clone();
            let flipped = self.flip_and_settle()?;
            let busy = stats.watchdog.enter(Step::CloseWindow);
            let tables = self.close_window(flipped, window_start, window_us, last)?;
            drop(busy);
            let _busy = stats.watchdog.enter(Step::SendWindow);
            if tx.blocking_send(tables).is_err() || last {
                self.close_probes();
                return Ok(());
            }
            window_start = window_end;
        }
    }

    /// Probes the CUDA/NCCL libraries these processes map; `why` names
    /// what asked for the scan (logged when a process is out of scope).
    fn scan(&mut self, pids: &[u32], why: &'static str) {
        for &pid in pids {
            if !self.pid_filter.is_empty() && !self.pid_filter.contains(&pid) {
                continue;
            }
            if let Some(cgroup) = self.scope.as_ref().and_then(|s| s.outside(pid)) {
                tracing::info!(pid, why, cgroup, "outside --cgroup-root: not probed");
                continue;
            }
            let all = self.statics.scan_pid(pid);
            let found = self.guard.of_process(pid, &all, |f| self.probes.is_attached(f));
            for &f in &found {
                let info = self.attr.get(pid);
                if f.lib != Lib::Libc && !info.libraries.contains(&f.mapped_as) {
                    info.libraries.push(f.mapped_as.clone());
                }
                if !self.probes.is_attached(f) {
                    self.attach(pid, f);
                }
            }
            if found.iter().any(|f| f.lib != Lib::Libc) {
                self.stacks.register(pid, &mut self.probes);
                self.probes.mark_known(pid);
            }
        }
    }

    /// Handles process events until the window ends, waking at least every
    /// 10 ms (exec → rescan at once) and at once for a held library lookup.
    fn poll_until(&mut self, window_end: i64, stop: &AtomicBool) {
        loop {
            let now = chrono::Utc::now().timestamp_micros();
            if now >= window_end || stop.load(Ordering::Relaxed) {
                return;
            }
            self.rings.wait_procs(None, Duration::from_micros(((window_end - now) as u64).min(10_000)));
            let stats = self.stats.clone();
            let dog = &stats.watchdog;
            let busy = dog.enter(Step::ProcessEvents);
            for e in self.rings.procs() {
                self.on_proc_event(e);
            }
            drop(busy);
            self.stalls.extend(self.stacks.take());
            self.take_marks();
            let now = Instant::now();
            let due: Vec<u32> = self.follow_ups.iter().filter(|(t, _)| *t <= now).map(|(_, p)| *p).collect();
            if !due.is_empty() {
                self.follow_ups.retain(|(t, _)| *t > now);
                let _busy = dog.enter(Step::ScanNew);
                self.scan(&due, "follow-up");
            }
            if Instant::now() >= self.next_scan {
                let _busy = dog.enter(Step::Rescan);
                self.scan(&libs::pids(self.cfg.cgroup_root.as_deref()), "rescan");
                self.next_scan = Instant::now() + self.cfg.rescan;
            }
        }
    }

    /// Turns the hold off where every hold outlasts its probing (a kernel
    /// where a held thread delays uprobe registration): each would cost its
    /// thread the full bound for nothing.
    fn hold_outlasted(&mut self, took: Duration) {
        if !self.cfg.hold_dlopen {
            return;
        }
        if took < self.cfg.hold_max.mul_f64(0.9) {
            self.holds_outlasted = 0;
            return;
        }
        // One slow probing (a loaded node, another tool's probes closing)
        // costs one bounded wait; only a kernel where every hold outlasts
        // its probing turns the hold off.
        self.holds_outlasted += 1;
        if self.holds_outlasted < HOLDS_OUTLASTED_OFF {
            tracing::info!(took_ms = took.as_millis() as u64, "probing a held process took the whole hold");
            return;
        }
        self.cfg.hold_dlopen = false;
        tracing::warn!(
            took_ms = took.as_millis() as u64,
            "library hold turned off: probing a held process took the whole hold {HOLDS_OUTLASTED_OFF} times in a row (on this kernel a held thread delays uprobe registration); first calls into a library dlopen'd and called at once are missed"
        );
        if let Err(e) = self.probes.set_hold_dlopen(false, self.cfg.hold_max) {
            tracing::warn!(error = %e, "cannot turn the library hold off");
        }
    }

    fn on_proc_event(&mut self, e: ProcEvent) {
        match e.kind {
            PROC_DLOPEN => {
                // The thread waits in the kernel until its library is
                // probed and its interpreter found (the scan does both).
                let t = Instant::now();
                self.scan(&[e.tgid], "held lookup");
                self.probes.release(e.tgid, e.other);
                let took = t.elapsed();
                tracing::debug!(pid = e.tgid, tid = e.other, held_us = took.as_micros() as u64, "library lookup held");
                self.hold_outlasted(took);
                return;
            }
            PROC_LIB_LOOKUP => {
                // Nothing waits (a kernel without the hold): probe now, not
                // at the next rescan; the calls made meanwhile are lost.
                self.scan(&[e.tgid], "lookup");
                return;
            }
            PROC_EXEC | PROC_FORK => {
                let pid = if e.kind == PROC_FORK { e.other } else { e.tgid };
                if e.kind == PROC_EXEC {
                    // A new image: what was derived from the old one (its
                    // interpreter's layout, its maps) no longer holds.
                    let _rt = Unpreempted::for_maps(&self.probes.features);
                    self.probes.forget(pid);
                    self.baselines.forget(&mut self.probes.ebpf, pid);
                    self.stacks.forget(pid);
                }
                self.attr.refresh(pid);
                self.scan(&[pid], if e.kind == PROC_FORK { "fork" } else { "exec" });
                // The loader maps DT_NEEDED libraries and programs dlopen
                // theirs shortly after exec: look again soon.
                let now = Instant::now();
                for ms in [10, 40, 150, 500, 1500] {
                    self.follow_ups.push((now + Duration::from_millis(ms), pid));
                }
            }
            PROC_COMM_INIT => {
                let p = self.attr.get(e.tgid);
                p.nccl_comm = Some(format!("{:016x}", e.extra));
                p.nccl_rank = Some((e.other as i32, e.value));
                self.described.remove(&e.tgid);
                return;
            }
            _ => {}
        }
        self.events.push(e);
    }

    /// Flips the aggregates' active half and handles process events until
    /// every program that may still write the old one has finished: a thread
    /// held at a library lookup keeps that wait from ending until the loop
    /// releases it. Returns the half to drain.
    fn flip_and_settle(&mut self) -> Result<drain::Flipped> {
        let flipped = drain::flip(&mut self.probes)?;
        let now = crate::probes::duty::mono_ns();
        self.flip_ratio = self.probes.duty.as_mut().map_or(1.0, |d| d.window_ratio(now));
        self.sampling.flipped(flipped.idle());
        self.grace.begin();
        let stats = self.stats.clone();
        let _busy = stats.watchdog.enter(Step::Settle);
        while !self.grace.done() {
            self.rings.wait_procs(Some(self.grace.fd()), Duration::from_millis(10));
            for e in self.rings.procs() {
                self.on_proc_event(e);
            }
        }
        Ok(flipped)
    }

    /// Drains the kernel's window (the idle half) and turns it into tables.
    fn close_window(
        &mut self,
        flipped: drain::Flipped,
        window_start: i64,
        window_us: i64,
        last: bool,
    ) -> Result<Tables> {
        let mut d = drain::drain(&mut self.probes, flipped, &mut self.per_thread)?;
        if !self.pid_filter.is_empty() {
            // Library probes fire for every process using the file: keep --pid only.
            let keep = &self.pid_filter;
            d.calls.retain(|(k, _)| keep.contains(&k.tgid));
            d.sched.retain(|(p, _)| keep.contains(p));
            d.io.retain(|(k, _)| keep.contains(&k.tgid));
        }
        let flushed = self.stacks.flush(last);
        self.stalls.extend(flushed);
        self.take_marks();
        let delta = d.counters.since(&self.last_counters);
        self.last_counters = d.counters;
        let shares = self.sampling.estimate(&mut d, self.flip_ratio, delta.mark_drops == 0);
        self.count_cost(&d, &shares);
        let stalls = std::mem::take(&mut self.stalls);
        let probe_run_ns = self.run_time.window_end(&self.probes);
        if d.cgroups.iter().any(|(id, _)| !self.cg_paths.contains_key(id)) {
            self.cg_paths = crate::attribution::cgroup::paths(&self.cfg.cgroup_mount, self.cfg.cgroup_root.as_deref());
        }
        let progress = self.progress(&d, window_start + window_us, delta.mark_drops > 0);
        if self.attr.begin_window() {
            // A process gone from /proc has passed its exit tracepoint, so
            // its exit event is in the ring even when it exited after the
            // settle: its rows take the name it had then, not the one
            // cached before a rename (seen on 6.1 under emulation).
            let late = self.rings.procs();
            tracing::debug!(
                events = late.len(),
                exits = late.iter().filter(|e| e.kind == PROC_EXIT).count(),
                "a cached process is gone from /proc: process events read after the settle"
            );
            for e in late {
                self.on_proc_event(e);
            }
        }
        for e in self.events.iter().filter(|e| e.kind == PROC_EXIT) {
            self.attr.exited_as(e.tgid, &e.comm);
        }
        let ctx = WindowCtx {
            node: &self.cfg.node,
            window_start_us: window_start,
            window_us: window_us as u64,
            mono_to_wall_us: crate::progress::mono_to_wall_us(),
            counters_delta: delta,
            spool_dropped: self.spool_dropped.load(Ordering::Relaxed),
            probe_run_ns,
            host: &self.host,
            cgroup_scoped: self.cfg.cgroup_root.is_some(),
            sample_shares: &shares,
        };
        // Only processes in scope produce rows (a scoped agent shares the kernel maps' view).
        let mut built = WindowBuilder::new(&ctx, &mut self.attr).build(&d, &stalls, &self.events, &self.cg_paths);
        let mut changed: Vec<u32> = Vec::new();
        for (k, _) in &d.calls {
            let key = self.attr.get(k.tgid).meta_key();
            if self.described.insert(k.tgid, key) != Some(key) {
                changed.push(k.tgid);
            }
        }
        let meta = WindowBuilder::new(&ctx, &mut self.attr).process_meta(&changed);
        built.tables.extend(meta.tables);
        let progress = WindowBuilder::new(&ctx, &mut self.attr).progress(&progress);
        built.tables.extend(progress.tables);
        let invalid = built.invalid_rows + meta.invalid_rows + progress.invalid_rows;
        self.stats.rows_invalid.fetch_add(invalid, Ordering::Relaxed);
        self.forget_exited();
        self.detach_unused();
        self.baselines.update(&mut self.probes, &d, &self.cfg);
        self.count_window(&delta, probe_run_ns);
        Ok(built.tables)
    }

    /// Timed calls as they returned: to the step finder, and counted in
    /// and out of the duty cycle's on parts.
    fn take_marks(&mut self) {
        let marks = self.rings.marks();
        if self.probes.duty.is_some() {
            self.sampling.note(&marks);
        }
        self.steps.push(marks);
    }

    /// Calls in flight per process at the window's end (the thread slots
    /// the drain read), and how long ago each known CUDA process last made a call.
    fn progress(&mut self, d: &drain::Drained, window_end: i64, marks_lost: bool) -> Vec<crate::progress::Progress> {
        for (k, _) in &d.calls {
            self.last_call_us.insert(k.tgid, window_end);
        }
        let keep = &self.pid_filter;
        let in_flight: Vec<_> =
            d.threads.iter().copied().filter(|(_, c)| keep.is_empty() || keep.contains(&c.tgid)).collect();
        let now = crate::progress::mono_now_ns();
        let mut rows =
            crate::progress::collect(&in_flight, &self.last_call_us, now, window_end, crate::progress::proc_state);
        // Steps that ended before the window's end on the monotonic clock.
        let end_ns = (window_end - crate::progress::mono_to_wall_us()).max(0) as u64 * 1000;
        let mut steps = self.steps.window(end_ns);
        if marks_lost {
            // A lost mark can merge two steps into one: no count rather than a wrong one.
            steps.clear();
        }
        for r in &mut rows {
            r.steps = steps.remove(&r.pid);
        }
        rows
    }

    /// Drops what is cached about processes that exited: their probe state
    /// at once (files they mapped can be detached), their names and
    /// cgroups one window later (`crate::exits`: calls they made after the
    /// flip are in the next window).
    fn forget_exited(&mut self) {
        let _rt = Unpreempted::for_maps(&self.probes.features);
        for e in self.events.iter().filter(|e| e.kind == PROC_EXIT) {
            self.probes.forget(e.tgid);
            self.baselines.forget(&mut self.probes.ebpf, e.tgid);
            self.stacks.forget(e.tgid);
            self.described.remove(&e.tgid);
            self.last_call_us.remove(&e.tgid);
            self.over_goal.forget(e.tgid);
            self.sampling.forget(e.tgid);
            self.steps.forget(e.tgid);
        }
        for pid in crate::exits::exited_before(&mut self.exited, self.events.drain(..)) {
            self.attr.forget(pid);
        }
        // Exits lost to a full ring buffer, and reused pids, are caught here:
        // cached state stays bounded by the processes alive now.
        for pid in self.attr.prune() {
            self.sampling.forget(pid);
            self.probes.forget(pid);
            self.baselines.forget(&mut self.probes.ebpf, pid);
            self.stacks.forget(pid);
            self.described.remove(&pid);
            self.last_call_us.remove(&pid);
        }
        self.stats.cached_processes.store(self.attr.len() as u64, Ordering::Relaxed);
    }

    /// Closes every library's probes at a stop, all at once (`close_now`).
    fn close_probes(&mut self) {
        let t = Instant::now();
        let links = self.probes.take_all();
        let n = links.len();
        self.detacher.close_now(links);
        tracing::info!(links = n, took = ?t.elapsed(), "library probes closed");
    }

    /// Frees the probes of library files no process maps any more: taken
    /// here, closed by the detacher thread (each close waits out RCU grace
    /// periods; on the loop that stalled every held lookup behind it).
    fn detach_unused(&mut self) {
        let _rt = Unpreempted::for_maps(&self.probes.features);
        let (n, links) = self.probes.take_unused(self.cfg.detach_unused_after);
        let probed = self.probes.probed_files() as u64;
        self.stats.libraries.store(probed, Ordering::Relaxed);
        if n > 0 {
            self.stats.library_detaches.fetch_add(n as u64, Ordering::Relaxed);
            self.stats.uprobes_detaching.fetch_add(links.len() as u64, Ordering::Relaxed);
            tracing::info!(files = n, probed, "detaching library files no traced process maps");
            self.detacher.send(links);
        }
    }

    /// The window's trap cost to the traced processes (metrics, a note for
    /// a process above the budget), and the duty cycle's next ratio.
    fn count_cost(&mut self, d: &drain::Drained, shares: &HashMap<u32, f64>) {
        let s = &self.stats;
        s.sample_ratio_ppm.store((self.flip_ratio * 1e6).round() as u64, Ordering::Relaxed);
        let Some(trap_ns) = self.probes.trap_ns else { return };
        let seen = |pid| shares.get(&pid).copied().unwrap_or(1.0);
        let c = crate::cost::window_cost(trap_ns, &d.calls, &d.nested, self.cfg.window, seen);
        s.trap_time_ns.fetch_add(c.total_ns, Ordering::Relaxed);
        s.busiest_trap_ppm.store(c.busiest.map_or(0, |(_, share)| (share * 1e6) as u64), Ordering::Relaxed);
        self.over_goal.check(&c, self.budget.share(), self.probes.duty.is_some());
        let floor = self.probes.duty.as_ref().map_or(1.0, |d| d.floor());
        let next = self.budget.next(&c.need, floor);
        if let Some(duty) = &self.probes.duty {
            duty.set_ratio(next);
        }
    }

    fn count_window(&self, delta: &Counters, probe_run_ns: u64) {
        let s = &self.stats;
        s.windows.fetch_add(1, Ordering::Relaxed);
        s.events.fetch_add(delta.events, Ordering::Relaxed);
        s.ringbuf_drops.fetch_add(delta.ringbuf_drops, Ordering::Relaxed);
        s.mark_drops.fetch_add(delta.mark_drops, Ordering::Relaxed);
        s.sched_missed.fetch_add(delta.sched_missed, Ordering::Relaxed);
        s.py_faults.fetch_add(delta.py_faults, Ordering::Relaxed);
        s.map_full.fetch_add(delta.map_full + delta.inflight_full, Ordering::Relaxed);
        s.lib_holds.fetch_add(delta.lib_holds, Ordering::Relaxed);
        s.lib_hold_ns.fetch_add(delta.lib_hold_ns, Ordering::Relaxed);
        s.lib_hold_timeouts.fetch_add(delta.lib_hold_timeouts, Ordering::Relaxed);
        s.probe_run_ns.fetch_add(probe_run_ns, Ordering::Relaxed);
    }
}
