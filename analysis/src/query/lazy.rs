// SPDX-License-Identifier: Apache-2.0
//! A table whose Delta snapshot is read the first time a query scans it, so
//! opening the engine reads no log and a query pays only for the tables it
//! names (an aged store's `call_windows` lists tens of thousands of files
//! that a ranking over the signal tiers never needs).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::catalog::{ScanArgs, ScanResult, Session, TableProvider};
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use ingero_store::Store;
use ingero_store::delta::log::current;
use ingero_store::delta::visible::Visible;
use object_store::ObjectMeta;
use object_store::path::Path;

/// Names a store-relative key as the engine's object store lists it.
pub(crate) type KeyOf = Arc<dyn Fn(&str) -> std::result::Result<Path, String> + Send + Sync>;

pub(crate) struct LazyTable {
    name: String,
    store: Store,
    /// The table over its directory, listed through `visible`.
    listing: Arc<dyn TableProvider>,
    visible: Arc<Visible>,
    key_of: KeyOf,
    /// Whether the snapshot had files; set by the first scan.
    loaded: tokio::sync::OnceCell<bool>,
}

impl std::fmt::Debug for LazyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyTable").field("name", &self.name).finish_non_exhaustive()
    }
}

impl LazyTable {
    pub(crate) fn new(
        name: &str,
        store: &Store,
        listing: Arc<dyn TableProvider>,
        visible: Arc<Visible>,
        key_of: KeyOf,
    ) -> LazyTable {
        LazyTable { name: name.to_string(), store: store.clone(), listing, visible, key_of, loaded: Default::default() }
    }

    /// Reads the snapshot once and shows its files; whether it has any.
    async fn load(&self) -> Result<bool> {
        let has_files = self.loaded.get_or_try_init(|| async {
            let snap = current(&self.store, &self.name).await.map_err(|e| DataFusionError::External(Box::new(e)))?;
            let mut files = Vec::with_capacity(snap.files.len());
            for (path, add) in &snap.files {
                let location = (self.key_of)(&format!("{}/{path}", self.name)).map_err(DataFusionError::Execution)?;
                let last_modified = chrono::DateTime::from_timestamp_millis(add.modification_time).unwrap_or_default();
                files.push(ObjectMeta {
                    location,
                    last_modified,
                    size: add.size.max(0) as u64,
                    e_tag: None,
                    version: None,
                });
            }
            self.visible.show(files);
            Ok::<_, DataFusionError>(!snap.files.is_empty())
        });
        has_files.await.copied()
    }

    /// An empty table of the same columns: a table with no files yet still plans.
    fn empty(&self) -> Result<MemTable> {
        MemTable::try_new(self.listing.schema(), vec![vec![]])
    }
}

#[async_trait::async_trait]
impl TableProvider for LazyTable {
    fn schema(&self) -> SchemaRef {
        self.listing.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        self.listing.supports_filters_pushdown(filters)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if self.load().await? {
            self.listing.scan(state, projection, filters, limit).await
        } else {
            self.empty()?.scan(state, projection, filters, limit).await
        }
    }

    async fn scan_with_args<'a>(&self, state: &dyn Session, args: ScanArgs<'a>) -> Result<ScanResult> {
        if self.load().await? {
            self.listing.scan_with_args(state, args).await
        } else {
            self.empty()?.scan_with_args(state, args).await
        }
    }
}
