// SPDX-License-Identifier: Apache-2.0
//! `ingero export --format perfetto`: several nodes side by side on one
//! timeline (ui.perfetto.dev): per node its straggler score and flagged
//! spans, per process its scheduler and call counters per window, per thread
//! its outlier CUDA/NCCL calls as slices.

mod gather;
mod layout;
mod perfetto;

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{CmdResult, Failure, Since, SourceArgs};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    /// Perfetto's protobuf trace (open in ui.perfetto.dev or trace_processor).
    Perfetto,
}

#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    #[arg(long, value_enum, default_value = "perfetto", env = "INGERO_EXPORT_FORMAT")]
    pub format: Format,
    /// From how far back (10m, 1h) or an RFC 3339 time.
    #[arg(long, default_value = "10m", env = "INGERO_SINCE", value_parser = Since::parse)]
    pub since: Since,
    /// Up to this RFC 3339 time or this long after --since (default: now).
    #[arg(long, env = "INGERO_UNTIL")]
    pub until: Option<String>,
    /// Only this job's processes (and its nodes' straggler spans).
    #[arg(long, env = "INGERO_JOB")]
    pub job: Option<String>,
    /// Only these nodes (repeat, or comma-separated).
    #[arg(long, env = "INGERO_NODES", value_delimiter = ',')]
    pub node: Vec<String>,
    /// Keep at most this many outlier calls (the longest).
    #[arg(long, default_value_t = 200_000, env = "INGERO_EXPORT_MAX_SLICES")]
    pub max_slices: usize,
    /// The trace file to write.
    #[arg(long, env = "INGERO_EXPORT_OUT")]
    pub out: PathBuf,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub rank: crate::cli::RankArgs,
}

fn until(a: &ExportArgs, start_us: i64) -> Result<i64, String> {
    let Some(u) = &a.until else { return Ok(chrono::Utc::now().timestamp_micros() + 1) };
    if let Ok(d) = humantime::parse_duration(u) {
        return Ok(start_us + d.as_micros() as i64);
    }
    chrono::DateTime::parse_from_rfc3339(u)
        .map(|t| t.timestamp_micros())
        .map_err(|_| format!("--until `{u}` is neither a duration after --since nor an RFC 3339 time"))
}

pub(crate) async fn run(a: ExportArgs) -> CmdResult {
    if a.out.is_dir() {
        return Err(Failure::Usage(format!("--out {} is a directory; give a file name", a.out.display())));
    }
    if a.max_slices == 0 {
        return Err(Failure::Usage("--max-slices must be > 0".into()));
    }
    let start_us = a.since.start_us();
    let end_us = until(&a, start_us).map_err(Failure::Usage)?;
    if end_us <= start_us {
        return Err(Failure::Usage("--until is not after --since".into()));
    }
    let scope = gather::Scope { start_us, end_us, job: a.job.clone(), nodes: a.node.clone() };
    let mut nodes = gather::Nodes::new();
    eprintln!("reading scheduler and call windows…");
    gather::windows(&a.source, &scope, &mut nodes).await?;
    eprintln!("reading outlier calls…");
    let (kept, found) = gather::stalls(&a.source, &scope, a.max_slices, &mut nodes).await?;
    let marks = gather::annotations(&a.source, &scope, &mut nodes).await?;
    if nodes.is_empty() {
        return Err(Failure::Usage(format!(
            "no data{}{} between {} and {}: check --since, --job, --node and --store/--server",
            a.job.as_ref().map(|j| format!(" for job {j}")).unwrap_or_default(),
            if a.node.is_empty() { String::new() } else { format!(" on {}", a.node.join(", ")) },
            ingero_model::time::rfc3339(start_us),
            ingero_model::time::rfc3339(end_us),
        )));
    }
    if let Some(missing) = a.node.iter().find(|n| !nodes.contains_key(*n)) {
        eprintln!("warning: no data for node {missing} in the range");
    }
    eprintln!("ranking the range…");
    // From the first window there is: history ranking bins its range (range /
    // 360 per bin), so an empty head would coarsen the spans.
    let first = nodes.values().flat_map(|p| p.values()).flat_map(|p| p.sched.first().map(|r| r[0])).min();
    let from = Since::At(first.unwrap_or(start_us).max(start_us));
    let ranking = super::stragglers::fetch(&a.source, a.job.clone(), Some(from), true, a.rank.detector()).await?;
    let trace = layout::build(&nodes, &ranking, &scope);
    let bytes = trace.builder.encode();
    std::fs::write(&a.out, &bytes).map_err(|e| anyhow::anyhow!("writing {}: {e}", a.out.display()))?;
    eprintln!(
        "wrote {} ({} KiB): {} node(s), {} process(es), {} outlier call(s){}, {} counter value(s), {} straggler span(s), \
         {marks} annotation(s); open it in https://ui.perfetto.dev",
        a.out.display(),
        bytes.len().div_ceil(1024),
        nodes.len(),
        nodes.values().map(|p| p.len()).sum::<usize>(),
        kept,
        if found > kept { format!(" (the longest of {found}: --max-slices)") } else { String::new() },
        trace.counters,
        trace.spans,
    );
    Ok(())
}
