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
use crate::model::RankWindow;

/// The op the waiting ranks are inside.
const WAITED_OP: (&str, &str) = ("nccl", "ncclAllReduce");

/// One rank of a hung job in one window.
#[derive(Debug, Clone, PartialEq)]
pub struct Hung {
    /// Seconds since the job stopped, at the window's end.
    pub for_s: f64,
    /// This rank is the one the others wait for.
    pub culprit: bool,
}

/// Every rank's window when a hang holds the job of `ranks` at `t`.
pub(crate) fn of_job(ranks: &[usize], t: Duration, faults: &[Injection]) -> Option<Vec<RankWindow>> {
    let f = faults.iter().find(|f| f.kind == FaultKind::Hang && f.active(t) && ranks.iter().any(|&n| f.hits(n)))?;
    let for_s = (t - f.at).as_secs_f64() + 1.0;
    let window = |node| RankWindow { hung: Some(Hung { for_s, culprit: f.hits(node) }), ..Default::default() };
    Some(ranks.iter().map(|&n| window(n)).collect())
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
    }
}

/// Appends a hung rank's rows.
pub(crate) fn append(sched: &mut BatchBuilder, progress: &mut BatchBuilder, common: &Common, h: &Hung) {
    sched.append(common, &sched_row(h)).expect("simulated row fits the schema");
    progress.append(common, &progress_row(h, common.pid)).expect("simulated row fits the schema");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RankId, Rng, rows, step_job};
    use ingero_model::Table;
    use ingero_model::signals::of_tables;

    /// Before the hang the job steps; during it no call returns, every rank
    /// ships what it is inside, and only the culprit is not in the
    /// all-reduce; after it the job steps again.
    #[test]
    fn a_hung_job_ships_what_each_rank_is_inside_and_no_calls() {
        let faults = vec![Injection::parse("hang@2:10s+30s", 4).unwrap()];
        let mut rng = Rng::new(3);
        let ranks = [0, 2];
        for (t, hung) in [(9, false), (10, true), (39, true), (40, false)] {
            let w = step_job(&ranks, Duration::from_secs(t), &faults, 0.05, &mut rng);
            for (i, r) in w.iter().enumerate() {
                assert_eq!(r.hung.is_some(), hung, "t={t}: {r:?}");
                let node = format!("node-{}", ranks[i]);
                let id = RankId { node: &node, job: "j", rank: i, world: 2, window_start_us: t as i64 * 1_000_000 };
                let tables = rows(&id, r, false, &mut rng);
                let has = |table| tables.iter().any(|(tb, _)| *tb == table);
                assert_eq!((has(Table::CallWindows), has(Table::ProgressWindows)), (!hung, hung), "t={t}");
                if !hung {
                    continue;
                }
                let tables: Vec<_> = tables.into_iter().map(|(t, b)| (t, vec![b])).collect();
                let s = &of_tables(&tables)[0].1;
                let p = &s.procs[0];
                let waited = (t - 10 + 1) as f64 * 1e9;
                assert_eq!(p.waits_in("ncclAllReduce", waited), ranks[i] != 2, "t={t} {p:?}");
                assert_eq!(p.last_call_age_ns, Some(waited as u64), "{p:?}");
                assert!(s.measured && s.wait_ns == 0.0, "{s:?}");
            }
        }
    }
}
