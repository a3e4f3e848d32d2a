// SPDX-License-Identifier: Apache-2.0
//! What a report is about and the raw material it is built from (read by
//! [`super::collect`]).

use ingero_model::hist::Histogram;
use serde::Serialize;

use crate::error::Result;

/// What a report is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pod { namespace: String, name: String },
    Node(String),
    Pid { pid: u32, node: Option<String> },
}

impl Target {
    /// `kind` is pod | node | pid; a pod is `NAMESPACE/NAME`, a pid may be `NODE:PID`.
    pub fn parse(kind: &str, target: &str) -> Result<Target, String> {
        match kind {
            "pod" => match target.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    Ok(Target::Pod { namespace: ns.into(), name: name.into() })
                }
                _ => Err(format!("pod must be NAMESPACE/NAME, got `{target}`")),
            },
            "node" if !target.is_empty() => Ok(Target::Node(target.into())),
            "pid" => {
                let (node, pid) = match target.split_once(':') {
                    Some((n, p)) => (Some(n.to_string()), p),
                    None => (None, target),
                };
                let pid =
                    pid.parse::<u32>().map_err(|_| format!("pid must be a number (or NODE:PID), got `{target}`"))?;
                Ok(Target::Pid { pid, node })
            }
            _ => Err(format!("unknown report target `{kind}` `{target}` (pod NS/NAME, node NAME or pid N)")),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Target::Pod { namespace, name } => format!("pod {namespace}/{name}"),
            Target::Node(n) => format!("node {n}"),
            Target::Pid { pid, node: Some(n) } => format!("pid {pid} on {n}"),
            Target::Pid { pid, node: None } => format!("pid {pid}"),
        }
    }

    /// What the user would type for this kind of target, as SQL over a
    /// window table, and the kind's name in the plural ("pods").
    pub(super) fn spelled(&self) -> (&'static str, &'static str) {
        match self {
            Target::Pod { .. } => ("concat(namespace, '/', pod)", "pods"),
            Target::Node(_) => ("node", "nodes"),
            Target::Pid { .. } => ("concat(node, ':', CAST(pid AS VARCHAR))", "processes"),
        }
    }

    pub(super) fn filter(&self) -> String {
        let q = |s: &str| format!("'{}'", s.replace('\'', "''"));
        match self {
            Target::Pod { namespace, name } => format!("namespace = {} AND pod = {}", q(namespace), q(name)),
            Target::Node(n) => format!("node = {}", q(n)),
            Target::Pid { pid, node: Some(n) } => format!("pid = {pid} AND node = {}", q(n)),
            Target::Pid { pid, node: None } => format!("pid = {pid}"),
        }
    }
}

/// One window of the target.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Point {
    pub t_us: i64,
    pub runq_share: f64,
    pub offcpu_share: f64,
    /// Off-CPU outside calls that wait for the GPU or peers (syncs, copies,
    /// collectives): the host's own stall.
    #[serde(default)]
    pub host_offcpu_share: f64,
    pub sync_p99_ns: Option<u64>,
    /// Time in device syncs, blocking copies and collectives / wall time:
    /// waiting for the GPU or the other ranks.
    pub wait_share: f64,
    /// Time in blocking copies / wall time: waiting for its own GPU.
    #[serde(default)]
    pub copy_share: f64,
    pub launches_per_s: f64,
    pub io_share: f64,
    /// Median of the job's other nodes in the same window.
    pub peer_wait_share: Option<f64>,
    #[serde(default)]
    pub peer_copy_share: Option<f64>,
    pub peer_stall_share: Option<f64>,
    /// Median step time of the target's processes, where the agents found
    /// their steps (`progress_windows`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_p50_ns: Option<u64>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Neighbour {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub comm: String,
    pub cgroup_path: String,
    pub cores: f64,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Event {
    pub time: String,
    pub kind: String,
    pub value: i64,
    pub detail: Option<String>,
    pub comm: String,
}

/// Latency of one CUDA/NCCL op over the whole report range.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct OpStat {
    pub library: String,
    pub op: String,
    /// What the call does (`launch`, `sync`, `copy`, …: `signals::op_kind`).
    #[serde(default)]
    pub kind: String,
    pub count: u64,
    /// Calls that returned an error (timed calls only).
    #[serde(default)]
    pub errors: u64,
    pub total_ns: u64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: u64,
    /// Some durations come from a sample (imported traces).
    pub sampled: bool,
    /// Share of `count` the probes saw when the agent's duty cycle (its
    /// trap budget) estimated the rest; absent when every call was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_share: Option<f64>,
    /// Calls seen, summed over rows (`count` when nothing was estimated).
    #[serde(skip)]
    pub seen: f64,
    #[serde(skip)]
    pub hist: Histogram,
}

/// Raw material of a report.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub(crate) struct ReportData {
    pub nodes: Vec<String>,
    pub jobs: Vec<String>,
    pub pids: Vec<u32>,
    /// Each process's name in its latest window.
    pub comms: Vec<String>,
    /// Names processes had earlier in the range and dropped (renamed).
    pub former_comms: Vec<String>,
    pub series: Vec<Point>,
    #[serde(skip)]
    /// Per window: its syncs' latency histogram and the longest of them.
    pub sync_hist: Vec<(i64, Histogram, u64)>,
    /// Of the GPU-feeding threads' captured off-CPU time, the share spent
    /// in reads, writes and flushes; None where no episode was captured.
    #[serde(skip)]
    pub blocked_io_share: Option<f64>,
    pub sync_calls: u64,
    pub launches: u64,
    pub neighbours: Vec<Neighbour>,
    pub events: Vec<Event>,
    pub peers: usize,
    pub window_secs: f64,
    /// Per op, busiest first.
    pub ops: Vec<OpStat>,
    /// Diagnoses recorded by the source product of imported traces (JSON).
    pub reference: Vec<String>,
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    ingero_model::time::median(&mut v)
}

/// A quantile read from histogram buckets, never above `max`, the longest
/// call seen (0: not known): a bucket's bound can overshoot it.
pub(crate) fn capped(q: Option<u64>, max: u64) -> Option<u64> {
    q.map(|v| if max > 0 { v.min(max) } else { v })
}
