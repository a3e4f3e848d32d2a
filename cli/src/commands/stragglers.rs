// SPDX-License-Identifier: Apache-2.0
//! `ingero stragglers`: the ranking, live from a server or from history.

use clap::{Args, ValueEnum};

use super::columns::{fit, wrap};
use super::{CmdResult, Failure, Since, SourceArgs, status_failure};
use ingero_analysis::rank::history::{self, HistoryRequest};
use ingero_analysis::report::fleet;
use ingero_model::time::rfc3339;
use ingero_server::rank::Ranking;
use ingero_server::rank::detector::DetectorConfig;
use ingero_server::rank::standing::Deviation;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    /// For a terminal (80 columns): one line per deviating node, most deviant first.
    Table,
    /// Every node's standing: score, signals, step time, cost.
    Json,
    /// The fleet view: nodes × time heatmap per job, ranking, per-node detail
    /// (history: --since defaults to 1h).
    Html,
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
    /// Write to this file instead of standard output.
    #[arg(long, env = "INGERO_STRAGGLERS_OUT")]
    pub out: Option<std::path::PathBuf>,
    /// History bin width (10s, 1m): each node is judged once per bin.
    /// Default: the range / 360, at least 1 s, in whole bins of the signal
    /// tier that fits. With --store only (a server picks its own). 10s
    /// gives the bins of `analysis/sql/stragglers.sql`.
    #[arg(long, env = "INGERO_RESOLUTION", value_parser = humantime::parse_duration)]
    pub resolution: Option<std::time::Duration>,
    #[command(flatten)]
    pub rank: crate::cli::RankArgs,
}

pub(crate) async fn run(a: StragglersArgs) -> CmdResult {
    if let Some(out) = &a.out
        && out.is_dir()
    {
        return Err(Failure::Usage(format!("--out {} is a directory; give a file name", out.display())));
    }
    if a.resolution.is_some() && a.source.server.is_some() {
        return Err(Failure::Usage("--resolution ranks a store's history: give --store, not --server".into()));
    }
    if a.resolution.is_some_and(|r| r < std::time::Duration::from_secs(1)) {
        return Err(Failure::Usage("--resolution must be at least 1s (agents send 1-second windows)".into()));
    }
    let html = matches!(a.format, Format::Html);
    // The fleet view is history: without --since it covers the last hour.
    let since = a.since.or(html.then_some(Since::Ago(std::time::Duration::from_secs(3600))));
    let end_us = chrono::Utc::now().timestamp_micros() + 1;
    let ranking = fetch_at(&a.source, a.job.clone(), since, html, a.rank.detector(), a.resolution).await?;
    if let Some(job) = a.job.as_deref().filter(|_| ranking["nodes"] == 0) {
        return Err(unknown_job(&a.source, job, since).await?);
    }
    if !a.rank.gpu_price.is_empty() {
        unpriced_note(&ranking);
    }
    let body = match a.format {
        Format::Json => serde_json::to_string_pretty(&ranking)? + "\n",
        Format::Table => table(&ranking, chrono::Utc::now()),
        Format::Html => {
            let r: Ranking = serde_json::from_value(ranking)?;
            let start = since.map_or(0, |s| s.start_us());
            let from = r.timeline.as_ref().map_or(start, |t| t.start_us.max(start));
            fleet::render(&r, (&rfc3339(from), &rfc3339(end_us)), &a.source.flags())
        }
    };
    match &a.out {
        Some(path) => {
            std::fs::write(path, body).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        None => print!("{body}"),
    }
    Ok(())
}

/// Says which jobs' costs no `--gpu-price` rule priced (a job is priced
/// when a rule covers each of its nodes): a rule that matches nothing (a
/// mistyped node pool) would otherwise go unnoticed.
fn unpriced_note(ranking: &serde_json::Value) {
    let rows = ["stragglers", "episodes"].into_iter().filter_map(|k| ranking[k].as_array()).flatten();
    let jobs: std::collections::BTreeSet<&str> = rows
        .filter(|r| r["cost"].is_object() && r["cost"]["usd"].is_null())
        .filter_map(|r| r["job"].as_str())
        .collect();
    if !jobs.is_empty() {
        let jobs: Vec<&str> = jobs.into_iter().collect();
        eprintln!(
            "note: the costs of job {} are in GPU-hours only: no --gpu-price rule covers every node it ran on \
             (add node:NAME=USD, model:TEXT=USD or default=USD)",
            jobs.join(", ")
        );
    }
}

/// A `--job` no node reported in the range: a usage error naming the jobs
/// that did (a name mistyped), or saying none did (a range too short).
async fn unknown_job(source: &SourceArgs, job: &str, since: Option<Since>) -> CmdResult<Failure> {
    const SHOWN: usize = 8;
    let start = since.unwrap_or(Since::Ago(std::time::Duration::from_secs(3600))).start_us();
    let q = format!(
        "SELECT DISTINCT job FROM sched_windows WHERE window_start >= to_timestamp_micros({start}) \
         AND job IS NOT NULL AND job <> ''"
    );
    let mut jobs = std::collections::BTreeSet::new();
    for b in super::sql::batches(source, &q).await? {
        let col = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8)?;
        let col = arrow::array::AsArray::as_string::<i32>(&col);
        jobs.extend(col.iter().flatten().map(str::to_string));
    }
    let seen = match jobs.len() {
        0 => "no job has data in that range: a longer --since?".to_string(),
        n => {
            let shown: Vec<String> = jobs.into_iter().take(SHOWN).collect();
            let more = if n > SHOWN { format!(", … {n} in all") } else { String::new() };
            format!("jobs with data then: {}{more}", shown.join(", "))
        }
    };
    Ok(Failure::Usage(format!("no node of job {job:?} reported in the range ({seen})")))
}

/// The ranking as JSON: live from `--server` (history when `since` is set),
/// else over the store's history (the last hour without `since`).
pub(crate) async fn fetch(
    source: &SourceArgs,
    job: Option<String>,
    since: Option<Since>,
    timeline: bool,
    cfg: DetectorConfig,
) -> CmdResult<serde_json::Value> {
    fetch_at(source, job, since, timeline, cfg, None).await
}

/// [`fetch`] with the history's bin width (store history only).
async fn fetch_at(
    source: &SourceArgs,
    job: Option<String>,
    since: Option<Since>,
    timeline: bool,
    cfg: DetectorConfig,
    resolution: Option<std::time::Duration>,
) -> CmdResult<serde_json::Value> {
    if let Some(mut c) = source.client().await? {
        let (since_secs, start_us) = since.map_or((0, 0), |s| s.wire());
        let req = ingero_proto::pb::StragglersRequest {
            job: job.unwrap_or_default(),
            since_secs,
            start_us,
            timeline,
            ..Default::default()
        };
        let json = c.stragglers(req).await.map_err(status_failure)?.into_inner().json;
        return Ok(serde_json::from_str(&json)?);
    }
    let engine = source.engine().await?;
    let start_us = since.unwrap_or(Since::Ago(std::time::Duration::from_secs(3600))).start_us();
    let end_us = chrono::Utc::now().timestamp_micros() + 1;
    let req = HistoryRequest { start_us, end_us, job, resolution };
    let r: Ranking = history::rank(&engine, &req, DetectorConfig { timeline, ..cfg }).await.map_err(Failure::lib)?;
    Ok(serde_json::to_value(r)?)
}

/// An 80-column table: most deviant first.
/// SINCE is the time of day for a flag from today (UTC), else the full
/// timestamp (the column then pushes TOP SIGNAL right, still ≤ 80 columns).
pub(crate) fn table(r: &serde_json::Value, now: chrono::DateTime<chrono::Utc>) -> String {
    let today = now.format("%Y-%m-%d").to_string();
    let mut o = format!("{:<16} {:<14} {:>6} {:<5} {:<8} {}\n", "NODE", "JOB", "SCORE", "FLAG", "SINCE", "TOP SIGNAL");
    let empty = vec![];
    let list = r["stragglers"].as_array().unwrap_or(&empty);
    let unranked = r["unranked"].as_array().unwrap_or(&empty);
    if list.is_empty() && unranked.is_empty() {
        o.push_str(nothing_listed(r));
    }
    for u in unranked {
        let nodes: Vec<&str> = u["nodes"].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
        let mut named = nodes.iter().take(3).copied().collect::<Vec<_>>().join(", ");
        if nodes.len() > 3 {
            named.push_str(&format!(" and {} more", nodes.len() - 3));
        }
        // The reason on its own line: 80 columns.
        o.push_str(&format!(
            "job {} ({named}):\n  {}\n",
            u["job"].as_str().unwrap_or(""),
            u["reason"].as_str().unwrap_or("not ranked")
        ));
    }
    for s in list {
        let since = s["since"]
            .as_str()
            .map(|t| if t.starts_with(&today) { t.get(11..19).unwrap_or(t).to_string() } else { t.to_string() })
            .unwrap_or_else(|| "-".into());
        // The column says it in a few words; a flagged node's line below in full.
        let top = serde_json::from_value::<Deviation>(s["signals"][0].clone()).ok();
        let room = (80 - 46usize).saturating_sub(since.chars().count().max(8));
        let flag = match (s["stuck"] == true, s["flagged"] == true) {
            (true, _) => "STUCK",
            (_, true) => "YES",
            _ => "no",
        };
        o.push_str(&format!(
            "{:<16} {:<14} {:>6.1} {:<5} {:<8} {}\n",
            fit(s["node"].as_str().unwrap_or(""), 16),
            fit(s["job"].as_str().unwrap_or(""), 14),
            s["score"].as_f64().unwrap_or(0.0),
            flag,
            since,
            fit(&top.as_ref().map_or("-".into(), Deviation::brief), room.max(12))
        ));
        if let Some(d) = top.filter(|_| flag != "no") {
            wrap(&d.text, 78).iter().for_each(|l| o.push_str(&format!("  {l}\n")));
        }
        if let Ok(step) = serde_json::from_value::<ingero_server::rank::steps::StepTime>(s["step"].clone()) {
            wrap(&step.text(), 78).iter().for_each(|l| o.push_str(&format!("  {l}\n")));
        }
        if let Some(c) = s.get("cost").filter(|c| c.is_object()) {
            let usd = c["usd"].as_f64().map_or(String::new(), |d| format!(" (${d:.2})"));
            let (h, g) = (c["gpu_hours"].as_f64().unwrap_or(0.0), c["gpus"].as_u64().unwrap_or(0));
            o.push_str(&format!("  lost so far: {h:.2} GPU-hours{usd} on the job's {g} GPUs\n"));
        }
    }
    if let Some(nodes @ 1..) = r["nodes"].as_u64() {
        let apart = list.len() + unranked.iter().map(|u| u["nodes"].as_array().map_or(0, Vec::len)).sum::<usize>();
        let calm = (nodes as usize).saturating_sub(apart);
        let jobs = r["jobs"].as_u64().unwrap_or(0);
        o.push_str(&format!("{nodes} node(s) in {jobs} job(s) judged; {calm} within their job's range\n"));
    }
    // Several replicas: say which answered; a silent one's jobs may be missing.
    let replicas = r["replicas"].as_array().unwrap_or(&empty);
    let down: Vec<&serde_json::Value> = replicas.iter().filter(|a| a["answered"] != true).collect();
    if !replicas.is_empty() {
        o.push_str(&format!("replicas: {} of {} answered\n", replicas.len() - down.len(), replicas.len()));
    }
    for d in down {
        let why = fit(d["error"].as_str().unwrap_or("no answer"), 40);
        o.push_str(&format!(
            "  NOT ANSWERING {} ({why}): its jobs may be missing\n",
            d["replica"].as_str().unwrap_or("?")
        ));
    }
    o
}

/// The table's line when it lists no node: nothing to rank is not "all calm".
fn nothing_listed(r: &serde_json::Value) -> &'static str {
    match (r["nodes"].as_u64(), r["source"].as_str()) {
        (Some(0), Some("live")) => "no node has reported to this aggregator yet\n",
        (Some(0), _) => "no node reported in the range (a longer --since?)\n",
        _ => "no node deviates from its job\n",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_time_today_and_a_full_timestamp_otherwise() {
        let runq = serde_json::json!({"signal": "runq_share", "value": 0.41, "job_median": 0.03, "z": 27.6,
            "text": "run-queue wait 41% vs job median 3%"});
        let host = serde_json::json!({"signal": "offcpu_share", "value": 0.38, "job_median": 0.02, "z": 9.1,
            "text": "host-blocked (off-CPU outside CUDA/NCCL calls) 38% vs job median 2%"});
        let stuck = serde_json::json!({"signal": "stuck", "value": 95.0, "job_median": 0.0, "z": 0.0,
            "text": "job stuck: python (pid 4242) is on CPU outside any CUDA/NCCL call; 7 rank(s) on 7 other node(s) have waited up to 95 s in ncclAllReduce for it"});
        let r = serde_json::json!({"stragglers": [
            {"node": "node-333", "job": "llama-pretrain", "score": 27.6, "flagged": true,
             "since": "2026-11-20T10:00:00Z", "signals": [runq]},
            {"node": "node-12", "job": "llama-pretrain", "score": 9.1, "flagged": true,
             "since": "2026-11-23T08:15:02Z", "signals": [host.clone()],
             "cost": {"gpus": 1024, "gpu_hours": 1234.5678, "usd": 4938.27},
             "step": {"seconds": 0.48, "job_seconds": 0.31, "ratio": 1.55}},
            {"node": "node-40", "job": "llama-pretrain", "score": 5.0, "flagged": false,
             "since": null, "signals": [host]},
            {"node": "node-7", "job": "bert", "score": 0.0, "flagged": true, "stuck": true,
             "since": "2026-11-23T11:58:00Z", "signals": [stuck]},
        ]});
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-23T12:00:00Z").unwrap().with_timezone(&chrono::Utc);
        let t = table(&r, now);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines.iter().all(|l| l.chars().count() <= 80), "wider than 80 columns:\n{t}");
        assert!(lines[1].contains("2026-11-20T10:00:00Z") && lines[1].ends_with(" run-queue 41%…"), "{t}");
        // A full timestamp leaves the column little room: the line below says it.
        assert_eq!(lines[2], "  run-queue wait 41% vs job median 3%", "{t}");
        // Its value in the column, whatever the label's length; in full below.
        assert!(lines[3].contains(" 08:15:02 ") && !lines[3].contains("2026-11-23"), "{t}");
        assert!(lines[3].ends_with(" host-blocked 38% (job 2%)"), "{t}");
        assert_eq!(lines[4], "  host-blocked (off-CPU outside CUDA/NCCL calls) 38% vs job median 2%", "{t}");
        assert_eq!(lines[5], "  step 0.480 s, 1.55× the job's 0.310 s", "{t}");
        assert!(lines[6].contains("lost so far: 1234.57 GPU-hours ($4938.27) on the job's 1024 GPUs"), "{t}");
        // A node that deviates but is not flagged: one line.
        assert!(lines[7].starts_with("node-40 ") && lines[7].contains(" no ") && lines[7].ends_with("(job 2%)"), "{t}");
        assert!(
            lines[8].starts_with("node-7 ") && lines[8].contains(" STUCK ") && lines[8].ends_with(" peers waited 95 s")
        );
        assert!(
            lines[9].starts_with("  job stuck: python (pid 4242)") && lines[10].ends_with("ncclAllReduce for it"),
            "{t}"
        );
        assert_eq!(lines.len(), 11, "{t}");
    }

    #[test]
    fn all_calm_and_no_data_read_differently() {
        let now = chrono::Utc::now();
        let calm = table(&serde_json::json!({"source": "history", "jobs": 2, "nodes": 40, "stragglers": []}), now);
        assert!(calm.contains("no node deviates from its job\n40 node(s) in 2 job(s) judged; 40 within"), "{calm}");
        let none = table(&serde_json::json!({"source": "history", "jobs": 0, "nodes": 0, "stragglers": []}), now);
        assert!(none.contains("no node reported in the range") && !none.contains("judged"), "{none}");
        let live = table(&serde_json::json!({"source": "live", "jobs": 0, "nodes": 0, "stragglers": []}), now);
        assert!(live.contains("no node has reported to this aggregator yet"), "{live}");
        // Nodes listed, and those of a job left unranked, are not counted calm.
        let r = serde_json::json!({"source": "history", "jobs": 2, "nodes": 10,
            "stragglers": [{"node": "n1", "job": "a", "score": 9.0, "flagged": true, "signals": []}],
            "unranked": [{"job": "b", "nodes": ["m1", "m2", "m3"], "reason": "no shared window"}]});
        assert!(table(&r, now).ends_with("10 node(s) in 2 job(s) judged; 6 within their job's range\n"));
        // An older aggregator's answer (no count) keeps the old line, no total.
        let old = table(&serde_json::json!({"source": "live", "jobs": 1, "stragglers": []}), now);
        assert!(old.ends_with("no node deviates from its job\n"), "{old}");
    }
}
