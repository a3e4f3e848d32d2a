// SPDX-License-Identifier: Apache-2.0
//! What the probe loop is started with and what it counts: read by the
//! thresholds, the detacher and the metrics endpoint without importing the
//! loop itself (a leaf; `probe_loop` re-exports both).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::watchdog::Watchdog;

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
    /// Find each process's training steps from its syncs, copies and collectives.
    pub steps: bool,
    /// Off-CPU episodes outside any call at least this long ship with their call site (0: none).
    pub offcpu_site_min: Duration,
    /// Library files to probe at start (plus the usual install locations).
    pub libs: Vec<PathBuf>,
    /// Hold a thread at its first lookup in a new CUDA/NCCL library until it is probed.
    pub hold_dlopen: bool,
    /// The longest a held thread waits (it spins a CPU meanwhile).
    pub hold_max: Duration,
    /// Probes of a library file no scanned process has mapped this long are detached.
    pub detach_unused_after: Duration,
    /// Library files probed at most, in all and per process (a pod's
    /// thousands of mapped copies must not take the agent's fds).
    pub max_libraries: usize,
    pub max_libraries_per_process: usize,
    /// A loop step running longer than this makes the agent unhealthy.
    pub watchdog: Duration,
    /// The probes' own run time is measured in one window of this many (0: never).
    pub probe_time_every: u32,
    /// The share of one CPU the agent's traps may cost a traced process
    /// before launch-type probes are duty-cycled (None: never).
    pub trap_budget: Option<f64>,
}

/// Shared with the metrics endpoint.
#[derive(Debug, Default)]
pub struct LoopStats {
    pub windows: AtomicU64,
    pub events: AtomicU64,
    pub ringbuf_drops: AtomicU64,
    /// Step marks lost to a full marks ring (the windows they fell in ship no steps).
    pub mark_drops: AtomicU64,
    /// Switches of tracked threads no program saw (the kernel skipped the
    /// scheduler programs): each can lose one off-CPU episode.
    pub sched_missed: AtomicU64,
    /// Python call sites shipped without (some of) their Python frames: a
    /// read of the interpreter's memory failed in the probe.
    pub py_faults: AtomicU64,
    pub map_full: AtomicU64,
    /// Threads held at a new CUDA/NCCL library's first lookup, their total
    /// wait (ns) and the holds that ran out before the library was probed.
    pub lib_holds: AtomicU64,
    pub lib_hold_ns: AtomicU64,
    pub lib_hold_timeouts: AtomicU64,
    pub probe_run_ns: AtomicU64,
    /// What one trap costs a probed call here (ns; 0: not measured).
    pub trap_ns: AtomicU64,
    /// Time traced processes spent in the agent's traps (estimate: traps x trap_ns).
    pub trap_time_ns: AtomicU64,
    /// The largest share of one CPU a traced process spent in them last window (ppm).
    pub busiest_trap_ppm: AtomicU64,
    /// The share of the last window the duty-cycled probes were on (ppm; 1,000,000: always).
    pub sample_ratio_ppm: AtomicU64,
    pub libraries: AtomicU64,
    /// Library files that could not be probed (each is retried on the next scan).
    pub attach_failures: AtomicU64,
    /// New library files not probed: a cap or the agent's fd headroom.
    pub libraries_refused: AtomicU64,
    /// Library files whose probes were detached (no traced process mapped them).
    pub library_detaches: AtomicU64,
    /// Uprobes taken off detached files and not closed yet.
    pub uprobes_detaching: AtomicU64,
    /// Kernel memory of the BPF maps (fdinfo memlock).
    pub kernel_map_bytes: AtomicU64,
    /// Processes whose attribution is cached.
    pub cached_processes: AtomicU64,
    /// Rows refused by the schema check (never expected; counted, not dropped silently).
    pub rows_invalid: AtomicU64,
    /// The latest any window was closed after its end (µs): its calls went on
    /// counting in it that long (a busy or preempted loop).
    pub window_late_max_us: AtomicU64,
    pub kube: std::sync::OnceLock<Arc<crate::attribution::apiserver::KubeStats>>,
    /// What the loop is doing, and whether it is stuck (`/healthz`).
    pub watchdog: Watchdog,
}
