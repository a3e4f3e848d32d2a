// SPDX-License-Identifier: Apache-2.0
//! `ingero import`: traces recorded by the Go reference product (SQLite) →
//! our tables, written as Parquet into a store.
//!
//! Every file is read, validated and folded before the first byte is
//! written, so a bad file leaves the store untouched. File names are a pure
//! function of the trace and node, and every commit carries the trace's
//! fingerprint as a Delta transaction, so importing a file again adds nothing.

pub(crate) mod fold;
pub(crate) mod nesting;
pub(crate) mod rolled;
pub(crate) mod source;

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use ingero_model::Tables;

use crate::error::Result;
use ingero_store::flush::Logs;
use ingero_store::{Store, bulk};

pub use fold::FoldStats;

/// One node of one folded file, not yet written.
#[derive(Debug)]
pub struct Folded {
    pub file: String,
    /// The node its rows are written as.
    pub node: String,
    pub fingerprint: u64,
    pub tables: Tables,
    pub stats: FoldStats,
    pub reference_chains: usize,
}

/// The files to import as sets that are each one trace: a live file with
/// its rolled-over siblings (oldest first), each file once.
pub fn sets(files: &[PathBuf]) -> Result<Vec<Vec<PathBuf>>> {
    rolled::sets(files)
}

/// Reads and folds one trace, which may be a rolled-over set (files in
/// time order): one result per file and node it names (0.9+ files, merged
/// multi-node files), else per file as `node` (the caller's --node,
/// required then). A rolled file's process names, cgroups and host facts
/// come from the whole set (the source writes some only once, to the file
/// that was live then). `progress(file, events_done, events_total)`.
pub fn fold_set(
    paths: &[PathBuf],
    node: Option<&str>,
    job: Option<String>,
    window_ns: i64,
    mut progress: impl FnMut(&Path, u64, u64),
) -> Result<Vec<Folded>> {
    let mut traces = paths.iter().map(|p| source::Trace::open(p)).collect::<Result<Vec<_>>>()?;
    share_across_set(&mut traces);
    let threads = if traces.len() > 1 { set_threads(&traces)? } else { Threads::new() };
    let nesting = if traces.len() > 1 { set_nesting(&traces)? } else { SetNesting::new() };
    let mut out = Vec::new();
    for (trace, path) in traces.iter().zip(paths) {
        let fold = |n, t| progress(path, n, t);
        out.extend(fold_trace(trace, path, node, job.clone(), window_ns, (&threads, &nesting), fold)?);
    }
    Ok(out)
}

/// Per node (None: a file that names none), each process's threads.
type Threads = std::collections::HashMap<Option<String>, std::collections::HashMap<u32, HashSet<u32>>>;

/// The threads each process had over the whole set: its thread time in a
/// window is its thread count's, whichever file the window is in.
fn set_threads(traces: &[source::Trace]) -> Result<Threads> {
    let mut out = Threads::new();
    for t in traces {
        for part in t.parts()? {
            let m = out.entry(part.node.clone()).or_default();
            for (pid, tids) in t.threads(part.node.as_deref())? {
                m.entry(pid).or_default().extend(tids);
            }
        }
    }
    Ok(out)
}

/// Per node, the driver calls' nesting over the whole set (its files read
/// once more: a file alone holds some minutes' stored calls of an op and
/// other minutes' counts of it).
type SetNesting = std::collections::HashMap<Option<String>, nesting::Shares>;

fn set_nesting(traces: &[source::Trace]) -> Result<SetNesting> {
    let mut out = SetNesting::new();
    for t in traces {
        for part in t.parts()? {
            let mut n = nesting::Nesting::default();
            t.for_each_event(part.node.as_deref(), |e| _ = n.nested(&e), |_| {})?;
            let m = out.entry(part.node.clone()).or_default();
            for (k, (seen, nested)) in n.shares {
                let e = m.entry(k).or_default();
                (e.0, e.1) = (e.0 + seen, e.1 + nested);
            }
        }
    }
    Ok(out)
}

/// Names, cgroups, the session and the node a set's files lack, from the
/// others (a file's own entries win for its own rows).
fn share_across_set(traces: &mut [source::Trace]) {
    if traces.len() < 2 {
        return;
    }
    let mut names = std::collections::HashMap::new();
    let mut cgroups = std::collections::HashMap::new();
    for t in traces.iter() {
        names.extend(t.names.iter().map(|(k, v)| (*k, v.clone())));
        cgroups.extend(t.cgroups.iter().map(|(k, v)| (*k, v.clone())));
    }
    let session = traces.iter().find_map(|t| t.session.clone());
    let mut nodes: Vec<String> = traces.iter().flat_map(|t| t.nodes.clone()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    for t in traces.iter_mut() {
        // A file rolled before its node recorded anything (the new live
        // file, annotations only) is of the set's one node.
        if t.nodes.is_empty() && t.names_nodes() && nodes.len() == 1 {
            t.nodes = nodes.clone();
        }
        for (k, v) in &names {
            t.names.entry(*k).or_insert_with(|| v.clone());
        }
        for (k, v) in &cgroups {
            t.cgroups.entry(*k).or_insert_with(|| v.clone());
        }
        if t.session.is_none() {
            t.session = session.clone();
        }
    }
}

fn fold_trace(
    trace: &source::Trace,
    path: &Path,
    node: Option<&str>,
    job: Option<String>,
    window_ns: i64,
    (threads, nesting): (&Threads, &SetNesting),
    mut progress: impl FnMut(u64, u64),
) -> Result<Vec<Folded>> {
    let total = trace.events;
    let mut out = Vec::new();
    let mut done = 0u64;
    for part in trace.parts()? {
        let name = match (&part.node, node) {
            (Some(n), _) => n.clone(),
            (None, Some(n)) => n.to_string(),
            (None, None) => {
                return Err(crate::error::Error::Import {
                    path: path.display().to_string(),
                    reason: "the trace names no node (schema before 0.9): give one with --node".into(),
                });
            }
        };
        let mut f = fold::Folder::new(trace, &part, &name, job.clone(), window_ns);
        if let Some(t) = threads.get(&part.node) {
            f.seed_threads(t);
        }
        if let Some(n) = nesting.get(&part.node) {
            f.seed_nesting(n);
        }
        trace.for_each_event(part.node.as_deref(), |e| f.event(e), |n| progress(done + n, total))?;
        let (tables, mut stats) = f.finish()?;
        stats.bad_annotations = trace.bad_annotations;
        done += stats.events;
        out.push(Folded {
            file: path.display().to_string(),
            node: name.clone(),
            fingerprint: fingerprint(trace, &name, &stats),
            tables,
            stats,
            reference_chains: part.chains.len(),
        });
    }
    Ok(out)
}

/// What makes one node of one file the same trace again: its content, not
/// its path or size (a rolled-over file is the live file renamed after a
/// checkpoint that changes its size).
fn fingerprint(trace: &source::Trace, node: &str, stats: &FoldStats) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let started = trace.session.as_ref().map(|s| s.started_ns);
    (node, trace.events, &trace.version, started, stats.events, stats.first_ns, stats.last_ns).hash(&mut h);
    (stats.annotations, trace.chains.len()).hash(&mut h);
    h.finish()
}

/// Writes folded files into the store and commits them to each table's
/// Delta log. Each file's commits carry `import-<fingerprint>` as a
/// transaction, so importing the same trace again adds nothing.
pub async fn write(store: &Store, folded: &[Folded]) -> Result<usize> {
    let mut files = 0;
    let mut logs = Logs::new("import".into());
    for f in folded {
        let info = serde_json::json!({"import": f.file, "node": f.node});
        files += bulk::commit_tables(store, &mut logs, &f.tables, f.fingerprint, info).await?;
    }
    Ok(files)
}
