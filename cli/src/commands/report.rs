// SPDX-License-Identifier: Apache-2.0
//! `ingero report`: cause → effect → fix for a pod, node or process.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{CmdResult, Failure, Since, SourceArgs, status_failure};
use ingero_analysis::report::{self, Report, Target, html, text};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    /// For a terminal (80 columns): chains, steps, the table of calls, call sites.
    Text,
    /// Every field: chains, ops (with kind and, when estimated, seen_share), call sites.
    Json,
    /// A self-contained page (no scripts, no network) with plots over time.
    Html,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pod", "node", "pid"])))]
pub(crate) struct ReportArgs {
    /// The pod, as NAMESPACE/NAME.
    #[arg(long, env = "INGERO_REPORT_POD")]
    pub pod: Option<String>,
    /// A node (bare metal, imported traces, or the whole node).
    #[arg(long, env = "INGERO_REPORT_NODE")]
    pub node: Option<String>,
    /// A process id (NODE:PID when several nodes are in the store).
    #[arg(long, env = "INGERO_REPORT_PID")]
    pub pid: Option<String>,
    /// How far back (10m, 1h) or from an RFC 3339 time.
    #[arg(long, default_value = "10m", env = "INGERO_SINCE", value_parser = Since::parse)]
    pub since: Since,
    /// What to write.
    #[arg(long, value_enum, default_value = "text", env = "INGERO_FORMAT")]
    pub format: Format,
    /// Write to this file instead of standard output.
    #[arg(long, env = "INGERO_REPORT_OUT")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub rank: crate::cli::RankArgs,
}

pub(crate) async fn run(a: ReportArgs) -> CmdResult {
    let (kind, t) = match (&a.pod, &a.node, &a.pid) {
        (Some(p), _, _) => ("pod", p.as_str()),
        (_, Some(n), _) => ("node", n.as_str()),
        (_, _, Some(p)) => ("pid", p.as_str()),
        _ => return Err(Failure::Usage("one of --pod, --node or --pid is required".into())),
    };
    Target::parse(kind, t).map_err(Failure::Usage)?;
    if let Some(out) = &a.out
        && out.is_dir()
    {
        return Err(Failure::Usage(format!("--out {} is a directory; give a file name", out.display())));
    }
    let rep = fetch(&a.source, kind, t, a.since, a.rank.detector()).await?;
    let body = render(&rep, a.format)?;
    match &a.out {
        Some(path) => {
            std::fs::write(path, body).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        None => print!("{body}"),
    }
    Ok(())
}

/// The report of one target (`kind` is pod, node or pid), from `--server` or the store.
pub(crate) async fn fetch(
    source: &SourceArgs,
    kind: &str,
    target: &str,
    since: Since,
    cfg: ingero_server::rank::detector::DetectorConfig,
) -> CmdResult<Report> {
    let parsed = Target::parse(kind, target).map_err(Failure::Usage)?;
    if let Some(mut c) = source.client().await? {
        let (since_secs, start_us) = since.wire();
        let req =
            ingero_proto::pb::ReportRequest { target: target.to_string(), kind: kind.into(), since_secs, start_us };
        return Ok(serde_json::from_str(&c.report(req).await.map_err(status_failure)?.into_inner().json)?);
    }
    let engine = source.engine().await?;
    let end = chrono::Utc::now().timestamp_micros() + 1;
    report::build(&engine, &parsed, since.start_us(), end, cfg).await.map_err(Failure::lib)
}

pub(crate) fn render(rep: &Report, f: Format) -> CmdResult<String> {
    Ok(match f {
        Format::Text => text::render(rep),
        Format::Json => serde_json::to_string_pretty(rep)? + "\n",
        Format::Html => html::render(rep),
    })
}
