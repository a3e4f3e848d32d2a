// SPDX-License-Identifier: Apache-2.0
//! A checkpoint's `add` rows read column by column. An aged table's
//! checkpoint is almost all `add`s (one per live file: tens of thousands);
//! turning each into JSON and parsing it back was most of opening a store.
//! The other rows (protocol, metadata, txns, removes: few) keep the JSON path,
//! which knows every field of them.

use arrow::array::{Array, AsArray, BooleanArray, MapArray, RecordBatch, StringArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::Int64Type;

use super::action::Add;

/// The batch's `add`s, and its other rows; `None` when the `add` column is
/// not shaped as this store writes it (another engine's checkpoint with
/// other types): the caller reads the whole batch as JSON then.
pub(super) fn split(batch: &RecordBatch, with_stats: bool) -> Option<(Vec<Add>, RecordBatch)> {
    let Some(col) = batch.column_by_name("add") else { return Some((Vec::new(), batch.clone())) };
    let add = col.as_struct_opt()?;
    let path = add.column_by_name("path")?.as_string_opt::<i32>()?;
    let size = add.column_by_name("size")?.as_primitive_opt::<Int64Type>()?;
    let mtime = add.column_by_name("modificationTime")?.as_primitive_opt::<Int64Type>()?;
    let change = add.column_by_name("dataChange")?.as_boolean_opt()?;
    let parts = add.column_by_name("partitionValues")?.as_map_opt()?;
    let stats = match add.column_by_name("stats") {
        Some(s) if with_stats => Some(s.as_string_opt::<i32>()?),
        _ => None,
    };
    let (keys, values) = (parts.keys().as_string_opt::<i32>()?, parts.values().as_string_opt::<i32>()?);
    let is_add = |i: usize| add.is_valid(i) && path.is_valid(i);
    let mut adds = Vec::new();
    for i in (0..batch.num_rows()).filter(|&i| is_add(i)) {
        adds.push(Add {
            path: path.value(i).to_string(),
            partition_values: partition_values(parts, keys, values, i),
            size: if size.is_valid(i) { size.value(i) } else { 0 },
            modification_time: if mtime.is_valid(i) { mtime.value(i) } else { 0 },
            data_change: change.is_valid(i) && change.value(i),
            stats: stats.filter(|s| s.is_valid(i)).map(|s| s.value(i).to_string()),
        });
    }
    let others = BooleanArray::from_iter((0..batch.num_rows()).map(|i| Some(!is_add(i))));
    let rest = filter_record_batch(batch, &others).ok()?;
    Some((adds, rest))
}

/// Row `i`'s partition values.
fn partition_values(
    parts: &MapArray,
    keys: &StringArray,
    values: &StringArray,
    i: usize,
) -> std::collections::BTreeMap<String, Option<String>> {
    if !parts.is_valid(i) {
        return Default::default();
    }
    let offsets = parts.value_offsets();
    let (lo, hi) = (offsets[i] as usize, offsets[i + 1] as usize);
    (lo..hi).map(|j| (keys.value(j).to_string(), values.is_valid(j).then(|| values.value(j).to_string()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::action::{self, Action, Txn};

    /// Adds read column-wise equal what the JSON path reads, other rows are
    /// left for it, and statistics are read only when asked for.
    #[test]
    fn adds_read_by_column_match_the_json_path() {
        let mut a = crate::delta::table::add("date=2026-11-28/hour=01/a.parquet", 10, r#"{"numRecords":3}"#.into());
        a.modification_time = 77;
        let mut b = crate::delta::table::add("date=2026-11-28/hour=02/b.parquet", 20, r#"{"numRecords":4}"#.into());
        b.partition_values.insert("hour".into(), None);
        b.data_change = false;
        let txn = Action::Txn(Txn { app_id: "node:a".into(), version: 9, last_updated: Some(5) });
        let body = action::encode(&[Action::Add(a.clone()), txn, Action::Add(b.clone())]);
        let batch = super::super::checkpoint::decode_for_test(&body);
        let (adds, rest) = split(&batch, true).unwrap();
        let got: Vec<String> = adds.iter().map(|x| serde_json::to_string(x).unwrap()).collect();
        let want: Vec<String> = [a, b].iter().map(|x| serde_json::to_string(x).unwrap()).collect();
        assert_eq!(got, want);
        assert_eq!(rest.num_rows(), 1, "the txn stays for the JSON path");
        let (lean, _) = split(&batch, false).unwrap();
        assert!(lean.iter().all(|x| x.stats.is_none()) && lean.len() == 2);
    }
}
