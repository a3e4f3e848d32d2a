// SPDX-License-Identifier: Apache-2.0
//! Which batches a table already holds of a node, without a `txn` per node
//! in every data commit.
//!
//! A writer about to commit table T learns it from: the completed
//! high-waters (`crate::fold::Completed`), the intents of segments another
//! writer committed to T but has not completed yet (a writer flushes its
//! segments one after another, so that is at most its segment T names), and
//! T's own node versions (written by versions of ingero before intents, and
//! for nodes still arriving at a writer). Read in that order — T, then
//! `ingest_batches`, then intents — every segment T holds is either
//! completed or has its intent on the store: the intent was written before
//! the segment's first table commit and is deleted only once folded and an
//! hour old. An intent states the segment's whole ranges, which can only
//! overstate what a late writer stored of a node; what it left out the
//! other writer stored.

use std::collections::{BTreeMap, HashMap};

use super::Store;
use super::batches::{BATCHES_TABLE, node_versions, writer_of};
use super::delta::Snapshot;
use super::fold::Completed;
use super::intent::{self, Lasts};
use crate::error::Result;

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
    pub(crate) async fn stored<R>(
        &mut self,
        store: &Store,
        me: &str,
        table: &Snapshot,
        wanted: &BTreeMap<String, R>,
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
        for (node, v) in self.completed.high_waters_of(store, &batches, |n| wanted.contains_key(n)).await? {
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
        let lasts = intent::read(store, writer, segment).await?;
        if lasts.is_some() {
            self.read.insert((writer.to_string(), segment), lasts.clone());
        }
        Ok(lasts)
    }
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
