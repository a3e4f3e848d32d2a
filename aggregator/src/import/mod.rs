//! `ingero import`: traces recorded by the Go reference product (SQLite) →
//! our tables, written as Parquet into a store.
//!
//! Every file is read, validated and folded before the first byte is
//! written, so a bad file leaves the store untouched. File names are a pure
//! function of the trace and node, so importing the same file again
//! overwrites instead of duplicating.

pub(crate) mod fold;
pub(crate) mod source;

use std::hash::{Hash, Hasher};
use std::path::Path;

use ingero_proto::Tables;

use crate::error::Result;
use crate::store::layout::Partition;
use crate::store::{Store, parquet};

pub use fold::FoldStats;

/// One folded file, not yet written.
#[derive(Debug)]
pub struct Folded {
    pub file: String,
    pub fingerprint: u64,
    pub tables: Tables,
    pub stats: FoldStats,
    pub reference_chains: usize,
}

/// Reads and folds one trace; `progress(events_done, events_total)`.
pub fn fold_file(
    path: &Path,
    node: &str,
    job: Option<String>,
    window_ns: i64,
    progress: impl FnMut(u64, u64),
) -> Result<Folded> {
    let trace = source::Trace::open(path)?;
    let total = trace.events;
    let mut progress = progress;
    let mut f = fold::Folder::new(&trace, node, job, window_ns);
    trace.for_each_event(|e| f.event(e), |n| progress(n, total))?;
    let (tables, stats) = f.finish()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let started = trace.session.as_ref().map(|s| s.started_ns);
    (node, size, started, trace.events, &trace.version).hash(&mut h);
    Ok(Folded {
        file: path.display().to_string(),
        fingerprint: h.finish(),
        tables,
        stats,
        reference_chains: trace.chains.len(),
    })
}

/// Writes folded files into the store's hive layout.
pub async fn write(store: &Store, folded: &[Folded]) -> Result<usize> {
    let mut files = 0;
    for f in folded {
        for (table, batch) in &f.tables {
            for (part, b) in parquet::partition(*table, std::slice::from_ref(batch))? {
                let rel = import_file(&part, f.fingerprint);
                store.put_durable(&rel, parquet::encode(&b)?.into()).await?;
                files += 1;
            }
        }
    }
    Ok(files)
}

fn import_file(p: &Partition, fingerprint: u64) -> String {
    format!("{}/import-{fingerprint:016x}.parquet", p.dir())
}
