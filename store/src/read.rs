// SPDX-License-Identifier: Apache-2.0
//! Plain reads of a table's live files (its Delta snapshot), for tools and
//! tests; the query engine uses DataFusion over the same files.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use ingero_model::Table;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::Store;
use super::delta::log::current;
use super::delta::schema::to_logical;
use crate::error::Result;

/// Every live Parquet file of a table, as (key, size).
pub async fn list_files(store: &Store, table: Table) -> Result<Vec<(String, u64)>> {
    list_prefix(store, table.name()).await
}

/// Every live Parquet file of the named table, as (key, size).
pub async fn list_prefix(store: &Store, name: &str) -> Result<Vec<(String, u64)>> {
    let snap = current(store, name).await?;
    let mut files: Vec<(String, u64)> =
        snap.files.values().map(|a| (store.key(&format!("{name}/{}", a.path)).to_string(), a.size as u64)).collect();
    files.sort();
    Ok(files)
}

/// Reads every row of a table.
pub async fn read_table(store: &Store, table: Table) -> Result<Vec<RecordBatch>> {
    read_named(store, table.name(), &table.schema()).await
}

/// Reads every row of the named table (a signal tier, `ingest_batches`)
/// under its schema.
pub async fn read_named(store: &Store, name: &str, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    for (key, _) in list_prefix(store, name).await? {
        let bytes = store.object_store.get(&key.as_str().into()).await?.bytes().await?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
        for b in reader {
            out.push(to_logical(&b?, schema)?);
        }
    }
    Ok(out)
}
