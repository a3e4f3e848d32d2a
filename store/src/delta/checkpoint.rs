// SPDX-License-Identifier: Apache-2.0
//! Delta checkpoints: the whole state of a table at one version in one
//! Parquet file, so readers (ours and every other engine) stop replaying
//! the log from version 0. A checkpoint row is an action; the Parquet
//! columns are the actions' JSON fields, so rows are built from, and read
//! back into, the same JSON lines the commits hold.

use std::io::Cursor;
use std::sync::{Arc, OnceLock};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use object_store::ObjectStoreExt;
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::action::{self, Action, Txn};
use super::snapshot::Snapshot;
use crate::Store;
use crate::error::{Error, Result};

/// A checkpoint every this many commits (Delta's own default).
pub const EVERY: u64 = 100;

pub(crate) fn checkpoint_key(table: &str, version: u64) -> String {
    format!("{table}/_delta_log/{version:020}.checkpoint.parquet")
}

fn s(name: &str) -> Field {
    Field::new(name, DataType::Utf8, true)
}

fn l(name: &str) -> Field {
    Field::new(name, DataType::Int64, true)
}

fn map(name: &str) -> Field {
    Field::new_map(name, "key_value", Field::new("key", DataType::Utf8, false), s("value"), false, true)
}

fn st(name: &str, fields: Vec<Field>) -> Field {
    Field::new(name, DataType::Struct(Fields::from(fields)), true)
}

/// The checkpoint schema of the spec, for the actions this store writes.
fn schema() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            st("txn", vec![s("appId"), l("version"), l("lastUpdated")]),
            st(
                "add",
                vec![
                    s("path"),
                    map("partitionValues"),
                    l("size"),
                    l("modificationTime"),
                    Field::new("dataChange", DataType::Boolean, true),
                    s("stats"),
                ],
            ),
            st("remove", vec![s("path"), l("deletionTimestamp"), Field::new("dataChange", DataType::Boolean, true)]),
            st(
                "metaData",
                vec![
                    s("id"),
                    s("name"),
                    s("description"),
                    st("format", vec![s("provider"), map("options")]),
                    s("schemaString"),
                    Field::new_list("partitionColumns", Field::new_list_field(DataType::Utf8, true), true),
                    map("configuration"),
                    l("createdTime"),
                ],
            ),
            st(
                "protocol",
                vec![
                    Field::new("minReaderVersion", DataType::Int32, true),
                    Field::new("minWriterVersion", DataType::Int32, true),
                    Field::new_list("readerFeatures", Field::new_list_field(DataType::Utf8, true), true),
                    Field::new_list("writerFeatures", Field::new_list_field(DataType::Utf8, true), true),
                ],
            ),
        ]))
    })
    .clone()
}

/// The actions that rebuild `snap`.
fn actions(snap: &Snapshot) -> Vec<Action> {
    let mut out = Vec::new();
    out.extend(snap.protocol.clone().map(Action::Protocol));
    out.extend(snap.metadata.clone().map(Action::MetaData));
    // Transactions of apps silent longer than the table's retention expire
    // here (Delta's `delta.setTransactionRetentionDuration`): nodes and
    // replicas that are gone stop weighing on every later snapshot.
    let retention = snap.metadata.as_ref().and_then(|m| super::txn_retention(&m.configuration));
    let expired_before = retention.map(|r| chrono::Utc::now().timestamp_millis() - r.as_millis() as i64);
    let mut txns: Vec<(&String, &i64)> = snap.txns.iter().collect();
    txns.sort();
    out.extend(txns.into_iter().filter_map(|(app, &version)| {
        let last_updated = snap.txn_updated.get(app).copied();
        let expired = matches!((last_updated, expired_before), (Some(t), Some(before)) if t < before);
        (!expired).then(|| Action::Txn(Txn { app_id: app.clone(), version, last_updated }))
    }));
    out.extend(snap.files.values().cloned().map(Action::Add));
    // Tombstones a reader may still need (vacuum has not deleted them yet).
    let keep_after = chrono::Utc::now().timestamp_millis() - TOMBSTONE_RETENTION_MS;
    out.extend(snap.tombstones.iter().filter(|&(_, &t)| t >= keep_after).map(|(path, &t)| {
        Action::Remove(super::action::Remove { path: path.clone(), deletion_timestamp: Some(t), data_change: false })
    }));
    out
}

/// How long removed files stay listed (and on disk): Delta's default, 7 days,
/// so a reader on an older snapshot still finds its files.
pub const TOMBSTONE_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

/// Key of the pointer to the newest checkpoint, relative to the store.
pub fn last_checkpoint_key(table: &str) -> String {
    format!("{table}/_delta_log/_last_checkpoint")
}

/// The version `_last_checkpoint` names; None when it is missing or
/// unreadable (then the whole log is listed, as before any checkpoint).
pub async fn last_version(store: &Store, table: &str) -> Option<u64> {
    let body = store.object_store.get(&store.key(&last_checkpoint_key(table))).await.ok()?.bytes().await.ok()?;
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    v.get("version")?.as_u64()
}

/// Writes the checkpoint of `snap` (at its version) and `_last_checkpoint`.
pub async fn write(store: &Store, snap: &Snapshot) -> Result<()> {
    let Some(version) = snap.version else { return Ok(()) };
    let acts = actions(snap);
    let batch = decode(&action::encode(&acts), acts.len())?;
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, schema(), None)?;
    w.write(&batch)?;
    w.close()?;
    store.put_durable(&checkpoint_key(&snap.table, version), buf.into()).await?;
    let last = serde_json::json!({"version": version, "size": acts.len()}).to_string();
    store.put_durable(&last_checkpoint_key(&snap.table), last.into_bytes().into()).await
}

/// JSON actions as one batch of checkpoint rows.
fn decode(body: &[u8], rows: usize) -> Result<RecordBatch> {
    let reader = arrow::json::ReaderBuilder::new(schema()).with_batch_size(rows.max(1)).build(Cursor::new(body))?;
    let batches: Vec<RecordBatch> = reader.collect::<std::result::Result<_, _>>()?;
    Ok(arrow::compute::concat_batches(&schema(), &batches)?)
}

#[cfg(test)]
pub(super) fn decode_for_test(body: &[u8]) -> RecordBatch {
    decode(body, 1 << 20).unwrap()
}

/// The actions of a checkpoint.
pub async fn read(store: &Store, table: &str, version: u64) -> Result<Vec<Action>> {
    read_as(store, table, version, true).await
}

/// The actions of a checkpoint; `with_stats: false` leaves out every file's
/// statistics (most of an aged checkpoint's bytes), for readers that only
/// list files.
pub async fn read_as(store: &Store, table: &str, version: u64, with_stats: bool) -> Result<Vec<Action>> {
    let bytes = store.object_store.get(&store.key(&checkpoint_key(table, version))).await?.bytes().await?;
    let mut builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    if !with_stats {
        let descr = builder.parquet_schema();
        let keep: Vec<usize> =
            (0..descr.num_columns()).filter(|&i| descr.column(i).path().parts() != ["add", "stats"]).collect();
        let mask = ProjectionMask::leaves(descr, keep);
        builder = builder.with_projection(mask);
    }
    let reader = builder.build()?;
    let batches: Vec<RecordBatch> = reader.collect::<std::result::Result<_, _>>()?;
    let mut out = Vec::new();
    let mut json = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut json);
        for b in &batches {
            match super::adds::split(b, with_stats) {
                Some((adds, rest)) => {
                    out.extend(adds.into_iter().map(Action::Add));
                    w.write(&rest)?;
                }
                None => w.write(b)?,
            }
        }
        w.finish()?;
    }
    let text = String::from_utf8(json).map_err(|e| Error::State(e.to_string()))?;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let a =
            Action::parse(line).map_err(|e| Error::State(format!("{table}: checkpoint {version} is corrupt: {e}")))?;
        out.extend(a);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::{TableLog, log::commit_key};
    use arrow::datatypes::{DataType, Field};

    fn txns_of(actions: &[Action]) -> Vec<(String, Option<i64>)> {
        let mut out: Vec<_> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Txn(t) => Some((t.app_id.clone(), t.last_updated)),
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    /// A node silent longer than the table's transaction retention leaves
    /// the next checkpoint; a recent one and one that never said when stay,
    /// and `lastUpdated` survives the checkpoint's Parquet.
    #[tokio::test]
    async fn transactions_older_than_the_retention_expire_at_the_checkpoint() {
        let (_dir, store) = crate::fixtures::temp_store();
        let logical = Schema::new(vec![Field::new("node", DataType::Utf8, false)]);
        let mut log = TableLog::open(&store, "t", &logical).await.unwrap();
        let txn = |app: &str| Txn { app_id: app.into(), version: 1, last_updated: None };
        let v = log.commit(&store, vec![], vec![txn("node:new")], None, serde_json::json!({})).await.unwrap();
        let day_ms = 86_400_000;
        let old = chrono::Utc::now().timestamp_millis() - 8 * day_ms;
        let foreign = format!(
            "{{\"txn\":{{\"appId\":\"node:gone\",\"version\":3,\"lastUpdated\":{old}}}}}\n\
             {{\"txn\":{{\"appId\":\"node:legacy\",\"version\":4}}}}\n"
        );
        assert!(store.put_if_absent(&commit_key("t", v.unwrap() + 1), foreign.into()).await.unwrap());
        let snap = Snapshot::load(&store, "t").await.unwrap();
        assert_eq!(snap.txns.len(), 3, "the log itself keeps every txn: {:?}", snap.txns);
        assert_eq!(
            super::super::txn_retention(&snap.metadata.as_ref().unwrap().configuration).unwrap().as_secs(),
            7 * 86_400
        );

        write(&store, &snap).await.unwrap();
        let got = txns_of(&read(&store, "t", snap.version.unwrap()).await.unwrap());
        let names: Vec<&str> = got.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(names, ["node:legacy", "node:new"], "{got:?}");
        assert!(got[1].1.is_some_and(|t| t > old + 7 * day_ms), "lastUpdated kept: {got:?}");
        let reloaded = Snapshot::load(&store, "t").await.unwrap();
        assert!(!reloaded.txns.contains_key("node:gone") && reloaded.txns.contains_key("node:new"));

        // Readers that only list files read it without the statistics.
        let add = crate::delta::table::add("date=2026-11-28/hour=1/f.parquet", 10, r#"{"numRecords":3}"#.into());
        let mut with_file = snap.clone();
        with_file.files.insert(add.path.clone(), add);
        write(&store, &with_file).await.unwrap();
        let adds = |acts: Vec<Action>| -> Vec<(String, Option<String>)> {
            acts.into_iter()
                .filter_map(|a| match a {
                    Action::Add(a) => Some((a.path, a.stats)),
                    _ => None,
                })
                .collect()
        };
        let v = with_file.version.unwrap();
        let full = adds(read(&store, "t", v).await.unwrap());
        let lean = adds(read_as(&store, "t", v, false).await.unwrap());
        assert_eq!(full, [("date=2026-11-28/hour=1/f.parquet".to_string(), Some(r#"{"numRecords":3}"#.to_string()))]);
        assert_eq!(lean, [("date=2026-11-28/hour=1/f.parquet".to_string(), None)]);
        let txns = txns_of(&read_as(&store, "t", v, false).await.unwrap());
        assert_eq!(txns.len(), 2, "the rest as it was: {txns:?}");

        // Without the property (a table another engine made), nothing expires.
        let mut bare = snap.clone();
        bare.metadata.as_mut().unwrap().configuration.clear();
        assert_eq!(txns_of(&actions(&bare)).len(), 3);
    }
}
