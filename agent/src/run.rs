//! `ingero-agent run`: the probe loop (probe → window → attribute) on its own
//! thread, shipping on the async runtime.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use aya::maps::{Array, MapData};
use ingero_proto::hist::Histogram;
use ingero_proto::Table;
use tokio::sync::mpsc;

use crate::attribution::Attributor;
use crate::error::Result;
use crate::probes::abi::{Counters, PROC_COMM_INIT, PROC_DLOPEN, PROC_EXEC, PROC_EXIT, PROC_FORK};
use crate::probes::drain::{self, Rings};
use crate::probes::load::{map, Attached, Probes};
use crate::probes::ops::Lib;
use crate::probes::{libs, ops};
use crate::window::{self, HostFacts, WindowCtx};

#[derive(Debug, Clone)]
pub struct LoopConfig {
    pub node: String,
    pub window: Duration,
    pub rescan: Duration,
    pub cgroup_root: Option<PathBuf>,
    pub cgroup_mount: PathBuf,
    pub pids: Vec<u32>,
    /// Outlier when a call exceeds this multiple of the op's running median…
    pub outlier_factor: f64,
    /// …but never below this.
    pub outlier_min: Duration,
    /// Fixed threshold instead of the median rule.
    pub outlier_abs: Option<Duration>,
    /// Library files to probe at start (plus the usual install locations).
    pub libs: Vec<PathBuf>,
    /// Hold a thread that dlopens a CUDA/NCCL library until it is probed.
    pub hold_dlopen: bool,
}

/// Shared with the metrics endpoint.
#[derive(Default)]
pub struct LoopStats {
    pub windows: AtomicU64,
    pub events: AtomicU64,
    pub ringbuf_drops: AtomicU64,
    pub map_full: AtomicU64,
    pub probe_run_ns: AtomicU64,
    pub libraries: AtomicU64,
    /// Library files that could not be probed (each is retried on the next scan).
    pub attach_failures: AtomicU64,
    /// Kernel memory of the BPF maps (fdinfo memlock).
    pub kernel_map_bytes: AtomicU64,
    /// Processes whose attribution is cached.
    pub cached_processes: AtomicU64,
    pub spool_dropped: AtomicU64,
    pub kube: std::sync::OnceLock<Arc<crate::attribution::apiserver::KubeStats>>,
}

/// Monotonic clock (what bpf_ktime_get_ns reads) → wall clock offset in µs.
fn mono_to_wall_us() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mono_us = ts.tv_sec * 1_000_000 + ts.tv_nsec / 1000;
    chrono::Utc::now().timestamp_micros() - mono_us
}

/// Walks the cgroup tree: id (inode) → path, for naming cgroups in reports.
/// cgroup id → path relative to the mount; only under `scope` when the agent
/// is scoped with --cgroup-root (that subtree is its "node").
fn cgroup_paths(mount: &std::path::Path, scope: Option<&std::path::Path>) -> HashMap<u64, String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = HashMap::new();
    let mut stack = vec![scope.unwrap_or(mount).to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(m) = std::fs::metadata(&dir) {
            let rel = dir.strip_prefix(mount).map(|p| format!("/{}", p.display())).unwrap_or_default();
            out.insert(m.ino(), rel);
        }
        if let Ok(rd) = std::fs::read_dir(&dir) {
            stack.extend(rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
        if out.len() > 100_000 {
            break;
        }
    }
    out
}

/// Runs until `stop` is set; every window's tables go to `tx`.
pub fn probe_loop(
    mut probes: Probes,
    cfg: LoopConfig,
    tx: mpsc::Sender<Vec<(Table, RecordBatch)>>,
    stop: Arc<AtomicBool>,
    stats: Arc<LoopStats>,
    kube: crate::attribution::KubeSources,
) -> Result<()> {
    let mut rings = Rings::take(&mut probes)?;
    if let Some(root) = &cfg.cgroup_root {
        probes.set_scope(root)?;
    }
    probes.set_hold_dlopen(cfg.hold_dlopen)?;
    if !cfg.pids.is_empty() {
        for &p in &cfg.pids {
            probes.track(p)?;
        }
        probes.set_targets(&cfg.pids)?;
    }
    let host = HostFacts::read();
    if let Ok(mm) = crate::probes::memory::MapMemory::of_pid(std::process::id()) {
        stats.kernel_map_bytes.store(mm.total(), Ordering::Relaxed);
        tracing::info!(
            kernel_map_mib = mm.total() >> 20,
            possible_cpus = mm.possible_cpus,
            at_256_cpus_mib = mm.at_cpus(256) >> 20,
            "BPF maps loaded"
        );
    }
    let mut attr = Attributor::new(cfg.cgroup_mount.clone()).with_kubernetes(kube.watch, kube.gpus);
    let mut cg_paths = cgroup_paths(&cfg.cgroup_mount, cfg.cgroup_root.as_deref());
    let mut last_counters = Counters::default();
    let mut medians: HashMap<u32, f64> = HashMap::new();
    // pid → what its last process_meta row said (ProcInfo::meta_key).
    let mut described: HashMap<u32, u64> = HashMap::new();
    let pid_filter: HashSet<u32> = cfg.pids.iter().copied().collect();
    let run_time_fd = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
    let mut last_run_ns = 0u64;

    let mut statics = crate::probes::statics::StaticRuntimes::default();
    let mut scan = |probes: &mut Probes, attr: &mut Attributor, pids: &[u32]| {
        for &pid in pids {
            if !pid_filter.is_empty() && !pid_filter.contains(&pid) {
                continue;
            }
            for f in libs::scan_pid_with_statics(pid, &mut statics) {
                let info = attr.get(pid);
                if f.lib != Lib::Libc && !info.libraries.contains(&f.mapped_as) {
                    info.libraries.push(f.mapped_as.clone());
                }
                if probes.is_attached(&f) {
                    continue;
                }
                match probes.attach_found(&f) {
                    Ok(Attached::Now(syms)) => {
                        stats.libraries.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(pid, library = %f.mapped_as, probes = syms.len(), "attached");
                    }
                    Ok(Attached::Already) => {}
                    // Not marked attached: the next scan of this process retries.
                    Err(e) => {
                        stats.attach_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(pid, library = %f.mapped_as, error = %e, "cannot attach; will retry")
                    }
                }
            }
        }
    };
    scan(&mut probes, &mut attr, &libs::pids(cfg.cgroup_root.as_deref()));
    let mut next_scan = Instant::now() + cfg.rescan;
    let window_us = cfg.window.as_micros() as i64;
    let now_us = chrono::Utc::now().timestamp_micros();
    let mut window_start = now_us - now_us % window_us;
    let mut events = Vec::new();
    let mut follow_ups: Vec<(Instant, u32)> = Vec::new();
    // A fixed outlier threshold applies from the first call, not the first window.
    update_thresholds(&mut probes, &drain::Drained::default(), &mut medians, &cfg);
    // Libraries named on the command line or in the usual places are probed
    // before any process maps them, so a first process is traced from its first call.
    for f in libs::well_known(&cfg.libs) {
        match probes.attach_found(&f) {
            Ok(Attached::Now(syms)) if !syms.is_empty() => {
                stats.libraries.fetch_add(1, Ordering::Relaxed);
                tracing::info!(library = %f.path.display(), probes = syms.len(), "attached ahead of use");
            }
            Ok(_) => {}
            Err(e) => {
                stats.attach_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(library = %f.path.display(), error = %e, "cannot attach")
            }
        }
    }

    while !stop.load(Ordering::Relaxed) {
        let window_end = window_start + window_us;
        // Wake at least every 10 ms for process events (exec → rescan at
        // once), and at once for a held dlopen.
        loop {
            let now = chrono::Utc::now().timestamp_micros();
            if now >= window_end || stop.load(Ordering::Relaxed) {
                break;
            }
            rings.wait_procs(Duration::from_micros(((window_end - now) as u64).min(10_000)));
            for e in rings.procs() {
                match e.kind {
                    PROC_DLOPEN => {
                        // The thread waits in the kernel until its library is probed.
                        let t = Instant::now();
                        scan(&mut probes, &mut attr, &[e.tgid]);
                        probes.release(e.tgid);
                        tracing::debug!(pid = e.tgid, held_us = t.elapsed().as_micros() as u64, "dlopen held");
                        continue;
                    }
                    PROC_EXEC | PROC_FORK => {
                        let pid = if e.kind == PROC_FORK { e.other } else { e.tgid };
                        attr.refresh(pid);
                        scan(&mut probes, &mut attr, &[pid]);
                        // The loader maps DT_NEEDED libraries and programs dlopen
                        // theirs shortly after exec: look again soon.
                        let now = Instant::now();
                        for ms in [10, 40, 150, 500, 1500] {
                            follow_ups.push((now + Duration::from_millis(ms), pid));
                        }
                    }
                    PROC_COMM_INIT => {
                        let p = attr.get(e.tgid);
                        p.nccl_comm = Some(format!("{:016x}", e.extra));
                        p.nccl_rank = Some((e.other as i32, e.value));
                        described.remove(&e.tgid);
                        continue;
                    }
                    _ => {}
                }
                events.push(e);
            }
            let now = Instant::now();
            let due: Vec<u32> = follow_ups.iter().filter(|(t, _)| *t <= now).map(|(_, p)| *p).collect();
            if !due.is_empty() {
                follow_ups.retain(|(t, _)| *t > now);
                scan(&mut probes, &mut attr, &due);
            }
            if Instant::now() >= next_scan {
                scan(&mut probes, &mut attr, &libs::pids(cfg.cgroup_root.as_deref()));
                next_scan = Instant::now() + cfg.rescan;
            }
        }
        let mut d = drain::drain(&mut probes)?;
        if !pid_filter.is_empty() {
            // Library probes fire for every process using the file: keep --pid only.
            d.calls.retain(|(k, _)| pid_filter.contains(&k.tgid));
            d.sched.retain(|(p, _)| pid_filter.contains(p));
            d.io.retain(|(k, _)| pid_filter.contains(&k.tgid));
        }
        let stalls = rings.stalls();
        let delta = Counters {
            events: d.counters.events - last_counters.events,
            ringbuf_drops: d.counters.ringbuf_drops - last_counters.ringbuf_drops,
            map_full: d.counters.map_full - last_counters.map_full,
            inflight_full: d.counters.inflight_full - last_counters.inflight_full,
        };
        last_counters = d.counters;
        let run_ns = if run_time_fd.is_some() { total_run_ns(&probes) } else { 0 };
        let probe_run_ns = run_ns.saturating_sub(last_run_ns);
        last_run_ns = run_ns;
        if d.cgroups.iter().any(|(id, _)| !cg_paths.contains_key(id)) {
            cg_paths = cgroup_paths(&cfg.cgroup_mount, cfg.cgroup_root.as_deref());
        }
        let ctx = WindowCtx {
            node: &cfg.node,
            window_start_us: window_start,
            window_us: window_us as u64,
            mono_to_wall_us: mono_to_wall_us(),
            counters_delta: delta,
            spool_dropped: stats.spool_dropped.load(Ordering::Relaxed),
            probe_run_ns,
            host: &host,
            cgroup_scoped: cfg.cgroup_root.is_some(),
        };
        attr.begin_window();
        // Only processes in scope produce rows (a scoped agent shares the kernel maps' view).
        let mut tables = window::build(&ctx, &d, &stalls, &events, &mut attr, &cg_paths);
        let mut new: Vec<u32> = Vec::new();
        for (k, _) in &d.calls {
            let key = attr.get(k.tgid).meta_key();
            if described.insert(k.tgid, key) != Some(key) {
                new.push(k.tgid);
            }
        }
        if let Some(meta) = window::process_meta(&ctx, &new, &mut attr) {
            tables.push(meta);
        }
        for e in events.drain(..) {
            if e.kind == PROC_EXIT {
                attr.forget(e.tgid);
                probes.forget(e.tgid);
                described.remove(&e.tgid);
            }
        }
        // Exits lost to a full ring buffer, and reused pids, are caught here:
        // cached state stays bounded by the processes alive now.
        for pid in attr.prune() {
            probes.forget(pid);
            described.remove(&pid);
        }
        stats.cached_processes.store(attr.len() as u64, Ordering::Relaxed);
        update_thresholds(&mut probes, &d, &mut medians, &cfg);
        stats.windows.fetch_add(1, Ordering::Relaxed);
        stats.events.fetch_add(delta.events, Ordering::Relaxed);
        stats.ringbuf_drops.fetch_add(delta.ringbuf_drops, Ordering::Relaxed);
        stats.map_full.fetch_add(delta.map_full + delta.inflight_full, Ordering::Relaxed);
        stats.probe_run_ns.fetch_add(probe_run_ns, Ordering::Relaxed);
        if tx.blocking_send(tables).is_err() {
            break;
        }
        window_start = window_end;
    }
    Ok(())
}

fn total_run_ns(probes: &Probes) -> u64 {
    probes.ebpf.programs().filter_map(|(_, p)| p.info().ok()).map(|i| i.run_time().as_nanos() as u64).sum()
}

/// Outlier thresholds per op: N × the op's running median, at least `min`.
fn update_thresholds(probes: &mut Probes, d: &drain::Drained, medians: &mut HashMap<u32, f64>, cfg: &LoopConfig) {
    let mut per_op: HashMap<u32, Histogram> = HashMap::new();
    for (k, v) in &d.calls {
        let h = per_op.entry(k.op).or_default();
        for (i, &n) in v.hist.iter().enumerate() {
            if n > 0 {
                h.add(i as u8, n as u64);
            }
        }
    }
    let Ok(mut thr): std::result::Result<Array<&mut MapData, u64>, _> = map(&mut probes.ebpf, "thresholds") else {
        return;
    };
    for op in ops::all().iter().filter(|o| o.timed) {
        let id = op.id as u32;
        let t = match cfg.outlier_abs {
            Some(a) => a.as_nanos() as u64,
            None => {
                if let Some(m) = per_op.get(&id).and_then(|h| h.quantile(0.5)) {
                    let e = medians.entry(id).or_insert(m as f64);
                    *e = 0.8 * *e + 0.2 * m as f64;
                }
                match medians.get(&id) {
                    Some(m) => ((m * cfg.outlier_factor) as u64).max(cfg.outlier_min.as_nanos() as u64),
                    None => 0,
                }
            }
        };
        let _ = thr.set(id, t, 0);
    }
}
