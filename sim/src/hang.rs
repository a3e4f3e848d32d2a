// SPDX-License-Identifier: Apache-2.0
//! A hung job (`hang@NODE:AT[+FOR]`): from AT the rank on NODE blocks in
//! host code (a deadlock, a stuck data loader, a dead filesystem) and every
//! other rank of its job waits in its end-of-step all-reduce for it. No call
//! returns, so no call rows; each rank's agent ships its scheduler time and
//! what it is inside (`progress_windows`), which is how the aggregator
//! names the rank the others wait for.

use std::time::Duration;

use ingero_model::rows::BatchBuilder;
use ingero_model::tables::{Common, ProgressRow, SchedRow};

use crate::faults::{FaultKind, Injection};

/// The op the waiting ranks are inside.
const WAITED_OP: (&str, &str) = ("nccl", "ncclAllReduce");
/// The call whose return ends each simulated step (its sync).
pub(crate) const STEP_OP: &str = "cudaStreamSynchronize";

/// One rank of a hung job in one window.
#[derive(Debug, Clone, PartialEq)]
pub struct Hung {
    /// Seconds since the job stopped, at the window's end.
    pub for_s: f64,
    /// This rank is the one the others wait for.
    pub culprit: bool,
}

/// Each rank's state when a hang holds the job of `ranks` at `t`.
pub(crate) fn of_job(ranks: &[usize], t: Duration, faults: &[Injection]) -> Option<Vec<Hung>> {
    let f = faults.iter().find(|f| f.kind == FaultKind::Hang && f.active(t) && ranks.iter().any(|&n| f.hits(n)))?;
    let for_s = (t - f.at).as_secs_f64() + 1.0;
    Some(ranks.iter().map(|&n| Hung { for_s, culprit: f.hits(n) }).collect())
}

/// The scheduler row: asleep all window, inside the all-reduce (waiters) or
/// in host code (the culprit).
pub(crate) fn sched_row(h: &Hung) -> SchedRow {
    let off = 980_000_000;
    SchedRow {
        threads: 1,
        on_cpu_ns: 1_000_000_000 - off,
        off_cpu_ns: off,
        runq_wait_ns: 0,
        runq_max_ns: 0,
        voluntary_switches: 2,
        involuntary_switches: 0,
        wakeups: 2,
        off_cpu_in_call_ns: Some(if h.culprit { 0 } else { off }),
        runq_wait_in_call_ns: Some(0),
    }
}

/// What the rank is inside at the window's end (`progress_windows`).
pub(crate) fn progress_row(h: &Hung, tid: u32) -> ProgressRow<'static> {
    let age = (h.for_s * 1e9) as u64;
    let waits = !h.culprit;
    ProgressRow {
        threads_in_call: waits as u32,
        oldest_library: waits.then_some(WAITED_OP.0),
        oldest_op: waits.then_some(WAITED_OP.1),
        oldest_tid: waits.then_some(tid),
        oldest_age_ns: waits.then_some(age),
        last_call_age_ns: Some(age),
        proc_state: Some("S"),
        // A hung rank ends no step.
        steps: Some(0),
        step_p50_ns: None,
        step_max_ns: None,
        step_op: Some(STEP_OP),
    }
}

/// Appends a hung rank's rows.
pub(crate) fn append(sched: &mut BatchBuilder, progress: &mut BatchBuilder, common: &Common, h: &Hung) {
    sched.append(common, &sched_row(h)).expect("simulated row fits the schema");
    progress.append(common, &progress_row(h, common.pid)).expect("simulated row fits the schema");
}
