// SPDX-License-Identifier: Apache-2.0
//! What an export shows, read with SQL (from `--server` or a store):
//! processes with their per-window scheduler and call counters, outlier
//! calls per thread, and the detector's score and flagged spans per node.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, UInt64Type};

use crate::commands::{CmdResult, SourceArgs, sql};
use ingero_analysis::query::{quote, time_predicate};
use ingero_model::table::names::{CALL_WINDOWS, HOST_EVENTS, SCHED_WINDOWS, STALL_EVENTS};

/// Which rows: a time range, optionally one job and some nodes.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    pub start_us: i64,
    pub end_us: i64,
    pub job: Option<String>,
    pub nodes: Vec<String>,
}

impl Scope {
    /// Rows of the range whose time is in `col` (window_start, or event_time
    /// for stall_events), in the job and on the nodes asked for.
    fn filter(&self, col: &str) -> String {
        let mut f = time_predicate(col, self.start_us, self.end_us);
        if let Some(j) = &self.job {
            f.push_str(&format!(" AND job = {}", quote(j)));
        }
        if !self.nodes.is_empty() {
            let list: Vec<String> = self.nodes.iter().map(|n| quote(n)).collect();
            f.push_str(&format!(" AND node IN ({})", list.join(", ")));
        }
        f
    }
}

/// One process: (node, pid) and what names it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Process {
    pub comm: String,
    pub pod: Option<String>,
    pub job: Option<String>,
    pub rank: Option<i64>,
    /// (window_start µs, window µs, on-CPU, off-CPU, off-CPU inside calls, run-queue wait) in ns.
    pub sched: Vec<[i64; 6]>,
    /// (window_start µs, window µs, calls).
    pub calls: Vec<[i64; 3]>,
    /// Outlier calls by thread.
    pub stalls: BTreeMap<i64, Vec<Stall>>,
    /// What the job wrote about itself (imported traces): steps, epochs.
    pub annotations: Vec<Annotation>,
}

/// One annotation: its labels at an instant (span 0) or over a span.
#[derive(Debug, Clone)]
pub(crate) struct Annotation {
    pub start_us: i64,
    pub span_ns: i64,
    /// (key, value), sorted by key.
    pub labels: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub(crate) struct Stall {
    pub start_us: i64,
    pub duration_ns: i64,
    pub library: String,
    pub op: String,
    pub threshold_ns: i64,
    pub reason: String,
    pub stack_id: Option<u64>,
}

/// Everything by node, then pid.
pub(crate) type Nodes = BTreeMap<String, BTreeMap<i64, Process>>;

fn ints(b: &RecordBatch, col: &str) -> Vec<Option<i64>> {
    let Some(c) = b.column_by_name(col) else { return vec![None; b.num_rows()] };
    // Timestamps cast to their raw µs.
    let c = arrow::compute::cast(c, &DataType::Int64)
        .unwrap_or_else(|_| arrow::array::new_null_array(&DataType::Int64, b.num_rows()));
    let a = c.as_primitive::<Int64Type>();
    (0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i))).collect()
}

/// Unsigned 64-bit ids (stack ids use the whole range: a cast to i64 would null half of them).
fn u64s(b: &RecordBatch, col: &str) -> Vec<Option<u64>> {
    let Some(c) = b.column_by_name(col) else { return vec![None; b.num_rows()] };
    let Ok(c) = arrow::compute::cast(c, &DataType::UInt64) else { return vec![None; b.num_rows()] };
    let a = c.as_primitive::<UInt64Type>();
    (0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i))).collect()
}

fn strs(b: &RecordBatch, col: &str) -> Vec<Option<String>> {
    let Some(c) = b.column_by_name(col) else { return vec![None; b.num_rows()] };
    let c = arrow::compute::cast(c, &DataType::Utf8)
        .unwrap_or_else(|_| arrow::array::new_null_array(&DataType::Utf8, b.num_rows()));
    let a = c.as_string::<i32>();
    (0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i).to_string())).collect()
}

fn process<'a>(nodes: &'a mut Nodes, i: usize, cols: &Cols) -> &'a mut Process {
    let node = cols.node[i].clone().unwrap_or_default();
    let p = nodes.entry(node).or_default().entry(cols.pid[i].unwrap_or(0)).or_default();
    if p.comm.is_empty() {
        p.comm = cols.comm[i].clone().unwrap_or_default();
        p.pod = match (&cols.ns[i], &cols.pod[i]) {
            (Some(ns), Some(pod)) => Some(format!("{ns}/{pod}")),
            _ => None,
        };
        p.job.clone_from(&cols.job[i]);
        p.rank = cols.rank[i];
    }
    p
}

/// The columns every table starts with.
struct Cols {
    node: Vec<Option<String>>,
    pid: Vec<Option<i64>>,
    comm: Vec<Option<String>>,
    ns: Vec<Option<String>>,
    pod: Vec<Option<String>>,
    job: Vec<Option<String>>,
    rank: Vec<Option<i64>>,
}

impl Cols {
    fn of(b: &RecordBatch) -> Cols {
        Cols {
            node: strs(b, "node"),
            pid: ints(b, "pid"),
            comm: strs(b, "comm"),
            ns: strs(b, "namespace"),
            pod: strs(b, "pod"),
            job: strs(b, "job"),
            rank: ints(b, "rank"),
        }
    }
}

const COMMON: &str = "node, pid, comm, namespace, pod, job, rank";

/// Scheduler windows and call counts of every process in scope.
pub(crate) async fn windows(source: &SourceArgs, scope: &Scope, nodes: &mut Nodes) -> CmdResult {
    let f = scope.filter("window_start");
    let q = format!(
        "SELECT {COMMON}, window_start, window_us, on_cpu_ns, off_cpu_ns, off_cpu_in_call_ns, runq_wait_ns \
         FROM {SCHED_WINDOWS} WHERE pid <> 0 AND {f} ORDER BY window_start"
    );
    for b in sql::batches(source, &q).await? {
        let cols = Cols::of(&b);
        let v: Vec<Vec<Option<i64>>> =
            ["window_start", "window_us", "on_cpu_ns", "off_cpu_ns", "off_cpu_in_call_ns", "runq_wait_ns"]
                .iter()
                .map(|c| ints(&b, c))
                .collect();
        let windows: Vec<[i64; 6]> = (0..b.num_rows()).map(|i| std::array::from_fn(|k| v[k][i].unwrap_or(0))).collect();
        for (i, row) in windows.into_iter().enumerate() {
            process(nodes, i, &cols).sched.push(row);
        }
    }
    let q = format!(
        "SELECT {COMMON}, window_start, max(window_us) AS window_us, sum(count) AS calls FROM {CALL_WINDOWS} \
         WHERE pid <> 0 AND {f} GROUP BY {COMMON}, window_start ORDER BY window_start"
    );
    for b in sql::batches(source, &q).await? {
        let cols = Cols::of(&b);
        let (t, w, n) = (ints(&b, "window_start"), ints(&b, "window_us"), ints(&b, "calls"));
        for i in 0..b.num_rows() {
            let row = [t[i].unwrap_or(0), w[i].unwrap_or(0), n[i].unwrap_or(0)];
            process(nodes, i, &cols).calls.push(row);
        }
    }
    Ok(())
}

/// The `max` longest outlier calls in scope; returns (kept, found).
pub(crate) async fn stalls(
    source: &SourceArgs,
    scope: &Scope,
    max: usize,
    nodes: &mut Nodes,
) -> CmdResult<(usize, usize)> {
    let f = scope.filter("event_time");
    let total = sql::batches(source, &format!("SELECT count(*) AS n FROM {STALL_EVENTS} WHERE {f}")).await?;
    let found = total.first().and_then(|b| ints(b, "n").first().copied().flatten()).unwrap_or(0) as usize;
    let q = format!(
        "SELECT {COMMON}, tid, event_time, duration_ns, library, op, threshold_ns, reason, stack_id \
         FROM {STALL_EVENTS} WHERE {f} ORDER BY duration_ns DESC LIMIT {max}"
    );
    let mut kept = 0;
    for b in sql::batches(source, &q).await? {
        let cols = Cols::of(&b);
        let (tid, t, d, th, stack) = (
            ints(&b, "tid"),
            ints(&b, "event_time"),
            ints(&b, "duration_ns"),
            ints(&b, "threshold_ns"),
            u64s(&b, "stack_id"),
        );
        let (lib, op, reason) = (strs(&b, "library"), strs(&b, "op"), strs(&b, "reason"));
        for i in 0..b.num_rows() {
            let s = Stall {
                start_us: t[i].unwrap_or(0),
                duration_ns: d[i].unwrap_or(0),
                library: lib[i].clone().unwrap_or_default(),
                op: op[i].clone().unwrap_or_default(),
                threshold_ns: th[i].unwrap_or(0),
                reason: reason[i].clone().unwrap_or_default(),
                stack_id: stack[i],
            };
            let p = process(nodes, i, &cols);
            p.stalls.entry(tid[i].unwrap_or(0)).or_default().push(s);
            kept += 1;
        }
    }
    Ok((kept, found))
}

/// The annotations in scope (trace-wide ones under pid 0).
pub(crate) async fn annotations(source: &SourceArgs, scope: &Scope, nodes: &mut Nodes) -> CmdResult<usize> {
    let f = scope.filter("event_time");
    let q = format!(
        "SELECT {COMMON}, event_time, value, detail FROM {HOST_EVENTS} WHERE kind = 'annotation' AND {f} ORDER BY event_time"
    );
    let mut n = 0;
    for b in sql::batches(source, &q).await? {
        let cols = Cols::of(&b);
        let (t, span, detail) = (ints(&b, "event_time"), ints(&b, "value"), strs(&b, "detail"));
        for i in 0..b.num_rows() {
            let labels: BTreeMap<String, String> =
                detail[i].as_deref().and_then(|d| serde_json::from_str(d).ok()).unwrap_or_default();
            let a = Annotation {
                start_us: t[i].unwrap_or(0),
                span_ns: span[i].unwrap_or(0).max(0),
                labels: labels.into_iter().collect(),
            };
            process(nodes, i, &cols).annotations.push(a);
            n += 1;
        }
    }
    Ok(n)
}
