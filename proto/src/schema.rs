// SPDX-License-Identifier: Apache-2.0
//! The Arrow schema of every table Ingero writes, defined once.
//!
//! Agents build batches with these schemas, the aggregator validates incoming
//! batches against them and writes them to Parquet unchanged, and queries read
//! them back. `proto/README.md` documents every column; a test keeps the two
//! in step.

use std::sync::{Arc, OnceLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::rows::Columns;
use crate::tables::{
    CallRow, CgroupRow, Common, HostEventRow, IoRow, NodeRow, ProcessMetaRow, ProgressRow, SchedRow, StackRow, StallRow,
};

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

/// Columns every row of every table starts with, in this order.
pub const COMMON: &[Column] = Common::COLUMNS;

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

    /// Table-specific columns (after [`COMMON`]), from its row struct.
    pub fn own_columns(self) -> &'static [Column] {
        match self {
            Table::CallWindows => CallRow::COLUMNS,
            Table::SchedWindows => SchedRow::COLUMNS,
            Table::CgroupWindows => CgroupRow::COLUMNS,
            Table::IoWindows => IoRow::COLUMNS,
            Table::HostEvents => HostEventRow::COLUMNS,
            Table::StallEvents => StallRow::COLUMNS,
            Table::ProcessMeta => ProcessMetaRow::COLUMNS,
            Table::NodeWindows => NodeRow::COLUMNS,
            Table::ProgressWindows => ProgressRow::COLUMNS,
            Table::Stacks => StackRow::COLUMNS,
        }
    }

    /// All columns in order.
    pub fn columns(self) -> Vec<Column> {
        let mut cols = COMMON.to_vec();
        cols.extend_from_slice(self.own_columns());
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
