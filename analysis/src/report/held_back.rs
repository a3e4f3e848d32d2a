// SPDX-License-Identifier: Apache-2.0
//! A rank held back by another: its job had a straggler on another node
//! in the range. The target then has no stall of its own to show ("no
//! stall found" read as "all is well"), yet its syncs and steps got slower
//! while it waited for that node: the chain names the node and says so.

use crate::rank::episode::Episode;

use super::chains::{Chain, Severity, Summary, gpu_effects};
use super::data::ReportData;

/// Episodes shown per chain, longest first.
const SHOWN: usize = 3;

/// The chain for the straggler episodes of the target's jobs on nodes that
/// are not the target's (`episodes`: the jobs' episodes in the range, open
/// ones counted to `until_us`); `alone`: the target has no chain of its own.
pub(crate) fn chain(
    d: &ReportData,
    s: &Summary,
    episodes: &[Episode],
    (until_us, alone): (i64, bool),
) -> Option<Chain> {
    let mut others: Vec<&Episode> = episodes.iter().filter(|e| !d.nodes.contains(&e.node)).collect();
    if others.is_empty() {
        return None;
    }
    let span = |e: &Episode| e.end_us.or(e.seen_until_us).unwrap_or(until_us) - e.start_us;
    others.sort_by_key(|e| std::cmp::Reverse(span(e)));
    let mut nodes: Vec<&str> = others.iter().map(|e| e.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let root_cause = others
        .iter()
        .take(SHOWN)
        .map(|e| {
            let secs = humantime::format_duration(std::time::Duration::from_secs((span(e).max(0) / 1_000_000) as u64));
            format!("{} (job {}) was a flagged straggler for {secs}: {}", e.node, e.job, e.text)
        })
        .collect();
    let (effects, lost) = (gpu_effects(d, s), others.iter().map(|e| e.lost_s).sum::<f64>());
    let severity = if lost > 0.0 && !effects.is_empty() { Severity::High } else { Severity::Medium };
    let mut effect = effects;
    let those = if nodes.len() == 1 { "that node" } else { "those nodes" };
    effect.push(format!("this rank's collectives and syncs wait for {those} each step"));
    let why = match (alone, nodes.len()) {
        (true, _) => "this rank has no stall of its own to fix",
        (false, 1) => "this rank's waits for it end with it",
        (false, _) => "this rank's waits for them end with them",
    };
    let fix =
        format!("fix {} first (`ingero report --node {}` over the same range): {why}", nodes.join(", "), nodes[0]);
    Some(Chain {
        explains: None,
        severity,
        cause: "held_back".into(),
        title: match nodes.len() {
            1 => format!("Straggler {} → this rank waits for it", nodes[0]),
            n => format!("{n} stragglers ({}) → this rank waits for them", nodes.join(", ")),
        },
        root_cause,
        effect,
        contributing: vec![],
        fixes: vec![fix],
        call_sites: vec![],
    })
}
