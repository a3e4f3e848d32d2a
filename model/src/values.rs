// SPDX-License-Identifier: Apache-2.0
//! Value checks on decoded rows: what no real agent can produce is refused
//! with the row and column named, before anything is stored. Only invariants
//! that hold for every window are checked: a window drained late carries more
//! than its nominal length of scheduler time, and a call that starts in one
//! window and fails in the next counts its error there, so neither "time ≤
//! threads × window" nor "errors ≤ count" may be enforced (a refused batch is
//! dropped by the agent, with every good row in it).

use crate::Table;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::UInt64Type;

/// Longest accepted window (an import may use long windows; agents use ~1 s).
pub const MAX_WINDOW_US: u64 = 24 * 3600 * 1_000_000;
/// Shortest accepted window.
pub const MIN_WINDOW_US: u64 = 1_000;
/// No duration or duration sum in one row may exceed 30 days (more than 256
/// CPUs busy for a whole 1-hour window): beyond it the value is garbage.
pub const MAX_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;
/// More calls in one row than a probed process could make in a day.
pub const MAX_COUNT: u64 = 10_000_000_000;

fn u64s<'a>(b: &'a RecordBatch, name: &str) -> Option<&'a arrow::array::PrimitiveArray<UInt64Type>> {
    b.column_by_name(name).and_then(|c| c.as_primitive_opt::<UInt64Type>())
}

/// Checks one decoded batch of `table`; the error names table, row and column.
pub fn check(table: Table, b: &RecordBatch) -> Result<(), String> {
    let bad = |i: usize, what: String| Err(format!("{table}: row {i}: {what}"));
    if let Some(w) = u64s(b, "window_us") {
        for i in 0..b.num_rows() {
            let v = w.value(i);
            if !(MIN_WINDOW_US..=MAX_WINDOW_US).contains(&v) {
                return bad(i, format!("window_us {v} is outside [{MIN_WINDOW_US}, {MAX_WINDOW_US}]"));
            }
        }
    }
    for (f, col) in b.schema().fields().iter().zip(b.columns()) {
        let Some(a) = col.as_primitive_opt::<UInt64Type>() else { continue };
        let limit = if f.name().ends_with("_ns") {
            MAX_NS
        } else if f.name() == "count" || f.name() == "errors" {
            MAX_COUNT
        } else {
            continue;
        };
        if let Some(i) = (0..a.len()).find(|&i| a.is_valid(i) && a.value(i) > limit) {
            return bad(i, format!("{} = {} is not a plausible value (limit {limit})", f.name(), a.value(i)));
        }
    }
    if let (Some(total), Some(max)) = (u64s(b, "total_ns"), u64s(b, "max_ns"))
        && let Some(i) = (0..b.num_rows()).find(|&i| total.value(i) > 0 && max.value(i) > total.value(i))
    {
        return bad(i, format!("max_ns {} > total_ns {}", max.value(i), total.value(i)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::{ArrayRef, UInt64Array};
    use arrow::datatypes::{Field, Schema};

    fn batch(cols: &[(&str, ArrayRef)]) -> RecordBatch {
        let fields: Vec<Field> = cols.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), true)).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols.iter().map(|(_, a)| a.clone()).collect()).unwrap()
    }

    fn u(v: &[u64]) -> ArrayRef {
        Arc::new(UInt64Array::from(v.to_vec()))
    }

    #[test]
    fn plausible_rows_pass_and_absurd_ones_are_named() {
        let ok = batch(&[
            ("window_us", u(&[1_000_000])),
            ("count", u(&[5])),
            ("errors", u(&[1])),
            ("total_ns", u(&[900])),
            ("max_ns", u(&[400])),
        ]);
        assert_eq!(check(Table::CallWindows, &ok), Ok(()));
        let cases = [
            (batch(&[("window_us", u(&[0]))]), "window_us 0"),
            (batch(&[("window_us", u(&[1_000_000])), ("total_ns", u(&[u64::MAX]))]), "total_ns"),
            (batch(&[("errors", u(&[MAX_COUNT + 1]))]), "errors"),
            (batch(&[("total_ns", u(&[10])), ("max_ns", u(&[11]))]), "max_ns 11 > total_ns 10"),
            (batch(&[("count", u(&[MAX_COUNT + 1]))]), "count"),
        ];
        for (b, want) in cases {
            let e = check(Table::CallWindows, &b).unwrap_err();
            assert!(e.contains(want) && e.contains("row 0"), "{e}");
        }
    }
}
