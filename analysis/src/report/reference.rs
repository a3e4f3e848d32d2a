// SPDX-License-Identifier: Apache-2.0
//! Our diagnosis next to the one the source product stored with an imported
//! trace: for each of its causal chains, do we confirm, refine or disagree —
//! and why, in numbers.

use serde::Serialize;

use super::chains::{Chain, Summary, fmt_ns};
use super::cuda::cause_for_op;
use super::data::{OpStat, ReportData};
use crate::import::source::RefChain;
use ingero_model::time::rfc3339;

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Verdict {
    pub id: String,
    pub their_summary: String,
    pub their_root_cause: String,
    /// confirm | refine | disagree
    pub verdict: String,
    /// The cause of ours it maps to, if any.
    pub our_cause: Option<String>,
    pub why: String,
    /// How many times the source stored this diagnosis (the same one,
    /// numbers aside), and when first and last.
    #[serde(default = "one")]
    pub count: usize,
    #[serde(default)]
    pub first: String,
    #[serde(default)]
    pub last: String,
}

fn one() -> usize {
    1
}

/// One distinct diagnosis: severity, op and summary with its numbers
/// blanked (the source stores the same chain again at every detection).
fn group_key(r: &RefChain) -> (String, String, String) {
    let mut summary = String::with_capacity(r.summary.len());
    let mut in_num = false;
    for c in r.summary.chars() {
        if c.is_ascii_digit() || (in_num && c == '.') {
            if !in_num {
                summary.push('#');
            }
            in_num = true;
        } else {
            in_num = false;
            summary.push(c);
        }
    }
    (r.severity.clone(), r.cuda_op.clone(), summary)
}

/// The stored chains, one group per distinct diagnosis, in first-seen order.
fn groups(d: &ReportData) -> Vec<Vec<RefChain>> {
    let mut out: Vec<((String, String, String), Vec<RefChain>)> = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for r in d.reference.iter().filter_map(|j| serde_json::from_str::<RefChain>(j).ok()) {
        if !ids.insert(r.id.clone()) {
            continue;
        }
        let k = group_key(&r);
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(r),
            None => out.push((k, vec![r])),
        }
    }
    out.into_iter().map(|(_, v)| v).collect()
}

pub(crate) fn judge(d: &ReportData, s: &Summary, ours: &[Chain]) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = Vec::new();
    for group in groups(d) {
        let r = &group[group.len() - 1];
        let when = |c: &RefChain| rfc3339(c.detected_ns / 1000);
        let mut v = Verdict {
            id: r.id.clone(),
            their_summary: r.summary.clone(),
            their_root_cause: r.root_cause.clone(),
            verdict: "disagree".into(),
            our_cause: None,
            why: String::new(),
            count: group.len(),
            first: when(&group[0]),
            last: when(r),
        };
        let op = d.ops.iter().find(|o| !r.cuda_op.is_empty() && (o.op == r.cuda_op || o.op.starts_with(&r.cuda_op)));
        let host_cause = r.root_cause.contains("sched_switch") || r.explanation.contains("sched_switch");
        match op {
            // A driver op the runtime called inside its own calls: counted there.
            None if r.cuda_op.starts_with("cu")
                && !r.cuda_op.starts_with("cuda")
                && d.ops.iter().any(|o| o.op.starts_with("cuda")) =>
            {
                v.verdict = "refine".into();
                v.why = format!(
                    "every stored {} ran inside a runtime call on the same thread, counted there as the agent counts it: the runtime call's verdict is this one's",
                    r.cuda_op
                );
            }
            None if !r.cuda_op.is_empty() => {
                v.why = format!("no {} calls in the imported windows, so the tail cannot be checked", r.cuda_op);
            }
            None => {
                v.verdict = "confirm".into();
                v.why = "not about a CUDA op; recorded as is".into();
            }
            Some(o) => judge_op(&mut v, (r, host_cause), o, s, ours),
        }
        out.push(v);
    }
    out
}

/// The verdict on a diagnosis about an op we have calls of.
fn judge_op(v: &mut Verdict, (r, host_cause): (&RefChain, bool), o: &OpStat, s: &Summary, ours: &[Chain]) {
    let (p50, p99) = (o.p50_ns.unwrap_or(0), o.p99_ns.unwrap_or(0));
    let ratio = if p50 > 0 { p99 as f64 / p50 as f64 } else { 0.0 };
    let ours_txt = format!(
        "our {} p99 {} = {:.1}x p50 {} over {}{} calls (theirs: p99 {}µs = {:.1}x p50)",
        o.op,
        fmt_ns(p99),
        ratio,
        fmt_ns(p50),
        // Part of the count estimated under the trap budget.
        if o.seen_share.is_some() { "≈" } else { "" },
        o.count,
        r.p99_us,
        r.tail_ratio
    );
    let cause = cause_for_op(&o.op);
    let chain = ours.iter().find(|c| c.cause == cause);
    let theirs_ns = r.p99_us as f64 * 1e3;
    let near = p99 > 0 && (0.5..=2.0).contains(&(p99 as f64 / theirs_ns.max(1.0)));
    if ratio < 1.5 && o.sampled && near {
        // Most calls were counted, not stored: their durations are
        // the minute's mean, so the tail's shape is the recorder's to tell.
        v.verdict = "confirm".into();
        v.why = format!(
            "{ours_txt}: the same p99 within 2x; the recorder stored a sample of these calls and counted the rest, so its tail ratio stands"
        );
    } else if ratio < 1.5 {
        v.why = format!("{ours_txt}: no tail in the windows we built");
    } else if let Some(c) = chain.filter(|c| matches!(c.cause.as_str(), "allocator_churn" | "copy_waits")) {
        v.verdict = "refine".into();
        v.our_cause = Some(c.cause.clone());
        v.why = format!(
            "{ours_txt}. The tail is real, but the op itself explains it: {}. {}",
            c.title,
            if host_cause {
                format!(
                    "The {} they blame are the thread sleeping inside the call while the GPU drains (off-CPU {:.0}% of thread time); the trace has no run-queue wait, so CPU contention is not shown",
                    r.root_cause,
                    s.offcpu_share * 100.0
                )
            } else {
                String::new()
            }
        );
    } else if let Some(c) = chain {
        v.verdict = "confirm".into();
        v.our_cause = Some(c.cause.clone());
        v.why = format!(
            "{ours_txt}; we see the same tail ({}), with threads off-CPU {:.0}% of their time",
            c.title,
            s.offcpu_share * 100.0
        );
    } else {
        v.verdict = "confirm".into();
        v.why = format!("{ours_txt}; the tail is there but below our threshold for a chain of its own");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_op(seen_share: Option<f64>) -> String {
        let theirs = RefChain {
            id: "c1".into(),
            detected_ns: 1_700_000_000_000_000_000,
            severity: "HIGH".into(),
            summary: "cudaStreamSynchronize p99 is 40x p50".into(),
            cuda_op: "cudaStreamSynchronize".into(),
            p99_us: 40_000,
            p50_us: 1_000,
            tail_ratio: 40.0,
            ..RefChain::default()
        };
        let d = ReportData {
            ops: vec![OpStat {
                library: "cudart".into(),
                op: "cudaStreamSynchronize".into(),
                count: 4_000,
                p50_ns: Some(1_000_000),
                p99_ns: Some(1_100_000),
                max_ns: 2_000_000,
                seen_share,
                ..OpStat::default()
            }],
            reference: vec![serde_json::to_string(&theirs).unwrap()],
            ..ReportData::default()
        };
        let v = judge(&d, &Summary::default(), &[]);
        assert_eq!(v.len(), 1);
        v[0].why.clone()
    }

    #[test]
    fn our_count_says_when_it_is_an_estimate() {
        assert!(with_op(None).contains("over 4000 calls"), "{}", with_op(None));
        assert!(with_op(Some(0.25)).contains("over ≈4000 calls"), "{}", with_op(Some(0.25)));
    }
}
