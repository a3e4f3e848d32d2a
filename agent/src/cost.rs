// SPDX-License-Identifier: Apache-2.0
//! The agent's cost to the processes it traces, per window. Every probed
//! call traps once at entry and once more at return where it is
//! return-probed; calls made inside traced calls (the driver's launch under
//! the runtime's) trap too, counted in the thread slots. Each trap costs
//! what `probes::trap_cost` measured at start; the programs' own time is
//! the separately sampled `probe_run_ns`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::probes::abi::{CallKey, CallVal};
use crate::probes::ops;

/// The share of one CPU that the goal allows the agent's traps in one
/// traced process (issue: under 1%).
pub(crate) const GOAL_SHARE: f64 = 0.01;

/// One window's trap cost.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct WindowCost {
    /// Time all traced processes spent in the agent's traps.
    pub total_ns: u64,
    /// The process that spent the largest share of one CPU in them, and that share.
    pub busiest: Option<(u32, f64)>,
}

/// Traps per process in the window, times `trap_ns`.
pub(crate) fn window_cost(
    trap_ns: f64,
    calls: &[(CallKey, CallVal)],
    nested: &HashMap<u32, u64>,
    window: Duration,
) -> WindowCost {
    let probed = ops::all();
    let mut traps: HashMap<u32, u64> = nested.clone();
    for (k, v) in calls {
        let per_call = match probed.get(k.op as usize) {
            Some(op) if op.return_probed() => 2,
            _ => 1,
        };
        *traps.entry(k.tgid).or_insert(0) += v.count * per_call;
    }
    let cost = |n: u64| n as f64 * trap_ns;
    let total_ns = traps.values().map(|&n| cost(n)).sum::<f64>() as u64;
    let secs = window.as_secs_f64().max(1e-9);
    let busiest = traps
        .iter()
        .map(|(&tgid, &n)| (tgid, cost(n) / 1e9 / secs))
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
    WindowCost { total_ns, busiest }
}

/// Says once per process when its traps take more than the goal's share.
#[derive(Debug, Default)]
pub(crate) struct OverGoal {
    warned: HashSet<u32>,
}

impl OverGoal {
    pub(crate) fn check(&mut self, c: &WindowCost) {
        let Some((pid, share)) = c.busiest else { return };
        if share > GOAL_SHARE && self.warned.insert(pid) {
            tracing::warn!(
                pid,
                percent = format!("{:.1}", share * 100.0),
                "the agent's probes cost this process more than 1% of a CPU (probed calls x the trap cost measured at start); counts stay exact (no duty cycle bounds the cost yet)"
            );
        }
    }

    pub(crate) fn forget(&mut self, pid: u32) {
        self.warned.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::abi::HIST_BUCKETS;

    fn row(tgid: u32, op: &str, count: u64) -> (CallKey, CallVal) {
        let op = ops::all().iter().find(|o| o.symbol == op).unwrap().id as u32;
        (CallKey { tgid, op }, CallVal { count, errors: 0, total_ns: 0, max_ns: 0, hist: [0; HIST_BUCKETS] })
    }

    #[test]
    fn launches_trap_once_timed_calls_twice_nested_calls_once() {
        let calls =
            [row(1, "cudaLaunchKernel", 10_000), row(1, "cudaStreamSynchronize", 100), row(2, "cudaLaunchKernel", 50)];
        // 10,000 runtime launches, each with its driver launch nested (10,000 more traps).
        let nested = HashMap::from([(1, 10_000)]);
        let c = window_cost(1000.0, &calls, &nested, Duration::from_secs(1));
        // (10,000 + 2 x 100 + 10,000) traps x 1 us = 20.2 ms of 1 s.
        assert_eq!(c.total_ns, (20_200 + 50) * 1000);
        let (tgid, share) = c.busiest.unwrap();
        assert_eq!(tgid, 1);
        assert!((share - 0.0202).abs() < 1e-9, "{share}");
        assert!(share > GOAL_SHARE);
        assert_eq!(window_cost(1000.0, &[], &HashMap::new(), Duration::from_secs(1)), WindowCost::default());
    }
}
