// SPDX-License-Identifier: Apache-2.0
//! Which batches a table already holds, without a `txn` per node in every
//! data commit.
//!
//! Before a writer commits any table of a WAL segment it writes the
//! segment's intent — per node, the first and last batch sequence — to
//! `_ingero/intents/<writer>/<segment>.json`. Data tables then carry one
//! `txn`, the writer's segment (and, for a node's first segments at a
//! writer, the node's: `flush::ARRIVING`); after every table the segment's
//! completion names it in `ingest_batches`, and the node high-waters stay in
//! the intent until maintenance folds them into node versions
//! (`crate::fold`). At 10,000 nodes that is one node `txn` per node per
//! maintenance run instead of one per node per table per flush.
//!
//! A writer about to commit table T learns what T holds of a node from:
//! the completed high-waters (`crate::fold::Completed`), the intents of
//! segments another writer committed to T but has not completed yet (a
//! writer flushes its segments one after another, so that is at most its
//! segment T names), and T's own node versions (written by versions of
//! ingero before intents). Read in that order — T, then `ingest_batches`,
//! then intents — every segment T holds is either completed or has its
//! intent on the store: the intent was written before the segment's first
//! table commit and is deleted by maintenance only once folded and an hour
//! old. An intent states the segment's whole ranges, which can only
//! overstate what a late writer stored of a node; what it left out the other
//! writer stored.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use super::Store;
use super::delta::Snapshot;
use super::flush::NodeRange;
use super::fold::Completed;
use super::state::{BATCHES_TABLE, node_versions, writer_of};
use crate::error::{Error, Result};

const PREFIX: &str = "_ingero/intents";

/// How long a folded segment's intent stays at least: far longer than a
/// writer takes between reading `ingest_batches` and reading the intent.
pub(crate) const KEEP: Duration = Duration::from_secs(3600);

fn key(writer: &str, segment: u64) -> String {
    format!("{PREFIX}/{writer}/{segment:020}.json")
}

/// Per node, the last sequence of the segment.
pub(crate) type Lasts = Arc<BTreeMap<String, u64>>;

/// Writes a segment's intent (durably: it must outlive a crash before the
/// segment's first table commit is visible to others).
pub(crate) async fn write(
    store: &Store,
    writer: &str,
    segment: u64,
    nodes: &BTreeMap<String, NodeRange>,
) -> Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    store.put_durable(&key(writer, segment), body(writer, segment, nodes)?.into()).await
}

fn body(writer: &str, segment: u64, nodes: &BTreeMap<String, NodeRange>) -> Result<Vec<u8>> {
    let ranges: BTreeMap<&str, [u64; 2]> = nodes.iter().map(|(n, r)| (n.as_str(), [r.first, r.last])).collect();
    serde_json::to_vec(&serde_json::json!({"writer": writer, "segment": segment, "nodes": ranges})).map_err(json)
}

fn json(e: serde_json::Error) -> Error {
    Error::State(format!("segment intent: {e}"))
}

/// Intents read so far (an intent never changes once a table names it).
#[derive(Debug, Default)]
pub(crate) struct Intents {
    read: HashMap<(String, u64), Option<Lasts>>,
    /// The completed segments' high-waters (`ingest_batches`' rows are
    /// computed against them).
    pub(crate) completed: Completed,
}

impl Intents {
    /// Per node, the highest sequence table `table` holds that another
    /// writer stored (only nodes `wanted` names).
    pub(crate) async fn stored(
        &mut self,
        store: &Store,
        me: &str,
        table: &Snapshot,
        wanted: &BTreeMap<String, NodeRange>,
    ) -> Result<BTreeMap<String, u64>> {
        let mut hw: BTreeMap<String, u64> = BTreeMap::new();
        let mut raise = |node: &str, v: u64| {
            if wanted.contains_key(node) {
                let e = hw.entry(node.to_string()).or_insert(v);
                *e = (*e).max(v);
            }
        };
        // Written by ingero before intents, and for nodes still arriving at a writer.
        for (node, v) in node_versions(&table.txns) {
            raise(node, v);
        }
        let mut batches = super::delta::log::current(store, BATCHES_TABLE).await?;
        let pending: Vec<(String, u64)> = in_flight(me, table, &batches).map(|(w, s)| (w.to_string(), s)).collect();
        for (writer, segment) in &pending {
            let Some(lasts) = self.get(store, writer, *segment).await? else {
                // Completed (and its intent folded and removed) since
                // `batches` was read, or written by an ingero before intents.
                batches = super::delta::log::current(store, BATCHES_TABLE).await?;
                continue;
            };
            for (node, &last) in lasts.iter() {
                raise(node, last);
            }
        }
        for (node, v) in self.completed.high_waters(store, &batches).await? {
            raise(&node, v);
        }
        // Only segments still in flight are worth keeping (at 10,000 nodes
        // an intent is ~0.5 MB in memory; one per flush of every replica).
        self.read.retain(|k, _| pending.contains(k));
        Ok(hw)
    }

    async fn get(&mut self, store: &Store, writer: &str, segment: u64) -> Result<Option<Lasts>> {
        if let Some(l) = self.read.get(&(writer.to_string(), segment)) {
            return Ok(l.clone());
        }
        let lasts = match store.object_store.get(&store.key(&key(writer, segment))).await {
            Ok(r) => Some(Arc::new(parse(&r.bytes().await?)?)),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        if lasts.is_some() {
            self.read.insert((writer.to_string(), segment), lasts.clone());
        }
        Ok(lasts)
    }
}

fn parse(body: &[u8]) -> Result<BTreeMap<String, u64>> {
    #[derive(serde::Deserialize)]
    struct Intent {
        nodes: BTreeMap<String, [u64; 2]>,
    }
    let i: Intent = serde_json::from_slice(body).map_err(json)?;
    Ok(i.nodes.into_iter().map(|(n, [_, last])| (n, last)).collect())
}

/// The (writer, segment) pairs `table` holds that `batches` does not list
/// as completed: a writer's segment committed to some tables, not yet all.
fn in_flight<'a>(me: &'a str, table: &'a Snapshot, batches: &'a Snapshot) -> impl Iterator<Item = (&'a str, u64)> + 'a {
    table.txns.iter().filter_map(move |(app, &v)| {
        let writer = writer_of(app)?;
        let done = batches.txns.get(app).copied().unwrap_or(-1);
        (writer != me && v > done && v >= 0).then_some((writer, v as u64))
    })
}

/// The intents of `writer`'s segments in `(after, upto]` (a segment with no
/// node has none), each with its segment.
pub(crate) async fn listed(store: &Store, writer: &str, after: u64, upto: u64) -> Result<Vec<(u64, Lasts)>> {
    // Keys sort as their segments (zero-padded): list only those after.
    let (prefix, offset) = (store.key(&format!("{PREFIX}/{writer}")), store.key(&key(writer, after)));
    let listed: Vec<object_store::ObjectMeta> =
        store.object_store.list_with_offset(Some(&prefix), &offset).try_collect().await?;
    let wanted = listed.into_iter().filter_map(|m| {
        let (_, s) = parse_key(m.location.as_ref())?;
        (s > after && s <= upto).then_some((s, m.location))
    });
    let read = futures::stream::iter(wanted.map(|(s, key)| async move {
        match store.object_store.get(&key).await {
            Ok(r) => Ok(Some((s, Arc::new(parse(&r.bytes().await?)?)))),
            // Folded and removed since it was listed.
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::from(e)),
        }
    }));
    let got: Vec<Option<(u64, Lasts)>> = read.buffered(8).try_collect().await?;
    Ok(got.into_iter().flatten().collect())
}

/// Deletes the intents of segments folded into `ingest_batches`
/// (`crate::fold`) and completed more than [`KEEP`] ago; returns how many.
pub(crate) async fn cleanup(store: &Store) -> Result<u64> {
    let batches = super::delta::log::current(store, BATCHES_TABLE).await?;
    let folded = super::fold::folded(&batches);
    let cutoff = chrono::Utc::now() - KEEP;
    let listed: Vec<object_store::ObjectMeta> = store.object_store.list(Some(&store.key(PREFIX))).try_collect().await?;
    let mut deleted = 0;
    for m in listed {
        let Some((writer, segment)) = parse_key(m.location.as_ref()) else { continue };
        if m.last_modified < cutoff && folded.get(writer).is_some_and(|&f| segment <= f) {
            store.object_store.delete(&m.location).await?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// (writer, segment) of an intent's key.
fn parse_key(key: &str) -> Option<(&str, u64)> {
    let mut parts = key.rsplit('/');
    let segment = parts.next()?.strip_suffix(".json")?.parse().ok()?;
    Some((parts.next()?, segment))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_writer_and_segment() {
        assert_eq!(parse_key(&format!("pre/fix/{}", key("ab12", 42))), Some(("ab12", 42)));
        assert_eq!(parse_key("_ingero/intents/ab12/x.json"), None);
    }

    #[test]
    fn an_intent_reads_back_each_nodes_last() {
        let nodes = BTreeMap::from([("gpu-0".to_string(), NodeRange { first: 3, last: 9, batches: 7, rows: 70 })]);
        assert_eq!(parse(&body("w", 1, &nodes).unwrap()).unwrap(), BTreeMap::from([("gpu-0".to_string(), 9)]));
    }
}
