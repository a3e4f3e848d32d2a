// SPDX-License-Identifier: Apache-2.0
//! Arrow IPC stream encoding (zstd buffer compression) and the validation the
//! aggregator applies to every incoming table.

use std::io::Cursor;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};

use ingero_model::schema::Table;
use ingero_model::{Error, Result};

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
    // arrow-ipc panics on some malformed input (e.g. a schema field of type
    // NONE, found by the fuzzer): a bad batch must be an error, not a panic.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_unchecked(table, bytes, max_rows)))
        .unwrap_or_else(|_| Err(Error::Invalid(format!("{table}: malformed Arrow IPC stream (decoder panicked)"))))
}

/// Largest decompressed buffer one column of one batch may claim.
const MAX_BUFFER_BYTES: i64 = 1 << 30;

/// Walks the stream's message headers before arrow decodes anything: a batch
/// that claims more rows than allowed, or a compressed buffer that claims to
/// inflate beyond [`MAX_BUFFER_BYTES`], would otherwise make the decoder
/// allocate that much up front (and abort the process).
fn precheck(table: Table, bytes: &[u8], max_rows: usize) -> Result<()> {
    let bad = |m: String| Err(Error::Invalid(format!("{table}: {m}")));
    let mut pos = 0usize;
    let mut rows = 0i64;
    let read_i32 = |p: usize| bytes.get(p..p + 4).map(|b| i32::from_le_bytes(b.try_into().unwrap_or_default()));
    while pos < bytes.len() {
        let Some(mut len) = read_i32(pos) else {
            return bad("not an Arrow IPC stream: truncated message header".into());
        };
        pos += 4;
        if len == -1 {
            // Continuation marker, then the real length.
            let Some(l) = read_i32(pos) else { return bad("not an Arrow IPC stream: truncated message header".into()) };
            len = l;
            pos += 4;
        }
        if len == 0 {
            return Ok(()); // end of stream
        }
        let Some(meta) = usize::try_from(len).ok().and_then(|l| bytes.get(pos..pos.checked_add(l)?)) else {
            return bad(format!("not an Arrow IPC stream: message length {len} runs past the end"));
        };
        pos += meta.len();
        let msg =
            arrow::ipc::root_as_message(meta).map_err(|e| Error::Invalid(format!("{table}: bad IPC message: {e}")))?;
        let body_len = msg.bodyLength();
        let Some(body) = usize::try_from(body_len).ok().and_then(|l| bytes.get(pos..pos.checked_add(l)?)) else {
            return bad(format!("IPC body length {body_len} runs past the end"));
        };
        pos += body.len();
        let batch = msg.header_as_record_batch().or_else(|| msg.header_as_dictionary_batch().and_then(|d| d.data()));
        let Some(batch) = batch else { continue };
        rows = rows.saturating_add(batch.length().max(0));
        if batch.length() < 0 || rows > i64::try_from(max_rows).unwrap_or(i64::MAX) {
            return Err(Error::TooLarge(format!("{table}: more than {max_rows} rows in one batch")));
        }
        if batch.compression().is_some() {
            for b in batch.buffers().iter().flatten() {
                let (off, n) = (b.offset(), b.length());
                if n < 8 {
                    continue;
                }
                let claimed = usize::try_from(off)
                    .ok()
                    .and_then(|o| body.get(o..o + 8))
                    .map(|p| i64::from_le_bytes(p.try_into().unwrap_or_default()));
                match claimed {
                    None => return bad("IPC buffer outside its message body".into()),
                    Some(c) if c > MAX_BUFFER_BYTES => {
                        return bad(format!("a compressed buffer claims {c} bytes (limit {MAX_BUFFER_BYTES})"));
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

fn decode_unchecked(table: Table, bytes: &[u8], max_rows: usize) -> Result<Vec<RecordBatch>> {
    precheck(table, bytes, max_rows)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use ingero_model::rows::{BatchBuilder, CallRow, Common};

    #[test]
    fn built_batches_round_trip_and_limits_and_tables_are_checked() {
        // Any valid common columns: this checks the codec, not the values.
        let common = Common { node: "n1".into(), ..Default::default() };
        let row = CallRow {
            library: "cudart",
            op: "cudaLaunchKernel",
            count: 10,
            errors: 0,
            total_ns: 100,
            max_ns: 20,
            sampled: false,
            hist_bucket: &[10, 11],
            hist_count: &[4, 6],
            sample_ratio: None,
        };
        let mut b = BatchBuilder::new(Table::CallWindows);
        b.append(&common, &row).unwrap();
        b.append(&common, &row).unwrap();
        let batch = b.finish().unwrap();
        let bytes = encode(&Table::CallWindows.schema(), std::slice::from_ref(&batch)).unwrap();
        assert_eq!(decode(Table::CallWindows, &bytes, 10).unwrap(), vec![batch]);
        assert!(matches!(decode(Table::CallWindows, &bytes, 1), Err(Error::TooLarge(_))));
        let err = decode(Table::SchedWindows, &bytes, 10).unwrap_err().to_string();
        assert!(err.contains("sched_windows: column 12 must be `threads`, got `library`"), "{err}");
    }
}
