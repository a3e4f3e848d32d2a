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
    ingero_aggregator::query::check_read_only(&a.query).map_err(|e| Failure::Usage(e.to_string()))?;
    let batches = if let Some(mut c) = a.source.client().await? {
        let resp =
            c.sql(ingero_proto::pb::SqlRequest { query: a.query.clone() }).await.map_err(status_failure)?.into_inner();
        if resp.arrow_ipc.is_empty() {
            vec![]
        } else {
            arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(resp.arrow_ipc.to_vec()), None)?
                .collect::<Result<Vec<_>, _>>()?
        }
    } else {
        a.source.engine().await?.sql(&a.query).await.map_err(Failure::lib)?
    };
    match a.format.as_str() {
        "json" => {
            let mut w = arrow::json::ArrayWriter::new(std::io::stdout());
            w.write_batches(&batches.iter().collect::<Vec<_>>())?;
            w.finish()?;
            println!();
        }
        "csv" => {
            let mut w = arrow::csv::Writer::new(std::io::stdout());
            for b in &batches {
                w.write(b)?;
            }
        }
        _ => println!("{}", arrow::util::pretty::pretty_format_batches(&batches)?),
    }
    Ok(())
}
