// SPDX-License-Identifier: Apache-2.0
//! `ingero simulate`: virtual agents speaking the real ingest protocol, one
//! per node, each one rank of a data-parallel job, with injected faults; it
//! measures the time from each injection to the server's flag.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingero_proto::client::{RetryPolicy, SendError, channel};
use ingero_proto::pb::PushRequest;
use ingero_proto::pb::StragglersRequest;
use ingero_proto::pb::query_client::QueryClient;
use ingero_proto::routed::{Move, RoutedClient};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::faults::{Injection, Target};
use crate::model::{RankId, Rng, rows, step_job};

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// One aggregator, or every replica's URL comma-separated (nodes are
    /// routed as agents route them).
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
    /// Start of the first window (µs since the epoch): the run's windows
    /// are `[start_us, start_us + windows s)`, however long pushing took.
    pub start_us: i64,
    pub windows: u64,
    pub batches: u64,
    pub injections: Vec<InjectionResult>,
    /// Injected faults that make no straggler of one node (a slow link, a
    /// whole job slowed, a one-window blip): noise not to be flagged.
    pub noise: Vec<String>,
    /// Nodes flagged without a straggler fault of their own.
    pub false_flags: Vec<String>,
    /// Nodes that moved to another replica: seconds from their first
    /// unanswered push to the first batch the new replica acknowledged.
    pub failovers: Vec<Failover>,
    /// Batches the aggregators acknowledged (a batch sent again after a
    /// failover counts once).
    pub acknowledged: u64,
    /// Rows in the acknowledged batches, over all tables: what the store
    /// must hold, each row once.
    pub acknowledged_rows: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    pub node: String,
    pub to: String,
    pub secs: f64,
    /// Acknowledged-but-uncommitted batches sent again to the new replica.
    pub resent: usize,
}

pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

type Flags = Arc<Mutex<HashMap<String, (Instant, Vec<String>)>>>;

/// Runs the fleet in real time; `progress` gets one line per window.
pub async fn run(cfg: &SimConfig, mut progress: impl FnMut(&str)) -> Result<SimReport, SendError> {
    let replicas: Vec<(String, tonic::transport::Channel)> = cfg
        .server
        .split(',')
        .map(|u| u.trim())
        .filter(|u| !u.is_empty())
        .map(|u| Ok((u.to_string(), channel(u)?)))
        .collect::<Result<_, SendError>>()?;
    let mut fleet = Fleet::new(cfg, &replicas);
    let (flags, poller) = poll_flags(replicas.iter().map(|(_, ch)| QueryClient::new(ch.clone())).collect());
    let windows = cfg.duration.as_secs().max(1);
    let mut report = SimReport { nodes: cfg.nodes, start_us: fleet.start_us, ..Default::default() };
    for w in 0..windows {
        // The window [w, w+1) is shipped when it closes, as an agent would.
        tokio::time::sleep_until((fleet.start + Duration::from_secs(w + 1)).into()).await;
        let t0 = Instant::now();
        let (ok, failed, rows) = fleet.push_window(w).await?;
        report.batches += ok + failed as u64;
        report.acknowledged += ok;
        report.acknowledged_rows += rows;
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
    report.failovers = std::mem::take(&mut fleet.failovers);
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

/// One virtual agent's link: its routed client and the batches the
/// aggregator acknowledged but has not reported committed (an agent's spool
/// keeps them the same way, to send again after a failover).
#[derive(Debug, Clone)]
struct Link {
    client: RoutedClient,
    pending: Vec<PushRequest>,
    unanswered_since: Option<Instant>,
}

/// Pushes one batch as an agent would; on a failover, re-sends what the
/// replica left behind had not committed, then the batch. The failover,
/// if any, is returned with the time it took.
async fn push_routed(mut l: Link, req: PushRequest) -> (Link, Result<(), SendError>, Option<Failover>) {
    let mut moved = None;
    let mut resent_total = 0;
    let mut queue = vec![req];
    if l.client.return_if_due().await {
        // Back to the first choice: it gets what the other has not committed, oldest first.
        queue.splice(0..0, std::mem::take(&mut l.pending));
    }
    let mut res = Ok(());
    while let Some(r) = queue.first().cloned() {
        let attempt = Instant::now();
        match l.client.push(&r).await {
            Ok(resp) => {
                queue.remove(0);
                let node = r.node.clone();
                if resp.reports_commits {
                    l.pending.push(r);
                    l.pending.retain(|p| p.sequence > resp.committed_sequence);
                }
                if let Some(t) = l.unanswered_since.take() {
                    let (to, secs) = (l.client.current().into(), t.elapsed().as_secs_f64());
                    moved = Some(Failover { node, to, secs, resent: resent_total });
                }
            }
            Err(e) => {
                if l.client.take_move() != Some(Move::Failover) {
                    res = Err(e);
                    break;
                }
                l.unanswered_since.get_or_insert(attempt);
                let resent = std::mem::take(&mut l.pending);
                resent_total += resent.len();
                queue.splice(0..0, resent);
            }
        }
    }
    (l, res, moved)
}

/// Virtual agents: one client per node, nodes dealt round-robin into jobs.
struct Fleet<'a> {
    cfg: &'a SimConfig,
    links: Vec<Option<Link>>,
    members: Vec<Vec<usize>>,
    job_names: Vec<String>,
    start_us: i64,
    /// When window 0 starts (on a whole second).
    start: Instant,
    rng: Rng,
    failovers: Vec<Failover>,
}

impl<'a> Fleet<'a> {
    fn new(cfg: &'a SimConfig, replicas: &[(String, tonic::transport::Channel)]) -> Fleet<'a> {
        // Short: a replica that does not answer within 2 s is left (agents do the same).
        let policy = RetryPolicy { give_up_after: Duration::from_secs(2), ..Default::default() };
        let links = (0..cfg.nodes)
            .map(|i| {
                let client = RoutedClient::with_channels(replicas, &node_name(i), policy.clone());
                Some(Link { client, pending: Vec::new(), unanswered_since: None })
            })
            .collect();
        let (members, job_names) = job_layout(cfg);
        let now_us = chrono::Utc::now().timestamp_micros();
        let start_us = now_us - now_us % 1_000_000 + 1_000_000;
        let start = Instant::now() + Duration::from_micros((start_us - now_us) as u64);
        Fleet { cfg, links, members, job_names, start_us, start, rng: Rng::new(cfg.seed), failovers: Vec::new() }
    }

    /// Every node's batch for window `w`, pushed concurrently; (acked,
    /// failed, rows acked).
    async fn push_window(&mut self, w: u64) -> Result<(u64, usize, u64), SendError> {
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
                // A node whose previous push is still retrying skips this window.
                let Some(mut link) = self.links[node].take() else { continue };
                let req = link.client.request(&tables)?;
                let rows: u64 = tables.iter().map(|(_, b)| b.num_rows() as u64).sum();
                set.spawn(async move { (node, rows, push_routed(link, req).await) });
            }
        }
        let (mut ok, mut failed, mut acked_rows) = (0, 0, 0);
        while let Some(r) = set.join_next().await {
            let Ok((node, rows, (link, res, moved))) = r else {
                failed += 1;
                continue;
            };
            self.links[node] = Some(link);
            self.failovers.extend(moved);
            match res {
                Ok(()) => (ok, acked_rows) = (ok + 1, acked_rows + rows),
                Err(_) => failed += 1,
            }
        }
        Ok((ok, failed, acked_rows))
    }
}

/// Flags seen by polling the server every 100 ms (as a user's alerting would).
/// With replicas, any one answers for all: the first that answers is used.
fn poll_flags(mut qs: Vec<QueryClient<tonic::transport::Channel>>) -> (Flags, tokio::task::JoinHandle<()>) {
    let flags: Flags = Arc::default();
    let seen = flags.clone();
    let poller = tokio::spawn(async move {
        loop {
            let mut answer = None;
            for q in qs.iter_mut() {
                let mut req = tonic::Request::new(StragglersRequest::default());
                req.set_timeout(Duration::from_secs(1));
                if let Ok(r) = q.stragglers(req).await {
                    answer = Some(r);
                    break;
                }
            }
            if let Some(r) = answer
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
        if !inj.kind.is_straggler() {
            report.noise.push(inj.label());
        }
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
