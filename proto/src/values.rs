//! Value checks on decoded rows: what no real agent can produce is refused
//! with the row and column named, before anything is stored.

use crate::Table;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{UInt32Type, UInt64Type};

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
    if let (Some(n), Some(e)) = (u64s(b, "count"), u64s(b, "errors")) {
        if let Some(i) = (0..b.num_rows()).find(|&i| e.value(i) > n.value(i)) {
            return bad(i, format!("errors {} > count {}", e.value(i), n.value(i)));
        }
    }
    if let (Some(total), Some(max)) = (u64s(b, "total_ns"), u64s(b, "max_ns")) {
        if let Some(i) = (0..b.num_rows()).find(|&i| total.value(i) > 0 && max.value(i) > total.value(i)) {
            return bad(i, format!("max_ns {} > total_ns {}", max.value(i), total.value(i)));
        }
    }
    if table == Table::SchedWindows {
        let threads = b.column_by_name("threads").and_then(|c| c.as_primitive_opt::<UInt32Type>());
        let cols = (u64s(b, "on_cpu_ns"), u64s(b, "off_cpu_ns"), u64s(b, "runq_wait_ns"), u64s(b, "window_us"));
        if let (Some(t), (Some(on), Some(off), Some(rq), Some(w))) = (threads, cols) {
            for i in 0..b.num_rows() {
                // Each thread accounts at most its window, plus what spans the window's edges.
                let cap = (t.value(i).max(1) as u128) * (w.value(i) as u128 * 1000) * 2 + 1_000_000_000;
                let sum = on.value(i) as u128 + off.value(i) as u128 + rq.value(i) as u128;
                if sum > cap {
                    return bad(i, format!("on+off+runq {sum} ns exceeds {} threads × 2 windows", t.value(i)));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::{ArrayRef, UInt32Array, UInt64Array};
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
            (batch(&[("count", u(&[3])), ("errors", u(&[4]))]), "errors 4 > count 3"),
            (batch(&[("total_ns", u(&[10])), ("max_ns", u(&[11]))]), "max_ns 11 > total_ns 10"),
            (batch(&[("count", u(&[MAX_COUNT + 1]))]), "count"),
        ];
        for (b, want) in cases {
            let e = check(Table::CallWindows, &b).unwrap_err();
            assert!(e.contains(want) && e.contains("row 0"), "{e}");
        }
    }

    #[test]
    fn scheduler_time_cannot_exceed_what_the_threads_had() {
        let mk = |on: u64| {
            let t: ArrayRef = Arc::new(UInt32Array::from(vec![2]));
            batch(&[
                ("window_us", u(&[1_000_000])),
                ("threads", t),
                ("on_cpu_ns", u(&[on])),
                ("off_cpu_ns", u(&[0])),
                ("runq_wait_ns", u(&[0])),
            ])
        };
        assert_eq!(check(Table::SchedWindows, &mk(1_900_000_000)), Ok(()));
        assert!(check(Table::SchedWindows, &mk(50_000_000_000)).unwrap_err().contains("exceeds 2 threads"));
    }
}
