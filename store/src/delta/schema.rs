// SPDX-License-Identifier: Apache-2.0
//! Our Arrow schemas as Delta Lake schemas, and the storage form of a batch.
//!
//! Delta has no unsigned integers, and engines that honour the table schema
//! (delta-rs, Polars, Spark) refuse a Parquet `UINT_64` column under a
//! `long` field. Files in the store therefore hold the next wider signed
//! type (u8 → short, u16 → integer, u32 → long), so every engine reads the
//! same values we wrote; u64 stays `long` (every u64 we write is below the
//! signed maximum: counts, nanoseconds, 63-bit stack ids). Readers here turn
//! the columns back into the unsigned types the rest of the system uses.
//!
//! Stores written before 0.x held the signed type of the *same* width
//! (u8 as `byte`): a histogram bucket ≥ 128 (a call ≥ ~8.6 s) read back as
//! negative. Such files are still read bit for bit ([`to_logical`] and the
//! query engine's adapter reinterpret a same-width column instead of casting
//! it), and the table's schema is moved to the wide types at the next commit.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, ListArray, RecordBatch, RecordBatchOptions, make_array, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef, TimeUnit};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// Hive partition columns of every table (`date=YYYY-MM-DD/hour=HH`).
pub const PARTITION_COLUMNS: [&str; 2] = ["date", "hour"];

/// Their Delta types in tables created now (`hour=07` is the integer 7), so
/// engines compare them as dates and numbers. Tables created before keep
/// `string` ([`super::evolve::merge`]): the values in the log are the same
/// text either way.
pub const PARTITION_TYPES: [&str; 2] = ["date", "integer"];

/// The Delta type of an Arrow type, through its storage type.
fn delta_type(dt: &DataType) -> Result<Value> {
    Ok(match storage_type(dt) {
        DataType::Utf8 | DataType::LargeUtf8 => json!("string"),
        DataType::Dictionary(_, v) if matches!(v.as_ref(), DataType::Utf8) => json!("string"),
        DataType::Boolean => json!("boolean"),
        DataType::Int8 => json!("byte"),
        DataType::Int16 => json!("short"),
        DataType::Int32 => json!("integer"),
        DataType::Int64 => json!("long"),
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
    for (p, ty) in PARTITION_COLUMNS.iter().zip(PARTITION_TYPES) {
        fields.push(json!({"name": p, "type": ty, "nullable": true, "metadata": {}}));
    }
    Ok(json!({"type": "struct", "fields": fields}).to_string())
}

/// The signed type that holds every value of an unsigned one (lists
/// included); u64 keeps its width (values below 2^63, see the module doc).
pub fn storage_type(dt: &DataType) -> DataType {
    match dt {
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 | DataType::UInt64 => DataType::Int64,
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

/// Converts an integer array (or a list of them) to `to`: the bits kept
/// where the widths are equal (u64 ↔ i64, and the narrow files of old
/// stores), the value kept where they differ (an error, never a wrapped
/// value, if it does not fit).
pub fn convert_array(a: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if a.data_type() == to {
        return Ok(a.clone());
    }
    if let (DataType::List(_), DataType::List(f)) = (a.data_type(), to) {
        let l = a.as_list::<i32>();
        let values = convert_array(l.values(), f.data_type())?;
        return Ok(Arc::new(ListArray::try_new(f.clone(), l.offsets().clone(), values, l.nulls().cloned())?));
    }
    if !a.data_type().is_integer() || !to.is_integer() {
        return Err(Error::State(format!("cannot convert a {} column to {to}", a.data_type())));
    }
    if a.data_type().primitive_width() == to.primitive_width() {
        let data = a.to_data().into_builder().data_type(to.clone()).build()?;
        return Ok(make_array(data));
    }
    let strict = CastOptions { safe: false, ..Default::default() };
    Ok(cast_with_options(a, to, &strict)?)
}

fn convert(batch: &RecordBatch, schema: SchemaRef) -> Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| convert_array(c, f.data_type()))
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// A batch as it is written to a file.
pub fn to_storage(batch: &RecordBatch) -> Result<RecordBatch> {
    convert(batch, storage_schema(&batch.schema()))
}

/// A batch read from a file, back in the table's own types. Columns are
/// matched by name: a column the file lacks (written before it was added)
/// reads as null, a column the table does not know (added by another engine
/// or a newer ingero) is left out.
pub fn to_logical(batch: &RecordBatch, logical: &SchemaRef) -> Result<RecordBatch> {
    let file = batch.schema();
    let columns = logical
        .fields()
        .iter()
        .map(|f| match file.index_of(f.name()) {
            Ok(i) => convert_array(batch.column(i), f.data_type()),
            Err(_) if f.is_nullable() => Ok(new_null_array(f.data_type(), batch.num_rows())),
            Err(_) => Err(Error::State(format!("a file lacks column `{}`, which is required", f.name()))),
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(logical.clone(), columns, &rows)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int8Builder, Int32Array, ListBuilder, StringArray, UInt8Builder, UInt32Array, UInt64Array};

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
        assert_eq!(s.schema().field(1).data_type(), &DataType::Int64);
        assert_eq!(s.schema().field(3).data_type(), &DataType::new_list(DataType::Int16, false));
        // Outside engines read the stored values as they are: 200 stays 200.
        let stored = s.column(3).as_list::<i32>().value(0);
        assert_eq!(stored.as_primitive::<arrow::datatypes::Int16Type>().values(), &[1, 200]);
        let back = to_logical(&s, &schema).unwrap();
        assert_eq!(back, b);
        let delta: Value = serde_json::from_str(&schema_string(&schema).unwrap()).unwrap();
        assert_eq!(delta["fields"][1]["type"], "long");
        assert_eq!(delta["fields"][3]["type"]["elementType"], "short");
        assert_eq!(delta["fields"][4]["name"], "date");
        assert_eq!((&delta["fields"][4]["type"], &delta["fields"][5]["type"]), (&json!("date"), &json!("integer")));
    }

    #[test]
    fn files_of_old_stores_read_bit_for_bit() {
        // Before the wide types a u8 bucket was stored as i8: 200 as -56.
        let mut lb = ListBuilder::new(Int8Builder::new()).with_field(Field::new("item", DataType::Int8, false));
        lb.append_value([Some(1i8), Some(-56), Some(-128)]);
        let old = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int32, false),
            Field::new("buckets", DataType::new_list(DataType::Int8, false), false),
        ]));
        let b = RecordBatch::try_new(old, vec![Arc::new(Int32Array::from(vec![-294_967_296])), Arc::new(lb.finish())])
            .unwrap();
        let logical = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::UInt32, false),
            Field::new("buckets", DataType::new_list(DataType::UInt8, false), false),
        ]));
        let back = to_logical(&b, &logical).unwrap();
        assert_eq!(back.column(0).as_primitive::<arrow::datatypes::UInt32Type>().value(0), 4_000_000_000);
        let l = back.column(1).as_list::<i32>().value(0);
        assert_eq!(l.as_primitive::<arrow::datatypes::UInt8Type>().values(), &[1, 200, 128]);
    }

    #[test]
    fn columns_are_matched_by_name_missing_ones_read_as_null() {
        let file = Arc::new(Schema::new(vec![
            Field::new("extra", DataType::Utf8, true),
            Field::new("pid", DataType::Int64, false),
        ]));
        let b = RecordBatch::try_new(
            file,
            vec![Arc::new(StringArray::from(vec!["x", "y"])), Arc::new(arrow::array::Int64Array::from(vec![1, 2]))],
        )
        .unwrap();
        let logical = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::UInt32, false),
            Field::new("gpu", DataType::UInt64, true),
        ]));
        let back = to_logical(&b, &logical).unwrap();
        assert_eq!(back.column(0).as_primitive::<arrow::datatypes::UInt32Type>().values(), &[1, 2]);
        assert_eq!(back.column(1).null_count(), 2, "rows written before the column existed");
        let required = Arc::new(Schema::new(vec![Field::new("gpu", DataType::UInt64, false)]));
        assert!(to_logical(&b, &required).unwrap_err().to_string().contains("lacks column `gpu`"));
    }

    #[test]
    fn a_value_that_does_not_fit_is_an_error_not_a_wrapped_number() {
        let a: ArrayRef = Arc::new(arrow::array::Int16Array::from(vec![300]));
        assert!(convert_array(&a, &DataType::UInt8).is_err());
        let a: ArrayRef = Arc::new(arrow::array::Int16Array::from(vec![251]));
        assert_eq!(
            convert_array(&a, &DataType::UInt8).unwrap().as_primitive::<arrow::datatypes::UInt8Type>().value(0),
            251
        );
    }
}
