// SPDX-License-Identifier: Apache-2.0
//! The agent's cost to the processes it traces, per window. Every probed
//! call traps once at entry and once more at return where it is
//! return-probed; calls made inside traced calls (the driver's launch under
//! the runtime's) trap too, counted in the thread slots. Each trap costs
//! what `probes::trap_cost` measured at start; the programs' own time is
//! the separately sampled `probe_run_ns`. Under a duty cycle the
//! duty-cycled probes trap only while they are on (`ratio` of the window).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::probes::abi::{CallKey, CallVal};
use crate::probes::ops;

/// One window's trap cost.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct WindowCost {
    /// Time all traced processes spent in the agent's traps.
    pub total_ns: u64,
    /// The process that spent the largest share of one CPU in them, and that share.
    pub busiest: Option<(u32, f64)>,
    /// Per process, the share of one CPU its traps would take with every
    /// probe on: (pid, the probes always on, the duty-cycled ones).
    pub need: Vec<(u32, f64, f64)>,
}

/// Traps per process in the window, times `trap_ns`. `calls` and `nested`
/// hold the window's counts as estimated (`crate::sampling`): of a
/// process's duty-cycled calls only the share `seen(pid)` trapped.
pub(crate) fn window_cost(
    trap_ns: f64,
    calls: &[(CallKey, CallVal)],
    nested: &HashMap<u32, u64>,
    window: Duration,
    seen: impl Fn(u32) -> f64,
) -> WindowCost {
    let probed = ops::all();
    // pid → (traps of probes always on, traps of duty-cycled ones).
    let mut traps: HashMap<u32, (u64, u64)> = nested.iter().map(|(&p, &n)| (p, (0, n))).collect();
    for (k, v) in calls {
        let t = traps.entry(k.tgid).or_default();
        match probed.get(k.op as usize) {
            Some(op) if op.return_probed() => t.0 += 2 * v.count,
            Some(op) if op.duty_cycled() => t.1 += v.count,
            _ => t.0 += v.count,
        }
    }
    let secs = window.as_secs_f64().max(1e-9);
    let share = |n: f64| n * trap_ns / 1e9 / secs;
    let spent = |pid: u32, &(on, cycled): &(u64, u64)| on as f64 + cycled as f64 * seen(pid);
    let total_ns = traps.iter().map(|(&p, t)| spent(p, t) * trap_ns).sum::<f64>() as u64;
    let busiest = traps
        .iter()
        .map(|(&tgid, t)| (tgid, share(spent(tgid, t))))
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
    let mut need: Vec<_> =
        traps.iter().map(|(&p, &(on, cycled))| (p, share(on as f64), share(cycled as f64))).collect();
    need.sort_by_key(|n| n.0);
    WindowCost { total_ns, busiest, need }
}

/// Says once per process when its traps would take more than the budget.
#[derive(Debug, Default)]
pub(crate) struct OverGoal {
    warned: HashSet<u32>,
}

impl OverGoal {
    /// `budget`: the share of a CPU allowed (None: no budget, 1% is said);
    /// `duty`: whether a duty cycle keeps it on this kernel.
    pub(crate) fn check(&mut self, c: &WindowCost, budget: Option<f64>, duty: bool) {
        let limit = budget.unwrap_or(0.01);
        for &(pid, on, cycled) in &c.need {
            if on + cycled <= limit || !self.warned.insert(pid) {
                continue;
            }
            let percent = format!("{:.2}", (on + cycled) * 100.0);
            let budget_percent = format!("{:.2}", limit * 100.0);
            if budget.is_some() && duty {
                tracing::info!(
                    pid,
                    percent,
                    budget_percent,
                    "with every probe on, the agent's traps would cost this process more than --trap-budget: launch-type calls are counted from a duty cycle (sample_ratio in call_windows)"
                );
            } else {
                let why = if budget.is_some() {
                    "no duty cycle on this kernel (uprobe_multi links, Linux 6.6+)"
                } else {
                    "--trap-budget is off"
                };
                tracing::warn!(
                    pid,
                    percent,
                    budget_percent,
                    why,
                    "the agent's traps cost this process more than the budget; counts stay exact"
                );
            }
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
        let c = window_cost(1000.0, &calls, &nested, Duration::from_secs(1), |_| 1.0);
        // (10,000 + 2 x 100 + 10,000) traps x 1 us = 20.2 ms of 1 s.
        assert_eq!(c.total_ns, (20_200 + 50) * 1000);
        let (tgid, share) = c.busiest.unwrap();
        assert_eq!(tgid, 1);
        assert!((share - 0.0202).abs() < 1e-9, "{share}");
        assert!(share > 0.01);
        assert_eq!(window_cost(1000.0, &[], &HashMap::new(), Duration::from_secs(1), |_| 1.0), WindowCost::default());
        // Launches and their nested driver calls are the duty-cycled part;
        // the syncs' traps are always paid.
        assert_eq!(
            c.need.iter().find(|n| n.0 == 1).map(|n| ((n.1 * 1e6).round(), (n.2 * 1e6).round())),
            Some((200.0, 20_000.0))
        );
        // Sampled a quarter of the time: the estimates' traps were paid a quarter of the time.
        let q = window_cost(1000.0, &calls, &nested, Duration::from_secs(1), |_| 0.25);
        assert_eq!(q.total_ns, (200 + 5_000 + 50 / 4) * 1000 + 500);
        assert!((q.busiest.unwrap().1 - 0.0052).abs() < 1e-9);
    }
}
