// SPDX-License-Identifier: Apache-2.0
//! Retention, compaction, vacuum and log cleanup of every table of the store (`ingero maintain`,
//! and `ingero serve` every `--maintain-every`).

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use ingero_model::Table;

use super::batches::{BATCHES_TABLE, batches_schema};
use super::delta::log::current;
use super::delta::maintain::{self, Upkeep};
use super::delta::props;
use super::retention::{self, Retention};
use super::tiers::{self, Tier};
use super::{Store, parquet};
use crate::error::Result;

type Encode = fn(&RecordBatch) -> Result<parquet::ParquetFile>;

/// Every table with its schema and the encoder of its files.
pub fn tables() -> Vec<(&'static str, SchemaRef, Encode)> {
    let mut v: Vec<(&'static str, SchemaRef, Encode)> =
        Table::ALL.iter().map(|t| (t.name(), t.schema(), parquet::encode as Encode)).collect();
    v.extend(Tier::ALL.iter().map(|t| (t.name(), tiers::schema(), tiers::encode as Encode)));
    v.push((BATCHES_TABLE, batches_schema(), tiers::encode as Encode));
    v
}

/// Expires old partitions (`data`), compacts, vacuums (files removed more
/// than `retention` ago) and cleans the logs of the tables `mine` selects.
pub async fn run(store: &Store, retention: Duration, data: &Retention, mine: impl Fn(&str) -> bool) -> Result<Upkeep> {
    let mut total = Upkeep::default();
    let now = chrono::Utc::now().timestamp_micros();
    for (name, schema, encode) in tables().into_iter().filter(|(n, _, _)| mine(n)) {
        if let Some(ttl) = data.ttl(name) {
            let e = retention::expire(store, name, &schema, ttl, now).await?;
            total.expired.files += e.files;
            total.expired.rows += e.rows;
            total.expired.bytes += e.bytes;
        }
        let c = maintain::compact(store, name, &schema, encode).await?;
        let v = maintain::vacuum(store, name, &schema, retention).await?;
        // The table's own `delta.logRetentionDuration` (ingero sets 2 days).
        // From the readers' cache: one request when compaction and vacuum
        // left the table as they read it.
        let config = current(store, name).await?.metadata.as_ref().map(|m| m.configuration.clone()).unwrap_or_default();
        let l = maintain::cleanup_log(store, name, props::log_retention(&config)).await?;
        total.compacted_files += c.compacted_files;
        total.written_files += c.written_files;
        total.deleted_files += v.deleted_files;
        total.deleted_log_files += l.deleted_log_files;
    }
    if mine(BATCHES_TABLE) {
        total.folded_nodes = super::fold::fold(store).await?;
        total.deleted_intents = super::fold::cleanup(store).await?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::action::{Action, MetaData};
    use crate::delta::log::commit_key;
    use crate::delta::{Snapshot, TableLog};

    /// Sets every file's modification time under `dir` to `ago` back.
    fn age(dir: &std::path::Path, ago: Duration) {
        let when = std::time::SystemTime::now() - ago;
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            std::fs::File::options().write(true).open(e.path()).unwrap().set_modified(when).unwrap();
        }
    }

    /// Maintenance cuts an ingero table's log three days on (its own
    /// `delta.logRetentionDuration`, 2 days), and leaves alone the log of a
    /// table whose owner asked for 30 days.
    #[tokio::test]
    async fn the_log_is_kept_as_long_as_the_table_says() {
        let day = Duration::from_secs(86_400);
        for (owner_says, kept) in [(None, false), (Some("interval 30 days"), true)] {
            let (dir, store) = crate::fixtures::temp_store();
            let name = Table::CallWindows.name();
            let mut log = TableLog::open(&store, name, &Table::CallWindows.schema()).await.unwrap();
            for _ in 0..120 {
                log.commit(&store, vec![], vec![], None, serde_json::json!({})).await.unwrap();
            }
            if let Some(v) = owner_says {
                let mut meta: MetaData = log.snapshot.metadata.clone().unwrap();
                meta.configuration.insert(props::LOG_RETENTION_KEY.into(), v.into());
                let body = crate::delta::action::encode(&[Action::MetaData(meta)]);
                assert!(store.put_if_absent(&commit_key(name, 121), body.into()).await.unwrap());
            }
            let log_dir = dir.path().join(name).join("_delta_log");
            age(&log_dir, 3 * day);
            let u = run(&store, 7 * day, &Retention::default(), |n| n == name).await.unwrap();
            assert_eq!(u.deleted_log_files == 0, kept, "{owner_says:?}: {u:?}");
            assert_eq!(Snapshot::load(&store, name).await.unwrap().version, Some(120 + kept as u64));
        }
    }
}
