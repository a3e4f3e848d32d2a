// SPDX-License-Identifier: Apache-2.0
//! What the store already holds, for exactly-once ingest: the last WAL
//! segment this writer committed — a Delta transaction version (`txn`) of
//! the `ingest_batches` table, committed after the segment's data — and the
//! highest batch sequence stored per node, from the completed segments'
//! intents and the node versions they are folded into (`crate::fold`). So
//! neither claims rows that are not there, and every writer sharing the
//! store sees what the others stored.

use std::collections::BTreeMap;
use std::path::Path;

use object_store::ObjectStoreExt;

use super::Store;
use super::delta::Snapshot;
use crate::error::{Error, IoContext, Result};

pub use super::batches::{BATCHES_TABLE, batches_schema, node_app, writer_app};

/// Left by stores written before the Delta layout.
const OLD_STATE_KEY: &str = "_ingero/state.json";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CommitState {
    /// Every WAL segment of this writer up to this one is in the store.
    pub committed_segment: u64,
    /// Highest batch sequence stored, per node (by any writer).
    pub high_water: BTreeMap<String, u64>,
}

impl CommitState {
    pub(crate) async fn load(store: &Store, writer: &str) -> Result<CommitState> {
        let snap = Snapshot::load(store, BATCHES_TABLE).await?;
        if snap.version.is_none() && store.object_store.head(&store.key(OLD_STATE_KEY)).await.is_ok() {
            return Err(Error::State(format!(
                "{} was written by an ingero before 0.2 (plain Parquet and {OLD_STATE_KEY}); \
                 this version writes Delta Lake tables: give it a new store URL",
                store.url
            )));
        }
        let committed_segment = snap.txns.get(&writer_app(writer)).map_or(0, |&v| v.max(0) as u64);
        let high_water = super::fold::Completed::default().high_waters(store, &snap).await?;
        Ok(CommitState { committed_segment, high_water })
    }

    /// True when `(node, seq)` is already stored or earlier than what is.
    pub(crate) fn is_duplicate(&self, node: &str, seq: u64) -> bool {
        self.high_water.get(node).is_some_and(|&hw| seq <= hw)
    }

    pub(crate) fn record(&mut self, node: &str, seq: u64) {
        let hw = self.high_water.entry(node.to_string()).or_insert(seq);
        *hw = (*hw).max(seq);
    }
}

/// Brings a writer's in-memory high-waters up to what every writer has
/// committed: a node that moved here from another replica must have the
/// batches that one stored counted as duplicates when they are re-sent.
#[derive(Debug)]
pub(crate) struct SharedHighWater {
    store: Store,
    checked: Option<std::time::Instant>,
    /// Nodes that have pushed here (a merge also learns of others' nodes,
    /// so knowing a node's high-water does not mean it was seen here).
    seen: std::collections::HashSet<String>,
    completed: super::fold::Completed,
}

impl SharedHighWater {
    /// Longest a known node's store high-water may be stale.
    const EVERY: std::time::Duration = std::time::Duration::from_millis(500);

    pub(crate) fn new(store: Store) -> SharedHighWater {
        SharedHighWater { store, checked: None, seen: Default::default(), completed: Default::default() }
    }

    /// Merges the store's completed high-waters in when a node is new here or the
    /// last look is older than [`Self::EVERY`]. A failed read keeps what is known.
    pub(crate) async fn merge<'a>(
        &mut self,
        nodes: impl Iterator<Item = &'a str>,
        high_water: &mut BTreeMap<String, u64>,
    ) {
        let mut unknown = false;
        for n in nodes {
            if !self.seen.contains(n) {
                self.seen.insert(n.to_string());
                unknown = true;
            }
        }
        if !unknown && self.checked.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return;
        }
        self.checked = Some(std::time::Instant::now());
        let read = async {
            let snap = super::delta::log::current(&self.store, BATCHES_TABLE).await?;
            self.completed.high_waters(&self.store, &snap).await
        };
        match read.await {
            Ok(stored) => {
                for (node, v) in stored {
                    let hw = high_water.entry(node).or_insert(0);
                    *hw = (*hw).max(v);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read other writers' high-waters; using this writer's"),
        }
    }
}

/// This WAL's writer id: made once, kept in the WAL directory, so file
/// names and transaction ids stay the same across restarts and differ
/// between replicas sharing a store.
pub(crate) fn writer_id(wal_dir: &Path) -> Result<String> {
    let path = wal_dir.join("writer-id");
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).ctx(|| format!("reading {}", path.display())),
    }
    std::fs::create_dir_all(wal_dir).ctx(|| format!("creating {}", wal_dir.display()))?;
    let id = format!("{:016x}", rand::random::<u64>());
    let tmp = wal_dir.join("writer-id.tmp");
    std::fs::write(&tmp, &id).ctx(|| format!("writing {}", tmp.display()))?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).ctx(|| format!("fsync {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).ctx(|| format!("renaming {}", path.display()))?;
    Ok(id)
}
