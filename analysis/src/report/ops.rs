// SPDX-License-Identifier: Apache-2.0
//! The per-op table (calls, time, p50/p99/max): what the target called, most
//! time first, with the counts the agent's duty cycle estimated marked as
//! such, whether or not a chain fired. The HTML here; the terminal's, wrapped
//! to 80 columns, in `text.rs` from the same cells.

use maud::{Markup, html};

use super::chains::fmt_ns;
use super::data::OpStat;

/// Rows shown; the JSON (`ops`) has every op.
pub(super) const SHOWN: usize = 8;
pub(super) const NAME: usize = 28;

/// `12,345`; `≈48,000` when part of the count is an estimate.
pub(super) fn calls(o: &OpStat) -> String {
    count_text(o.count, o.seen_share.is_some())
}

pub(super) fn count_text(count: u64, estimated: bool) -> String {
    let digits = count.to_string();
    let mut out = String::from(if estimated { "≈" } else { "" });
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration, or `—` where no call of the op was timed (entry-only launches).
pub(super) fn dur(ns: Option<u64>) -> String {
    ns.filter(|&n| n > 0).map_or_else(|| "—".into(), fmt_ns)
}

/// Long names keep their start (the API name) and say they were cut.
pub(super) fn name(op: &str) -> String {
    if op.chars().count() <= NAME {
        op.to_string()
    } else {
        op.chars().take(NAME - 2).chain(std::iter::once('…')).collect()
    }
}

/// `cudaLaunchKernel 25%, cuLaunchKernel 40%`: the share each estimated op's probes saw.
pub(super) fn seen_line(ops: &[&OpStat]) -> Option<String> {
    let parts: Vec<String> =
        ops.iter().filter_map(|o| o.seen_share.map(|s| format!("{} {}", o.op, super::chains::pct(s)))).collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// `≈36,058 launches · 1,202 copies · 240 syncs`: every op (not only the
/// rows shown) summed by what it does, most calls first.
pub(super) fn by_kind(ops: &[OpStat]) -> Option<String> {
    let mut kinds: Vec<(&str, u64, bool)> = Vec::new();
    for o in ops.iter().filter(|o| !o.kind.is_empty()) {
        match kinds.iter_mut().find(|k| k.0 == o.kind) {
            Some(k) => (k.1, k.2) = (k.1 + o.count, k.2 || o.seen_share.is_some()),
            None => kinds.push((&o.kind, o.count, o.seen_share.is_some())),
        }
    }
    kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let parts: Vec<String> = kinds
        .iter()
        .map(|&(kind, count, estimated)| format!("{} {}", count_text(count, estimated), plural(kind, count)))
        .collect();
    (!parts.is_empty()).then(|| parts.join(" · "))
}

fn plural(kind: &str, n: u64) -> String {
    let (one, many) = match kind {
        "launch" => ("launch", "launches"),
        "copy" => ("copy", "copies"),
        "memory" => ("alloc or free", "allocs and frees"),
        "nccl control" => ("NCCL group/comm call", "NCCL group/comm calls"),
        k => return if n == 1 { k.to_string() } else { format!("{k}s") },
    };
    (if n == 1 { one } else { many }).to_string()
}

pub(crate) fn html(ops: &[OpStat]) -> Markup {
    let shown: Vec<&OpStat> = ops.iter().take(SHOWN).collect();
    let estimated = shown.iter().any(|o| o.seen_share.is_some());
    html! {
        @if !shown.is_empty() {
            h2 { "CUDA/NCCL calls" }
            table.ops {
                tr {
                    th { "op" } th { "kind" } th { "library" } th.num { "calls" }
                    @if estimated { th.num { "seen" } }
                    th.num { "total" } th.num { "p50" } th.num { "p99" } th.num { "max" }
                }
                @for o in &shown {
                    tr {
                        td { code { (o.op) } } td { (o.kind) } td { (o.library) } td.num { (calls(o)) }
                        @if estimated { td.num { (o.seen_share.map_or_else(|| "all".into(), super::chains::pct)) } }
                        td.num { (dur(Some(o.total_ns))) } td.num { (dur(o.p50_ns)) }
                        td.num { (dur(o.p99_ns)) } td.num { (dur(Some(o.max_ns))) }
                    }
                }
            }
            p.meta {
                @if let Some(k) = by_kind(ops) { "By kind: " (k) ". " }
                "Most time first"
                @if ops.len() > SHOWN { "; " (ops.len() - SHOWN) " more ops in the JSON" }
                "."
                @if estimated { " ≈: the agent's trap budget saw only the share of calls under “seen”; the rest of the count is estimated." }
                @if shown.iter().any(|o| o.sampled) { " Times of some ops come from a sample of their calls." }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::report) fn op(
        name: &str,
        count: u64,
        total_ns: u64,
        p50: Option<u64>,
        seen_share: Option<f64>,
    ) -> OpStat {
        OpStat {
            library: "cudart".into(),
            op: name.into(),
            kind: ingero_model::signals::op_kind("cudart", name).into(),
            count,
            total_ns,
            p50_ns: p50,
            p99_ns: p50.map(|p| p * 20),
            max_ns: p50.map_or(0, |p| p * 40),
            seen_share,
            ..OpStat::default()
        }
    }

    #[test]
    fn exact_counts_carry_no_mark_and_no_ops_no_section() {
        let exact = html(&[op("cudaMemcpyAsync", 1_000, 5_000_000, Some(5_000), None)]).into_string();
        assert!(exact.contains("1,000") && !exact.contains('≈') && !exact.contains(">seen<"), "{exact}");
        assert!(html(&[]).into_string().is_empty());
        let h = html(&[op("cudaLaunchKernel", 4_000, 0, None, Some(0.4))]).into_string();
        assert!(h.contains("≈4,000") && h.contains("<th class=\"num\">seen</th>") && h.contains("40%"), "{h}");
        assert!(h.contains("<td>launch</td>") && h.contains("By kind: ≈4,000 launches."), "{h}");
        let one = by_kind(&[op("cudaMemcpy", 1, 1, Some(1), None), op("cudaFree", 2, 1, Some(1), None)]);
        assert_eq!(one.as_deref(), Some("2 allocs and frees · 1 copy"));
    }
}
