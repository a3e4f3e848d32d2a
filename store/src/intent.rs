// SPDX-License-Identifier: Apache-2.0
//! Segment intents: before a writer commits any table of a WAL segment it
//! writes, durably, per node the first and last batch sequence of the
//! segment to `_ingero/intents/<writer>/<segment>.json`. Data tables then
//! carry one `txn`, the writer's segment (and, for a node's first segments
//! at a writer, the node's: `flush::ARRIVING`); the segment's completion
//! names it in `ingest_batches`, and the node high-waters stay here until
//! maintenance folds them into node versions (`crate::fold`). At 10,000
//! nodes that is one node `txn` per node per maintenance run instead of one
//! per node per table per flush. Who reads them: `crate::held` (what a
//! table holds of a node) and `crate::fold` (the completed high-waters).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use super::Store;
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

/// Writes a segment's intent, `nodes`: node → [first, last] (durably: it
/// must outlive a crash before the segment's first table commit is
/// visible to others).
pub(crate) async fn write(store: &Store, writer: &str, segment: u64, nodes: &BTreeMap<&str, [u64; 2]>) -> Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    store.put_durable(&key(writer, segment), body(writer, segment, nodes)?.into()).await
}

fn body(writer: &str, segment: u64, nodes: &BTreeMap<&str, [u64; 2]>) -> Result<Vec<u8>> {
    serde_json::to_vec(&serde_json::json!({"writer": writer, "segment": segment, "nodes": nodes})).map_err(json)
}

fn json(e: serde_json::Error) -> Error {
    Error::State(format!("segment intent: {e}"))
}

/// A segment's intent; `None` where there is none (never written, or
/// folded and deleted).
pub(crate) async fn read(store: &Store, writer: &str, segment: u64) -> Result<Option<Lasts>> {
    match store.object_store.get(&store.key(&key(writer, segment))).await {
        Ok(r) => Ok(Some(Arc::new(parse(&r.bytes().await?)?))),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
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

/// Deletes the intents of each writer's segments up to `folded[writer]`
/// written more than [`KEEP`] ago; returns how many.
pub(crate) async fn delete_folded(store: &Store, folded: &HashMap<String, u64>) -> Result<u64> {
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
        let nodes = BTreeMap::from([("gpu-0", [3, 9])]);
        assert_eq!(parse(&body("w", 1, &nodes).unwrap()).unwrap(), BTreeMap::from([("gpu-0".to_string(), 9)]));
    }
}
