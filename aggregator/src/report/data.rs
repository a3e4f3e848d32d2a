//! Everything a report needs, read from the store with a few time-pruned
//! queries: the target's own series, its node's other cgroups, its job's peers.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int64Type, UInt32Type, UInt64Type, UInt8Type};
use ingero_proto::hist::Histogram;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::query::{time_predicate, QueryEngine};
use crate::rank::signals::{is_launch, is_nccl_collective, is_sync_op};

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

    fn filter(&self) -> String {
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
    pub nccl_share: f64,
    pub launches_per_s: f64,
    pub io_share: f64,
    /// Median of the job's other nodes in the same window.
    pub peer_nccl_share: Option<f64>,
    pub peer_stall_share: Option<f64>,
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
    pub count: u64,
    pub total_ns: u64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: u64,
    /// Some durations come from a sample (imported traces).
    pub sampled: bool,
    #[serde(skip)]
    pub hist: Histogram,
}

/// Raw material of a report.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ReportData {
    pub nodes: Vec<String>,
    pub jobs: Vec<String>,
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    pub series: Vec<Point>,
    #[serde(skip)]
    pub sync_hist: Vec<(i64, Histogram)>,
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

fn f64s(b: &RecordBatch, i: usize) -> Vec<f64> {
    let c = b.column(i).as_primitive::<Float64Type>();
    (0..c.len()).map(|j| if c.is_null(j) { 0.0 } else { c.value(j) }).collect()
}

fn strs(b: &RecordBatch, i: usize) -> Vec<Option<String>> {
    let c = b.column(i).as_string::<i32>();
    (0..c.len()).map(|j| (!c.is_null(j)).then(|| c.value(j).to_string())).collect()
}

pub async fn collect(engine: &QueryEngine, target: &Target, start_us: i64, end_us: i64) -> Result<ReportData> {
    let time = time_predicate("window_start", start_us, end_us);
    let f = format!("{} AND {time}", target.filter());
    let mut d = ReportData::default();

    // Who: nodes, jobs, processes.
    let who = engine
        .sql(&format!("SELECT DISTINCT node, job, pid, comm FROM sched_windows WHERE {f} UNION SELECT DISTINCT node, job, pid, comm FROM call_windows WHERE {f}"))
        .await?;
    let (mut nodes, mut jobs, mut pids, mut comms) =
        (BTreeSet::new(), BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for b in &who {
        let pid = b.column(2).as_primitive::<UInt32Type>();
        for (i, (n, j)) in strs(b, 0).into_iter().zip(strs(b, 1)).enumerate() {
            nodes.extend(n);
            jobs.extend(j);
            pids.insert(pid.value(i));
        }
        comms.extend(strs(b, 3).into_iter().flatten());
    }
    if nodes.is_empty() {
        return Err(Error::NoData(format!(
            "no data for {} between {} and {}: check the name, --since and --store/--server",
            target.describe(),
            crate::rank::detector::rfc3339(start_us),
            crate::rank::detector::rfc3339(end_us)
        )));
    }
    d.nodes = nodes.into_iter().collect();
    d.jobs = jobs.into_iter().collect();
    d.pids = pids.into_iter().collect();
    d.comms = comms.into_iter().collect();

    let w = "CAST(window_start AS BIGINT)";
    let mut points: BTreeMap<i64, Point> = BTreeMap::new();
    let sched = engine
        .sql(&format!(
            "SELECT {w} AS t, SUM(CAST(runq_wait_ns AS DOUBLE)), SUM(CAST(off_cpu_ns AS DOUBLE)), SUM(CAST(on_cpu_ns AS DOUBLE)), MAX(CAST(window_us AS DOUBLE)) FROM sched_windows WHERE {f} GROUP BY 1"
        ))
        .await?;
    let mut window_us = 1e6f64;
    // Per window: (off-CPU ns, all thread time ns), for the host-stall share below.
    let mut off_cpu: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
    for b in &sched {
        let t = b.column(0).as_primitive::<Int64Type>();
        let (runq, off, on, wu) = (f64s(b, 1), f64s(b, 2), f64s(b, 3), f64s(b, 4));
        for i in 0..b.num_rows() {
            let total = (runq[i] + off[i] + on[i]).max(1.0);
            let p = points.entry(t.value(i)).or_default();
            p.runq_share = runq[i] / total;
            p.offcpu_share = off[i] / total;
            off_cpu.insert(t.value(i), (off[i], total));
            window_us = wu[i].max(1.0);
        }
    }
    d.window_secs = window_us / 1e6;

    let calls = engine
        .sql(&format!(
            "SELECT {w} AS t, library, op, count, total_ns, hist_bucket, hist_count, window_us, max_ns, sampled FROM call_windows WHERE {f}"
        ))
        .await?;
    let mut hists: BTreeMap<i64, Histogram> = BTreeMap::new();
    let mut ops: BTreeMap<String, OpStat> = BTreeMap::new();
    // Time spent inside calls that wait for the GPU or for peers, per window.
    let mut waiting: BTreeMap<i64, f64> = BTreeMap::new();
    for b in &calls {
        let t = b.column(0).as_primitive::<Int64Type>();
        let (lib, op) = (b.column(1).as_string::<i32>(), b.column(2).as_string::<i32>());
        let count = b.column(3).as_primitive::<UInt64Type>();
        let total = b.column(4).as_primitive::<UInt64Type>();
        let hb = b.column(5).as_list::<i32>();
        let hc = b.column(6).as_list::<i32>();
        let wu = b.column(7).as_primitive::<UInt64Type>();
        let mx = b.column(8).as_primitive::<UInt64Type>();
        let sampled = b.column(9).as_boolean();
        for i in 0..b.num_rows() {
            let p = points.entry(t.value(i)).or_default();
            let secs = (wu.value(i) as f64 / 1e6).max(1e-6);
            let (l, o) = (lib.value(i), op.value(i));
            let st = ops.entry(o.to_string()).or_insert_with(|| OpStat {
                library: l.into(),
                op: o.into(),
                ..Default::default()
            });
            st.count += count.value(i);
            st.total_ns += total.value(i);
            st.max_ns = st.max_ns.max(mx.value(i));
            st.sampled |= sampled.value(i);
            let (bk, ct) = (hb.value(i), hc.value(i));
            st.hist.merge(&Histogram::from_sparse(
                bk.as_primitive::<UInt8Type>().values(),
                ct.as_primitive::<UInt64Type>().values(),
            ));
            if is_sync_op(o) || is_nccl_collective(l, o) || o.contains("Memcpy") {
                *waiting.entry(t.value(i)).or_default() += total.value(i) as f64;
            }
            if is_sync_op(o) {
                d.sync_calls += count.value(i);
                let bk = hb.value(i);
                let ct = hc.value(i);
                let bk = bk.as_primitive::<UInt8Type>();
                let ct = ct.as_primitive::<UInt64Type>();
                hists.entry(t.value(i)).or_default().merge(&Histogram::from_sparse(bk.values(), ct.values()));
            } else if is_nccl_collective(l, o) {
                p.nccl_share += total.value(i) as f64 / (secs * 1e9);
            } else if is_launch(o) {
                d.launches += count.value(i);
                p.launches_per_s += count.value(i) as f64 / secs;
            }
        }
    }
    for (t, h) in &hists {
        points.entry(*t).or_default().sync_p99_ns = h.quantile(0.99);
    }
    // A thread asleep inside cudaStreamSynchronize, a device-to-host copy or
    // a collective waits for the GPU or for its peers: that is not the host
    // stalling. Only off-CPU time outside such calls counts.
    for (t, (off, total)) in off_cpu {
        let inside = waiting.get(&t).copied().unwrap_or(0.0);
        points.entry(t).or_default().host_offcpu_share = (off - inside).max(0.0) / total;
    }
    d.sync_hist = hists.into_iter().collect();
    d.ops = ops
        .into_values()
        .map(|mut o| {
            // Bucket bounds can overshoot the largest call seen.
            let cap = |q: Option<u64>| q.map(|v| if o.max_ns > 0 { v.min(o.max_ns) } else { v });
            o.p50_ns = cap(o.hist.quantile(0.5));
            o.p99_ns = cap(o.hist.quantile(0.99));
            o
        })
        .collect();
    d.ops.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)));

    let io = engine.sql(&format!("SELECT {w} AS t, SUM(CAST(total_ns AS DOUBLE)), MAX(CAST(window_us AS DOUBLE)) FROM io_windows WHERE {f} GROUP BY 1")).await?;
    for b in &io {
        let t = b.column(0).as_primitive::<Int64Type>();
        let (tot, wu) = (f64s(b, 1), f64s(b, 2));
        for i in 0..b.num_rows() {
            points.entry(t.value(i)).or_default().io_share = tot[i] / (wu[i].max(1.0) * 1e3);
        }
    }

    let ev_f = format!("{} AND {}", target.filter(), time_predicate("window_start", start_us, end_us));
    let ev = engine
        .sql(&format!("SELECT CAST(event_time AS BIGINT), kind, value, detail, comm FROM host_events WHERE {ev_f} ORDER BY 1 LIMIT 500"))
        .await?;
    for b in &ev {
        let t = b.column(0).as_primitive::<Int64Type>();
        let v = b.column(2).as_primitive::<Int64Type>();
        let (kind, detail, comm) = (strs(b, 1), strs(b, 3), strs(b, 4));
        for i in 0..b.num_rows() {
            d.events.push(Event {
                time: crate::rank::detector::rfc3339(t.value(i)),
                kind: kind[i].clone().unwrap_or_default(),
                value: v.value(i),
                detail: detail[i].clone(),
                comm: comm[i].clone().unwrap_or_default(),
            });
        }
    }

    // Other cgroups on the same node(s): who took the CPU.
    let node_list = d.nodes.iter().map(|n| format!("'{}'", n.replace('\'', "''"))).collect::<Vec<_>>().join(", ");
    let not_self = match target {
        Target::Pod { namespace, name } => format!(
            "NOT (COALESCE(namespace, '') = '{}' AND COALESCE(pod, '') = '{}')",
            namespace.replace('\'', "''"),
            name.replace('\'', "''")
        ),
        Target::Pid { pid, .. } => format!("pid <> {pid}"),
        Target::Node(_) => {
            format!("pid NOT IN ({})", d.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "))
        }
    };
    let span_ns = ((end_us.min(points.keys().last().copied().unwrap_or(end_us) + window_us as i64)
        - start_us.max(points.keys().next().copied().unwrap_or(start_us)))
    .max(1) as f64)
        * 1e3;
    let nb = engine
        .sql(&format!(
            "SELECT namespace, pod, comm, cgroup_path, SUM(CAST(on_cpu_ns AS DOUBLE)) AS cpu FROM cgroup_windows \
             WHERE node IN ({node_list}) AND {time} AND {not_self} GROUP BY 1, 2, 3, 4 ORDER BY cpu DESC LIMIT 5"
        ))
        .await?;
    for b in &nb {
        let (ns, pod, comm, path, cpu) = (strs(b, 0), strs(b, 1), strs(b, 2), strs(b, 3), f64s(b, 4));
        for i in 0..b.num_rows() {
            d.neighbours.push(Neighbour {
                namespace: ns[i].clone(),
                pod: pod[i].clone(),
                comm: comm[i].clone().unwrap_or_default(),
                cgroup_path: path[i].clone().unwrap_or_default(),
                cores: cpu[i] / span_ns,
            });
        }
    }

    let refs = engine
        .sql(&format!(
            "SELECT detail FROM host_events WHERE kind = 'reference_chain' AND node IN ({node_list}) AND {time} ORDER BY event_time"
        ))
        .await?;
    d.reference = refs.iter().flat_map(|b| strs(b, 0)).flatten().collect();

    // The job's other nodes, window by window.
    if let Some(job) = d.jobs.first() {
        let jf = format!("job = '{}' AND {time} AND node NOT IN ({node_list})", job.replace('\'', "''"));
        let pn = engine
            .sql(&format!(
                "SELECT node, {w} AS t, SUM(CASE WHEN library = 'nccl' AND op NOT IN ('ncclGroupStart', 'ncclGroupEnd', 'ncclCommInitRank') THEN CAST(total_ns AS DOUBLE) ELSE 0 END) / MAX(CAST(window_us AS DOUBLE) * 1000) FROM call_windows WHERE {jf} GROUP BY 1, 2"
            ))
            .await?;
        let ps = engine
            .sql(&format!(
                "SELECT node, {w} AS t, SUM(CAST(runq_wait_ns + off_cpu_ns AS DOUBLE)) / SUM(CAST(runq_wait_ns + off_cpu_ns + on_cpu_ns AS DOUBLE)) FROM sched_windows WHERE {jf} GROUP BY 1, 2"
            ))
            .await?;
        let mut peers = BTreeSet::new();
        let mut collect_by_t = |batches: &[RecordBatch]| {
            let mut by_t: HashMap<i64, Vec<f64>> = HashMap::new();
            for b in batches {
                let t = b.column(1).as_primitive::<Int64Type>();
                let v = f64s(b, 2);
                for (i, n) in strs(b, 0).into_iter().enumerate() {
                    peers.extend(n);
                    by_t.entry(t.value(i)).or_default().push(v[i]);
                }
            }
            by_t
        };
        let nccl = collect_by_t(&pn);
        let stall = collect_by_t(&ps);
        d.peers = peers.len();
        for (t, p) in points.iter_mut() {
            p.peer_nccl_share = nccl.get(t).map(|v| median(v.clone()));
            p.peer_stall_share = stall.get(t).map(|v| median(v.clone()));
        }
    }
    d.series = points
        .into_iter()
        .map(|(t, mut p)| {
            p.t_us = t;
            p
        })
        .collect();
    Ok(d)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    crate::rank::detector::median(&mut v)
}
