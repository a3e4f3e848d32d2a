// SPDX-License-Identifier: Apache-2.0
//! A table's snapshot read from `_delta_log/` (the newest checkpoint, then
//! the JSON commits after it) and brought up to date incrementally; what a
//! snapshot is and how an action changes it is `snapshot.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use super::checkpoint;
pub use super::snapshot::Snapshot;
use crate::Store;
use crate::error::{Error, Result};

/// Key of a commit file, relative to the store.
pub fn commit_key(table: &str, version: u64) -> String {
    format!("{table}/_delta_log/{version:020}.json")
}

/// The log's keys from the last checkpoint on, so opening a table costs the
/// same however old it is; the whole log when the pointer is missing or
/// names a checkpoint that is not there.
async fn list_log(store: &Store, table: &str) -> Result<Vec<String>> {
    let log = store.key(&format!("{table}/_delta_log/"));
    if let Some(cp) = checkpoint::last_version(store, table).await {
        // Lists keys after `<cp>` in byte order: `<cp>.checkpoint.parquet`, `<cp>.json` and newer.
        let from = store.key(&format!("{table}/_delta_log/{cp:020}"));
        let keys: Vec<String> = store
            .object_store
            .list_with_offset(Some(&log), &from)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await?;
        if keys.iter().any(|k| k.ends_with(&format!("{cp:020}.checkpoint.parquet"))) {
            return Ok(keys);
        }
        tracing::warn!(table, checkpoint = cp, "_last_checkpoint names a missing checkpoint; listing the whole log");
    }
    Ok(store.object_store.list(Some(&log)).map_ok(|m| m.location.to_string()).try_collect().await?)
}

impl Snapshot {
    /// Reads the table's log from the store (an absent table is empty).
    pub async fn load(store: &Store, table: &str) -> Result<Snapshot> {
        Self::load_as(store, table, true).await
    }

    /// [`Self::load`]; `with_stats: false` leaves the files' statistics out
    /// of what the checkpoint gives (readers that only list files).
    pub async fn load_as(store: &Store, table: &str, with_stats: bool) -> Result<Snapshot> {
        let mut s = Snapshot { table: table.to_string(), ..Default::default() };
        let keys = list_log(store, table).await?;
        let mut commits: Vec<u64> = Vec::new();
        let mut newest_checkpoint: Option<u64> = None;
        for k in &keys {
            let name = k.rsplit('/').next().unwrap_or_default();
            if let Some(v) = name.strip_suffix(".json").and_then(|v| v.parse().ok()) {
                commits.push(v);
            } else if let Some(v) = name.strip_suffix(".checkpoint.parquet").and_then(|v| v.parse::<u64>().ok()) {
                newest_checkpoint = newest_checkpoint.max(Some(v));
            }
        }
        if let Some(cp) = newest_checkpoint {
            for a in checkpoint::read_as(store, table, cp, with_stats).await? {
                s.apply(a);
            }
            s.version = Some(cp);
        }
        commits.retain(|&v| newest_checkpoint.is_none_or(|cp| v > cp));
        commits.sort_unstable();
        let first = newest_checkpoint.map_or(0, |cp| cp + 1);
        if let Some(gap) = commits.iter().enumerate().find(|&(i, &v)| v != first + i as u64) {
            return Err(Error::State(format!(
                "{table}: the Delta log misses version {} (found {})",
                first + gap.0 as u64,
                gap.1
            )));
        }
        // Fetch in parallel, apply in order.
        let bodies: Vec<(u64, bytes::Bytes)> = futures::stream::iter(commits)
            .map(|v| async move {
                let b = store.object_store.get(&store.key(&commit_key(table, v))).await?.bytes().await?;
                Ok::<_, Error>((v, b))
            })
            .buffered(16)
            .try_collect()
            .await?;
        for (v, body) in bodies {
            s.apply_commit(v, &body)?;
        }
        // A listing may lag behind the newest writes (S3-compatible stores):
        // read on by version until one is missing.
        s.refresh(store).await?;
        Ok(s)
    }

    /// Applies the commits written since this snapshot was read.
    pub async fn refresh(&mut self, store: &Store) -> Result<()> {
        loop {
            let next = self.version.map_or(0, |v| v + 1);
            match store.object_store.get(&store.key(&commit_key(&self.table, next))).await {
                Ok(r) => {
                    let body = r.bytes().await?;
                    self.apply_commit(next, &body)?;
                }
                Err(object_store::Error::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The table's newest snapshot, from a process-wide cache brought up to
/// date with one request when nothing changed. For readers: the files a
/// checkpoint lists come without their statistics.
pub async fn current(store: &Store, table: &str) -> Result<Arc<Snapshot>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Snapshot>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = format!("{}\u{0}{table}", store.url);
    let cached = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
    let snap = match cached {
        Some(s) => {
            let next = s.version.map_or(0, |v| v + 1);
            match store.object_store.head(&store.key(&commit_key(table, next))).await {
                Err(object_store::Error::NotFound { .. }) => return Ok(s),
                Err(e) => return Err(e.into()),
                Ok(_) => {
                    let mut n = (*s).clone();
                    n.refresh(store).await?;
                    Arc::new(n)
                }
            }
        }
        // Readers list files; the statistics stay in the checkpoint.
        None => Arc::new(Snapshot::load_as(store, table, false).await?),
    };
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, snap.clone());
    Ok(snap)
}
