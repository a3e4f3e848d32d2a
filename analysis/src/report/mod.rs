// SPDX-License-Identifier: Apache-2.0
//! Per-pod / per-node / per-process stall reports: cause → effect → fix, as
//! text, JSON and a self-contained HTML page.

pub mod blocked;
pub(crate) mod chains;
pub(crate) mod collect;
pub(crate) mod cuda;
pub(crate) mod data;
pub mod escape;
pub(crate) mod failing;
pub(crate) mod flame;
pub mod fleet;
pub(crate) mod hang;
pub(crate) mod held_back;
pub mod html;
pub(crate) mod ops;
pub(crate) mod reference;
pub mod sites;
pub(crate) mod starved;
pub mod steps;
pub mod text;

use serde::Serialize;

pub use data::Target;

use crate::error::Result;
use crate::query::QueryEngine;
use crate::rank::detector::{DetectorConfig, Standing};
use crate::rank::episode::Episode;
use crate::rank::history::{self, HistoryRequest};
use ingero_model::time::rfc3339;

/// How much of the report's time a chain's cause accounts for.
fn explains(c: &chains::Chain, s: &chains::Summary, d: &data::ReportData) -> Option<f64> {
    let span_ns = d.series.len() as f64 * d.window_secs * 1e9;
    let in_ops = |pred: &dyn Fn(&str) -> bool| {
        let ns: u64 = d.ops.iter().filter(|o| pred(&o.op)).map(|o| o.total_ns).sum();
        (span_ns > 0.0).then(|| ns as f64 / span_ns)
    };
    let share = match c.cause.as_str() {
        "cpu_contention" => Some(s.runq_share),
        "io_stall" | "memory_pressure" => Some(s.offcpu_share),
        "host_blocked" | "input_bound" => Some(s.host_offcpu_share),
        "slow_gpu" => Some((s.copy_share - s.peer_copy_share.unwrap_or(0.0)).max(0.0)),
        "slow_network" => s.peer_wait_share.map(|p| (s.wait_share - p).max(0.0)),
        "allocator_churn" => {
            in_ops(&|op| ["cudaFree", "cudaMalloc", "cuMemAlloc", "cuMemFree"].iter().any(|p| op.starts_with(p)))
        }
        "copy_waits" => in_ops(&|op| c.title.starts_with(&format!("{op} "))),
        _ => None,
    };
    share.map(|x| x.clamp(0.0, 1.0))
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Report {
    pub target: String,
    pub from: String,
    pub to: String,
    pub nodes: Vec<String>,
    pub jobs: Vec<String>,
    pub pids: Vec<u32>,
    /// The processes' names now (each in its latest window).
    pub processes: Vec<String>,
    /// Names they had earlier in the range (a process that renamed itself).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub renamed_from: Vec<String>,
    pub summary: chains::Summary,
    pub chains: Vec<chains::Chain>,
    /// The straggler ranking of this target's node(s) within their job.
    pub straggler: Vec<Standing>,
    pub neighbours: Vec<data::Neighbour>,
    pub events: Vec<data::Event>,
    pub series: Vec<data::Point>,
    /// Latency per CUDA/NCCL op, busiest first.
    #[serde(default)]
    pub ops: Vec<data::OpStat>,
    /// For imported traces: the source product's own diagnoses and what we make of them.
    #[serde(default)]
    pub reference: Vec<reference::Verdict>,
    /// Where the target's stalls were made (every op), busiest first.
    #[serde(default)]
    pub call_sites: Vec<sites::CallSite>,
    /// Where its threads blocked off CPU outside CUDA/NCCL calls, busiest first.
    #[serde(default)]
    pub blocked_sites: Vec<blocked::BlockedSite>,
    /// Step times, where the job labelled its steps (imported traces' annotations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<steps::Steps>,
}

pub async fn build(
    engine: &QueryEngine,
    target: &Target,
    start_us: i64,
    end_us: i64,
    cfg: DetectorConfig,
) -> Result<Report> {
    let mut d = collect::collect(engine, target, start_us, end_us).await?;
    let time = crate::query::time_predicate("window_start", start_us, end_us);
    let nodes = d.nodes.iter().map(|n| crate::query::quote(n)).collect::<Vec<_>>().join(", ");
    let (filter, node_filter) = (format!("{} AND {time}", target.filter()), format!("node IN ({nodes}) AND {time}"));
    let blocked_sites = blocked::collect(engine, &filter, &node_filter).await?;
    d.blocked_io_share = blocked::io_share(&blocked_sites);
    let summary = chains::summarize(&d);
    let mut chains = chains::diagnose(&d, &summary);
    chains.extend(cuda::chains(&d, &summary));
    chains.extend(failing::chain(&d));
    let workers = starved::workers(engine, &d, start_us, end_us).await?;
    let trainer = starved::trainer(engine, &d, start_us, end_us).await?;
    if let Some(c) = starved::input_bound(&d, &summary, &workers, trainer.as_deref()) {
        // The same symptom, explained: the host is blocked waiting for input.
        chains.retain(|x| x.cause != "host_blocked");
        chains.push(c);
    }
    if let Some(hung) = hang::chain(engine, &d, start_us, end_us, &cfg).await? {
        chains.insert(0, hung); // first among the high-severity ones
    }
    chains.sort_by_key(|c| c.severity);
    let call_sites = sites::collect(engine, &filter, &node_filter).await?;
    for c in chains.iter_mut() {
        c.call_sites = sites::for_cause(&c.cause, &c.title, &call_sites, 5);
        if matches!(c.cause.as_str(), "host_blocked" | "input_bound") && blocked_sites.iter().any(|b| b.feeds_gpu) {
            // The threads that feed the GPU: another thread's wait shows at theirs.
            c.root_cause.extend(blocked_sites.iter().filter(|b| b.feeds_gpu).take(3).map(|b| b.label()));
            if c.cause == "host_blocked" {
                // The places are known: no profiler needed to find them.
                c.fixes = vec![
                    "start at the lines above: take the waiting off the training loop's path (prefetch, more loader workers, work moved to a thread)".into(),
                ];
            }
        }
    }
    for c in chains.iter_mut().filter(|c| c.explains.is_none()) {
        c.explains = explains(c, &summary, &d);
    }
    let reference = reference::judge(&d, &summary, &chains);
    let steps = steps::collect(engine, &d, start_us, end_us).await?;
    let (straggler, episodes) = ranked(engine, &d, (start_us, end_us), &cfg).await?;
    if let Some(c) = held_back::chain(&d, &summary, &episodes, (end_us, chains.is_empty())) {
        chains.push(c);
        chains.sort_by_key(|c| c.severity);
    }
    Ok(Report {
        target: target.describe(),
        // The range the data covers, within the one asked for.
        from: rfc3339(d.series.first().map_or(start_us, |p| p.t_us.max(start_us))),
        to: rfc3339(d.series.last().map_or(end_us, |p| (p.t_us + (d.window_secs * 1e6) as i64).min(end_us))),
        nodes: d.nodes.clone(),
        jobs: d.jobs.clone(),
        pids: d.pids.clone(),
        processes: d.comms.clone(),
        renamed_from: d.former_comms.clone(),
        summary,
        chains,
        straggler,
        neighbours: d.neighbours.clone(),
        events: d.events.iter().take(50).cloned().collect(),
        series: d.series,
        ops: d.ops.into_iter().take(20).collect(),
        reference,
        call_sites: call_sites.into_iter().take(20).collect(),
        blocked_sites: blocked_sites.into_iter().take(10).collect(),
        steps,
    })
}

/// The target's nodes' standings in their jobs' ranking over the range, and
/// the jobs' straggler episodes (the target's nodes' and the others').
async fn ranked(
    engine: &QueryEngine,
    d: &data::ReportData,
    (start_us, end_us): (i64, i64),
    cfg: &DetectorConfig,
) -> Result<(Vec<Standing>, Vec<Episode>)> {
    let (mut straggler, mut episodes) = (Vec::new(), Vec::new());
    for job in &d.jobs {
        let req = HistoryRequest { start_us, end_us, job: Some(job.clone()), resolution: None };
        let r = history::rank(engine, &req, cfg.clone()).await?;
        straggler.extend(r.stragglers.into_iter().filter(|s| d.nodes.contains(&s.node)));
        episodes.extend(r.episodes);
    }
    Ok((straggler, episodes))
}

/// ", earlier named A, B" for processes that renamed themselves in the range.
fn renamed(r: &Report) -> String {
    if r.renamed_from.is_empty() {
        return String::new();
    }
    format!(", earlier named {}", r.renamed_from.join(", "))
}
