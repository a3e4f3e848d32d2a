// SPDX-License-Identifier: Apache-2.0
//! Our Arrow schemas as Delta Lake schemas, and the storage form of a batch.
//!
//! Delta has no unsigned integers, and engines that honour the table schema
//! (delta-rs, Polars, Spark) refuse a Parquet `UINT_64` column under a
//! `long` field. Files in the store therefore hold the signed type of the
//! same width (the bits unchanged: every unsigned value we write is below
//! the signed maximum — stack ids are 63-bit hashes); readers here turn them
//! back into the unsigned columns the rest of the system works with.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, ListArray, RecordBatch, make_array};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef, TimeUnit};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// Hive partition columns of every table (`date=YYYY-MM-DD/hour=HH`).
pub const PARTITION_COLUMNS: [&str; 2] = ["date", "hour"];

/// The Delta type of an Arrow type (storage and logical map alike).
fn delta_type(dt: &DataType) -> Result<Value> {
    Ok(match dt {
        DataType::Utf8 | DataType::LargeUtf8 => json!("string"),
        DataType::Dictionary(_, v) if matches!(v.as_ref(), DataType::Utf8) => json!("string"),
        DataType::Boolean => json!("boolean"),
        DataType::Int8 | DataType::UInt8 => json!("byte"),
        DataType::Int16 | DataType::UInt16 => json!("short"),
        DataType::Int32 | DataType::UInt32 => json!("integer"),
        DataType::Int64 | DataType::UInt64 => json!("long"),
        DataType::Float64 => json!("double"),
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => json!("timestamp"),
        DataType::List(f) => json!({
            "type": "array",
            "elementType": delta_type(f.data_type())?,
            "containsNull": f.is_nullable(),
        }),
        other => return Err(Error::State(format!("no Delta Lake type for Arrow {other}"))),
    })
}

/// The Delta `schemaString` of a table: its columns, then the partition columns.
pub fn schema_string(logical: &Schema) -> Result<String> {
    let mut fields = Vec::new();
    for f in logical.fields() {
        fields.push(json!({
            "name": f.name(),
            "type": delta_type(f.data_type())?,
            "nullable": f.is_nullable(),
            "metadata": {},
        }));
    }
    for p in PARTITION_COLUMNS {
        fields.push(json!({"name": p, "type": "string", "nullable": true, "metadata": {}}));
    }
    Ok(json!({"type": "struct", "fields": fields}).to_string())
}

/// The signed type of the same width, for unsigned ones (lists included).
fn storage_type(dt: &DataType) -> DataType {
    match dt {
        DataType::UInt8 => DataType::Int8,
        DataType::UInt16 => DataType::Int16,
        DataType::UInt32 => DataType::Int32,
        DataType::UInt64 => DataType::Int64,
        DataType::List(f) => {
            DataType::List(Arc::new(Field::new(f.name(), storage_type(f.data_type()), f.is_nullable())))
        }
        other => other.clone(),
    }
}

/// The schema files are written with.
pub fn storage_schema(logical: &Schema) -> SchemaRef {
    let fields: Vec<FieldRef> = logical
        .fields()
        .iter()
        .map(|f| Arc::new(Field::new(f.name(), storage_type(f.data_type()), f.is_nullable())))
        .collect();
    Arc::new(Schema::new(fields))
}

/// Reinterprets an array as `to` (same widths, bits unchanged): no copy.
fn reinterpret(a: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if a.data_type() == to {
        return Ok(a.clone());
    }
    if let (DataType::List(_), DataType::List(f)) = (a.data_type(), to) {
        let l = a.as_list::<i32>();
        let values = reinterpret(l.values(), f.data_type())?;
        return Ok(Arc::new(ListArray::try_new(f.clone(), l.offsets().clone(), values, l.nulls().cloned())?));
    }
    let same_width =
        a.data_type().primitive_width().is_some() && a.data_type().primitive_width() == to.primitive_width();
    if !same_width || !a.data_type().is_integer() || !to.is_integer() {
        return Err(Error::State(format!("cannot store {} as {to}", a.data_type())));
    }
    let data = a.to_data().into_builder().data_type(to.clone()).build()?;
    Ok(make_array(data))
}

fn convert(batch: &RecordBatch, schema: SchemaRef) -> Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| reinterpret(c, f.data_type()))
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// A batch as it is written to a file.
pub fn to_storage(batch: &RecordBatch) -> Result<RecordBatch> {
    convert(batch, storage_schema(&batch.schema()))
}

/// A batch read from a file, back in the table's own types.
pub fn to_logical(batch: &RecordBatch, logical: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields().len() != logical.fields().len() {
        return Err(Error::State(format!(
            "a file has {} columns, the table {}",
            batch.num_columns(),
            logical.fields().len()
        )));
    }
    convert(batch, logical.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ListBuilder, StringArray, UInt8Builder, UInt32Array, UInt64Array};

    #[test]
    fn unsigned_columns_round_trip_through_storage_bit_for_bit() {
        let mut lb = ListBuilder::new(UInt8Builder::new()).with_field(Field::new("item", DataType::UInt8, false));
        lb.append_value([Some(1u8), Some(200)]);
        lb.append_value(Vec::<Option<u8>>::new());
        let schema = Arc::new(Schema::new(vec![
            Field::new("node", DataType::Utf8, false),
            Field::new("pid", DataType::UInt32, false),
            Field::new("ns", DataType::UInt64, true),
            Field::new("buckets", DataType::new_list(DataType::UInt8, false), false),
        ]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(UInt32Array::from(vec![7, 4_000_000_000])),
                Arc::new(UInt64Array::from(vec![Some(1), None])),
                Arc::new(lb.finish()),
            ],
        )
        .unwrap();
        let s = to_storage(&b).unwrap();
        assert_eq!(s.schema().field(1).data_type(), &DataType::Int32);
        assert_eq!(s.schema().field(3).data_type(), &DataType::new_list(DataType::Int8, false));
        let back = to_logical(&s, &schema).unwrap();
        assert_eq!(back, b);
        let delta: Value = serde_json::from_str(&schema_string(&schema).unwrap()).unwrap();
        assert_eq!(delta["fields"][1]["type"], "integer");
        assert_eq!(delta["fields"][3]["type"]["elementType"], "byte");
        assert_eq!(delta["fields"][4]["name"], "date");
    }
}
