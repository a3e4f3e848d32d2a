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
    /// The named threads that made these stalls, most stalls first: those
    /// whose name differs from the process's (a data loader's worker, a
    /// framework's pool), so a wait is seen to be the worker's, not the
    /// main loop's. Empty when every stall was the process's main thread
    /// (or no name was read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<SiteThread>,
}

/// A named thread at a call site and how many of its stalls it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteThread {
    pub name: String,
    pub count: u64,
}

/// `on thread pt_worker_7`, `on threads loader_0 (12), loader_1 (3)`; None
/// when no named thread made them.
pub fn threads_phrase(threads: &[SiteThread]) -> Option<String> {
    const SHOWN: usize = 3;
    match threads {
        [] => None,
        [t] => Some(format!("on thread {}", t.name)),
        _ => {
            let named: Vec<String> = threads.iter().take(SHOWN).map(|t| format!("{} ({})", t.name, t.count)).collect();
            let more = threads.len().saturating_sub(SHOWN);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            Some(format!("on threads {}{more}", named.join(", ")))
        }
    }
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

/// One outlier call (off-CPU episode) as read from `stall_events`.
struct Call {
    op: String,
    library: String,
    duration_ns: u64,
    stack_id: Option<u64>,
    /// Its thread's name where it differs from the process's.
    thread: Option<String>,
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
    let q = format!("SELECT op, library, duration_ns, stack_id, comm, thread_name FROM {STALL_EVENTS} WHERE {filter}");
    let mut calls: Vec<Call> = Vec::new();
    for b in &engine.sql(&q).await? {
        read_calls(b, &mut calls)?;
    }
    let mut per_stack: HashMap<Option<u64>, usize> = HashMap::new();
    for c in &calls {
        *per_stack.entry(c.stack_id).or_default() += 1;
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

fn read_calls(b: &RecordBatch, out: &mut Vec<Call>) -> Result<()> {
    let (op, lib) = (b.strings("op")?, b.strings("library")?);
    let (dur, sid) = (b.primitives::<UInt64Type>("duration_ns")?, b.primitives::<UInt64Type>("stack_id")?);
    let (comm, thread) = (b.strings("comm")?, b.strings("thread_name")?);
    for i in 0..b.num_rows() {
        let named = (!thread.is_null(i)).then(|| thread.value(i)).filter(|t| !t.is_empty() && *t != comm.value(i));
        out.push(Call {
            op: op.value(i).to_string(),
            library: lib.value(i).to_string(),
            duration_ns: dur.value(i),
            stack_id: (!sid.is_null(i)).then(|| sid.value(i)),
            thread: named.map(str::to_string),
        });
    }
    Ok(())
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
fn group(calls: Vec<Call>, stacks: &HashMap<u64, Frames>) -> Vec<CallSite> {
    let empty = Frames::default();
    type Acc = (CallSite, Vec<u64>, BTreeMap<String, u64>);
    let mut sites: BTreeMap<(String, Vec<SiteFrame>), Acc> = BTreeMap::new();
    for c in calls {
        let f = c.stack_id.and_then(|i| stacks.get(&i)).unwrap_or(&empty);
        let shown = if f.python.is_empty() {
            f.native
                .iter()
                .map(|n| SiteFrame { file: n.file.clone(), function: n.function.clone(), line: None })
                .collect()
        } else {
            f.python.clone()
        };
        let (site, durs, threads) = sites.entry((c.op.clone(), shown.clone())).or_insert_with(|| {
            let s = CallSite {
                op: c.op,
                library: c.library,
                count: 0,
                total_ns: 0,
                p99_ns: 0,
                max_ns: 0,
                frames: shown,
                native: f.native.clone(),
                threads: Vec::new(),
            };
            (s, Vec::new(), BTreeMap::new())
        });
        site.count += 1;
        site.total_ns += c.duration_ns;
        site.max_ns = site.max_ns.max(c.duration_ns);
        durs.push(c.duration_ns);
        if let Some(t) = c.thread {
            *threads.entry(t).or_default() += 1;
        }
    }
    let mut out: Vec<CallSite> = sites.into_values().map(|(s, d, t)| finish(s, d, t)).collect();
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)));
    out
}

/// The site's p99 (nearest rank) and its named threads, most stalls first.
fn finish(mut s: CallSite, mut durs: Vec<u64>, threads: BTreeMap<String, u64>) -> CallSite {
    durs.sort_unstable();
    s.p99_ns = durs[((durs.len() as f64 * 0.99).ceil() as usize).clamp(1, durs.len()) - 1];
    s.threads = threads.into_iter().map(|(name, count)| SiteThread { name, count }).collect();
    s.threads.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.name.cmp(&b.name)));
    s
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
        let c = |op: &str, d: u64, id: Option<u64>, thread: Option<&str>| Call {
            op: op.into(),
            library: "cudart".into(),
            duration_ns: ms(d),
            stack_id: id,
            thread: thread.map(str::to_string),
        };
        let calls = vec![
            c("cudaStreamSynchronize", 40, Some(1), Some("pt_worker_1")),
            c("cudaStreamSynchronize", 48, Some(2), Some("pt_worker_0")),
            c("cudaStreamSynchronize", 1, Some(2), Some("pt_worker_0")),
            c("cudaMemcpy", 5, Some(3), None),
            c("cudaMemcpy", 7, None, None),
        ];
        let sites = group(calls, &stacks);
        assert_eq!(sites.len(), 3, "{sites:?}");
        let top = &sites[0];
        assert_eq!((top.op.as_str(), top.count, top.p99_ns, top.max_ns), ("cudaStreamSynchronize", 3, ms(48), ms(48)));
        // Its threads, most stalls first.
        assert_eq!(threads_phrase(&top.threads).unwrap(), "on threads pt_worker_0 (2), pt_worker_1 (1)");
        assert_eq!(top.label(), "train.py:57 train_step");
        assert_eq!(top.frames[1].function, "<module>");
        // No Python frames: the native ones name the site.
        let native = sites.iter().find(|s| s.op == "cudaMemcpy" && s.count == 1 && !s.frames.is_empty()).unwrap();
        assert_eq!(native.label(), "libffi.so ffi_call");
        assert!(sites.iter().any(|s| s.frames.is_empty() && s.label() == "(no stack captured)"));
        assert!(sites.iter().filter(|s| s.op == "cudaMemcpy").all(|s| s.threads.is_empty()));
        assert_eq!(for_cause("slow_gpu", "", &sites, 5)[0].op, "cudaStreamSynchronize");
        assert_eq!(for_cause("allocator_churn", "", &sites, 5).len(), 0);
    }

    #[test]
    fn names_threads_by_how_many_stalls_each_made() {
        let t = |name: &str, count| SiteThread { name: name.into(), count };
        assert_eq!(threads_phrase(&[]), None);
        assert_eq!(threads_phrase(&[t("loader_0", 4)]).unwrap(), "on thread loader_0");
        let four = [t("a", 4), t("b", 3), t("c", 2), t("d", 1)];
        assert_eq!(threads_phrase(&four).unwrap(), "on threads a (4), b (3), c (2) and 1 more");
    }
}
