// SPDX-License-Identifier: Apache-2.0
//! Committing to a Delta table from several writers at once: the next log
//! version is created with put-if-absent (S3 `If-None-Match: *`, a hard
//! link on local disks), so exactly one writer wins each version and the
//! others re-read the log and try the next one.

use std::collections::BTreeMap;

use arrow::datatypes::Schema;

use super::action::{self, Action, Add, Format, MetaData, Protocol, Txn};
use super::checkpoint;
use super::log::{Snapshot, commit_key};
use super::props;
use super::protocol;
use super::schema::{PARTITION_COLUMNS, schema_string};
use crate::Store;
use crate::error::Result;

/// One table's log, kept up to date by the writer that holds it.
#[derive(Debug)]
pub struct TableLog {
    pub snapshot: Snapshot,
    schema_string: String,
}

/// The `add` of a file already written at `rel` (relative to the table
/// directory, `date=…/hour=…/name.parquet`).
pub fn add(rel: &str, size: usize, stats: String) -> Add {
    let mut partition_values = BTreeMap::new();
    for part in rel.split('/') {
        if let Some((k, v)) = part.split_once('=')
            && PARTITION_COLUMNS.contains(&k)
        {
            partition_values.insert(k.to_string(), Some(v.to_string()));
        }
    }
    Add {
        path: rel.to_string(),
        partition_values,
        size: size as i64,
        modification_time: chrono::Utc::now().timestamp_millis(),
        data_change: true,
        stats: Some(stats),
    }
}

impl TableLog {
    pub async fn open(store: &Store, table: &str, logical: &Schema) -> Result<TableLog> {
        Ok(TableLog { snapshot: Snapshot::load(store, table).await?, schema_string: schema_string(logical)? })
    }

    /// Commits `adds` and `txns` in one new version, unless `guard`'s app
    /// already has its version (the commit happened before a crash).
    /// Returns the version written, or `None` when the guard held.
    pub async fn commit(
        &mut self,
        store: &Store,
        adds: Vec<Add>,
        txns: Vec<Txn>,
        guard: Option<&Txn>,
        info: serde_json::Value,
    ) -> Result<Option<u64>> {
        loop {
            self.prepare(store).await?;
            if let Some(g) = guard
                && self.snapshot.txns.get(&g.app_id).is_some_and(|&v| v >= g.version)
            {
                return Ok(None);
            }
            if let Some(v) = self.try_commit(store, adds.clone(), txns.clone(), info.clone()).await? {
                return Ok(Some(v));
            }
            // Another writer took the version: read it and try the one after.
        }
    }

    /// Brings the snapshot up to date, creating the table if it has no log.
    pub async fn prepare(&mut self, store: &Store) -> Result<()> {
        self.snapshot.refresh(store).await?;
        while self.snapshot.version.is_none() {
            self.create(store).await?;
            self.snapshot.refresh(store).await?;
        }
        protocol::check_writable(&self.snapshot.table, self.snapshot.protocol.as_ref())
    }

    /// One attempt at the version after the snapshot's (call [`Self::prepare`]
    /// first): `None` when another writer took it.
    pub async fn try_commit(
        &mut self,
        store: &Store,
        adds: Vec<Add>,
        txns: Vec<Txn>,
        info: serde_json::Value,
    ) -> Result<Option<u64>> {
        let now = chrono::Utc::now().timestamp_millis();
        let mut actions: Vec<Action> = Vec::with_capacity(adds.len() + txns.len() + 1);
        actions.push(Action::CommitInfo(serde_json::json!({
            "timestamp": now,
            "operation": "WRITE",
            "operationParameters": {"mode": "Append"},
            "isBlindAppend": true,
            "engineInfo": format!("ingero/{}", env!("CARGO_PKG_VERSION")),
            "ingero": info,
        })));
        if let Some(meta) = self.schema_update()? {
            actions.push(Action::MetaData(meta));
        }
        // Never below the version the table holds: another writer may have
        // stored later batches of a node first, and a reader takes the
        // latest txn as the app's version.
        let floor = |t: &Txn| self.snapshot.txns.get(&t.app_id).copied().unwrap_or(i64::MIN);
        actions.extend(
            txns.into_iter()
                .map(|t| Action::Txn(Txn { version: t.version.max(floor(&t)), last_updated: Some(now), ..t })),
        );
        actions.extend(adds.into_iter().map(Action::Add));
        let body = action::encode(&actions);
        let next = self.snapshot.version.map_or(0, |v| v + 1);
        if !store.put_if_absent(&commit_key(&self.snapshot.table, next), body.clone().into()).await? {
            return Ok(None);
        }
        self.snapshot.apply_commit(next, &body)?;
        self.checkpoint_if_due(store, next).await;
        Ok(Some(next))
    }

    /// Replaces `inputs` by `output` in one commit (compaction). `None` when
    /// another writer removed one of the inputs first: it compacted them.
    pub async fn replace(&mut self, store: &Store, inputs: &[String], outputs: Vec<Add>) -> Result<Option<u64>> {
        let info = serde_json::json!({"operation": "OPTIMIZE", "operationParameters": {"files": inputs.len()}});
        let outputs = outputs.into_iter().map(|o| Action::Add(Add { data_change: false, ..o }));
        self.remove_then(store, inputs, false, info, outputs.collect()).await
    }

    /// Removes `paths` in one commit (data retention: `dataChange: true`, a
    /// DELETE to readers). `None` when another writer removed one first.
    pub async fn remove_files(&mut self, store: &Store, paths: &[String]) -> Result<Option<u64>> {
        let info = serde_json::json!({
            "operation": "DELETE",
            "operationParameters": {"reason": "retention", "files": paths.len()},
        });
        self.remove_then(store, paths, true, info, vec![]).await
    }

    /// One commit that removes `paths` and adds `then`, retried on the next
    /// version until it lands, or `None` once one of `paths` is gone.
    async fn remove_then(
        &mut self,
        store: &Store,
        paths: &[String],
        data_change: bool,
        mut info: serde_json::Value,
        then: Vec<Action>,
    ) -> Result<Option<u64>> {
        let now = chrono::Utc::now().timestamp_millis();
        info["timestamp"] = now.into();
        info["engineInfo"] = format!("ingero/{}", env!("CARGO_PKG_VERSION")).into();
        let mut actions = vec![Action::CommitInfo(info)];
        actions.extend(paths.iter().map(|p| {
            Action::Remove(super::action::Remove { path: p.clone(), deletion_timestamp: Some(now), data_change })
        }));
        actions.extend(then);
        let body = action::encode(&actions);
        loop {
            self.snapshot.refresh(store).await?;
            protocol::check_writable(&self.snapshot.table, self.snapshot.protocol.as_ref())?;
            if paths.iter().any(|p| !self.snapshot.files.contains_key(p)) {
                return Ok(None);
            }
            let next = self.snapshot.version.map_or(0, |v| v + 1);
            if store.put_if_absent(&commit_key(&self.snapshot.table, next), body.clone().into()).await? {
                self.snapshot.apply_commit(next, &body)?;
                self.checkpoint_if_due(store, next).await;
                return Ok(Some(next));
            }
        }
    }

    /// The table's metadata with our columns merged in ([`super::evolve::merge`]),
    /// when that changes it: a new nullable column of a newer ingero, or a
    /// table written before unsigned columns were widened (u8 as `byte`),
    /// moved to the wide types by the first commit of wide files so outside
    /// engines read them under the right type.
    /// Tables created before ingero set its properties ([`props::OURS`]:
    /// transaction and log retention) gain them with the same commit; a
    /// value already there (another engine's, an owner's) is kept.
    fn schema_update(&self) -> Result<Option<MetaData>> {
        let Some(current) = self.snapshot.metadata.as_ref() else { return Ok(None) };
        let mut meta = current.clone();
        if current.schema_string != self.schema_string
            && let Some(merged) =
                super::evolve::merge(&self.snapshot.table, &current.schema_string, &self.schema_string)?
        {
            meta.schema_string = merged;
        }
        for (k, v) in props::OURS {
            meta.configuration.entry(k.into()).or_insert_with(|| v.into());
        }
        Ok((meta != *current).then_some(meta))
    }

    async fn checkpoint_if_due(&self, store: &Store, version: u64) {
        if version.is_multiple_of(checkpoint::EVERY) {
            // A reader without it replays more commits; nothing is lost.
            if let Err(e) = checkpoint::write(store, &self.snapshot).await {
                tracing::warn!(table = %self.snapshot.table, version, error = %e, "Delta checkpoint failed");
            }
        }
    }

    /// Version 0: protocol and metadata (whoever gets there first).
    async fn create(&mut self, store: &Store) -> Result<()> {
        let meta = MetaData {
            id: table_id(),
            name: Some(self.snapshot.table.clone()),
            format: Format { provider: "parquet".into(), options: BTreeMap::new() },
            schema_string: self.schema_string.clone(),
            partition_columns: PARTITION_COLUMNS.iter().map(|s| s.to_string()).collect(),
            configuration: props::OURS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            created_time: Some(chrono::Utc::now().timestamp_millis()),
        };
        let body = action::encode(&[Action::Protocol(Protocol::ours()), Action::MetaData(meta)]);
        store.put_if_absent(&commit_key(&self.snapshot.table, 0), body.into()).await?;
        Ok(())
    }
}

/// A random table id in UUID form, as the spec asks.
fn table_id() -> String {
    let r: u128 = rand::random();
    let h = format!("{r:032x}");
    format!("{}-{}-4{}-8{}-{}", &h[0..8], &h[8..12], &h[13..16], &h[17..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field};
    use object_store::ObjectStoreExt;

    /// A late commit of a node's older batches does not move its version
    /// back; and a log another engine wrote with a lower later txn reads as
    /// that later one (the protocol's "latest").
    #[tokio::test]
    async fn txn_versions_are_the_latest_and_never_written_lower() {
        let (_dir, store) = crate::fixtures::temp_store();
        let logical = Schema::new(vec![Field::new("node", DataType::Utf8, false)]);
        let mut log = TableLog::open(&store, "t", &logical).await.unwrap();
        let txn = |v| Txn { app_id: "node:a".into(), version: v, last_updated: None };
        log.commit(&store, vec![], vec![txn(100)], None, serde_json::json!({})).await.unwrap();
        let v = log.commit(&store, vec![], vec![txn(95)], None, serde_json::json!({})).await.unwrap().unwrap();
        let body = store.object_store.get(&store.key(&commit_key("t", v))).await.unwrap();
        let text = String::from_utf8(body.bytes().await.unwrap().to_vec()).unwrap();
        assert!(text.contains("\"version\":100"), "{text}");
        assert_eq!(Snapshot::load(&store, "t").await.unwrap().txns["node:a"], 100);

        let foreign = "{\"txn\":{\"appId\":\"node:a\",\"version\":7}}\n";
        assert!(store.put_if_absent(&commit_key("t", v + 1), foreign.into()).await.unwrap());
        assert_eq!(Snapshot::load(&store, "t").await.unwrap().txns["node:a"], 7, "the latest txn, not the highest");
    }

    /// A table created when u8 columns were stored as `byte` moves to the
    /// wide types with its next commit, keeping its id and partitioning, and
    /// gains the transaction retention ingero sets.
    #[tokio::test]
    async fn an_old_tables_schema_is_widened_by_the_next_commit() {
        let (_dir, store) = crate::fixtures::temp_store();
        let logical = Schema::new(vec![Field::new("hist_bucket", DataType::new_list(DataType::UInt8, false), false)]);
        let old = schema_string(&logical).unwrap().replace("\"short\"", "\"byte\"");
        assert!(old.contains("\"byte\""));
        let meta = MetaData {
            id: "0b3c5c1e-0000-4000-8000-000000000001".into(),
            name: Some("call_windows".into()),
            format: Format { provider: "parquet".into(), options: BTreeMap::new() },
            schema_string: old,
            partition_columns: PARTITION_COLUMNS.iter().map(|s| s.to_string()).collect(),
            configuration: BTreeMap::new(),
            created_time: Some(1),
        };
        let v0 = action::encode(&[Action::Protocol(Protocol::ours()), Action::MetaData(meta)]);
        assert!(store.put_if_absent(&commit_key("call_windows", 0), v0.into()).await.unwrap());

        let mut log = TableLog::open(&store, "call_windows", &logical).await.unwrap();
        let v = log.commit(&store, vec![], vec![], None, serde_json::json!({})).await.unwrap();
        assert_eq!(v, Some(1));
        let body = store.object_store.get(&store.key(&commit_key("call_windows", 1))).await.unwrap();
        let text = String::from_utf8(body.bytes().await.unwrap().to_vec()).unwrap();
        let meta_line = text.lines().find(|l| l.contains("metaData")).expect("a metaData action in version 1");
        assert!(meta_line.contains("0b3c5c1e-0000-4000-8000-000000000001"), "same table id: {meta_line}");
        assert!(meta_line.contains("short") && !meta_line.contains("byte"), "{meta_line}");
        assert!(meta_line.contains(r#""delta.setTransactionRetentionDuration":"interval 7 days""#), "{meta_line}");
        assert!(meta_line.contains(r#""delta.logRetentionDuration":"interval 2 days""#), "{meta_line}");
        // Once widened, later commits carry no metaData.
        let v = log.commit(&store, vec![], vec![], None, serde_json::json!({})).await.unwrap();
        let body = store.object_store.get(&store.key(&commit_key("call_windows", v.unwrap()))).await.unwrap();
        assert!(!String::from_utf8(body.bytes().await.unwrap().to_vec()).unwrap().contains("metaData"));
    }
}
