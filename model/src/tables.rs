// SPDX-License-Identifier: Apache-2.0
//! One definition per table: each row struct below generates its table's
//! column list (name, Arrow type from the field's Rust type, nullability
//! from `Option`, unit, meaning) and the values of a row, in column order.
//! [`crate::schema`] builds the Arrow schemas and `proto/README.md` from
//! these lists; every producer (agent, simulator, load generator, importer)
//! fills these structs, so none can drift from the schema.

use crate::column::{Cell, Column, Columns, Row, TimestampUs, Val};
use crate::table::Table;

/// Column name: the field name, or the `as "name"` given.
macro_rules! col_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident $col:literal) => {
        $col
    };
}

macro_rules! columns {
    ($(#[$meta:meta])* $row:ident<$lt:lifetime> for $table:ident { $($body:tt)* }) => {
        columns!(@def [$(#[$meta])*] $row [<$lt>] { $($body)* });
        impl<$lt> Row for $row<$lt> {
            const TABLE: Table = Table::$table;
        }
    };
    ($(#[$meta:meta])* $row:ident for $table:ident { $($body:tt)* }) => {
        columns!(@def [$(#[$meta])*] $row [] { $($body)* });
        impl Row for $row {
            const TABLE: Table = Table::$table;
        }
    };
    ($(#[$meta:meta])* $row:ident { $($body:tt)* }) => {
        columns!(@def [$(#[$meta])*] $row [] { $($body)* });
    };
    (@def [$($attr:tt)*] $row:ident [$($gen:tt)*] {
        $( $field:ident $(as $col:literal)? : $ty:ty, $unit:literal, $doc:literal; )*
    }) => {
        $($attr)*
        pub struct $row $($gen)* {
            $( #[doc = $doc] pub $field: $ty, )*
        }

        impl $($gen)* Columns for $row $($gen)* {
            const COLUMNS: &'static [Column] = &[
                $( Column {
                    name: col_name!($field $($col)?),
                    ty: <$ty as Cell>::TYPE,
                    nullable: <$ty as Cell>::NULLABLE,
                    unit: $unit,
                    doc: $doc,
                }, )*
            ];

            fn with_vals<T>(&self, f: impl FnOnce(&[Val<'_>]) -> T) -> T {
                f(&[ $( Cell::val(&self.$field) ),* ])
            }
        }
    };
}

columns! {
    /// The columns every row of every table starts with.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
    Common {
        node: String, "", "Node name (Kubernetes node, else hostname)";
        namespace: Option<String>, "", "Pod namespace; null when not in a known pod";
        pod: Option<String>, "", "Pod name; null when not in a known pod";
        container: Option<String>, "", "Container name (or container id when the pod is unknown)";
        job: Option<String>, "", "Job identity: owner (Job, JobSet, PyTorchJob, …), else NCCL communicator id, else configured label";
        rank: Option<i32>, "", "Rank of the process in its job (RANK or ncclCommInitRank)";
        world_size: Option<i32>, "", "Number of ranks in the job (WORLD_SIZE or nranks)";
        pid: u32, "", "Process id (tgid) in the agent's pid namespace (the host's with hostPID, a kind node's own); 0 for node-level rows";
        comm: String, "", "Process name (task comm, 15 chars max)";
        cgroup_id: u64, "", "cgroup v2 id (inode of the cgroup directory); 0 when unknown";
        window_start_us as "window_start": TimestampUs, "µs since epoch, UTC", "Start of the aggregation window";
        window_us: u64, "µs", "Window length";
    }
}

/// Positions of the common columns in a row of any table (they come first),
/// for readers of stored or pushed batches; checked by name when compiled.
pub mod common {
    use super::Common;
    use crate::column::{Columns, position};
    pub const NODE: usize = position(Common::COLUMNS, "node");
    pub const JOB: usize = position(Common::COLUMNS, "job");
    pub const PID: usize = position(Common::COLUMNS, "pid");
    pub const WINDOW_START: usize = position(Common::COLUMNS, "window_start");
    pub const WINDOW_US: usize = position(Common::COLUMNS, "window_us");
}

columns! {
    /// `call_windows`: one row per process, op and window.
    #[derive(Debug, Clone, PartialEq)]
    CallRow<'a> for CallWindows {
        library: &'a str, "", "cudart (runtime), cuda (driver) or nccl";
        op: &'a str, "", "Function name, e.g. cudaStreamSynchronize, ncclAllReduce";
        count: u64, "calls", "Calls that started in the window";
        errors: u64, "calls", "Calls that returned a non-success code (return-probed ops only)";
        total_ns: u64, "ns", "Sum of call durations (0 for entry-only ops such as launches)";
        max_ns: u64, "ns", "Longest call";
        sampled: bool, "", "True when some durations are estimates (imported traces: calls the recorder counted but did not store are in the histogram at their mean duration); count and total_ns are exact";
        hist_bucket: &'a [u8], "bucket index", "Sparse latency histogram: indices of non-empty buckets (see Histogram)";
        hist_count: &'a [u64], "calls", "Sparse latency histogram: count per bucket in hist_bucket";
        sample_ratio: Option<f64>, "share", "Share of the window this op's probe was attached (the agent's --trap-budget duty cycle on launch-type calls): count is the calls seen divided by it, an estimate. Null: every call was seen";
    }
}

columns! {
    /// `sched_windows`: one row per CUDA-using process and window. A
    /// process with a thread that has made a traced CUDA/NCCL call counts
    /// those threads only (they feed the GPU; the others, watchdogs and idle
    /// pools, sleep by design); one without (a data-loading worker) counts
    /// all its threads.
    #[derive(Debug, Clone, PartialEq)]
    SchedRow for SchedWindows {
        threads: u32, "threads", "Threads of the process seen in the window (all of them, whichever the times below count)";
        on_cpu_ns: u64, "ns", "Time its threads ran on a CPU: those that feed the GPU (have made a traced CUDA/NCCL call) where it has any, else all (a data-loading worker); every thread on kernels before 5.17";
        off_cpu_ns: u64, "ns", "Time its threads were blocked or sleeping (switched out, not runnable)";
        runq_wait_ns: u64, "ns", "Time its threads were runnable but waiting for a CPU (run-queue latency)";
        runq_max_ns: u64, "ns", "Longest single run-queue wait";
        voluntary_switches: u64, "switches", "Context switches where the thread blocked";
        involuntary_switches: u64, "switches", "Context switches where the thread was preempted while runnable";
        wakeups: u64, "wakeups", "sched_wakeup / sched_wakeup_new events for its threads";
        off_cpu_in_call_ns: Option<u64>, "ns", "Part of off_cpu_ns spent inside a traced CUDA/NCCL call: waiting for the device or for peers, not a host stall (the rest is host-blocked). Null where not measured (imported traces)";
        runq_wait_in_call_ns: Option<u64>, "ns", "Part of runq_wait_ns spent inside a traced CUDA/NCCL call. Null where not measured";
    }
}

columns! {
    /// `cgroup_windows`: one row per cgroup and window.
    #[derive(Debug, Clone, PartialEq)]
    CgroupRow<'a> for CgroupWindows {
        cgroup_path: &'a str, "", "cgroup v2 path below the cgroup root";
        on_cpu_ns: u64, "ns", "CPU time of every task in the cgroup (noisy-neighbour attribution)";
        runq_wait_ns: u64, "ns", "Run-queue wait of every task in the cgroup";
        switches: u64, "switches", "Context switches of every task in the cgroup";
    }
}

columns! {
    /// `io_windows`: one row per process, device, op and window.
    #[derive(Debug, Clone, PartialEq)]
    IoRow<'a> for IoWindows {
        device: &'a str, "", "Block device as major:minor";
        op: &'a str, "", "read, write, flush, discard or other";
        count: u64, "requests", "Requests completed in the window";
        bytes: u64, "bytes", "Bytes transferred";
        total_ns: u64, "ns", "Sum of issue→complete latencies";
        max_ns: u64, "ns", "Longest request";
        hist_bucket: &'a [u8], "bucket index", "Sparse latency histogram: indices of non-empty buckets (see Histogram)";
        hist_count: &'a [u64], "calls", "Sparse latency histogram: count per bucket in hist_bucket";
    }
}

columns! {
    /// `host_events`: one row per event.
    #[derive(Debug, Clone, PartialEq)]
    HostEventRow<'a> for HostEvents {
        event_time: TimestampUs, "µs since epoch, UTC", "When it happened";
        kind: &'a str, "", "oom_kill, exec, exit, fork, mem_pressure, swap; in an imported trace also reference_chain (a diagnosis it stored) and annotation (a label set its job wrote: a step, an epoch)";
        value: i64, "kind-specific", "oom_kill: victim pages; annotation: span length in ns (0: an instant); exit: exit status, or 128 + the signal that killed it (137 SIGKILL, 134 SIGABRT), as Kubernetes reports it; fork: child pid (new processes only, never threads); mem_pressure/swap: bytes";
        detail: Option<&'a str>, "", "Free text: victim name, new binary path, … (reference_chain: the chain as JSON; annotation: its labels as a JSON object)";
    }
}

columns! {
    /// `stall_events`: one row per outlier call.
    #[derive(Debug, Clone, PartialEq)]
    StallRow<'a> for StallEvents {
        event_time: TimestampUs, "µs since epoch, UTC", "Start of the outlier call (of the off-CPU episode)";
        tid: u32, "", "Thread id that made the call";
        library: &'a str, "", "cudart, cuda or nccl; kernel for an off-CPU episode";
        op: &'a str, "", "Function name; for an off-CPU episode the syscall the thread slept in (futex, clock_nanosleep, read, …)";
        duration_ns: u64, "ns", "Duration of this call (how long the thread was off CPU)";
        threshold_ns: u64, "ns", "Threshold it crossed";
        reason: &'a str, "", "threshold: an outlier call (median_multiple in an imported trace); off_cpu: the thread was off CPU outside any CUDA/NCCL call (a lock, a queue, a sleep, a blocking read), its stack taken as the syscall returned";
        stack_id: Option<u64>, "", "Where the call was made: the stack's id in `stacks` (null when no stack was captured)";
        feeds_gpu: Option<bool>, "", "off_cpu: true when the thread has made a traced CUDA/NCCL call, so its wait holds the GPU's work back; false for the process's other threads (watchdogs, pools, a producer thread: their waits show at the feeding thread's wait for them). Null for outlier calls and imported traces";
        thread_name: Option<&'a str>, "", "The thread's own name (its comm: frameworks name their worker threads) as the agent read it when the event arrived; `comm` is the process's. Null where not read (the thread already gone, imported traces)";
    }
}

columns! {
    /// `stacks`: one row per frame of each distinct stack a window's rows name.
    #[derive(Debug, Clone, PartialEq)]
    StackRow<'a> for Stacks {
        stack_id: u64, "", "Stack id: a hash of its frames, so the same stack has the same id in every window and on every node";
        depth: u32, "", "Position of the frame, 0 = innermost (Python frames first, then native ones)";
        kind: &'a str, "", "python (a CPython frame) or native (a return address in an ELF file)";
        file: &'a str, "", "python: the source file (co_filename); native: the mapped file's path as the process sees it";
        function: &'a str, "", "python: the qualified name (3.11+; the plain name before); native: the ELF symbol, empty when none";
        line: Option<u32>, "", "python: the line being executed; null for native frames";
        offset: Option<u64>, "bytes", "native: the return address as an offset into the file; null for Python frames";
    }
}

columns! {
    /// `process_meta`: one row per process per window it changed or was first seen.
    #[derive(Debug, Clone, PartialEq)]
    ProcessMetaRow<'a> for ProcessMeta {
        cmdline: &'a str, "", "Command line, arguments joined by spaces (truncated to 4 KiB)";
        container_id: Option<&'a str>, "", "Container runtime id (64 hex) parsed from the cgroup path";
        pod_uid: Option<&'a str>, "", "Pod UID parsed from the cgroup path";
        cgroup_path: &'a str, "", "cgroup v2 path";
        local_rank: Option<i32>, "", "LOCAL_RANK from the environment";
        master_addr: Option<&'a str>, "", "MASTER_ADDR:MASTER_PORT from the environment";
        nccl_comm_id: Option<&'a str>, "", "NCCL communicator id (hex) learned from ncclCommInitRank";
        gpus: Option<&'a str>, "", "GPU device ids held by the container (kubelet PodResources), comma separated";
        libraries: &'a str, "", "Traced libraries mapped by the process, comma separated paths";
        labels: Option<&'a str>, "", "Pod labels as a JSON object";
    }
}

columns! {
    /// `node_windows`: one row per node and window.
    #[derive(Debug, Clone, PartialEq)]
    NodeRow<'a> for NodeWindows {
        events: u64, "events", "Probe hits aggregated in the window";
        ringbuf_drops: u64, "events", "Outlier events lost to a full ring buffer (summed over CPUs)";
        map_full: u64, "events", "Updates lost to a full kernel map (summed over CPUs)";
        spool_dropped: u64, "batches", "Batches dropped from a full on-disk spool since the agent started";
        probe_run_ns: u64, "ns", "eBPF program run time in the window (BPF_STATS_RUN_TIME)";
        kernel: Option<&'a str>, "", "Kernel release";
        cpu_model: Option<&'a str>, "", "CPU model name";
        cpu_cores: Option<u32>, "cores", "Online CPUs";
        gpu_model: Option<&'a str>, "", "GPU model";
        driver_version: Option<&'a str>, "", "NVIDIA driver version";
        cuda_version: Option<&'a str>, "", "CUDA version";
        gpu_count: Option<u32>, "GPUs", "GPUs the NVIDIA driver lists on the node (/proc/driver/nvidia/gpus)";
    }
}

columns! {
    /// `progress_windows`: one row per traced CUDA/NCCL process and window.
    #[derive(Debug, Clone, PartialEq)]
    ProgressRow<'a> for ProgressWindows {
        threads_in_call: u32, "threads", "Threads inside a traced CUDA/NCCL call at the end of the window";
        oldest_library: Option<&'a str>, "", "Library of the call in flight longest; null when none is";
        oldest_op: Option<&'a str>, "", "The call in flight longest (e.g. cudaStreamSynchronize: waiting for the GPU or peers); null when none is";
        oldest_tid: Option<u32>, "", "Thread making that call";
        oldest_age_ns: Option<u64>, "ns", "How long that call has been in flight at the end of the window";
        last_call_age_ns: Option<u64>, "ns", "Time from the end of the last window in which the process made a traced call to the end of this one (0: it made one in this window); null when never seen";
        proc_state: Option<&'a str>, "", "State of its main thread from /proc: R running, S sleeping, D uninterruptible (IO), T stopped, Z zombie";
        steps: Option<u32>, "steps", "Training steps that ended in the window, found without code changes: the process's syncs, copies and collectives repeat in a cycle, and each return of the call that closes the cycle (step_op) ends a step. Null while its calls follow no cycle (no such calls, no repeating order, or fewer than three cycles seen)";
        step_p50_ns: Option<u64>, "ns", "Median time of those steps, each from the end of the step before; null when none has a known start";
        step_max_ns: Option<u64>, "ns", "Longest of those steps";
        step_op: Option<&'a str>, "", "The call whose return ends each step (e.g. cudaStreamSynchronize)";
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::COMMON;

    #[test]
    fn common_positions_name_the_columns_of_every_table() {
        let at = |i: usize| COMMON[i].name;
        assert_eq!(
            [at(common::NODE), at(common::JOB), at(common::PID), at(common::WINDOW_START), at(common::WINDOW_US)],
            ["node", "job", "pid", "window_start", "window_us"]
        );
        for t in Table::ALL {
            let schema = t.schema();
            for i in [common::NODE, common::JOB, common::PID, common::WINDOW_START, common::WINDOW_US] {
                assert_eq!(schema.field(i).name(), COMMON[i].name, "{}", t.name());
            }
        }
    }

    #[test]
    #[should_panic(expected = "no such column")]
    fn a_missing_column_has_no_position() {
        crate::column::position(COMMON, "node_name");
    }
}
