//! `ingero stragglers`: the ranking, live from a server or from history.

use clap::{Args, ValueEnum};

use super::{CmdResult, Failure, Since, SourceArgs, status_failure};
use ingero_aggregator::rank::Ranking;
use ingero_aggregator::rank::history::{self, HistoryRequest};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub(crate) struct StragglersArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Rank over this much history (10m, 1h) or from an RFC 3339 time. With
    /// --server and no --since: the live ranking.
    #[arg(long, env = "INGERO_SINCE", value_parser = Since::parse)]
    pub since: Option<Since>,
    /// Only this job.
    #[arg(long, env = "INGERO_JOB")]
    pub job: Option<String>,
    #[arg(long, value_enum, default_value = "table", env = "INGERO_FORMAT")]
    pub format: Format,
    #[command(flatten)]
    pub rank: crate::cli::RankArgs,
}

pub(crate) async fn run(a: StragglersArgs) -> CmdResult {
    let ranking: serde_json::Value = if let Some(mut c) = a.source.client().await? {
        let (since_secs, start_us) = a.since.map_or((0, 0), |s| s.wire());
        let req = ingero_proto::pb::StragglersRequest { job: a.job.clone().unwrap_or_default(), since_secs, start_us };
        let json = c.stragglers(req).await.map_err(status_failure)?.into_inner().json;
        serde_json::from_str(&json)?
    } else {
        let engine = a.source.engine().await?;
        let start_us = a.since.unwrap_or(Since::Ago(std::time::Duration::from_secs(3600))).start_us();
        let req = HistoryRequest {
            start_us,
            end_us: chrono::Utc::now().timestamp_micros() + 1,
            job: a.job.clone(),
            resolution: None,
        };
        let r: Ranking = history::rank(&engine, &req, a.rank.detector()).await.map_err(Failure::lib)?;
        serde_json::to_value(r)?
    };
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&ranking)?),
        Format::Table => print!("{}", table(&ranking)),
    }
    Ok(())
}

/// An 80-column table: most deviant first.
pub(crate) fn table(r: &serde_json::Value) -> String {
    let mut o = format!("{:<16} {:<14} {:>6} {:<4} {:<8} {}\n", "NODE", "JOB", "SCORE", "FLAG", "SINCE", "TOP SIGNAL");
    let empty = vec![];
    let list = r["stragglers"].as_array().unwrap_or(&empty);
    if list.is_empty() {
        o.push_str("no node deviates from its job\n");
    }
    let cut = |s: &str, n: usize| {
        if s.chars().count() > n { format!("{}…", s.chars().take(n - 1).collect::<String>()) } else { s.to_string() }
    };
    for s in list {
        let since = s["since"].as_str().map(|t| t.get(11..19).unwrap_or(t).to_string()).unwrap_or_else(|| "-".into());
        let top = s["signals"][0]["text"].as_str().unwrap_or("-");
        o.push_str(&format!(
            "{:<16} {:<14} {:>6.1} {:<4} {:<8} {}\n",
            cut(s["node"].as_str().unwrap_or(""), 16),
            cut(s["job"].as_str().unwrap_or(""), 14),
            s["score"].as_f64().unwrap_or(0.0),
            if s["flagged"] == true { "YES" } else { "no" },
            since,
            cut(top, 80 - 53)
        ));
    }
    o
}
