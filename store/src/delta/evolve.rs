// SPDX-License-Identifier: Apache-2.0
//! Additive schema evolution: the table's schema after this writer's columns
//! are merged into it.
//!
//! The table's own fields come first, in their order and as they are (so a
//! column another engine or a newer ingero added is kept, and our rows read
//! as null there); then each of our columns the table lacks, nullable (rows
//! already written read as null). A column we store wider than the table
//! holds it (u8 once stored as `byte`, now `short`) takes our type; the
//! partition columns keep the table's type (`string` in tables created
//! before they were typed). Anything
//! else that would change a column, or a required column our files lack, is
//! refused: writing would make the table wrong for every reader.

use serde_json::Value;

use super::schema::PARTITION_COLUMNS;
use crate::error::{Error, Result};

/// The merged `schemaString`, or `None` when the table already has it.
pub fn merge(table: &str, current: &str, ours: &str) -> Result<Option<String>> {
    let parse = |s: &str, whose: &str| -> Result<Vec<Value>> {
        let v: Value = serde_json::from_str(s).map_err(|e| refuse(table, format!("{whose} schema: {e}")))?;
        v["fields"].as_array().cloned().ok_or_else(|| refuse(table, format!("{whose} schema has no fields")))
    };
    let (theirs, mine) = (parse(current, "the table's")?, parse(ours, "our")?);
    let mut merged = Vec::with_capacity(theirs.len() + mine.len());
    for f in &theirs {
        let name = f["name"].as_str().unwrap_or_default();
        match mine.iter().find(|m| m["name"] == f["name"]) {
            Some(m) if m["type"] == f["type"] => merged.push(f.clone()),
            // Partition values are text in the log whatever the column's
            // type: a table created with `string` partitions keeps them.
            Some(_) if PARTITION_COLUMNS.contains(&name) => merged.push(f.clone()),
            Some(m) if widens(&f["type"], &m["type"]) => {
                let mut f = f.clone();
                f["type"] = m["type"].clone();
                merged.push(f);
            }
            Some(m) => {
                return Err(refuse(
                    table,
                    format!("column `{name}` is {} in the table and {} in our files", f["type"], m["type"]),
                ));
            }
            None if f["nullable"] == false => {
                return Err(refuse(table, format!("the table requires column `{name}`, which our files lack")));
            }
            None => merged.push(f.clone()),
        }
    }
    let added: Vec<Value> = mine
        .iter()
        .filter(|m| !theirs.iter().any(|f| f["name"] == m["name"]))
        .map(|m| {
            let mut m = m.clone();
            m["nullable"] = Value::Bool(true);
            m
        })
        .collect();
    let changed = merged != theirs || !added.is_empty();
    merged.extend(added);
    Ok(changed.then(|| serde_json::json!({"type": "struct", "fields": merged}).to_string()))
}

/// Whether `to` holds every value of `from`: a wider signed integer, or a
/// list of such.
fn widens(from: &Value, to: &Value) -> bool {
    const RANK: [&str; 4] = ["byte", "short", "integer", "long"];
    let rank = |v: &Value| v.as_str().and_then(|s| RANK.iter().position(|r| *r == s));
    match (rank(from), rank(to)) {
        (Some(a), Some(b)) => a < b,
        _ => {
            from["type"] == "array"
                && to["type"] == "array"
                && from["containsNull"] == to["containsNull"]
                && widens(&from["elementType"], &to["elementType"])
        }
    }
}

fn refuse(table: &str, reason: String) -> Error {
    Error::TableSchema { table: table.to_string(), reason }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field(name: &str, ty: Value, nullable: bool) -> Value {
        json!({"name": name, "type": ty, "nullable": nullable, "metadata": {}})
    }

    fn schema(fields: Vec<Value>) -> String {
        json!({"type": "struct", "fields": fields}).to_string()
    }

    fn fields(s: &str) -> Vec<Value> {
        serde_json::from_str::<Value>(s).unwrap()["fields"].as_array().unwrap().clone()
    }

    #[test]
    fn new_columns_are_appended_nullable_and_foreign_ones_kept() {
        let table = schema(vec![
            field("node", json!("string"), false),
            field("note", json!("string"), true), // added by another engine
            field("date", json!("string"), true),
        ]);
        let ours = schema(vec![
            field("node", json!("string"), false),
            field("gpu", json!("long"), false),
            field("date", json!("string"), true),
        ]);
        let merged = merge("t", &table, &ours).unwrap().expect("a new column");
        let names: Vec<String> = fields(&merged).iter().map(|f| f["name"].as_str().unwrap().to_string()).collect();
        assert_eq!(names, ["node", "note", "date", "gpu"]);
        assert_eq!(fields(&merged)[3]["nullable"], true, "old rows have no value for it");
        assert_eq!(merge("t", &merged, &ours).unwrap(), None, "merging again changes nothing");
        assert_eq!(merge("t", &ours, &ours).unwrap(), None);
    }

    #[test]
    fn string_partitions_of_older_tables_stay_strings() {
        let logical = arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
            "node",
            arrow::datatypes::DataType::Utf8,
            false,
        )]);
        let ours = crate::delta::schema::schema_string(&logical).unwrap();
        let mut old: Value = serde_json::from_str(&ours).unwrap();
        for f in old["fields"].as_array_mut().unwrap() {
            if f["name"] == "date" || f["name"] == "hour" {
                assert_ne!(f["type"], "string", "typed in new tables");
                f["type"] = json!("string");
            }
        }
        let old = old.to_string();
        assert_eq!(merge("t", &old, &ours).unwrap(), None);
    }

    /// A table written by an older ingero gains a column with the first
    /// commit of a newer one; the old rows read back as null in it.
    #[tokio::test]
    async fn an_old_table_gains_a_column_and_old_rows_read_as_null() {
        use std::sync::Arc;

        use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, UInt64Array};
        use arrow::datatypes::{DataType, Field, Schema, UInt64Type};

        use crate::delta::{TableLog, maintain, schema, stats, table};

        let (_dir, store) = crate::fixtures::temp_store();
        let old = Arc::new(Schema::new(vec![Field::new("node", DataType::Utf8, false)]));
        let new = Arc::new(Schema::new(vec![
            Field::new("node", DataType::Utf8, false),
            Field::new("gpu_ns", DataType::UInt64, true),
        ]));
        let mut paths = Vec::new();
        for (i, (logical, cols)) in [
            (old.clone(), vec![Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef]),
            (new.clone(), vec![Arc::new(StringArray::from(vec!["c"])), Arc::new(UInt64Array::from(vec![7]))]),
        ]
        .into_iter()
        .enumerate()
        {
            let b = schema::to_storage(&RecordBatch::try_new(logical.clone(), cols).unwrap()).unwrap();
            let mut bytes = Vec::new();
            let mut w = ::parquet::arrow::ArrowWriter::try_new(&mut bytes, b.schema(), None).unwrap();
            w.write(&b).unwrap();
            w.close().unwrap();
            let rel = format!("date=2026-11-27/hour=1/f{i}.parquet");
            store.put_durable(&format!("t/{rel}"), bytes.clone().into()).await.unwrap();
            let mut log = TableLog::open(&store, "t", &logical).await.unwrap();
            let add = table::add(&rel, bytes.len(), stats::of(&b));
            log.commit(&store, vec![add], vec![], None, json!({})).await.unwrap().unwrap();
            paths.push(rel);
        }
        let snap = crate::delta::log::current(&store, "t").await.unwrap();
        let table_fields = fields(&snap.metadata.as_ref().unwrap().schema_string);
        let gpu = table_fields.iter().find(|f| f["name"] == "gpu_ns").expect("the table gained gpu_ns");
        assert_eq!(gpu["nullable"], true);
        let back = maintain::read_all(&store, "t", &paths, &new).await.unwrap();
        assert_eq!(back.num_rows(), 3);
        let gpu = back.column(1).as_primitive::<UInt64Type>();
        assert_eq!((gpu.null_count(), gpu.value(2)), (2, 7), "old rows null, the new one its value");
    }

    #[test]
    fn narrow_integers_widen_and_other_changes_are_refused() {
        let list = |e: &str| json!({"type": "array", "elementType": e, "containsNull": false});
        let old = schema(vec![field("bucket", list("byte"), false), field("pid", json!("integer"), false)]);
        let ours = schema(vec![field("bucket", list("short"), false), field("pid", json!("long"), false)]);
        let merged = fields(&merge("t", &old, &ours).unwrap().unwrap());
        assert_eq!(merged[0]["type"]["elementType"], "short");
        assert_eq!(merged[1]["type"], "long");

        let narrower = merge("t", &ours, &old).unwrap_err().to_string();
        assert!(narrower.contains("column `bucket`") && narrower.contains("table t"), "{narrower}");
        let to_string = schema(vec![field("bucket", list("short"), false), field("pid", json!("string"), false)]);
        assert!(merge("t", &ours, &to_string).is_err());
        let required = schema(vec![field("bucket", list("short"), false), field("owner", json!("string"), false)]);
        let e = merge("t", &required, &ours).unwrap_err().to_string();
        assert!(e.contains("requires column `owner`"), "{e}");
    }
}
