// SPDX-License-Identifier: Apache-2.0
//! The Arrow schema of every table Ingero writes, defined once.
//!
//! Agents build batches with these schemas, the aggregator validates incoming
//! batches against them and writes them to Parquet unchanged, and queries read
//! them back. `proto/README.md` documents every column; a test keeps the two
//! in step.

use std::sync::{Arc, OnceLock};

use arrow::datatypes::{Field, Schema, SchemaRef};

use crate::column::Columns;
pub use crate::column::{ColType, Column};
pub use crate::table::Table;
use crate::tables::{
    CallRow, CgroupRow, Common, HostEventRow, IoRow, NodeRow, ProcessMetaRow, ProgressRow, SchedRow, StackRow, StallRow,
};

/// Columns every row of every table starts with, in this order.
pub const COMMON: &[Column] = Common::COLUMNS;

impl Table {
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
    /// `INGERO_BLESS=1 cargo test -p ingero-model` rewrites it.
    #[test]
    fn readme_documents_every_column() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../proto/README.md");
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
                panic!("proto/README.md is stale: run INGERO_BLESS=1 cargo test -p ingero-model");
            }
        }
    }
}
