// SPDX-License-Identifier: Apache-2.0
//! `ingero simulate`: virtual agents speaking the real ingest protocol, one
//! per node, each one rank of a data-parallel job, with injected faults; it
//! measures the time from each injection to the server's flag.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingero_proto::client::{IngestClient, RetryPolicy, SendError, channel};
use ingero_proto::pb::StragglersRequest;
use ingero_proto::pb::query_client::QueryClient;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::faults::{Injection, Target};
use crate::model::{RankId, Rng, rows, step_job};

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub server: String,
    pub nodes: usize,
    pub jobs: usize,
    pub duration: Duration,
    pub injections: Vec<Injection>,
    /// Per-window multiplicative jitter of every rank (0.05 = ±5 %).
    pub jitter: f64,
    pub seed: u64,
    pub job_prefix: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct InjectionResult {
    pub injection: String,
    pub at_secs: f64,
    /// Seconds from injection to the first flag of that node; None: never.
    pub flagged_after_secs: Option<f64>,
    pub signals: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct SimReport {
    pub nodes: usize,
    pub windows: u64,
    pub batches: u64,
    pub injections: Vec<InjectionResult>,
    /// Nodes flagged without a straggler fault of their own.
    pub false_flags: Vec<String>,
}

pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

type Flags = Arc<Mutex<HashMap<String, (Instant, Vec<String>)>>>;

/// Runs the fleet in real time; `progress` gets one line per window.
pub async fn run(cfg: &SimConfig, mut progress: impl FnMut(&str)) -> Result<SimReport, SendError> {
    let ch = channel(&cfg.server)?;
    let mut fleet = Fleet::new(cfg, ch.clone());
    let (flags, poller) = poll_flags(QueryClient::new(ch));
    let windows = cfg.duration.as_secs().max(1);
    let mut report = SimReport { nodes: cfg.nodes, ..Default::default() };
    for w in 0..windows {
        // The window [w, w+1) is shipped when it closes, as an agent would.
        tokio::time::sleep_until((fleet.start + Duration::from_secs(w + 1)).into()).await;
        let t0 = Instant::now();
        let (ok, failed) = fleet.push_window(w).await?;
        report.batches += ok;
        report.windows += 1;
        let flagged: Vec<String> = flags.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        progress(&format!(
            "window {:>3}/{windows}: {} nodes pushed in {:>4} ms{}{}",
            w + 1,
            cfg.nodes - failed,
            t0.elapsed().as_millis(),
            if failed > 0 { format!(", {failed} failed") } else { String::new() },
            if flagged.is_empty() { String::new() } else { format!("; flagged: {}", summarize(&flagged)) }
        ));
    }
    // Give the last windows time to be judged.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    poller.abort();
    let flags = flags.lock().unwrap_or_else(|p| p.into_inner()).clone();
    score(cfg, &flags, fleet.start, &mut report);
    Ok(report)
}

/// Nodes dealt round-robin into jobs: each job's node indices and name.
pub(crate) fn job_layout(cfg: &SimConfig) -> (Vec<Vec<usize>>, Vec<String>) {
    let jobs = cfg.jobs.clamp(1, cfg.nodes.max(1));
    let members = (0..jobs).map(|j| (0..cfg.nodes).filter(|n| n % jobs == j).collect()).collect();
    let names =
        (0..jobs).map(|j| if jobs == 1 { cfg.job_prefix.clone() } else { format!("{}-{j}", cfg.job_prefix) }).collect();
    (members, names)
}

/// Virtual agents: one client per node, nodes dealt round-robin into jobs.
struct Fleet<'a> {
    cfg: &'a SimConfig,
    clients: Vec<IngestClient>,
    members: Vec<Vec<usize>>,
    job_names: Vec<String>,
    start_us: i64,
    /// When window 0 starts (on a whole second).
    start: Instant,
    rng: Rng,
}

impl<'a> Fleet<'a> {
    fn new(cfg: &'a SimConfig, ch: tonic::transport::Channel) -> Fleet<'a> {
        let policy = RetryPolicy { give_up_after: Duration::from_secs(5), ..Default::default() };
        let clients =
            (0..cfg.nodes).map(|i| IngestClient::with_channel(ch.clone(), &node_name(i), policy.clone())).collect();
        let (members, job_names) = job_layout(cfg);
        let now_us = chrono::Utc::now().timestamp_micros();
        let start_us = now_us - now_us % 1_000_000 + 1_000_000;
        let start = Instant::now() + Duration::from_micros((start_us - now_us) as u64);
        Fleet { cfg, clients, members, job_names, start_us, start, rng: Rng::new(cfg.seed) }
    }

    /// Every node's batch for window `w`, pushed concurrently; (acked, failed).
    async fn push_window(&mut self, w: u64) -> Result<(u64, usize), SendError> {
        let t = Duration::from_secs(w);
        let mut set = JoinSet::new();
        for (j, ranks) in self.members.iter().enumerate() {
            let win = step_job(ranks, t, &self.cfg.injections, self.cfg.jitter, &mut self.rng);
            for (k, (&node, r)) in ranks.iter().zip(&win).enumerate() {
                let name = node_name(node);
                let id = RankId {
                    node: &name,
                    job: &self.job_names[j],
                    rank: k,
                    world: ranks.len(),
                    window_start_us: self.start_us + w as i64 * 1_000_000,
                };
                let tables = rows(&id, r, w == 0, &mut self.rng);
                let mut c = self.clients[node].clone();
                let req = c.request(&tables)?;
                set.spawn(async move { c.push(&req).await.map(|_| ()) });
            }
        }
        let (mut ok, mut failed) = (0, 0);
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(())) => ok += 1,
                _ => failed += 1,
            }
        }
        Ok((ok, failed))
    }
}

/// Flags seen by polling the server every 100 ms (as a user's alerting would).
fn poll_flags(mut q: QueryClient<tonic::transport::Channel>) -> (Flags, tokio::task::JoinHandle<()>) {
    let flags: Flags = Arc::default();
    let seen = flags.clone();
    let poller = tokio::spawn(async move {
        loop {
            if let Ok(r) = q.stragglers(StragglersRequest::default()).await
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&r.into_inner().json)
            {
                let now = Instant::now();
                let mut f = seen.lock().unwrap_or_else(|p| p.into_inner());
                for s in v["stragglers"].as_array().into_iter().flatten().filter(|s| s["flagged"] == true) {
                    let node = s["node"].as_str().unwrap_or_default().to_string();
                    let sig = s["signals"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x["text"].as_str().map(String::from))
                        .collect();
                    f.entry(node).or_insert((now, sig));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (flags, poller)
}

/// Time to flag per injected straggler, and flags of nodes with no fault.
fn score(cfg: &SimConfig, flags: &HashMap<String, (Instant, Vec<String>)>, start: Instant, report: &mut SimReport) {
    let mut culprits = std::collections::HashSet::new();
    for inj in &cfg.injections {
        if let (true, Target::Node(n)) = (inj.kind.is_straggler(), &inj.target) {
            culprits.insert(node_name(*n));
            let at = start + inj.at;
            let hit = flags.get(&node_name(*n));
            report.injections.push(InjectionResult {
                injection: inj.label(),
                at_secs: inj.at.as_secs_f64(),
                flagged_after_secs: hit.filter(|(t, _)| *t >= at).map(|(t, _)| (*t - at).as_secs_f64()),
                signals: hit.map(|(_, s)| s.clone()).unwrap_or_default(),
            });
        }
    }
    let mut false_flags: Vec<String> = flags.keys().filter(|n| !culprits.contains(*n)).cloned().collect();
    false_flags.sort();
    report.false_flags = false_flags;
}

fn summarize(nodes: &[String]) -> String {
    let mut v = nodes.to_vec();
    v.sort();
    if v.len() <= 4 { v.join(", ") } else { format!("{} and {} more", v[..4].join(", "), v.len() - 4) }
}
