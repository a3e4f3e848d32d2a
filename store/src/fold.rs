// SPDX-License-Identifier: Apache-2.0
//! Each node's completed high-water — the highest batch sequence of any
//! segment every table holds — without a `txn` per node per flush.
//!
//! A segment's completion (its `ingest_batches` commit) names the writer's
//! segment; the node sequences stay in the segment's intent
//! (`crate::intent`). Maintenance folds them, every run, into the
//! `node:<name>` versions of `ingest_batches` and marks each writer's
//! folded segments with `ingero-folded-<writer>`: at 10,000 nodes, one
//! `txn` per node per maintenance run instead of one per node per flush.
//! A reader takes the node versions and, for each writer, the intents of
//! the completed segments above its folded one (listed once, cached: an
//! intent never changes).
//!
//! An intent is deleted only after a fold that covers it has committed, so
//! a reader that finds one gone reads `ingest_batches` again afterwards and
//! gets the fold's versions: the high-waters read are never less than the
//! snapshot given says.

use std::collections::{BTreeMap, HashMap};

use super::Store;
use super::batches::{BATCHES_TABLE, batches_schema, node_app, node_versions, writer_of};
use super::delta::action::Txn;
use super::delta::{Snapshot, TableLog};
use super::intent;
use crate::error::Result;

const FOLDED_APP: &str = "ingero-folded-";
const FOLDS_APP: &str = "ingero-folds-";

/// Transaction app id of a writer's folded segments.
pub(crate) fn folded_app(writer: &str) -> String {
    format!("{FOLDED_APP}{writer}")
}

/// Transaction app id a writer's completions carry to say they leave node
/// high-waters to folds (a writer without it commits them every segment).
pub(crate) fn folds_app(writer: &str) -> String {
    format!("{FOLDS_APP}{writer}")
}

/// How recently a writer that commits node high-waters every segment (an
/// ingero before folds) must have completed one for completions to carry
/// them again: such a replica reads a node's high-water only there.
const OLD_WRITER_RECENT: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// True when a replica of an ingero before folds completed a segment in
/// `batches` lately: a node moving to it must find its high-water in the
/// node versions, so completions carry every node's again.
pub(crate) fn old_writer_active(batches: &Snapshot, now_ms: i64) -> bool {
    batches.txns.keys().filter_map(|app| Some((app, writer_of(app)?))).any(|(app, w)| {
        let recent = batches.txn_updated.get(app).is_some_and(|&ms| now_ms - ms < OLD_WRITER_RECENT.num_milliseconds());
        recent && !batches.txns.contains_key(&folds_app(w))
    })
}

/// Per writer, (folded, completed) segments in `batches`.
fn segments(batches: &Snapshot) -> BTreeMap<&str, (u64, u64)> {
    let mut out: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (app, &v) in &batches.txns {
        let v = v.max(0) as u64;
        if let Some(w) = writer_of(app) {
            out.entry(w).or_default().1 = v;
        }
    }
    for (w, (folded, _)) in out.iter_mut() {
        *folded = batches.txns.get(&folded_app(w)).map_or(0, |&v| v.max(0) as u64);
    }
    out
}

/// A writer's completed segments not yet folded past which it folds
/// itself (maintenance folds every run, long before).
pub(crate) const SELF_FOLD: u64 = 256;

/// How many of `writer`'s completed segments `batches` has not folded
/// (the commit just made included: it is not in the snapshot yet).
pub(crate) fn backlog(batches: &Snapshot, writer: &str) -> u64 {
    segments(batches).get(writer).map_or(0, |&(folded, completed)| completed.saturating_sub(folded)) + 1
}

/// The completed segments' intents read so far.
#[derive(Debug, Default)]
pub(crate) struct Completed {
    /// Per writer, the segment up to which its intents are in `lasts`.
    read_to: HashMap<String, u64>,
    /// Per node, the highest last sequence of the intents read.
    lasts: HashMap<String, u64>,
}

impl Completed {
    /// Per node, at least the highest sequence of the segments `batches`
    /// lists as completed.
    pub(crate) async fn high_waters(&mut self, store: &Store, batches: &Snapshot) -> Result<BTreeMap<String, u64>> {
        self.high_waters_of(store, batches, |_| true).await
    }

    /// [`Self::high_waters`] of the nodes `keep` selects only (a segment's
    /// nodes: not a copy of the fleet's per table commit).
    pub(crate) async fn high_waters_of(
        &mut self,
        store: &Store,
        batches: &Snapshot,
        keep: impl Fn(&str) -> bool,
    ) -> Result<BTreeMap<String, u64>> {
        let mut read_any = false;
        for (w, (folded, completed)) in segments(batches) {
            let from = self.read_to.get(w).copied().unwrap_or(0).max(folded);
            if completed <= from {
                continue;
            }
            read_any = true;
            for (_, lasts) in intent::listed(store, w, from, completed).await? {
                for (n, &last) in lasts.iter() {
                    let e = self.lasts.entry(n.clone()).or_default();
                    *e = (*e).max(last);
                }
            }
            self.read_to.insert(w.to_string(), completed);
        }
        if read_any {
            // An intent a fold covered may have been deleted while it was
            // listed: that fold is in the log now. Kept, as every value
            // here: a completed high-water stays true.
            let now = super::delta::log::current(store, BATCHES_TABLE).await?;
            for (n, v) in node_versions(&now.txns) {
                let e = self.lasts.entry(n.to_string()).or_default();
                *e = (*e).max(v);
            }
        }
        let mut hw: BTreeMap<String, u64> =
            self.lasts.iter().filter(|(n, _)| keep(n)).map(|(n, &v)| (n.clone(), v)).collect();
        for (n, v) in node_versions(&batches.txns).filter(|(n, _)| keep(n)) {
            let e = hw.entry(n.to_string()).or_default();
            *e = (*e).max(v);
        }
        Ok(hw)
    }
}

/// Folds the completed segments' intents into `ingest_batches`' node
/// versions; returns the node versions committed.
pub(crate) async fn fold(store: &Store) -> Result<u64> {
    let mut log = TableLog::open(store, BATCHES_TABLE, &batches_schema()).await?;
    loop {
        log.prepare(store).await?;
        let snap = &log.snapshot;
        let mut txns: Vec<Txn> = segments(snap)
            .into_iter()
            .filter(|(_, (folded, completed))| completed > folded)
            .map(|(w, (_, completed))| Txn { app_id: folded_app(w), version: completed as i64, last_updated: None })
            .collect();
        if txns.is_empty() {
            return Ok(0);
        }
        // What a fresh reader gets: the node versions and every completed
        // segment's intent above its writer's folded one.
        let lasts = Completed::default().high_waters(store, snap).await?;
        let raised: Vec<Txn> = lasts
            .into_iter()
            .filter(|(n, last)| snap.txns.get(&node_app(n)).is_none_or(|&v| (*last as i64) > v))
            .map(|(n, last)| Txn { app_id: node_app(&n), version: last as i64, last_updated: None })
            .collect();
        let nodes = raised.len() as u64;
        txns.extend(raised);
        let info = serde_json::json!({"operation": "FOLD HIGH-WATERS", "nodes": nodes});
        if log.try_commit(store, Vec::new(), txns, info).await?.is_some() {
            return Ok(nodes);
        }
    }
}

/// The folded segments of each writer in `batches`.
pub(crate) fn folded(batches: &Snapshot) -> HashMap<String, u64> {
    segments(batches).into_iter().map(|(w, (f, _))| (w.to_string(), f)).collect()
}

/// Deletes the intents of folded segments written more than
/// [`intent::KEEP`] ago; returns how many.
pub(crate) async fn cleanup(store: &Store) -> Result<u64> {
    let batches = super::delta::log::current(store, BATCHES_TABLE).await?;
    intent::delete_folded(store, &folded(&batches)).await
}
