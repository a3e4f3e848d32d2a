// SPDX-License-Identifier: Apache-2.0
//! The tables Ingero writes: names and meaning (their columns come from the
//! row structs in [`crate::tables`], their schemas from [`crate::schema`]).

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
    ProgressWindows,
    Stacks,
}

/// Table names as constants, for SQL text: `FROM {CALL_WINDOWS}` in a
/// `format!` is checked by the compiler, `FROM call_windows` is not.
pub mod names {
    use super::Table;
    pub const CALL_WINDOWS: &str = Table::CallWindows.name();
    pub const SCHED_WINDOWS: &str = Table::SchedWindows.name();
    pub const CGROUP_WINDOWS: &str = Table::CgroupWindows.name();
    pub const IO_WINDOWS: &str = Table::IoWindows.name();
    pub const HOST_EVENTS: &str = Table::HostEvents.name();
    pub const STALL_EVENTS: &str = Table::StallEvents.name();
    pub const PROCESS_META: &str = Table::ProcessMeta.name();
    pub const NODE_WINDOWS: &str = Table::NodeWindows.name();
    pub const PROGRESS_WINDOWS: &str = Table::ProgressWindows.name();
    pub const STACKS: &str = Table::Stacks.name();
}

impl Table {
    pub const ALL: [Table; 10] = [
        Table::CallWindows,
        Table::SchedWindows,
        Table::CgroupWindows,
        Table::IoWindows,
        Table::HostEvents,
        Table::StallEvents,
        Table::ProcessMeta,
        Table::NodeWindows,
        Table::ProgressWindows,
        Table::Stacks,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Table::CallWindows => "call_windows",
            Table::SchedWindows => "sched_windows",
            Table::CgroupWindows => "cgroup_windows",
            Table::IoWindows => "io_windows",
            Table::HostEvents => "host_events",
            Table::StallEvents => "stall_events",
            Table::ProcessMeta => "process_meta",
            Table::NodeWindows => "node_windows",
            Table::ProgressWindows => "progress_windows",
            Table::Stacks => "stacks",
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
            Table::ProgressWindows => {
                "What each CUDA-using process is inside at the end of each window: the calls in flight and their age (hung ranks)"
            }
            Table::Stacks => {
                "Frames of the stacks that stall_events rows name (stack_id): Python frames with file, function and line, then native frames. Each stack is shipped once per window and node, under the first process that made it: join on node and stack_id, not on pid"
            }
        }
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
