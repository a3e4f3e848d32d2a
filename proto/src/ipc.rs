//! Arrow IPC stream encoding (zstd buffer compression) and the validation the
//! aggregator applies to every incoming table.

use std::io::Cursor;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow::ipc::CompressionType;

use crate::schema::Table;
use crate::{Error, Result};

/// Encodes batches of one schema as an IPC stream with zstd buffer compression.
pub fn encode(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let opts = IpcWriteOptions::default().try_with_compression(Some(CompressionType::ZSTD)).map_err(Error::Arrow)?;
    let mut w = StreamWriter::try_new_with_options(Vec::new(), schema, opts)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()?;
    Ok(w.into_inner()?)
}

/// Decodes an IPC stream and checks it against the table's schema.
///
/// `max_rows` bounds the decoded size so a small compressed message cannot
/// expand into unbounded memory.
pub fn decode(table: Table, bytes: &[u8], max_rows: usize) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)
        .map_err(|e| Error::Invalid(format!("{table}: not an Arrow IPC stream: {e}")))?;
    check_schema(table, &reader.schema())?;
    let mut out = Vec::new();
    let mut rows = 0usize;
    for b in reader {
        let b = b.map_err(|e| Error::Invalid(format!("{table}: corrupt IPC record batch: {e}")))?;
        rows += b.num_rows();
        if rows > max_rows {
            return Err(Error::TooLarge(format!("{table}: more than {max_rows} rows in one batch")));
        }
        check_nulls(table, &b)?;
        if b.num_rows() > 0 {
            // Re-stamp with the canonical schema so metadata differences from
            // senders never reach the store.
            out.push(RecordBatch::try_new(table.schema(), b.columns().to_vec())?);
        }
    }
    Ok(out)
}

/// Exact field-by-field comparison with a message naming the first mismatch.
pub fn check_schema(table: Table, got: &Schema) -> Result<()> {
    let want = table.schema();
    if got.fields().len() != want.fields().len() {
        let names: Vec<_> = got.fields().iter().map(|f| f.name().as_str()).collect();
        return Err(Error::Invalid(format!(
            "{table}: expected {} columns, got {} ({})",
            want.fields().len(),
            got.fields().len(),
            names.join(", ")
        )));
    }
    for (i, (w, g)) in want.fields().iter().zip(got.fields()).enumerate() {
        if w.name() != g.name() {
            return Err(Error::Invalid(format!("{table}: column {i} must be `{}`, got `{}`", w.name(), g.name())));
        }
        if w.data_type() != g.data_type() {
            return Err(Error::Invalid(format!(
                "{table}: column `{}` must be {}, got {}",
                w.name(),
                w.data_type(),
                g.data_type()
            )));
        }
    }
    Ok(())
}

/// A sender may mark a column nullable, but a required column must hold no nulls.
fn check_nulls(table: Table, b: &RecordBatch) -> Result<()> {
    for (f, c) in table.schema().fields().iter().zip(b.columns()) {
        if !f.is_nullable() && c.null_count() > 0 {
            return Err(Error::Invalid(format!(
                "{table}: column `{}` is required but has {} nulls",
                f.name(),
                c.null_count()
            )));
        }
    }
    Ok(())
}
