// SPDX-License-Identifier: Apache-2.0
//! `ingero import`: traces recorded by the Go reference product (SQLite) →
//! our tables, written as Parquet into a store.
//!
//! Every file is read, validated and folded before the first byte is
//! written, so a bad file leaves the store untouched. File names are a pure
//! function of the trace and node, and every commit carries the trace's
//! fingerprint as a Delta transaction, so importing a file again adds nothing.

pub(crate) mod fold;
pub(crate) mod source;

use std::hash::{Hash, Hasher};
use std::path::Path;

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

/// Reads and folds one trace: one result per node it names (0.9+ files,
/// merged multi-node files), else one as `node` (the caller's --node,
/// required then). `progress(events_done, events_total)`.
pub fn fold_file(
    path: &Path,
    node: Option<&str>,
    job: Option<String>,
    window_ns: i64,
    mut progress: impl FnMut(u64, u64),
) -> Result<Vec<Folded>> {
    let trace = source::Trace::open(path)?;
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
        let mut f = fold::Folder::new(&trace, &part, &name, job.clone(), window_ns);
        trace.for_each_event(part.node.as_deref(), |e| f.event(e), |n| progress(done + n, total))?;
        let (tables, stats) = f.finish()?;
        done += stats.events;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let started = part.session.as_ref().map(|s| s.started_ns);
        (&name, size, started, trace.events, &trace.version).hash(&mut h);
        out.push(Folded {
            file: path.display().to_string(),
            node: name,
            fingerprint: h.finish(),
            tables,
            stats,
            reference_chains: part.chains.len(),
        });
    }
    Ok(out)
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
