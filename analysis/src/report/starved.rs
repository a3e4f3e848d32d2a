// SPDX-License-Identifier: Apache-2.0
//! The input-bound (starved GPU) chain: the GPU is mostly idle — the
//! training process waits little on the device — while the process waits
//! in host code for its input and its data-loading workers (the child
//! processes it forked: PyTorch DataLoader workers, whatever they are
//! called) burn CPU or context-switch heavily.

use arrow::array::Array;
use arrow::datatypes::{Float64Type, Int64Type, UInt32Type};

use super::chains::{Chain, Severity, Summary, pct};
use super::data::ReportData;
use crate::error::Result;
use crate::query::columns::Columns;
use crate::query::{QueryEngine, quote, time_predicate};
use ingero_model::table::names::{CALL_WINDOWS, HOST_EVENTS, SCHED_WINDOWS};

/// Fewer kernel launches a second than this, with busy workers: starved
/// whatever the scheduler events say (a trainer fed in time launches
/// hundreds to thousands a second).
const STARVED_LAUNCHES_PER_S: f64 = 1.0;

/// A data-loading worker: a child of a traced process that makes no CUDA call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Worker {
    pub pid: u32,
    pub comm: String,
    pub switches_per_s: f64,
    /// Cores used; None where on-CPU time is not measured (imported traces
    /// record only off-CPU periods).
    pub cores: Option<f64>,
}

fn list<T: ToString>(v: &[T]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// Names that say "data loading" (PyTorch names its DataLoader workers'
/// threads and pin-memory thread so; other loaders say "loader").
const LOADER_NAMES: [&str; 4] = ["pt_data", "dataloader", "data_worker", "loader"];

/// The workers of the target's processes in [start_us, end_us): children
/// from its fork events; where the trace has none (workers started before
/// it), processes of the target's container that make no CUDA call and
/// are named like data loaders or like the trainer (a forked Python worker
/// keeps its parent's name); where the container is unknown (cgroup 0,
/// rows folded from a trace's aggregates), by data-loader names only.
/// With their scheduler rows.
pub(crate) async fn workers(engine: &QueryEngine, d: &ReportData, start_us: i64, end_us: i64) -> Result<Vec<Worker>> {
    if d.pids.is_empty() || d.nodes.is_empty() {
        return Ok(vec![]);
    }
    let (nodes, time) = (
        d.nodes.iter().map(|n| quote(n)).collect::<Vec<_>>().join(", "),
        time_predicate("window_start", start_us, end_us),
    );
    let forks = engine
        .sql(&format!(
            "SELECT DISTINCT value FROM {HOST_EVENTS} WHERE kind = 'fork' AND node IN ({nodes}) AND pid IN ({}) AND {time}",
            list(&d.pids)
        ))
        .await?;
    let mut children: Vec<i64> = Vec::new();
    for b in &forks {
        children.extend(b.primitives::<Int64Type>("value")?.values());
    }
    let candidates = if children.is_empty() {
        format!("({})", same_container(d, &nodes, &time))
    } else {
        format!("({})", list(&children))
    };
    let span_s = (d.series.len() as f64 * d.window_secs).max(d.window_secs);
    let rows = engine
        .sql(&format!(
            "SELECT pid, MAX(comm) AS comm, SUM(CAST(voluntary_switches + involuntary_switches AS DOUBLE)) AS switches, \
             SUM(CAST(on_cpu_ns AS DOUBLE)) AS on_cpu_ns, CAST(COUNT(off_cpu_in_call_ns) AS DOUBLE) AS measured \
             FROM {SCHED_WINDOWS} WHERE node IN ({nodes}) AND {time} AND pid IN {candidates} \
             AND pid NOT IN (SELECT DISTINCT pid FROM {CALL_WINDOWS} WHERE node IN ({nodes}) AND {time}) GROUP BY pid ORDER BY switches DESC"
        ))
        .await?;
    let mut out = Vec::new();
    for b in &rows {
        let (pid, comm) = (b.primitives::<UInt32Type>("pid")?, b.strings("comm")?);
        let f = |name: &str| b.primitives::<Float64Type>(name);
        let (sw, on, measured) = (f("switches")?, f("on_cpu_ns")?, f("measured")?);
        for i in 0..b.num_rows() {
            out.push(Worker {
                pid: pid.value(i),
                comm: if comm.is_valid(i) { comm.value(i).to_string() } else { String::new() },
                switches_per_s: sw.value(i) / span_s,
                cores: (measured.value(i) > 0.0).then(|| on.value(i) / 1e9 / span_s),
            });
        }
    }
    Ok(out)
}

/// SQL for the pids of the target's containers that may be its workers
/// (no fork events: they were started before the trace). "The trainer" is
/// the target's processes that call CUDA (a node's report has many others).
fn same_container(d: &ReportData, nodes: &str, time: &str) -> String {
    let named =
        |col: &str| LOADER_NAMES.iter().map(|n| format!("lower({col}) LIKE '%{n}%'")).collect::<Vec<_>>().join(" OR ");
    let cuda = |col: &str| {
        format!(
            "SELECT DISTINCT {col} FROM {CALL_WINDOWS} WHERE node IN ({nodes}) AND {time} AND pid IN ({}) ",
            list(&d.pids)
        )
    };
    format!(
        "SELECT DISTINCT w.pid FROM {SCHED_WINDOWS} w WHERE w.node IN ({nodes}) AND {time} \
         AND ((({loader}) AND (w.cgroup_id = 0 OR w.cgroup_id IN ({cg}))) \
           OR (w.cgroup_id <> 0 AND w.comm IN ({comm}) AND w.cgroup_id IN ({cg})))",
        loader = named("w.comm"),
        cg = cuda("cgroup_id"),
        comm = cuda("comm"),
    )
}

/// The target's busiest CUDA process, as `comm (pid N)`.
pub(crate) async fn trainer(
    engine: &QueryEngine,
    d: &ReportData,
    start_us: i64,
    end_us: i64,
) -> Result<Option<String>> {
    if d.pids.is_empty() || d.nodes.is_empty() {
        return Ok(None);
    }
    let q = format!(
        "SELECT pid, MAX(comm) AS comm, SUM(count) AS n FROM {CALL_WINDOWS} WHERE node IN ({}) AND pid IN ({}) AND {} \
         GROUP BY pid ORDER BY n DESC LIMIT 1",
        d.nodes.iter().map(|n| quote(n)).collect::<Vec<_>>().join(", "),
        list(&d.pids),
        time_predicate("window_start", start_us, end_us)
    );
    for b in engine.sql(&q).await? {
        let (pid, comm) = (b.primitives::<UInt32Type>("pid")?, b.strings("comm")?);
        if b.num_rows() > 0 {
            let name = if comm.is_valid(0) { comm.value(0) } else { "pid" };
            return Ok(Some(format!("{name} (pid {})", pid.value(0))));
        }
    }
    Ok(None)
}

/// The chain, when the GPU waits for input the workers are struggling to make.
pub(crate) fn input_bound(d: &ReportData, s: &Summary, workers: &[Worker], trainer: Option<&str>) -> Option<Chain> {
    let switches: f64 = workers.iter().map(|w| w.switches_per_s).sum();
    let cores: f64 = workers.iter().filter_map(|w| w.cores).sum();
    let busy = switches >= 500.0 || cores >= 1.0;
    // Over the whole span the target was seen in, gaps included: a trainer
    // seen in few windows has not launched more for it.
    let launches = match (d.series.first(), d.series.last()) {
        (Some(a), Some(b)) => d.launches as f64 / ((b.t_us - a.t_us) as f64 / 1e6 + d.window_secs),
        _ => 0.0,
    };
    // A GPU process (it calls CUDA) whose GPU idles: little time waiting on
    // it, and much time waiting in host code or hardly a launch at all (a
    // trace that sampled the trainer's scheduler events still counts its launches).
    let waiting_for_input = s.host_offcpu_share >= 0.3;
    let idle = s.wait_share < 0.2 && (waiting_for_input || launches < STARVED_LAUNCHES_PER_S);
    if d.ops.is_empty() || workers.is_empty() || !busy || !idle {
        return None;
    }
    let named: Vec<String> = workers
        .iter()
        .take(6)
        .map(|w| {
            let cpu = w.cores.map_or(String::new(), |c| format!(", {c:.1} cores"));
            format!("{} (pid {}): {:.0} switches/s{cpu}", w.comm, w.pid, w.switches_per_s)
        })
        .collect();
    Some(Chain {
call_sites: Vec::new(),
        explains: None,
        severity: if s.host_offcpu_share >= 0.5 || launches < STARVED_LAUNCHES_PER_S {
            Severity::High
        } else {
            Severity::Medium
        },
        cause: "input_bound".into(),
        title: "Input pipeline too slow → the GPU starves".into(),
        root_cause: vec![format!(
            "{} {}, while its {} data worker(s) context-switch {:.0} times/s{}: {}",
            trainer.or(d.comms.first().map(|c| c.as_str())).unwrap_or("the training process"),
            if waiting_for_input {
                format!("waits for input {} of the time in host code", pct(s.host_offcpu_share))
            } else {
                format!("launches only {launches:.1} kernels/s")
            },
            workers.len(),
            switches,
            if cores > 0.0 { format!(" and use {cores:.1} cores") } else { String::new() },
            named.join("; ")
        )],
        effect: vec![format!(
            "the GPU is mostly idle: the process waits on it only {} of the time and launches {:.1} kernels/s",
            pct(s.wait_share),
            launches
        )],
        contributing: vec![],
        fixes: vec![
            "size DataLoader num_workers to the cores the pod really has (cores − 2), not more: oversubscribed workers thrash".into(),
            "persistent_workers=True (no worker restart every epoch) and pin_memory=True (async host→device copies)".into(),
            "fetch whole batches (a BatchSampler, or a dataset __getitems__) instead of one sample per call; larger prefetch_factor".into(),
            "move decoding and augmentation to the GPU (torchvision.transforms.v2 on CUDA tensors, NVIDIA DALI)".into(),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::data::{OpStat, Point};

    /// Ten 1-s windows, `launches_per_s` in each.
    fn data_at(launches_per_s: f64) -> ReportData {
        let series = (0..10).map(|i| Point { t_us: i * 1_000_000, launches_per_s, ..Default::default() }).collect();
        let ops = vec![OpStat { op: "cudaLaunchKernel".into(), count: 400, ..Default::default() }];
        let launches = (launches_per_s * 10.0) as u64;
        let comms = vec!["python3".into()];
        ReportData { series, pids: vec![7], comms, window_secs: 1.0, ops, launches, ..Default::default() }
    }

    fn data() -> ReportData {
        data_at(40.0)
    }

    fn worker(pid: u32, switches: f64) -> Worker {
        Worker { pid, comm: "pt_data_worker".into(), switches_per_s: switches, cores: None }
    }

    #[test]
    fn an_idle_gpu_with_busy_workers_is_input_bound() {
        let d = data();
        let s = Summary { host_offcpu_share: 0.7, wait_share: 0.03, ..Default::default() };
        let w = [worker(11, 40_000.0), worker(12, 38_000.0)];
        let c = input_bound(&d, &s, &w, None).expect("a chain");
        assert_eq!((c.cause.as_str(), c.severity), ("input_bound", Severity::High));
        let root = &c.root_cause[0];
        assert!(root.contains("pt_data_worker (pid 11): 40000 switches/s"), "{root}");
        assert!(root.contains("2 data worker(s) context-switch 78000 times/s"), "{root}");
        assert!(c.effect[0].contains("launches 40.0 kernels/s"), "{:?}", c.effect);
        assert!(c.fixes.iter().any(|f| f.contains("persistent_workers")));
    }

    #[test]
    fn a_busy_gpu_or_quiet_workers_are_not() {
        let d = data();
        let w = [worker(11, 40_000.0)];
        let gpu_bound = Summary { host_offcpu_share: 0.7, wait_share: 0.6, ..Default::default() };
        assert!(input_bound(&d, &gpu_bound, &w, None).is_none(), "waits on the GPU: not starved");
        let fed = Summary { host_offcpu_share: 0.05, wait_share: 0.03, ..Default::default() };
        assert!(input_bound(&d, &fed, &w, None).is_none(), "not waiting for input");
        let s = Summary { host_offcpu_share: 0.7, wait_share: 0.03, ..Default::default() };
        assert!(input_bound(&d, &s, &[worker(11, 20.0)], None).is_none(), "quiet workers");
        assert!(input_bound(&d, &s, &[], None).is_none(), "no workers");
        let no_cuda = ReportData { ops: vec![], ..data_at(0.0) };
        assert!(input_bound(&no_cuda, &s, &w, None).is_none(), "a process that never calls CUDA is no starved trainer");
    }

    /// The recording the issue describes: 16-28 launches in ~96 s, the
    /// trainer's scheduler events sampled (little off-CPU seen), its
    /// workers switching hundreds of thousands of times.
    #[test]
    fn hardly_a_launch_with_busy_workers_is_starved_whatever_the_off_cpu_says() {
        let d = data_at(0.2);
        let s = Summary { host_offcpu_share: 0.02, wait_share: 0.0, ..Default::default() };
        let w = [worker(11, 2_500.0), Worker { comm: "pt_data_pin".into(), ..worker(12, 900.0) }];
        let c = input_bound(&d, &s, &w, None).expect("a chain");
        assert_eq!(c.severity, Severity::High);
        assert!(c.root_cause[0].contains("launches only 0.2 kernels/s"), "{:?}", c.root_cause);
        assert!(c.root_cause[0].contains("pt_data_pin (pid 12)"), "{:?}", c.root_cause);
        // Fed in time (40 launches/s) and not waiting: not starved.
        assert!(input_bound(&data(), &s, &w, None).is_none());
    }
}
