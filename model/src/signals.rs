// SPDX-License-Identifier: Apache-2.0
//! Per-node, per-window signals computed from call, scheduler, IO and host
//! rows: the inputs of the straggler detector.

use std::collections::HashMap;

use crate::Table;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int32Type, TimestampMicrosecondType, UInt32Type, UInt64Type};

use crate::progress::ProcProgress;

/// Rows without a job identity are grouped under this name.
pub const DEFAULT_JOB: &str = "(unlabelled)";

/// The signals, in the order they are reported.
///
/// They follow what a real data-parallel job does on its GPU node: NCCL
/// collectives and launches only enqueue work and return at once; a rank
/// waits for its GPU and for its peers inside a device sync or a blocking
/// copy. So a straggler is the rank that waits *least* there (its peers
/// wait for it), and its cause is what else it spent the step on: the
/// run queue, host-side blocking (off-CPU outside any CUDA/NCCL call), IO,
/// memory. Waiting inside a sync is never a host stall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Run-queue wait of the job's processes / scheduler time (CPU contention).
    RunqShare,
    /// Off-CPU time *outside* CUDA/NCCL calls / scheduler time: threads
    /// blocked in host code (IO, locks, page faults, input pipeline).
    OffCpuShare,
    /// Time in blocking device-to-host copies (`loss.item()`) / wall time:
    /// waiting for its own GPU's work before any collective is due.
    CopyWaitShare,
    /// Time in device syncs, blocking copies and collectives / wall time:
    /// waiting for the GPU or for the other ranks.
    DeviceWaitShare,
    /// Block IO latency summed / wall time.
    IoShare,
    /// OOM kills, memory-pressure and swap events.
    MemEvents,
    /// Kernel launches per second (reported, not scored: ranks in lockstep
    /// launch at the same rate).
    LaunchRate,
}

/// Signals of one node in one window.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Signals {
    pub runq_ns: f64,
    pub offcpu_ns: f64,
    pub oncpu_ns: f64,
    /// Part of `offcpu_ns` inside a CUDA/NCCL call (not a host stall).
    pub offcpu_call_ns: f64,
    /// Blocking device-to-host copies.
    pub copy_ns: f64,
    /// Syncs, blocking copies and collectives.
    pub wait_ns: f64,
    /// Of each process's oldest CUDA/NCCL call still in flight at the
    /// window's end, the part of the window it ran (at most the window).
    /// `wait_ns` counts a call when it returns: ranks waiting seconds in a
    /// collective for a hung peer show here meanwhile.
    #[serde(default)]
    pub in_call_ns: f64,
    pub io_ns: f64,
    pub mem_events: f64,
    pub launches: f64,
    pub window_ns: f64,
    /// Threads covered by the scheduler rows (shares are per thread).
    pub threads: f64,
    /// What each process is inside at the window's end (hung ranks).
    pub procs: Vec<ProcProgress>,
    /// Calls or scheduler time were reported (not only progress rows).
    pub measured: bool,
    /// The node's GPUs, where its batch said (`node_windows`): what a
    /// straggler's cost is priced by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Host>,
}

/// A node's GPUs as its agent reads them from the NVIDIA driver.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Host {
    pub gpu_model: Option<String>,
    pub gpus: Option<u32>,
}

impl Signals {
    pub fn get(&self, s: Signal) -> f64 {
        let w = self.window_ns.max(1.0);
        let sched = (self.runq_ns + self.offcpu_ns + self.oncpu_ns).max(1.0);
        match s {
            Signal::RunqShare => self.runq_ns / sched,
            Signal::OffCpuShare => (self.offcpu_ns - self.offcpu_call_ns).max(0.0) / sched,
            Signal::CopyWaitShare => self.copy_ns / w,
            Signal::DeviceWaitShare => self.wait_ns / w,
            Signal::IoShare => self.io_ns / w,
            Signal::MemEvents => self.mem_events,
            Signal::LaunchRate => self.launches / (w / 1e9),
        }
    }

    /// Share of the window spent waiting on the device and the peers,
    /// calls still in flight included: what a straggler costs its peers is
    /// measured by it (never scored: a call in flight has no duration yet).
    pub fn waiting_share(&self) -> f64 {
        (self.wait_ns + self.in_call_ns) / self.window_ns.max(1.0)
    }

    /// A process as it stood at the window's end, its call in flight counted.
    fn add_proc(&mut self, p: ProcProgress) {
        self.in_call_ns += p.age_ns.map_or(0.0, |a| (a as f64).min(self.window_ns));
        self.procs.push(p);
    }

    pub fn merge(&mut self, o: &Signals) {
        self.runq_ns += o.runq_ns;
        self.offcpu_ns += o.offcpu_ns;
        self.oncpu_ns += o.oncpu_ns;
        self.offcpu_call_ns += o.offcpu_call_ns;
        self.copy_ns += o.copy_ns;
        self.wait_ns += o.wait_ns;
        self.in_call_ns += o.in_call_ns;
        self.io_ns += o.io_ns;
        self.mem_events += o.mem_events;
        self.launches += o.launches;
        self.window_ns = self.window_ns.max(o.window_ns);
        self.threads += o.threads;
        self.procs.extend(o.procs.iter().cloned());
        self.measured |= o.measured;
        if o.host.is_some() {
            self.host.clone_from(&o.host);
        }
    }
}

/// Key of a node-window.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct NodeWindowKey {
    pub job: String,
    pub node: String,
    pub window_start_us: i64,
}

pub fn is_sync_op(op: &str) -> bool {
    op.contains("Synchronize")
}

/// Copies that block the host until the device has done the work queued
/// before them (device-to-host, `loss.item()`); the `Async` ones enqueue.
pub const BLOCKING_COPIES: [&str; 9] = [
    "cudaMemcpy",
    "cudaMemcpy_ptds",
    "cudaMemcpyPeer",
    "cuMemcpy",
    "cuMemcpy_ptds",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoH_v2_ptds",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoD_v2_ptds",
];

pub fn is_blocking_copy(op: &str) -> bool {
    BLOCKING_COPIES.contains(&op)
}

pub fn is_nccl_collective(library: &str, op: &str) -> bool {
    library == "nccl" && !matches!(op, "ncclGroupStart" | "ncclGroupEnd") && !op.starts_with("ncclComm")
}

/// Where a host thread waits for its GPU or its peers.
pub fn is_device_wait(library: &str, op: &str) -> bool {
    is_sync_op(op) || is_blocking_copy(op) || is_nccl_collective(library, op)
}

/// Work submitted to the GPU: kernels, cooperative kernels, graphs (runtime,
/// driver, and their per-thread-stream variants).
pub fn is_launch(op: &str) -> bool {
    LAUNCH_PREFIXES.iter().any(|p| op.starts_with(p))
}

/// What a call does, whatever its API name or layer (runtime, driver,
/// `_ptsz`/`_v2` forms): reports count by it as well as by name, so a launch
/// reached only at the driver still counts as a launch.
pub fn op_kind(library: &str, op: &str) -> &'static str {
    match op {
        _ if is_launch(op) => "launch",
        _ if is_sync_op(op) => "sync",
        _ if op.contains("Memcpy") => "copy",
        _ if op.contains("Memset") => "memset",
        _ if op.contains("Event") => "event",
        _ if ["Malloc", "Free", "MemAlloc", "MemFree"].iter().any(|p| op.contains(p)) => "memory",
        _ if is_nccl_collective(library, op) => "collective",
        _ if library == "nccl" => "nccl control",
        _ => "other",
    }
}

/// The name prefixes of every launch entry point (`Ex`, `_ptsz` and
/// `ExC` forms included); the SQL of history and reports is built from it.
pub const LAUNCH_PREFIXES: [&str; 6] = [
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaGraphLaunch",
    "cuGraphLaunch",
    "cudaLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel",
];

/// One batch's node-window signals, computed once where the batch is
/// accepted (ingest, WAL replay, import) and handed to both the live
/// detector and the signal tiers.
pub type BatchSignals = Vec<(NodeWindowKey, Signals)>;

/// [`from_tables`] over one batch's tables, as a list.
pub fn of_tables(tables: &[(Table, Vec<RecordBatch>)]) -> BatchSignals {
    let mut out: BatchSignals = from_tables(tables.iter().map(|(t, b)| (t, b))).into_iter().collect();
    let hosts = hosts(tables);
    if !hosts.is_empty() {
        for (k, s) in &mut out {
            s.host = hosts.get(&k.node).cloned();
        }
    }
    out
}

/// Each node's GPUs from the batch's `node_windows` rows (the last row
/// that names any); nodes whose agent read no driver are left out.
pub fn hosts(tables: &[(Table, Vec<RecordBatch>)]) -> HashMap<String, Host> {
    let mut out = HashMap::new();
    for b in tables.iter().filter(|(t, _)| *t == Table::NodeWindows).flat_map(|(_, b)| b) {
        let node = b.column(crate::tables::common::NODE).as_string::<i32>();
        let model = b.column_by_name("gpu_model").map(|c| c.as_string::<i32>().clone());
        let count = b.column_by_name("gpu_count").map(|c| c.as_primitive::<UInt32Type>().clone());
        for i in 0..b.num_rows() {
            let gpu_model = model.as_ref().filter(|c| c.is_valid(i)).map(|c| c.value(i).to_string());
            let gpus = count.as_ref().filter(|c| c.is_valid(i)).map(|c| c.value(i));
            if gpu_model.is_some() || gpus.is_some() {
                out.insert(node.value(i).to_string(), Host { gpu_model, gpus });
            }
        }
    }
    out
}

/// Aggregates one pushed batch into node-window signals. IO and host events
/// carry the job of the process they belong to; node-wide rows without a
/// job are attributed to every job seen on the node in the same batch.
pub fn from_tables<'a>(
    tables: impl IntoIterator<Item = (&'a Table, &'a Vec<RecordBatch>)>,
) -> HashMap<NodeWindowKey, Signals> {
    let mut out: HashMap<NodeWindowKey, Signals> = HashMap::new();
    for (table, batches) in tables {
        for b in batches {
            add_batch(*table, b, &mut out);
        }
    }
    out
}

fn add_batch(table: Table, b: &RecordBatch, out: &mut HashMap<NodeWindowKey, Signals>) {
    use crate::tables::common;
    let node = b.column(common::NODE).as_string::<i32>();
    let job = b.column(common::JOB).as_string::<i32>();
    let start = b.column(common::WINDOW_START).as_primitive::<TimestampMicrosecondType>();
    let win = b.column(common::WINDOW_US).as_primitive::<UInt64Type>();
    let u64col = |name: &str| b.column_by_name(name).map(|c| c.as_primitive::<UInt64Type>().clone());
    let strcol = |name: &str| b.column_by_name(name).map(|c| c.as_string::<i32>().clone());
    let (lib, op) = (strcol("library"), strcol("op"));
    let (count, total) = (u64col("count"), u64col("total_ns"));
    let (runq, off, on) = (u64col("runq_wait_ns"), u64col("off_cpu_ns"), u64col("on_cpu_ns"));
    let off_call = u64col("off_cpu_in_call_ns");
    let threads = b.column_by_name("threads").map(|c| c.as_primitive::<UInt32Type>().clone());
    let kind = strcol("kind");
    // Rows of one node-window are contiguous (a batch is one node's window):
    // sum them locally and touch the map (and allocate a key) once per run.
    let mut run: Option<(usize, Signals)> = None;
    let same = |a: usize, i: usize| {
        start.value(a) == start.value(i)
            && node.value(a) == node.value(i)
            && job.is_null(a) == job.is_null(i)
            && (job.is_null(i) || job.value(a) == job.value(i))
    };
    let flush = |(a, s): (usize, Signals), out: &mut HashMap<NodeWindowKey, Signals>| {
        let key = NodeWindowKey {
            job: if job.is_null(a) { DEFAULT_JOB.to_string() } else { job.value(a).to_string() },
            node: node.value(a).to_string(),
            window_start_us: start.value(a),
        };
        out.entry(key).or_default().merge(&s);
    };
    for i in 0..b.num_rows() {
        if let Some(r) = run.take_if(|(a, _)| !same(*a, i)) {
            flush(r, out);
        }
        let measured = matches!(table, Table::CallWindows | Table::SchedWindows);
        let mut s = Signals { window_ns: win.value(i) as f64 * 1e3, measured, ..Default::default() };
        match table {
            Table::CallWindows => {
                let (Some(lib), Some(op), Some(count), Some(total)) = (&lib, &op, &count, &total) else { continue };
                let (l, o) = (lib.value(i), op.value(i));
                if is_device_wait(l, o) {
                    s.wait_ns = total.value(i) as f64;
                    if is_blocking_copy(o) {
                        s.copy_ns = total.value(i) as f64;
                    }
                } else if is_launch(o) {
                    s.launches = count.value(i) as f64;
                }
            }
            Table::SchedWindows => {
                let (Some(runq), Some(off), Some(on)) = (&runq, &off, &on) else { continue };
                s.runq_ns = runq.value(i) as f64;
                s.offcpu_ns = off.value(i) as f64;
                s.oncpu_ns = on.value(i) as f64;
                s.offcpu_call_ns = off_call.as_ref().filter(|c| c.is_valid(i)).map_or(0.0, |c| c.value(i) as f64);
                s.threads = threads.as_ref().map_or(1.0, |t| t.value(i) as f64);
            }
            Table::IoWindows => {
                let Some(total) = &total else { continue };
                s.io_ns = total.value(i) as f64;
            }
            Table::ProgressWindows => s.add_proc(progress(b, i)),
            Table::HostEvents => {
                let Some(kind) = &kind else { continue };
                if matches!(kind.value(i), "oom_kill" | "mem_pressure" | "swap") {
                    s.mem_events = 1.0;
                }
            }
            _ => continue,
        }
        run.get_or_insert_with(|| (i, Signals::default())).1.merge(&s);
    }
    if let Some(r) = run {
        flush(r, out);
    }
}

/// One row of `progress_windows`.
fn progress(b: &RecordBatch, i: usize) -> ProcProgress {
    let u32s = |name: &str| b.column_by_name(name).map(|c| c.as_primitive::<UInt32Type>().clone());
    let u64_at = |name: &str| {
        b.column_by_name(name)
            .map(|c| c.as_primitive::<UInt64Type>().clone())
            .filter(|c| c.is_valid(i))
            .map(|c| c.value(i))
    };
    let str_at = |name: &str| {
        b.column_by_name(name)
            .map(|c| c.as_string::<i32>().clone())
            .filter(|c| c.is_valid(i))
            .map(|c| c.value(i).to_string())
    };
    let rank = b.column_by_name("rank").map(|c| c.as_primitive::<Int32Type>().clone());
    ProcProgress {
        pid: u32s("pid").map_or(0, |c| c.value(i)),
        rank: rank.filter(|c| c.is_valid(i)).map(|c| c.value(i)),
        comm: str_at("comm").unwrap_or_default(),
        threads_in_call: u32s("threads_in_call").map_or(0, |c| c.value(i)),
        op: str_at("oldest_op"),
        age_ns: u64_at("oldest_age_ns"),
        last_call_age_ns: u64_at("last_call_age_ns"),
        state: str_at("proc_state"),
        steps: b
            .column_by_name("steps")
            .map(|c| c.as_primitive::<UInt32Type>())
            .filter(|c| c.is_valid(i))
            .map(|c| c.value(i)),
        step_p50_ns: u64_at("step_p50_ns"),
    }
}
