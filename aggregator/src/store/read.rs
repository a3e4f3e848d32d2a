// SPDX-License-Identifier: Apache-2.0
//! Plain reads of a table straight from the store (tools and tests; the
//! query engine uses DataFusion over the same files).

use arrow::array::RecordBatch;
use futures::TryStreamExt;
use ingero_proto::Table;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::Store;
use crate::error::Result;

/// Every Parquet file of a table, as (key, size).
pub async fn list_files(store: &Store, table: Table) -> Result<Vec<(String, u64)>> {
    list_prefix(store, table.name()).await
}

/// Every Parquet file under a table directory, as (key, size).
pub async fn list_prefix(store: &Store, name: &str) -> Result<Vec<(String, u64)>> {
    let prefix = store.key(name);
    let mut files: Vec<(String, u64)> =
        store.object_store.list(Some(&prefix)).map_ok(|m| (m.location.to_string(), m.size)).try_collect().await?;
    files.retain(|(k, _)| k.ends_with(".parquet"));
    files.sort();
    Ok(files)
}

/// Reads every row of a table.
pub async fn read_table(store: &Store, table: Table) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    for (key, _) in list_files(store, table).await? {
        let bytes = store.object_store.get(&key.as_str().into()).await?.bytes().await?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
        for b in reader {
            out.push(b?);
        }
    }
    Ok(out)
}
