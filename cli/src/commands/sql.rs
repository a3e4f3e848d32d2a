// SPDX-License-Identifier: Apache-2.0
//! `ingero sql`: read-only SQL over the dataset.

use clap::Args;

use super::{CmdResult, Failure, SourceArgs, status_failure};

#[derive(Debug, Args)]
pub(crate) struct SqlArgs {
    /// The query (SELECT/WITH/EXPLAIN/SHOW/DESCRIBE). Tables: call_windows,
    /// sched_windows, cgroup_windows, io_windows, host_events, stall_events,
    /// process_meta, node_windows, progress_windows (columns in proto/README.md).
    pub query: String,
    #[command(flatten)]
    pub source: SourceArgs,
    /// Output format.
    #[arg(long, default_value = "table", value_parser = ["table", "json", "csv"])]
    pub format: String,
}

pub(crate) async fn run(a: SqlArgs) -> CmdResult {
    let batches = batches(&a.source, &a.query).await?;
    match a.format.as_str() {
        "json" => println!("{}", String::from_utf8_lossy(&json_rows(&batches)?)),
        "csv" => {
            let mut w = arrow::csv::Writer::new(std::io::stdout());
            for b in &batches {
                w.write(&flat_for_csv(b)?)?;
            }
        }
        _ if batches.iter().all(|b| b.num_rows() == 0) => {
            // The columns, then what is missing (an empty table drew `++`).
            let cols: Vec<String> =
                batches.first().map_or(Vec::new(), |b| b.schema().fields().iter().map(|f| f.name().clone()).collect());
            if !cols.is_empty() {
                println!("{}", cols.join(" | "));
            }
            println!("(no rows)");
        }
        _ => println!("{}", arrow::util::pretty::pretty_format_batches(&batches)?),
    }
    Ok(())
}

/// `b` with its nested columns (lists such as `hist_bucket`, structs) as
/// text, `[1, 2, 3]` as the table shows them: CSV has no nested values,
/// and the writer would fail after the header.
fn flat_for_csv(b: &arrow::array::RecordBatch) -> Result<arrow::array::RecordBatch, arrow::error::ArrowError> {
    use arrow::array::{Array, ArrayRef, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    if !b.schema().fields().iter().any(|f| f.data_type().is_nested()) {
        return Ok(b.clone());
    }
    let mut fields = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    for (f, c) in b.schema().fields().iter().zip(b.columns()) {
        if !f.data_type().is_nested() {
            fields.push(f.as_ref().clone());
            cols.push(c.clone());
            continue;
        }
        let fmt = ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default())?;
        let text: StringArray = (0..c.len()).map(|i| c.is_valid(i).then(|| fmt.value(i).to_string())).collect();
        fields.push(Field::new(f.name(), DataType::Utf8, true));
        cols.push(std::sync::Arc::new(text));
    }
    arrow::array::RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), cols)
}

/// The rows as a JSON array of objects: every column in every row (null
/// as `null`, so each object has the same keys), `[]` for none.
pub(crate) fn json_rows(batches: &[arrow::array::RecordBatch]) -> Result<Vec<u8>, arrow::error::ArrowError> {
    let mut w = arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow::json::writer::JsonArray>(Vec::new());
    w.write_batches(&batches.iter().collect::<Vec<_>>())?;
    w.finish()?;
    let buf = w.into_inner();
    Ok(if buf.is_empty() { b"[]".to_vec() } else { buf })
}

/// Runs one read-only query on `--server` or on the store.
pub(crate) async fn batches(source: &SourceArgs, query: &str) -> CmdResult<Vec<arrow::array::RecordBatch>> {
    ingero_analysis::query::check_read_only(query).map_err(|e| Failure::Usage(e.to_string()))?;
    if let Some(mut c) = source.client().await? {
        let resp = c
            .sql(ingero_proto::pb::SqlRequest { query: query.to_string() })
            .await
            .map_err(status_failure)?
            .into_inner();
        if resp.arrow_ipc.is_empty() {
            return Ok(vec![]);
        }
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(resp.arrow_ipc.to_vec()), None)?;
        return Ok(reader.collect::<Result<Vec<_>, _>>()?);
    }
    source.engine().await?.sql(query).await.map_err(Failure::lib)
}
