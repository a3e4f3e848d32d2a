// SPDX-License-Identifier: Apache-2.0
//! The hung-rank chain: from the stored `progress_windows` of the target's
//! job, the windows in which the others waited for a rank on the target's
//! node (the same judgement as the live detector's `stuck`).

use std::collections::BTreeMap;

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::{Int32Type, Int64Type, UInt32Type, UInt64Type};

use super::chains::{Chain, Severity};
use super::data::ReportData;
use crate::error::Result;
use crate::query::columns::Columns;
use crate::query::{QueryEngine, quote, time_predicate};
use crate::rank::detector::DetectorConfig;
use crate::rank::signals::Signals;
use crate::rank::stuck::{Culprit, ProcProgress, culprits};
use ingero_model::table::names::PROGRESS_WINDOWS;
use ingero_model::time::rfc3339;

/// The chain, when one of the target's nodes held the rank a stuck job of
/// it waited for in [start_us, end_us).
pub(crate) async fn chain(
    engine: &QueryEngine,
    d: &ReportData,
    start_us: i64,
    end_us: i64,
    cfg: &DetectorConfig,
) -> Result<Option<Chain>> {
    let Some(job) = d.jobs.first() else { return Ok(None) };
    let sql = format!(
        "SELECT node, CAST(window_start AS BIGINT) AS t, {PROC_COLUMNS} FROM {PROGRESS_WINDOWS} WHERE job = {} AND {}",
        quote(job),
        time_predicate("window_start", start_us, end_us)
    );
    let mut windows: BTreeMap<i64, BTreeMap<String, Signals>> = BTreeMap::new();
    for b in engine.sql(&sql).await? {
        rows(&b, &mut windows)?;
    }
    let after = cfg.stuck_after.as_nanos() as f64;
    let mut found: Vec<(i64, String, Culprit)> = Vec::new();
    for (t, nodes) in &windows {
        let pairs: Vec<(&String, &Signals)> = nodes.iter().collect();
        for c in culprits(after, &pairs) {
            let node = pairs[c.node].0.clone();
            if d.nodes.contains(&node) {
                found.push((*t, node, c));
            }
        }
    }
    let (Some(first), Some((_, node, last))) = (found.first().map(|f| f.0), found.last()) else { return Ok(None) };
    let mut c = hung_rank(job, node, last, first, found.len());
    c.explains = Some((found.len() as f64 / d.series.len().max(1) as f64).min(1.0));
    Ok(Some(c))
}

fn rows(b: &RecordBatch, windows: &mut BTreeMap<i64, BTreeMap<String, Signals>>) -> Result<()> {
    let (node, t) = (b.strings("node")?, b.primitives::<Int64Type>("t")?);
    for (i, p) in procs_of(b)?.into_iter().enumerate() {
        windows.entry(t.value(i)).or_default().entry(node.value(i).to_string()).or_default().procs.push(p);
    }
    Ok(())
}

/// The SQL columns [`procs_of`] reads from `progress_windows`.
pub(crate) const PROC_COLUMNS: &str =
    "pid, rank, comm, threads_in_call, oldest_op, oldest_age_ns, last_call_age_ns, proc_state";

/// Each row's process as it stood at the end of its window (the columns of
/// [`PROC_COLUMNS`]).
pub(crate) fn procs_of(b: &RecordBatch) -> Result<Vec<ProcProgress>> {
    let (pid, rank) = (b.primitives::<UInt32Type>("pid")?, b.primitives::<Int32Type>("rank")?);
    let (comm, in_call) = (b.strings("comm")?, b.primitives::<UInt32Type>("threads_in_call")?);
    let (op, age) = (b.strings("oldest_op")?, b.primitives::<UInt64Type>("oldest_age_ns")?);
    let (last, state) = (b.primitives::<UInt64Type>("last_call_age_ns")?, b.strings("proc_state")?);
    Ok((0..b.num_rows())
        .map(|i| ProcProgress {
            pid: pid.value(i),
            rank: rank.is_valid(i).then(|| rank.value(i)),
            comm: comm.value(i).to_string(),
            threads_in_call: in_call.value(i),
            op: op.is_valid(i).then(|| op.value(i).to_string()),
            age_ns: age.is_valid(i).then(|| age.value(i)),
            last_call_age_ns: last.is_valid(i).then(|| last.value(i)),
            state: state.is_valid(i).then(|| state.value(i).to_string()),
            ..Default::default()
        })
        .collect())
}

fn hung_rank(job: &str, node: &str, c: &Culprit, since_us: i64, windows: usize) -> Chain {
    let pid = c.proc.pid;
    Chain {
call_sites: Vec::new(),
        explains: None,
        severity: Severity::High,
        cause: "hung_rank".into(),
        title: "Hung rank → the whole job waits".into(),
        root_cause: vec![format!("on {node}: {}", c.dev.text)],
        effect: vec![format!(
            "every other rank of {job} waits for it, its GPUs idle but held, since {} ({windows} window(s) seen stuck)",
            rfc3339(since_us)
        )],
        contributing: vec![],
        fixes: vec![
            format!("see where it is: `py-spy dump --pid {pid}` (Python stacks) or `gdb -p {pid} -batch -ex 'thread apply all bt'` on {node}"),
            "record which collective each rank entered last: NCCL_DEBUG=INFO, PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1)".into(),
            "fail fast instead of holding every GPU: init_process_group(timeout=timedelta(minutes=5)) with TORCH_NCCL_ASYNC_ERROR_HANDLING=1, so the job restarts from its checkpoint".into(),
        ],
    }
}
