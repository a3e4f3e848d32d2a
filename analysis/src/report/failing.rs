// SPDX-License-Identifier: Apache-2.0
//! Calls that returned an error. Only timed calls (return-probed) carry
//! errors, and none of them answers "not yet" with an error code (stream
//! and event queries are entry-counted), so every error here is a failure:
//! a call that failed returned at once, and what the program believes it
//! queued, copied or waited for may not have happened.

use super::chains::{Chain, Severity};
use super::data::{OpStat, ReportData};
use super::ops::count_text;

/// Ops named, most errors first.
const SHOWN: usize = 4;

/// A chain when any call failed: High when an op failed at least half of
/// the time, Medium from 1%, else Low.
pub(crate) fn chain(d: &ReportData) -> Option<Chain> {
    let mut failing: Vec<&OpStat> = d.ops.iter().filter(|o| o.errors > 0).collect();
    if failing.is_empty() {
        return None;
    }
    failing.sort_by(|a, b| b.errors.cmp(&a.errors).then_with(|| a.op.cmp(&b.op)));
    let share = |o: &OpStat| o.errors as f64 / o.count.max(o.errors).max(1) as f64;
    let worst = failing.iter().map(|o| share(o)).fold(0.0, f64::max);
    let mut root_cause: Vec<String> = failing
        .iter()
        .take(SHOWN)
        .map(|o| {
            let (errors, n) = (count_text(o.errors, false), count_text(o.count.max(o.errors), false));
            format!("{errors} of {n} {} calls returned an error ({:.0}%)", o.op, share(o) * 100.0)
        })
        .collect();
    if failing.len() > SHOWN {
        root_cause.push(format!("and {} more ops (the JSON report's ops[].errors)", failing.len() - SHOWN));
    }
    Some(Chain {
        call_sites: Vec::new(),
        explains: None,
        severity: if worst >= 0.5 {
            Severity::High
        } else if worst >= 0.01 {
            Severity::Medium
        } else {
            Severity::Low
        },
        cause: "failing_calls".into(),
        title: "CUDA/NCCL calls fail → work may not have happened".into(),
        root_cause,
        effect: vec![
            "a failing call returns at once: what the program believes it queued, copied or waited for may not \
             have happened, and the times of these calls say nothing about the GPU"
                .into(),
        ],
        contributing: vec![],
        fixes: vec![
            "find the first failing call: run once with CUDA_LAUNCH_BLOCKING=1 and check every return code \
             (PyTorch raises on most; custom extensions and ctypes callers often ignore them)"
                .into(),
            "on this node: `nvidia-smi` (is the GPU visible to the pod? a driver older than the image's CUDA \
             runtime fails every call), and `dmesg` for Xid errors"
                .into(),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, count: u64, errors: u64) -> OpStat {
        OpStat { library: "cudart".into(), op: name.into(), count, errors, ..Default::default() }
    }

    #[test]
    fn failures_are_named_with_their_share_and_graded() {
        let mut d = ReportData {
            ops: vec![
                op("cudaLaunchKernel", 5000, 0),
                op("cudaStreamSynchronize", 156, 156),
                op("cudaMemcpy", 4000, 2),
            ],
            ..Default::default()
        };
        let c = chain(&d).unwrap();
        assert_eq!(c.severity, Severity::High);
        assert_eq!(
            c.root_cause,
            [
                "156 of 156 cudaStreamSynchronize calls returned an error (100%)",
                "2 of 4,000 cudaMemcpy calls returned an error (0%)"
            ]
        );
        d.ops = vec![op("ncclAllReduce", 1000, 20)];
        assert_eq!(chain(&d).unwrap().severity, Severity::Medium);
        d.ops = vec![op("cudaMalloc", 1000, 1)];
        assert_eq!(chain(&d).unwrap().severity, Severity::Low);
        d.ops = vec![op("cudaMalloc", 1000, 0)];
        assert!(chain(&d).is_none());
    }
}
