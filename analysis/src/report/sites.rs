// SPDX-License-Identifier: Apache-2.0
//! Where stalls are made: outlier calls (`stall_events`) grouped by their
//! call site, the frames of the stack the agent captured (`stacks`):
//! Python frames innermost first (file, function, line being executed),
//! native frames on demand. A site is an op plus the frames that name it.

use std::collections::{BTreeMap, HashMap};

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::{UInt32Type, UInt64Type};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::query::QueryEngine;
use crate::query::columns::Columns;
use ingero_model::table::names::{STACKS, STALL_EVENTS};

/// Distinct stacks read per report (the most frequent).
const MAX_STACKS: usize = 2_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SiteFrame {
    pub file: String,
    pub function: String,
    pub line: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NativeFrame {
    /// The mapped file (executable or library).
    pub file: String,
    /// ELF symbol; empty when the file has none there.
    pub function: String,
    /// Return address as an offset into the file.
    pub offset: u64,
}

/// One call site: an op called from one place, and its stalls there.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallSite {
    pub op: String,
    pub library: String,
    /// Stalls (outlier calls) made here.
    pub count: u64,
    pub total_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Python frames, innermost first; a program without them gets its
    /// native frames here (file = the mapped file, line = null).
    pub frames: Vec<SiteFrame>,
    /// Native frames, innermost first (the call's return address first).
    #[serde(default)]
    pub native: Vec<NativeFrame>,
}

impl CallSite {
    /// `train.py:57 train_step`, or `?` when no frame was captured.
    pub fn label(&self) -> String {
        match self.frames.first() {
            Some(f) => {
                let file = f.file.rsplit('/').next().unwrap_or(&f.file);
                match f.line {
                    Some(l) => format!("{file}:{l} {}", f.function),
                    None => format!("{file} {}", f.function).trim_end().to_string(),
                }
            }
            None => "(no stack captured)".into(),
        }
    }
}

#[derive(Default)]
struct Frames {
    python: Vec<SiteFrame>,
    native: Vec<NativeFrame>,
}

/// Call sites of the target's stalls (`filter`: its rows in the range;
/// `stacks_filter`: its nodes' rows in the range, since a window ships each
/// stack once per node, under the first process that made it), busiest first.
pub(crate) async fn collect(engine: &QueryEngine, filter: &str, stacks_filter: &str) -> Result<Vec<CallSite>> {
    collect_where(engine, &format!("{filter} AND reason <> '{OFF_CPU}'"), stacks_filter).await
}

/// `stall_events.reason` of an off-CPU episode outside calls (not a call).
pub(crate) const OFF_CPU: &str = "off_cpu";

/// Sites of the `stall_events` rows `filter` selects.
pub(crate) async fn collect_where(engine: &QueryEngine, filter: &str, stacks_filter: &str) -> Result<Vec<CallSite>> {
    let stalls =
        engine.sql(&format!("SELECT op, library, duration_ns, stack_id FROM {STALL_EVENTS} WHERE {filter}")).await?;
    let mut per_stack: HashMap<Option<u64>, usize> = HashMap::new();
    let mut calls: Vec<(String, String, u64, Option<u64>)> = Vec::new();
    for b in &stalls {
        let (op, lib) = (b.strings("op")?, b.strings("library")?);
        let (dur, sid) = (b.primitives::<UInt64Type>("duration_ns")?, b.primitives::<UInt64Type>("stack_id")?);
        for i in 0..b.num_rows() {
            let id = (!sid.is_null(i)).then(|| sid.value(i));
            *per_stack.entry(id).or_default() += 1;
            calls.push((op.value(i).to_string(), lib.value(i).to_string(), dur.value(i), id));
        }
    }
    if calls.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids: Vec<(usize, u64)> = per_stack.iter().filter_map(|(id, n)| Some((*n, (*id)?))).collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    ids.truncate(MAX_STACKS);
    let stacks = frames(engine, stacks_filter, &ids.iter().map(|x| x.1).collect::<Vec<_>>()).await?;
    Ok(group(calls, &stacks))
}

async fn frames(engine: &QueryEngine, filter: &str, ids: &[u64]) -> Result<HashMap<u64, Frames>> {
    let mut out: HashMap<u64, Frames> = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    // A stack is shipped in every window that names it: DISTINCT keeps one
    // copy. (No `IN (ids)`: ids above i64::MAX do not survive as SQL literals.)
    let q = format!(
        "SELECT DISTINCT stack_id, depth, kind, file, function, line, \"offset\" FROM {STACKS} WHERE {filter} ORDER BY stack_id, depth"
    );
    let wanted: std::collections::HashSet<u64> = ids.iter().copied().collect();
    for b in engine.sql(&q).await? {
        add_frames(&b, &wanted, &mut out)?;
    }
    Ok(out)
}

fn add_frames(b: &RecordBatch, wanted: &std::collections::HashSet<u64>, out: &mut HashMap<u64, Frames>) -> Result<()> {
    let id = b.primitives::<UInt64Type>("stack_id")?;
    let (kind, file, func) = (b.strings("kind")?, b.strings("file")?, b.strings("function")?);
    let (line, off) = (b.primitives::<UInt32Type>("line")?, b.primitives::<UInt64Type>("offset")?);
    for i in (0..b.num_rows()).filter(|&i| wanted.contains(&id.value(i))) {
        let f = out.entry(id.value(i)).or_default();
        if kind.value(i) == "python" {
            let line = (!line.is_null(i)).then(|| line.value(i));
            f.python.push(SiteFrame { file: file.value(i).into(), function: func.value(i).into(), line });
        } else {
            let offset = if off.is_null(i) { 0 } else { off.value(i) };
            f.native.push(NativeFrame { file: file.value(i).into(), function: func.value(i).into(), offset });
        }
    }
    Ok(())
}

/// Groups calls by (op, readable frames): stacks that differ only in native
/// frames below the same Python line are one site.
fn group(calls: Vec<(String, String, u64, Option<u64>)>, stacks: &HashMap<u64, Frames>) -> Vec<CallSite> {
    let empty = Frames::default();
    let mut sites: BTreeMap<(String, Vec<SiteFrame>), (CallSite, Vec<u64>)> = BTreeMap::new();
    for (op, library, dur, id) in calls {
        let f = id.and_then(|i| stacks.get(&i)).unwrap_or(&empty);
        let shown = if f.python.is_empty() {
            f.native
                .iter()
                .map(|n| SiteFrame { file: n.file.clone(), function: n.function.clone(), line: None })
                .collect()
        } else {
            f.python.clone()
        };
        let (site, durs) = sites.entry((op.clone(), shown.clone())).or_insert_with(|| {
            let s = CallSite {
                op,
                library,
                count: 0,
                total_ns: 0,
                p99_ns: 0,
                max_ns: 0,
                frames: shown,
                native: f.native.clone(),
            };
            (s, Vec::new())
        });
        site.count += 1;
        site.total_ns += dur;
        site.max_ns = site.max_ns.max(dur);
        durs.push(dur);
    }
    let mut out: Vec<CallSite> = sites
        .into_values()
        .map(|(mut s, mut d)| {
            d.sort_unstable();
            // Nearest rank.
            s.p99_ns = d[((d.len() as f64 * 0.99).ceil() as usize).clamp(1, d.len()) - 1];
            s
        })
        .collect();
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)));
    out
}

/// The sites a chain's cause shows up at: the ops it is about, or every
/// site for a host-side cause (the stalls are where its time surfaced).
pub(crate) fn for_cause(cause: &str, title: &str, all: &[CallSite], n: usize) -> Vec<CallSite> {
    use crate::rank::signals::{is_blocking_copy, is_device_wait, is_sync_op};
    let keep = |s: &CallSite| match cause {
        "allocator_churn" => ["cudaFree", "cudaMalloc", "cuMemAlloc", "cuMemFree"].iter().any(|p| s.op.starts_with(p)),
        "copy_waits" => title.starts_with(&format!("{} ", s.op)),
        "slow_gpu" | "slow_network" | "straggler" | "hang" => {
            is_sync_op(&s.op) || is_blocking_copy(&s.op) || is_device_wait(&s.library, &s.op)
        }
        _ => true,
    };
    all.iter().filter(|s| keep(s)).take(n).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(file: &str, f: &str, l: u32) -> SiteFrame {
        SiteFrame { file: file.into(), function: f.into(), line: Some(l) }
    }

    #[test]
    fn groups_by_op_and_python_frames_and_ranks_by_time() {
        let mut stacks = HashMap::new();
        let frames = |n: u64| Frames {
            python: vec![py("/w/train.py", "train_step", 57), py("/w/train.py", "<module>", 90)],
            native: vec![NativeFrame { file: "/lib/libffi.so".into(), function: "ffi_call".into(), offset: n }],
        };
        stacks.insert(1, frames(10));
        stacks.insert(2, frames(20)); // same Python line, other native frames
        stacks.insert(3, Frames { python: vec![], native: frames(30).native });
        let ms = |x: u64| x * 1_000_000;
        let c = |op: &str, d: u64, id: Option<u64>| (op.to_string(), "cudart".to_string(), ms(d), id);
        let calls = vec![
            c("cudaStreamSynchronize", 40, Some(1)),
            c("cudaStreamSynchronize", 48, Some(2)),
            c("cudaMemcpy", 5, Some(3)),
            c("cudaMemcpy", 7, None),
        ];
        let sites = group(calls, &stacks);
        assert_eq!(sites.len(), 3, "{sites:?}");
        let top = &sites[0];
        assert_eq!((top.op.as_str(), top.count, top.p99_ns, top.max_ns), ("cudaStreamSynchronize", 2, ms(48), ms(48)));
        assert_eq!(top.label(), "train.py:57 train_step");
        assert_eq!(top.frames[1].function, "<module>");
        // No Python frames: the native ones name the site.
        let native = sites.iter().find(|s| s.op == "cudaMemcpy" && s.count == 1 && !s.frames.is_empty()).unwrap();
        assert_eq!(native.label(), "libffi.so ffi_call");
        assert!(sites.iter().any(|s| s.frames.is_empty() && s.label() == "(no stack captured)"));
        assert_eq!(for_cause("slow_gpu", "", &sites, 5)[0].op, "cudaStreamSynchronize");
        assert_eq!(for_cause("allocator_churn", "", &sites, 5).len(), 0);
    }
}
