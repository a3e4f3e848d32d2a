// SPDX-License-Identifier: Apache-2.0
//! Per-file Delta statistics (`numRecords`, `minValues`, `maxValues`,
//! `nullCount`) so that other engines (Spark, Trino, delta-rs, DuckDB) can
//! skip files on node, time and value predicates without opening them.
//!
//! Computed from the batch in its storage form (the types the file holds).
//! Bounds are always safe for skipping: a timestamp's minimum is rounded
//! down and its maximum up to the millisecond (Delta keeps milliseconds);
//! a long string's minimum is its 32-character prefix and its maximum is
//! left out (a prefix is no upper bound); a float column with NaN or an
//! infinity has no bounds. Lists and booleans get a null count only.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::{max, max_string, min, min_string};
use arrow::datatypes::{ArrowPrimitiveType, TimestampMicrosecondType};
use arrow::datatypes::{DataType, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, TimeUnit};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;
use serde_json::{Map, Value, json};
use std::collections::HashMap;

/// Characters of a string kept in its minimum (Spark's
/// `dataSkippingStringPrefixLength`).
pub const STRING_PREFIX: usize = 32;

/// The `stats` JSON of a file holding `batch` (storage types).
pub fn of(batch: &RecordBatch) -> String {
    build(batch, |_, col| bounds(col))
}

/// The `stats` JSON of `batch` written as the Parquet file `md` describes:
/// integer, string and timestamp bounds come from the statistics the
/// Parquet writer computed while encoding (reading every value a second
/// time was an eighth of a flush's encoding); the rest as [`of`].
pub fn of_file(batch: &RecordBatch, md: &ParquetMetaData) -> String {
    let leaves: HashMap<&str, usize> = md
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.path().parts().len() == 1)
        .map(|(i, c)| (c.path().parts()[0].as_str(), i))
        .collect();
    build(batch, |name, col| match leaves.get(name) {
        Some(&leaf) if file_bounds_apply(col.data_type()) => file_bounds(md, leaf, col.data_type()),
        _ => bounds(col),
    })
}

fn build(batch: &RecordBatch, bounds: impl Fn(&str, &dyn Array) -> (Option<Value>, Option<Value>)) -> String {
    let (mut mins, mut maxs, mut nulls) = (Map::new(), Map::new(), Map::new());
    for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
        nulls.insert(field.name().clone(), json!(col.null_count()));
        let (lo, hi) = bounds(field.name(), col.as_ref());
        if let Some(v) = lo {
            mins.insert(field.name().clone(), v);
        }
        if let Some(v) = hi {
            maxs.insert(field.name().clone(), v);
        }
    }
    json!({
        "numRecords": batch.num_rows(),
        "minValues": mins,
        "maxValues": maxs,
        "nullCount": nulls,
    })
    .to_string()
}

/// Types whose Parquet statistics are the same bounds [`bounds`] computes
/// (floats are not: Parquet leaves NaN out of its bounds, Delta readers
/// must not skip a file that holds one).
fn file_bounds_apply(t: &DataType) -> bool {
    matches!(t, DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::Utf8)
        || matches!(t, DataType::Timestamp(TimeUnit::Microsecond, Some(_)))
}

/// A column's bounds over every row group of the file; none where any
/// row group with values has no statistics.
fn file_bounds(md: &ParquetMetaData, leaf: usize, t: &DataType) -> (Option<Value>, Option<Value>) {
    let (mut lo, mut hi): (Option<Bound>, Option<Bound>) = (None, None);
    for rg in md.row_groups() {
        let c = rg.column(leaf);
        let Some(s) = c.statistics() else { return (None, None) };
        let (Some(l), Some(h)) = (Bound::min(s), Bound::max(s)) else {
            if s.null_count_opt() == Some(rg.num_rows() as u64) {
                continue; // only nulls here
            }
            return (None, None);
        };
        lo = Some(lo.map_or(l.clone(), |v| v.min(l)));
        hi = Some(hi.map_or(h.clone(), |v| v.max(h)));
    }
    match (t, lo, hi) {
        (DataType::Timestamp(..), Some(Bound::Int(l)), Some(Bound::Int(h))) => {
            (millis(l.div_euclid(1000)), millis((h + 999).div_euclid(1000)))
        }
        (_, Some(Bound::Int(l)), Some(Bound::Int(h))) => (Some(json!(l)), Some(json!(h))),
        (_, Some(Bound::Str(l, _)), Some(Bound::Str(h, exact))) => {
            let (Ok(l), Ok(h)) = (std::str::from_utf8(&l), std::str::from_utf8(&h)) else { return (None, None) };
            (Some(json!(prefix(l))), (exact && h.chars().count() <= STRING_PREFIX).then(|| json!(h)))
        }
        _ => (None, None),
    }
}

/// One row group's bound of a column: an integer, or bytes and whether
/// they are the exact value (Parquet truncates long ones).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Bound {
    Int(i64),
    Str(Vec<u8>, bool),
}

impl Bound {
    fn min(s: &Statistics) -> Option<Bound> {
        match s {
            Statistics::Int32(v) => v.min_opt().map(|&x| Bound::Int(x.into())),
            Statistics::Int64(v) => v.min_opt().map(|&x| Bound::Int(x)),
            Statistics::ByteArray(v) => v.min_opt().map(|x| Bound::Str(x.data().to_vec(), v.min_is_exact())),
            _ => None,
        }
    }

    fn max(s: &Statistics) -> Option<Bound> {
        match s {
            Statistics::Int32(v) => v.max_opt().map(|&x| Bound::Int(x.into())),
            Statistics::Int64(v) => v.max_opt().map(|&x| Bound::Int(x)),
            Statistics::ByteArray(v) => v.max_opt().map(|x| Bound::Str(x.data().to_vec(), v.max_is_exact())),
            _ => None,
        }
    }
}

/// The `stats` JSON of a file whose columns are not summarised (tests).
#[cfg(test)]
pub(crate) fn rows_only(rows: usize) -> String {
    format!("{{\"numRecords\":{rows}}}")
}

/// A column's (minimum, maximum) as Delta writes them, where it has them.
fn bounds(col: &dyn Array) -> (Option<Value>, Option<Value>) {
    match col.data_type() {
        DataType::Int8 => ints::<Int8Type>(col),
        DataType::Int16 => ints::<Int16Type>(col),
        DataType::Int32 => ints::<Int32Type>(col),
        DataType::Int64 => ints::<Int64Type>(col),
        DataType::Float64 => floats(col),
        DataType::Utf8 => strings(col),
        DataType::Dictionary(_, v) if v.as_ref() == &DataType::Utf8 => {
            arrow::compute::cast(col, &DataType::Utf8).map_or((None, None), |a| strings(a.as_ref()))
        }
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => timestamps(col),
        _ => (None, None),
    }
}

fn ints<T: ArrowPrimitiveType>(col: &dyn Array) -> (Option<Value>, Option<Value>)
where
    T::Native: Into<i64>,
{
    let a = col.as_primitive::<T>();
    (min(a).map(|v| json!(v.into())), max(a).map(|v| json!(v.into())))
}

fn floats(col: &dyn Array) -> (Option<Value>, Option<Value>) {
    let a = col.as_primitive::<Float64Type>();
    if a.iter().flatten().any(|v| !v.is_finite()) {
        return (None, None);
    }
    (min(a).map(|v| json!(v)), max(a).map(|v| json!(v)))
}

fn strings(col: &dyn Array) -> (Option<Value>, Option<Value>) {
    let a = col.as_string::<i32>();
    let lo = min_string(a).map(|s| json!(prefix(s)));
    let hi = max_string(a).filter(|s| s.chars().count() <= STRING_PREFIX).map(|s| json!(s));
    (lo, hi)
}

/// The first [`STRING_PREFIX`] characters (a string's prefix sorts at or
/// before it, so it is a valid minimum).
fn prefix(s: &str) -> &str {
    s.char_indices().nth(STRING_PREFIX).map_or(s, |(i, _)| &s[..i])
}

fn timestamps(col: &dyn Array) -> (Option<Value>, Option<Value>) {
    let a = col.as_primitive::<TimestampMicrosecondType>();
    let lo = min(a).and_then(|us| millis(us.div_euclid(1000)));
    let hi = max(a).and_then(|us| millis((us + 999).div_euclid(1000)));
    (lo, hi)
}

fn millis(ms: i64) -> Option<Value> {
    let t = chrono::DateTime::from_timestamp_millis(ms)?;
    Some(json!(t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, BooleanArray, Float64Array, Int16Array, Int64Array, StringArray};
    use arrow::array::{TimestampMicrosecondArray, new_null_array};

    use super::*;

    fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(cols).unwrap()
    }

    fn stats(b: &RecordBatch) -> Value {
        serde_json::from_str(&of(b)).unwrap()
    }

    #[test]
    fn numbers_and_strings_get_exact_bounds_and_null_counts() {
        let b = batch(vec![
            ("node", Arc::new(StringArray::from(vec![Some("n-2"), None, Some("n-10")])) as ArrayRef),
            ("bucket", Arc::new(Int16Array::from(vec![Some(200), Some(3), None]))),
            ("ns", Arc::new(Int64Array::from(vec![i64::MAX - 1, 5, 7]))),
            ("share", Arc::new(Float64Array::from(vec![0.5, -1.25, 3.0]))),
            ("flag", Arc::new(BooleanArray::from(vec![true, false, true]))),
        ]);
        let s = stats(&b);
        assert_eq!(s["numRecords"], 3);
        assert_eq!(s["minValues"], json!({"node": "n-10", "bucket": 3, "ns": 5, "share": -1.25}));
        assert_eq!(s["maxValues"], json!({"node": "n-2", "bucket": 200, "ns": i64::MAX - 1, "share": 3.0}));
        assert_eq!(s["nullCount"], json!({"node": 1, "bucket": 1, "ns": 0, "share": 0, "flag": 0}));
    }

    #[test]
    fn timestamps_round_outwards_to_the_millisecond() {
        let ts = TimestampMicrosecondArray::from(vec![1_700_000_000_123_456i64, 1_700_000_000_000_001, -1])
            .with_timezone("UTC");
        let s = stats(&batch(vec![("t", Arc::new(ts) as ArrayRef)]));
        assert_eq!(s["minValues"]["t"], "1969-12-31T23:59:59.999Z");
        assert_eq!(s["maxValues"]["t"], "2023-11-14T22:13:20.124Z");
        let exact = TimestampMicrosecondArray::from(vec![1_700_000_000_123_000i64]).with_timezone("UTC");
        let s = stats(&batch(vec![("t", Arc::new(exact) as ArrayRef)]));
        assert_eq!(s["minValues"]["t"], s["maxValues"]["t"]);
    }

    #[test]
    fn unsafe_bounds_are_left_out() {
        let long = "é".repeat(STRING_PREFIX + 5);
        let b = batch(vec![
            ("path", Arc::new(StringArray::from(vec![long.as_str(), "a"])) as ArrayRef),
            ("share", Arc::new(Float64Array::from(vec![1.0, f64::NAN]))),
            ("empty", new_null_array(&DataType::Int32, 2)),
        ]);
        let s = stats(&b);
        assert_eq!(s["minValues"], json!({"path": "a"}));
        assert_eq!(s["maxValues"], json!({}));
        assert_eq!(s["nullCount"]["empty"], 2);
        let only_long = batch(vec![("path", Arc::new(StringArray::from(vec![long.as_str()])) as ArrayRef)]);
        assert_eq!(stats(&only_long)["minValues"]["path"], "é".repeat(STRING_PREFIX));
    }

    /// The statistics taken from the Parquet writer's metadata are the ones
    /// computed from the values, over several row groups, nulls, truncated
    /// long strings, rounding timestamps and a NaN.
    #[test]
    fn file_statistics_equal_the_values_own() {
        use arrow::array::{Int8Array, ListArray};
        use arrow::datatypes::Int32Type;
        use parquet::arrow::ArrowWriter;
        use parquet::file::properties::{EnabledStatistics, WriterProperties};

        let long = "é".repeat(STRING_PREFIX + 40);
        let big = "z".repeat(STRING_PREFIX + 100);
        let ts = TimestampMicrosecondArray::from(vec![Some(1_700_000_000_123_456), None, Some(-1), Some(5), Some(9)])
            .with_timezone("UTC");
        let lists = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1)]),
            None,
            Some(vec![]),
            None,
            None,
        ]);
        let b = batch(vec![
            (
                "node",
                Arc::new(StringArray::from(vec![Some("n-2"), None, Some(long.as_str()), Some("n-10"), Some("b")]))
                    as ArrayRef,
            ),
            ("far", Arc::new(StringArray::from(vec![Some("a"), Some(big.as_str()), None, None, Some("c")]))),
            ("small", Arc::new(Int8Array::from(vec![Some(-3), None, Some(7), Some(1), None]))),
            ("ns", Arc::new(Int64Array::from(vec![Some(i64::MAX - 1), Some(5), Some(i64::MIN), None, Some(0)]))),
            ("t", Arc::new(ts)),
            ("share", Arc::new(Float64Array::from(vec![0.5, -1.25, f64::NAN, 3.0, 1.0]))),
            ("fine", Arc::new(Float64Array::from(vec![0.5, -1.25, 2.0, 3.0, 1.0]))),
            ("flag", Arc::new(BooleanArray::from(vec![true, false, true, true, false]))),
            ("late", Arc::new(Int16Array::from(vec![None, None, None, Some(4), Some(2)]))),
            ("empty", new_null_array(&DataType::Int32, 5)),
            ("list", Arc::new(lists)),
        ]);
        for rows in [1, 2, 5] {
            let props = WriterProperties::builder()
                .set_statistics_enabled(EnabledStatistics::Page)
                .set_max_row_group_row_count(Some(rows))
                .build();
            let mut buf = Vec::new();
            let mut w = ArrowWriter::try_new(&mut buf, b.schema(), Some(props)).unwrap();
            w.write(&b).unwrap();
            let md = w.close().unwrap();
            let file: Value = serde_json::from_str(&of_file(&b, &md)).unwrap();
            assert_eq!(file, stats(&b), "row groups of {rows} rows");
        }
        let s = stats(&b);
        assert_eq!(s["minValues"]["node"], "b");
        assert_eq!(s["maxValues"].get("node"), None, "the long value is the maximum");
        assert_eq!(s["minValues"]["late"], 2);
    }
}
