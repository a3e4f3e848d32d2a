//! Our diagnosis next to the one the source product stored with an imported
//! trace: for each of its causal chains, do we confirm, refine or disagree —
//! and why, in numbers.

use serde::Serialize;

use super::chains::{Chain, Summary, fmt_ns};
use super::cuda::cause_for_op;
use super::data::ReportData;
use crate::import::source::RefChain;

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
}

pub(crate) fn judge(d: &ReportData, s: &Summary, ours: &[Chain]) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = Vec::new();
    for json in &d.reference {
        let Ok(r) = serde_json::from_str::<RefChain>(json) else { continue };
        if out.iter().any(|v| v.id == r.id) {
            continue;
        }
        let mut v = Verdict {
            id: r.id.clone(),
            their_summary: r.summary.clone(),
            their_root_cause: r.root_cause.clone(),
            verdict: "disagree".into(),
            our_cause: None,
            why: String::new(),
        };
        let op = d.ops.iter().find(|o| !r.cuda_op.is_empty() && (o.op == r.cuda_op || o.op.starts_with(&r.cuda_op)));
        let host_cause = r.root_cause.contains("sched_switch") || r.explanation.contains("sched_switch");
        match op {
            None if !r.cuda_op.is_empty() => {
                v.why = format!("no {} calls in the imported windows, so the tail cannot be checked", r.cuda_op);
            }
            None => {
                v.verdict = "confirm".into();
                v.why = "not about a CUDA op; recorded as is".into();
            }
            Some(o) => {
                let (p50, p99) = (o.p50_ns.unwrap_or(0), o.p99_ns.unwrap_or(0));
                let ratio = if p50 > 0 { p99 as f64 / p50 as f64 } else { 0.0 };
                let ours_txt = format!(
                    "our {} p99 {} = {:.1}x p50 {} over {} calls (theirs: p99 {}µs = {:.1}x p50)",
                    o.op,
                    fmt_ns(p99),
                    ratio,
                    fmt_ns(p50),
                    o.count,
                    r.p99_us,
                    r.tail_ratio
                );
                let cause = cause_for_op(&o.op);
                let chain = ours.iter().find(|c| c.cause == cause);
                if ratio < 1.5 {
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
        }
        out.push(v);
    }
    out
}
