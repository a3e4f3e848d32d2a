//! The Arrow schema of every table Ingero writes, defined once.
//!
//! Agents build batches with these schemas, the aggregator validates incoming
//! batches against them and writes them to Parquet unchanged, and queries read
//! them back. `proto/README.md` documents every column; a test keeps the two
//! in step.

use std::sync::{Arc, OnceLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// One column: name, Arrow type, nullability, unit and meaning.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub ty: ColType,
    pub nullable: bool,
    pub unit: &'static str,
    pub doc: &'static str,
}

/// The handful of Arrow types the tables use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColType {
    Utf8,
    Bool,
    I32,
    I64,
    U32,
    U64,
    F64,
    /// UTC timestamp in microseconds.
    TimestampUs,
    /// `List<UInt8>`: sparse histogram bucket indices.
    ListU8,
    /// `List<UInt64>`: sparse histogram bucket counts.
    ListU64,
}

impl ColType {
    pub fn data_type(self) -> DataType {
        match self {
            ColType::Utf8 => DataType::Utf8,
            ColType::Bool => DataType::Boolean,
            ColType::I32 => DataType::Int32,
            ColType::I64 => DataType::Int64,
            ColType::U32 => DataType::UInt32,
            ColType::U64 => DataType::UInt64,
            ColType::F64 => DataType::Float64,
            ColType::TimestampUs => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ColType::ListU8 => DataType::new_list(DataType::UInt8, false),
            ColType::ListU64 => DataType::new_list(DataType::UInt64, false),
        }
    }
}

const fn col(name: &'static str, ty: ColType, unit: &'static str, doc: &'static str) -> Column {
    Column { name, ty, nullable: false, unit, doc }
}
const fn opt(name: &'static str, ty: ColType, unit: &'static str, doc: &'static str) -> Column {
    Column { name, ty, nullable: true, unit, doc }
}

use ColType::*;

/// Columns every row of every table starts with, in this order.
pub const COMMON: &[Column] = &[
    col("node", Utf8, "", "Node name (Kubernetes node, else hostname)"),
    opt("namespace", Utf8, "", "Pod namespace; null when not in a known pod"),
    opt("pod", Utf8, "", "Pod name; null when not in a known pod"),
    opt("container", Utf8, "", "Container name (or container id when the pod is unknown)"),
    opt(
        "job",
        Utf8,
        "",
        "Job identity: owner (Job, JobSet, PyTorchJob, …), else NCCL communicator id, else configured label",
    ),
    opt("rank", I32, "", "Rank of the process in its job (RANK or ncclCommInitRank)"),
    opt("world_size", I32, "", "Number of ranks in the job (WORLD_SIZE or nranks)"),
    col("pid", U32, "", "Process id (tgid) in the agent's pid namespace (the host's with hostPID, a kind node's own); 0 for node-level rows"),
    col("comm", Utf8, "", "Process name (task comm, 15 chars max)"),
    col("cgroup_id", U64, "", "cgroup v2 id (inode of the cgroup directory); 0 when unknown"),
    col("window_start", TimestampUs, "µs since epoch, UTC", "Start of the aggregation window"),
    col("window_us", U64, "µs", "Window length"),
];

/// Histogram bucket columns shared by the latency tables.
const HIST: &[Column] = &[
    col(
        "hist_bucket",
        ListU8,
        "bucket index",
        "Sparse latency histogram: indices of non-empty buckets (see Histogram)",
    ),
    col("hist_count", ListU64, "calls", "Sparse latency histogram: count per bucket in hist_bucket"),
];

const CALL_WINDOWS: &[Column] = &[
    col("library", Utf8, "", "cudart (runtime), cuda (driver) or nccl"),
    col("op", Utf8, "", "Function name, e.g. cudaStreamSynchronize, ncclAllReduce"),
    col("count", U64, "calls", "Calls that started in the window"),
    col("errors", U64, "calls", "Calls that returned a non-success code (return-probed ops only)"),
    col("total_ns", U64, "ns", "Sum of call durations (0 for entry-only ops such as launches)"),
    col("max_ns", U64, "ns", "Longest call"),
    col("sampled", Bool, "", "True when durations come from a sample of calls (imported traces); count is exact"),
];

const SCHED_WINDOWS: &[Column] = &[
    col("threads", U32, "threads", "Threads of the process seen in the window"),
    col("on_cpu_ns", U64, "ns", "Time the process's threads ran on a CPU"),
    col("off_cpu_ns", U64, "ns", "Time its threads were blocked or sleeping (switched out, not runnable)"),
    col("runq_wait_ns", U64, "ns", "Time its threads were runnable but waiting for a CPU (run-queue latency)"),
    col("runq_max_ns", U64, "ns", "Longest single run-queue wait"),
    col("voluntary_switches", U64, "switches", "Context switches where the thread blocked"),
    col("involuntary_switches", U64, "switches", "Context switches where the thread was preempted while runnable"),
    col("wakeups", U64, "wakeups", "sched_wakeup / sched_wakeup_new events for its threads"),
];

const CGROUP_WINDOWS: &[Column] = &[
    col("cgroup_path", Utf8, "", "cgroup v2 path below the cgroup root"),
    col("on_cpu_ns", U64, "ns", "CPU time of every task in the cgroup (noisy-neighbour attribution)"),
    col("runq_wait_ns", U64, "ns", "Run-queue wait of every task in the cgroup"),
    col("switches", U64, "switches", "Context switches of every task in the cgroup"),
];

const IO_WINDOWS: &[Column] = &[
    col("device", Utf8, "", "Block device as major:minor"),
    col("op", Utf8, "", "read, write, flush, discard or other"),
    col("count", U64, "requests", "Requests completed in the window"),
    col("bytes", U64, "bytes", "Bytes transferred"),
    col("total_ns", U64, "ns", "Sum of issue→complete latencies"),
    col("max_ns", U64, "ns", "Longest request"),
];

const HOST_EVENTS: &[Column] = &[
    col("event_time", TimestampUs, "µs since epoch, UTC", "When it happened"),
    col(
        "kind",
        Utf8,
        "",
        "oom_kill, exec, exit, fork, mem_pressure, swap; reference_chain for a diagnosis stored in an imported trace",
    ),
    col(
        "value",
        I64,
        "kind-specific",
        "oom_kill: victim pages; exit: exit status, or 128 + the signal that killed it (137 SIGKILL, 134 SIGABRT), as Kubernetes reports it; fork: child pid (new processes only, never threads); mem_pressure/swap: bytes",
    ),
    opt("detail", Utf8, "", "Free text: victim name, new binary path, … (reference_chain: the chain as JSON)"),
];

const STALL_EVENTS: &[Column] = &[
    col("event_time", TimestampUs, "µs since epoch, UTC", "Start of the outlier call"),
    col("tid", U32, "", "Thread id that made the call"),
    col("library", Utf8, "", "cudart, cuda or nccl"),
    col("op", Utf8, "", "Function name"),
    col("duration_ns", U64, "ns", "Duration of this call"),
    col("threshold_ns", U64, "ns", "Threshold it crossed"),
    col("reason", Utf8, "", "median_multiple (N × running median) or absolute"),
];

const PROCESS_META: &[Column] = &[
    col("cmdline", Utf8, "", "Command line, arguments joined by spaces (truncated to 4 KiB)"),
    opt("container_id", Utf8, "", "Container runtime id (64 hex) parsed from the cgroup path"),
    opt("pod_uid", Utf8, "", "Pod UID parsed from the cgroup path"),
    col("cgroup_path", Utf8, "", "cgroup v2 path"),
    opt("local_rank", I32, "", "LOCAL_RANK from the environment"),
    opt("master_addr", Utf8, "", "MASTER_ADDR:MASTER_PORT from the environment"),
    opt("nccl_comm_id", Utf8, "", "NCCL communicator id (hex) learned from ncclCommInitRank"),
    opt("gpus", Utf8, "", "GPU device ids held by the container (kubelet PodResources), comma separated"),
    col("libraries", Utf8, "", "Traced libraries mapped by the process, comma separated paths"),
    opt("labels", Utf8, "", "Pod labels as a JSON object"),
];

const NODE_WINDOWS: &[Column] = &[
    col("events", U64, "events", "Probe hits aggregated in the window"),
    col("ringbuf_drops", U64, "events", "Outlier events lost to a full ring buffer (summed over CPUs)"),
    col("map_full", U64, "events", "Updates lost to a full kernel map (summed over CPUs)"),
    col("spool_dropped", U64, "batches", "Batches dropped from a full on-disk spool since the agent started"),
    col("probe_run_ns", U64, "ns", "eBPF program run time in the window (BPF_STATS_RUN_TIME)"),
    opt("kernel", Utf8, "", "Kernel release"),
    opt("cpu_model", Utf8, "", "CPU model name"),
    opt("cpu_cores", U32, "cores", "Online CPUs"),
    opt("gpu_model", Utf8, "", "GPU model"),
    opt("driver_version", Utf8, "", "NVIDIA driver version"),
    opt("cuda_version", Utf8, "", "CUDA version"),
];

/// Every table the system writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    CallWindows,
    SchedWindows,
    CgroupWindows,
    IoWindows,
    HostEvents,
    StallEvents,
    ProcessMeta,
    NodeWindows,
}

impl Table {
    pub const ALL: [Table; 8] = [
        Table::CallWindows,
        Table::SchedWindows,
        Table::CgroupWindows,
        Table::IoWindows,
        Table::HostEvents,
        Table::StallEvents,
        Table::ProcessMeta,
        Table::NodeWindows,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Table::CallWindows => "call_windows",
            Table::SchedWindows => "sched_windows",
            Table::CgroupWindows => "cgroup_windows",
            Table::IoWindows => "io_windows",
            Table::HostEvents => "host_events",
            Table::StallEvents => "stall_events",
            Table::ProcessMeta => "process_meta",
            Table::NodeWindows => "node_windows",
        }
    }

    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    pub fn doc(self) -> &'static str {
        match self {
            Table::CallWindows => "CUDA runtime, driver and NCCL calls per process, op and window",
            Table::SchedWindows => "Scheduler time of each CUDA-using process per window",
            Table::CgroupWindows => "CPU use of every cgroup on the node per window (who contends)",
            Table::IoWindows => "Block IO latency per process, device and op per window",
            Table::HostEvents => "Individual host events: OOM kills, exec, exit, fork, memory pressure",
            Table::StallEvents => "Individual outlier calls (stalls) sent by the kernel as they happen",
            Table::ProcessMeta => {
                "Process and pod metadata, one row per process per window it changed or was first seen"
            }
            Table::NodeWindows => "Agent health and host facts per node and window (drops are never silent)",
        }
    }

    /// Table-specific columns (after [`COMMON`]).
    pub fn own_columns(self) -> Vec<Column> {
        let (own, hist): (&[Column], bool) = match self {
            Table::CallWindows => (CALL_WINDOWS, true),
            Table::SchedWindows => (SCHED_WINDOWS, false),
            Table::CgroupWindows => (CGROUP_WINDOWS, false),
            Table::IoWindows => (IO_WINDOWS, true),
            Table::HostEvents => (HOST_EVENTS, false),
            Table::StallEvents => (STALL_EVENTS, false),
            Table::ProcessMeta => (PROCESS_META, false),
            Table::NodeWindows => (NODE_WINDOWS, false),
        };
        let mut cols = own.to_vec();
        if hist {
            cols.extend_from_slice(HIST);
        }
        cols
    }

    /// All columns in order.
    pub fn columns(self) -> Vec<Column> {
        let mut cols = COMMON.to_vec();
        cols.extend(self.own_columns());
        cols
    }

    /// The Arrow schema, built once per table.
    pub fn schema(self) -> SchemaRef {
        static SCHEMAS: OnceLock<Vec<SchemaRef>> = OnceLock::new();
        let all = SCHEMAS.get_or_init(|| {
            Table::ALL
                .iter()
                .map(|t| {
                    let fields: Vec<Field> =
                        t.columns().iter().map(|c| Field::new(c.name, c.ty.data_type(), c.nullable)).collect();
                    Arc::new(Schema::new(fields))
                })
                .collect()
        });
        all[self as usize].clone()
    }
}

/// Markdown reference of every table and column (kept in proto/README.md).
pub fn markdown_reference() -> String {
    let mut out = String::new();
    for t in Table::ALL {
        out.push_str(&format!("### `{}`\n\n{}.\n\n", t.name(), t.doc()));
        out.push_str("| column | type | null | unit | meaning |\n|---|---|---|---|---|\n");
        let cols = t.columns();
        for (i, c) in cols.iter().enumerate() {
            if i < COMMON.len() && t != Table::CallWindows {
                continue; // common columns are listed in full once, under call_windows
            }
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                c.name,
                c.ty.data_type(),
                if c.nullable { "yes" } else { "no" },
                c.unit,
                c.doc
            ));
        }
        if t != Table::CallWindows {
            out.push_str("\n(plus the common columns, see `call_windows`)\n");
        }
        out.push('\n');
    }
    out
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        for t in Table::ALL {
            assert_eq!(Table::from_name(t.name()), Some(t));
            let cols = t.columns();
            let mut names: Vec<_> = cols.iter().map(|c| c.name).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), cols.len(), "duplicate column in {t}");
            assert_eq!(t.schema().fields().len(), cols.len());
        }
        assert_eq!(Table::from_name("nope"), None);
    }

    /// The column reference in README.md is generated from this module;
    /// `INGERO_BLESS=1 cargo test -p ingero-proto` rewrites it.
    #[test]
    fn readme_documents_every_column() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
        let readme = std::fs::read_to_string(path).unwrap();
        let (begin, end) = ("<!-- BEGIN TABLES -->\n", "<!-- END TABLES -->");
        let start = readme.find(begin).expect("README has no BEGIN TABLES marker") + begin.len();
        let stop = readme.find(end).expect("README has no END TABLES marker");
        let expected = markdown_reference();
        if readme[start..stop] != expected {
            if std::env::var_os("INGERO_BLESS").is_some() {
                let updated = format!("{}{}{}", &readme[..start], expected, &readme[stop..]);
                std::fs::write(path, updated).unwrap();
            } else {
                panic!("proto/README.md is stale: run INGERO_BLESS=1 cargo test -p ingero-proto");
            }
        }
    }
}
