// SPDX-License-Identifier: Apache-2.0
//! Row-at-a-time builders for the tables in [`crate::schema`].
//!
//! Producers (agent, simulator, importer) describe a row as values in schema
//! order; the builder checks each value against the column's type, so a
//! producer cannot drift from the schema without a clear error.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, ListBuilder, RecordBatch, StringBuilder,
    TimestampMicrosecondBuilder, UInt8Builder, UInt32Builder, UInt64Builder,
};
use arrow::datatypes::{DataType, Field};

use crate::column::ColType;
pub use crate::column::{Cell, Columns, Row, TimestampUs, Val};
use crate::schema::COMMON;
use crate::table::Table;
pub use crate::tables::*;
use crate::{Error, Result};

#[derive(Debug)]
enum Col {
    Utf8(StringBuilder),
    Bool(BooleanBuilder),
    I32(Int32Builder),
    I64(Int64Builder),
    U32(UInt32Builder),
    U64(UInt64Builder),
    F64(Float64Builder),
    Ts(TimestampMicrosecondBuilder),
    ListU8(ListBuilder<UInt8Builder>),
    ListU64(ListBuilder<UInt64Builder>),
}

impl Col {
    /// A builder for `n` rows (they grow past it by doubling).
    fn new(ty: ColType, n: usize) -> Col {
        let list = |t: DataType| Arc::new(Field::new("item", t, false));
        match ty {
            ColType::Utf8 => Col::Utf8(StringBuilder::with_capacity(n, n * 16)),
            ColType::Bool => Col::Bool(BooleanBuilder::with_capacity(n)),
            ColType::I32 => Col::I32(Int32Builder::with_capacity(n)),
            ColType::I64 => Col::I64(Int64Builder::with_capacity(n)),
            ColType::U32 => Col::U32(UInt32Builder::with_capacity(n)),
            ColType::U64 => Col::U64(UInt64Builder::with_capacity(n)),
            ColType::F64 => Col::F64(Float64Builder::with_capacity(n)),
            ColType::TimestampUs => Col::Ts(TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC")),
            ColType::ListU8 => Col::ListU8(
                ListBuilder::with_capacity(UInt8Builder::with_capacity(n * 4), n).with_field(list(DataType::UInt8)),
            ),
            ColType::ListU64 => Col::ListU64(
                ListBuilder::with_capacity(UInt64Builder::with_capacity(n * 4), n).with_field(list(DataType::UInt64)),
            ),
        }
    }

    /// Appends `v`; returns false when the value does not fit the column type.
    fn push(&mut self, v: Val<'_>) -> bool {
        match (self, v) {
            (Col::Utf8(b), Val::Str(s)) => b.append_value(s),
            (Col::Utf8(b), Val::Null) => b.append_null(),
            (Col::Bool(b), Val::Bool(x)) => b.append_value(x),
            (Col::Bool(b), Val::Null) => b.append_null(),
            (Col::I32(b), Val::I(x)) if i32::try_from(x).is_ok() => b.append_value(x as i32),
            (Col::I32(b), Val::Null) => b.append_null(),
            (Col::I64(b), Val::I(x)) => b.append_value(x),
            (Col::I64(b), Val::Null) => b.append_null(),
            (Col::U32(b), Val::U(x)) if u32::try_from(x).is_ok() => b.append_value(x as u32),
            (Col::U32(b), Val::Null) => b.append_null(),
            (Col::U64(b), Val::U(x)) => b.append_value(x),
            (Col::U64(b), Val::Null) => b.append_null(),
            (Col::F64(b), Val::F(x)) => b.append_value(x),
            (Col::F64(b), Val::Null) => b.append_null(),
            (Col::Ts(b), Val::Ts(x)) => b.append_value(x),
            (Col::Ts(b), Val::Null) => b.append_null(),
            (Col::ListU8(b), Val::U8s(xs)) => {
                b.values().append_slice(xs);
                b.append(true);
            }
            (Col::ListU64(b), Val::U64s(xs)) => {
                b.values().append_slice(xs);
                b.append(true);
            }
            _ => return false,
        }
        true
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Col::Utf8(b) => Arc::new(b.finish()),
            Col::Bool(b) => Arc::new(b.finish()),
            Col::I32(b) => Arc::new(b.finish()),
            Col::I64(b) => Arc::new(b.finish()),
            Col::U32(b) => Arc::new(b.finish()),
            Col::U64(b) => Arc::new(b.finish()),
            Col::F64(b) => Arc::new(b.finish()),
            Col::Ts(b) => Arc::new(b.finish()),
            Col::ListU8(b) => Arc::new(b.finish()),
            Col::ListU64(b) => Arc::new(b.finish()),
        }
    }
}

/// Builds one table's batch row by row.
#[derive(Debug)]
pub struct BatchBuilder {
    table: Table,
    cols: Vec<Col>,
    names: Vec<&'static str>,
    rows: usize,
}

impl BatchBuilder {
    /// A builder sized for a few rows (most batches are one process's or one
    /// node's window; Arrow's default of 1,024 rows per column made every
    /// small batch allocate and zero ~150 KB).
    pub fn new(table: Table) -> Self {
        Self::with_capacity(table, 16)
    }

    /// A builder sized for `rows` rows.
    pub fn with_capacity(table: Table, rows: usize) -> Self {
        let columns = table.columns();
        BatchBuilder {
            table,
            cols: columns.iter().map(|c| Col::new(c.ty, rows)).collect(),
            names: columns.iter().map(|c| c.name).collect(),
            rows: 0,
        }
    }

    pub fn table(&self) -> Table {
        self.table
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Appends a typed row; a row of another table is an error.
    pub fn append<R: Row>(&mut self, common: &Common, row: &R) -> Result<()> {
        if R::TABLE != self.table {
            return Err(Error::Invalid(format!("a {} row pushed to {}", R::TABLE, self.table)));
        }
        common.with_vals(|c| row.with_vals(|own| self.push_vals(c, own)))
    }

    /// Appends a row: the common columns, then the table's own columns in order.
    fn push_vals(&mut self, common_vals: &[Val<'_>], own: &[Val<'_>]) -> Result<()> {
        if COMMON.len() + own.len() != self.cols.len() {
            return Err(Error::Invalid(format!(
                "{}: row has {} values, table has {} columns",
                self.table,
                COMMON.len() + own.len(),
                self.cols.len()
            )));
        }
        // Check types before appending anything so a bad row leaves no partial state.
        let types = self.table.columns();
        for (i, v) in common_vals.iter().chain(own).enumerate() {
            if !fits(types[i].ty, *v) || (!types[i].nullable && *v == Val::Null) {
                return Err(Error::Invalid(format!(
                    "{}: value {v:?} does not fit column `{}` ({:?})",
                    self.table, self.names[i], types[i].ty
                )));
            }
        }
        for (c, v) in self.cols.iter_mut().zip(common_vals.iter().chain(own)) {
            let ok = c.push(*v);
            debug_assert!(ok);
        }
        self.rows += 1;
        Ok(())
    }

    /// Finishes the batch and resets the builder.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = self.cols.iter_mut().map(Col::finish).collect();
        self.rows = 0;
        Ok(RecordBatch::try_new(self.table.schema(), arrays)?)
    }
}

fn fits(ty: ColType, v: Val<'_>) -> bool {
    matches!(
        (ty, v),
        (_, Val::Null)
            | (ColType::Utf8, Val::Str(_))
            | (ColType::Bool, Val::Bool(_))
            | (ColType::I64, Val::I(_))
            | (ColType::U64, Val::U(_))
            | (ColType::F64, Val::F(_))
            | (ColType::TimestampUs, Val::Ts(_))
            | (ColType::ListU8, Val::U8s(_))
            | (ColType::ListU64, Val::U64s(_))
    ) || matches!((ty, v), (ColType::I32, Val::I(x)) if i32::try_from(x).is_ok())
        || matches!((ty, v), (ColType::U32, Val::U(x)) if u32::try_from(x).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common() -> Common {
        Common {
            node: "n1".into(),
            pid: 42,
            comm: "python".into(),
            window_start_us: TimestampUs(1_700_000_000_000_000),
            window_us: 1_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn builds_batches_of_the_table_schema() {
        let mut b = BatchBuilder::new(Table::CgroupWindows);
        for on_cpu_ns in [1, 2] {
            let row = CgroupRow { cgroup_path: "/kubepods/x", on_cpu_ns, runq_wait_ns: 0, switches: 3 };
            b.append(&common(), &row).unwrap();
        }
        let batch = b.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.schema(), Table::CgroupWindows.schema());
    }

    #[test]
    fn rejects_values_of_the_wrong_type_without_partial_rows() {
        let mut b = BatchBuilder::new(Table::CgroupWindows);
        let err = common()
            .with_vals(|c| b.push_vals(c, &[Val::Str("/x"), Val::Str("oops"), Val::U(0), Val::U(0)]))
            .unwrap_err();
        assert!(err.to_string().contains("on_cpu_ns"), "{err}");
        assert!(b.is_empty());
        let row = CgroupRow { cgroup_path: "/x", on_cpu_ns: 1, runq_wait_ns: 0, switches: 0 };
        b.append(&common(), &row).unwrap();
        assert_eq!(b.finish().unwrap().num_rows(), 1);
    }

    #[test]
    fn a_row_of_another_table_is_refused() {
        let mut b = BatchBuilder::new(Table::SchedWindows);
        let row = CgroupRow { cgroup_path: "/x", on_cpu_ns: 1, runq_wait_ns: 0, switches: 0 };
        let err = b.append(&common(), &row).unwrap_err().to_string();
        assert!(err.contains("cgroup_windows row pushed to sched_windows"), "{err}");
        assert!(b.is_empty());
    }
}
