// SPDX-License-Identifier: Apache-2.0
//! Retention, compaction, vacuum and log cleanup of every table of the store (`ingero maintain`,
//! and `ingero serve` every `--maintain-every`).

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use ingero_model::Table;

use super::delta::maintain::{self, Upkeep};
use super::retention::{self, Retention};
use super::state::{BATCHES_TABLE, batches_schema};
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
        let l = maintain::cleanup_log(store, name, maintain::LOG_RETENTION).await?;
        total.compacted_files += c.compacted_files;
        total.written_files += c.written_files;
        total.deleted_files += v.deleted_files;
        total.deleted_log_files += l.deleted_log_files;
    }
    Ok(total)
}
