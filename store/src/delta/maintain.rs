// SPDX-License-Identifier: Apache-2.0
//! Table upkeep: compaction (many small files of a settled hour → one file
//! per 256 Ki rows, committed as one remove+add so no reader ever sees a row
//! twice or not at all) and vacuum (deleting files removed longer ago than
//! the retention, and files no commit ever referenced). Several replicas may
//! run it at once: a compaction whose inputs another one removed first is
//! dropped at commit, so the table's own log decides who wins.

use std::collections::BTreeMap;
use std::time::Duration;

use ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;

use super::schema::to_logical;
use super::table::{TableLog, add};
use crate::error::{Error, Result};
use crate::layout::hour_of;
use crate::parquet::ParquetFile;
use crate::{Store, parquet};

/// Files with fewer rows than this are compacted.
const SMALL_ROWS: u64 = parquet::FILE_ROWS as u64 / 2;
/// A partition is compacted once it has this many small files.
const MIN_FILES: usize = 8;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Upkeep {
    pub compacted_files: usize,
    pub written_files: usize,
    pub deleted_files: usize,
    /// Commits and checkpoints a newer checkpoint covers, past the log retention.
    pub deleted_log_files: usize,
    /// Node high-waters folded into `ingest_batches` (`crate::fold`).
    pub folded_nodes: u64,
    /// Intents of segments folded, completed over an hour ago (`crate::intent`).
    pub deleted_intents: u64,
    /// Removed by data retention (files, rows, bytes), deleted later by vacuum.
    pub expired: crate::retention::Expired,
}

/// Groups of small files to merge: per settled hour partition, packed up to [`parquet::FILE_ROWS`] rows.
fn plan(log: &TableLog, now_us: i64) -> Vec<Vec<String>> {
    let current = hour_of(now_us);
    let mut by_part: BTreeMap<(String, String), Vec<(&String, u64)>> = BTreeMap::new();
    for (path, a) in &log.snapshot.files {
        let (date, hour) = (a.partition_values.get("date"), a.partition_values.get("hour"));
        let (Some(Some(d)), Some(Some(h))) = (date, hour) else { continue };
        let rows = a.rows();
        if rows < SMALL_ROWS {
            by_part.entry((d.clone(), h.clone())).or_default().push((path, rows));
        }
    }
    let mut groups = Vec::new();
    for ((date, hour), files) in by_part {
        let settled = chrono::NaiveDate::parse_from_str(&date, "%Y-%m-%d")
            .ok()
            .and_then(|d| d.and_hms_opt(hour.parse().ok()?, 0, 0))
            .is_some_and(|t| hour_of(t.and_utc().timestamp_micros()) < current - 1);
        if !settled || files.len() < MIN_FILES {
            continue;
        }
        let mut group: Vec<String> = Vec::new();
        let mut rows = 0;
        for (path, r) in files {
            if rows + r > parquet::FILE_ROWS as u64 && group.len() > 1 {
                groups.push(std::mem::take(&mut group));
                rows = 0;
            }
            group.push(path.clone());
            rows += r;
        }
        if group.len() > 1 {
            groups.push(group);
        }
    }
    groups
}

pub(crate) async fn read_all(store: &Store, table: &str, paths: &[String], logical: &SchemaRef) -> Result<RecordBatch> {
    let mut batches = Vec::new();
    for p in paths {
        let bytes = store.object_store.get(&store.key(&format!("{table}/{p}"))).await?.bytes().await?;
        for b in ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()? {
            batches.push(to_logical(&b?, logical)?);
        }
    }
    Ok(concat_batches(logical, &batches)?)
}

/// Compacts the table's settled partitions; `encode` writes one merged file.
pub async fn compact(
    store: &Store,
    table: &str,
    logical: &SchemaRef,
    encode: fn(&RecordBatch) -> Result<ParquetFile>,
) -> Result<Upkeep> {
    let mut log = TableLog::open(store, table, logical).await?;
    let mut done = Upkeep::default();
    for group in plan(&log, chrono::Utc::now().timestamp_micros()) {
        let merged = read_all(store, table, &group, logical).await?;
        let dir = group[0].rsplit_once('/').map_or("", |(d, _)| d).to_string();
        let rel = format!("{dir}/compact-{:016x}.parquet", rand::random::<u64>());
        let file = tokio::task::spawn_blocking(move || encode(&merged))
            .await
            .map_err(|e| Error::State(format!("compaction encoder panicked: {e}")))??;
        let output = add(&rel, file.bytes.len(), file.stats);
        store.put_durable(&format!("{table}/{rel}"), file.bytes.into()).await?;
        match log.replace(store, &group, vec![output]).await? {
            Some(_) => {
                done.compacted_files += group.len();
                done.written_files += 1;
            }
            // Another replica compacted them first; ours is an orphan for vacuum.
            None => tracing::debug!(table, files = group.len(), "compaction lost to another writer"),
        }
    }
    Ok(done)
}

/// Deletes files removed before `retention` ago, and files older than that
/// which no commit references (a writer that died between writing a file
/// and committing it).
pub async fn vacuum(store: &Store, table: &str, logical: &SchemaRef, retention: Duration) -> Result<Upkeep> {
    let log = TableLog::open(store, table, logical).await?;
    let cutoff_ms = chrono::Utc::now().timestamp_millis() - retention.as_millis() as i64;
    let prefix = store.key(&format!("{table}/"));
    let listed: Vec<object_store::ObjectMeta> = store.object_store.list(Some(&prefix)).try_collect().await?;
    let mut done = Upkeep::default();
    for m in listed {
        let key = m.location.to_string();
        let Some(rel) = key.strip_prefix(&format!("{prefix}/")).or_else(|| key.strip_prefix(prefix.as_ref())) else {
            continue;
        };
        let rel = rel.trim_start_matches('/');
        if rel.starts_with("_delta_log/") || !rel.ends_with(".parquet") || log.snapshot.files.contains_key(rel) {
            continue;
        }
        let removed_at = log.snapshot.tombstones.get(rel).copied();
        let old = removed_at.unwrap_or_else(|| m.last_modified.timestamp_millis()) < cutoff_ms;
        if old {
            store.object_store.delete(&m.location).await?;
            done.deleted_files += 1;
        }
    }
    Ok(done)
}

/// Deletes the log entries (`<version>.json`, older checkpoints, other
/// engines' `<version>.*` files) below the checkpoint `_last_checkpoint`
/// names, once older than `retention`, so the log stops growing with the
/// table's age. Without a checkpoint nothing is deleted.
pub async fn cleanup_log(store: &Store, table: &str, retention: Duration) -> Result<Upkeep> {
    let mut done = Upkeep::default();
    let Some(cp) = super::checkpoint::last_version(store, table).await else { return Ok(done) };
    match store.object_store.head(&store.key(&super::checkpoint::checkpoint_key(table, cp))).await {
        Ok(_) => {}
        Err(object_store::Error::NotFound { .. }) => return Ok(done),
        Err(e) => return Err(e.into()),
    }
    let cutoff = chrono::Utc::now() - retention;
    let log = store.key(&format!("{table}/_delta_log/"));
    let listed: Vec<object_store::ObjectMeta> = store.object_store.list(Some(&log)).try_collect().await?;
    for m in listed {
        let name = m.location.filename().unwrap_or_default();
        let version = name.split('.').next().filter(|v| v.len() == 20).and_then(|v| v.parse::<u64>().ok());
        if version.is_some_and(|v| v < cp) && m.last_modified < cutoff {
            store.object_store.delete(&m.location).await?;
            done.deleted_log_files += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::log::Snapshot;
    use arrow::datatypes::{DataType, Field, Schema};

    /// 250 commits (checkpoints at 100 and 200): cleanup keeps what a fresh
    /// log keeps, deletes only what checkpoint 200 covers, and the table
    /// reads the same before and after.
    #[tokio::test]
    async fn an_aged_log_is_cut_at_its_checkpoint_and_the_table_reads_the_same() {
        let (dir, store) = crate::fixtures::temp_store();
        let logical = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        let mut log = TableLog::open(&store, "t", &logical).await.unwrap();
        for i in 0..250 {
            let file = add(&format!("date=2026-11-27/hour=1/f{i}.parquet"), 100, crate::delta::stats::rows_only(1));
            log.commit(&store, vec![file], vec![], None, serde_json::json!({})).await.unwrap();
        }
        let before = Snapshot::load(&store, "t").await.unwrap();
        assert_eq!(before.version, Some(250));
        let log_dir = dir.path().join("t/_delta_log");
        let count = || std::fs::read_dir(&log_dir).unwrap().count();
        assert_eq!(count(), 251 + 2 + 1, "251 commits, 2 checkpoints, _last_checkpoint");

        // Within the retention (Delta's 30 days) nothing goes.
        assert_eq!(
            cleanup_log(&store, "t", crate::delta::props::DELTA_LOG_RETENTION).await.unwrap().deleted_log_files,
            0
        );
        // Past it: commits 0..=199 and checkpoint 100.
        assert_eq!(cleanup_log(&store, "t", Duration::ZERO).await.unwrap().deleted_log_files, 201);
        assert_eq!(count(), 51 + 1 + 1, "commits 200..=250, checkpoint 200, _last_checkpoint");

        let after = Snapshot::load(&store, "t").await.unwrap();
        assert_eq!(after.version, before.version);
        assert_eq!(after.files.keys().collect::<Vec<_>>(), before.files.keys().collect::<Vec<_>>());
        assert_eq!(after.files.len(), 250);
    }

    /// A stale `_last_checkpoint` (naming a checkpoint that is gone) falls
    /// back to the whole log instead of failing or reading too little.
    #[tokio::test]
    async fn a_stale_last_checkpoint_falls_back_to_the_whole_log() {
        let (_dir, store) = crate::fixtures::temp_store();
        let logical = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        let mut log = TableLog::open(&store, "t", &logical).await.unwrap();
        for i in 0..5 {
            let file = add(&format!("date=2026-11-27/hour=1/f{i}.parquet"), 100, crate::delta::stats::rows_only(1));
            log.commit(&store, vec![file], vec![], None, serde_json::json!({})).await.unwrap();
        }
        let pointer = br#"{"version":3,"size":9}"#.to_vec();
        store.put_durable(&crate::delta::checkpoint::last_checkpoint_key("t"), pointer.into()).await.unwrap();
        let snap = Snapshot::load(&store, "t").await.unwrap();
        assert_eq!((snap.version, snap.files.len()), (Some(5), 5));
        assert_eq!(cleanup_log(&store, "t", Duration::ZERO).await.unwrap().deleted_log_files, 0);
    }
}
