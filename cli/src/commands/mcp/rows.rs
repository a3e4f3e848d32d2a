// SPDX-License-Identifier: Apache-2.0
//! Query results as JSON an assistant can read: rows as objects, capped.

use arrow::array::RecordBatch;
use serde_json::{Value, json};

/// `{"columns": [..], "rows": [{..}], "row_count": N, "truncated": bool}`;
/// at most `limit` rows, `row_count` is the full count.
pub(crate) fn to_json(batches: &[RecordBatch], limit: usize) -> Result<Value, arrow::error::ArrowError> {
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let columns: Vec<String> =
        batches.first().map(|b| b.schema().fields().iter().map(|f| f.name().clone()).collect()).unwrap_or_default();
    let mut kept = Vec::new();
    let mut left = limit;
    for b in batches {
        if left == 0 {
            break;
        }
        let n = b.num_rows().min(left);
        kept.push(b.slice(0, n));
        left -= n;
    }
    let buf = crate::commands::sql::json_rows(&kept)?;
    let rows: Value = serde_json::from_slice(&buf).map_err(|e| arrow::error::ArrowError::JsonError(e.to_string()))?;
    Ok(json!({ "columns": columns, "rows": rows, "row_count": total, "truncated": total > limit }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(from: i64, n: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("node", DataType::Utf8, true),
        ]));
        let nodes: Vec<Option<String>> = (from..from + n).map(|i| (i % 2 == 0).then(|| format!("node-{i}"))).collect();
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(from..from + n)), Arc::new(StringArray::from(nodes))],
        )
        .unwrap()
    }

    #[test]
    fn rows_are_objects_capped_across_batches() {
        let v = to_json(&[batch(0, 3), batch(3, 3)], 4).unwrap();
        assert_eq!(v["columns"], json!(["n", "node"]));
        assert_eq!(v["row_count"], 6);
        assert_eq!(v["truncated"], true);
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[3], json!({"n": 3, "node": null}), "every row has every column");
        assert_eq!(rows[2], json!({"n": 2, "node": "node-2"}));
        let all = to_json(&[batch(0, 2)], 10).unwrap();
        assert_eq!((all["truncated"].clone(), all["rows"].as_array().unwrap().len()), (json!(false), 2));
        assert_eq!(to_json(&[], 5).unwrap()["rows"], json!([]));
    }
}
