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

/// The workers of the target's processes in [start_us, end_us): children
/// from its fork events, with their scheduler rows.
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
    if children.is_empty() {
        return Ok(vec![]);
    }
    let span_s = (d.series.len() as f64 * d.window_secs).max(d.window_secs);
    let rows = engine
        .sql(&format!(
            "SELECT pid, MAX(comm) AS comm, SUM(CAST(voluntary_switches + involuntary_switches AS DOUBLE)) AS switches, \
             SUM(CAST(on_cpu_ns AS DOUBLE)) AS on_cpu_ns, CAST(COUNT(off_cpu_in_call_ns) AS DOUBLE) AS measured \
             FROM {SCHED_WINDOWS} WHERE node IN ({nodes}) AND {time} AND pid IN ({}) \
             AND pid NOT IN (SELECT DISTINCT pid FROM {CALL_WINDOWS} WHERE node IN ({nodes}) AND {time}) GROUP BY pid ORDER BY switches DESC",
            list(&children)
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

/// The chain, when the GPU waits for input the workers are struggling to make.
pub(crate) fn input_bound(d: &ReportData, s: &Summary, workers: &[Worker]) -> Option<Chain> {
    let switches: f64 = workers.iter().map(|w| w.switches_per_s).sum();
    let cores: f64 = workers.iter().filter_map(|w| w.cores).sum();
    let busy = switches >= 500.0 || cores >= 1.0;
    // Idle GPU: little time waiting on it, much time waiting in host code.
    if workers.is_empty() || !busy || s.wait_share >= 0.2 || s.host_offcpu_share < 0.3 {
        return None;
    }
    let launches = if d.series.is_empty() {
        0.0
    } else {
        d.series.iter().map(|p| p.launches_per_s).sum::<f64>() / d.series.len() as f64
    };
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
        severity: if s.host_offcpu_share >= 0.5 { Severity::High } else { Severity::Medium },
        cause: "input_bound".into(),
        title: "Input pipeline too slow → the GPU starves".into(),
        root_cause: vec![format!(
            "{} waits for input {} of the time in host code, while its {} data worker(s) context-switch {:.0} times/s{}: {}",
            d.comms.first().map_or("the training process", |c| c.as_str()),
            pct(s.host_offcpu_share),
            workers.len(),
            switches,
            if cores > 0.0 { format!(" and use {cores:.1} cores") } else { String::new() },
            named.join("; ")
        )],
        effect: vec![format!(
            "the GPU is mostly idle: the process waits on it only {} of the time and launches {:.0} kernels/s",
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
    use crate::report::data::Point;

    fn data() -> ReportData {
        let series =
            (0..10).map(|i| Point { t_us: i * 1_000_000, launches_per_s: 40.0, ..Default::default() }).collect();
        ReportData { series, pids: vec![7], comms: vec!["python3".into()], window_secs: 1.0, ..Default::default() }
    }

    fn worker(pid: u32, switches: f64) -> Worker {
        Worker { pid, comm: "pt_data_worker".into(), switches_per_s: switches, cores: None }
    }

    #[test]
    fn an_idle_gpu_with_busy_workers_is_input_bound() {
        let d = data();
        let s = Summary { host_offcpu_share: 0.7, wait_share: 0.03, ..Default::default() };
        let w = [worker(11, 40_000.0), worker(12, 38_000.0)];
        let c = input_bound(&d, &s, &w).expect("a chain");
        assert_eq!((c.cause.as_str(), c.severity), ("input_bound", Severity::High));
        let root = &c.root_cause[0];
        assert!(root.contains("pt_data_worker (pid 11): 40000 switches/s"), "{root}");
        assert!(root.contains("2 data worker(s) context-switch 78000 times/s"), "{root}");
        assert!(c.effect[0].contains("launches 40 kernels/s"), "{:?}", c.effect);
        assert!(c.fixes.iter().any(|f| f.contains("persistent_workers")));
    }

    #[test]
    fn a_busy_gpu_or_quiet_workers_are_not() {
        let d = data();
        let w = [worker(11, 40_000.0)];
        let gpu_bound = Summary { host_offcpu_share: 0.7, wait_share: 0.6, ..Default::default() };
        assert!(input_bound(&d, &gpu_bound, &w).is_none(), "waits on the GPU: not starved");
        let fed = Summary { host_offcpu_share: 0.05, wait_share: 0.03, ..Default::default() };
        assert!(input_bound(&d, &fed, &w).is_none(), "not waiting for input");
        let s = Summary { host_offcpu_share: 0.7, wait_share: 0.03, ..Default::default() };
        assert!(input_bound(&d, &s, &[worker(11, 20.0)]).is_none(), "quiet workers");
        assert!(input_bound(&d, &s, &[]).is_none(), "no workers");
    }
}
