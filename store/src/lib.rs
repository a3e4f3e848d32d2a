// SPDX-License-Identifier: Apache-2.0
//! Ingero's storage layer: object-store selection, the write-ahead log, the
//! commit pipeline (group commit, dedup, flush), Parquet files in hive
//! partitions, the Delta Lake log over them and the signal tiers.
//!
//! It sits above the model and the wire (`ingero-model`, `ingero-proto`: WAL
//! replay decodes pushes) and below serving and analysis: it links no query
//! engine, ranking or reports (`scripts/check-layers.sh`).

pub mod batches;
pub mod bulk;
pub mod commit;
pub mod delta;
pub mod error;
#[cfg(test)]
mod fixtures;
pub mod flush;
pub(crate) mod fold;
pub mod handle;
pub(crate) mod held;
pub(crate) mod intent;
pub(crate) mod layout;
pub mod metrics;
pub mod parquet;
pub mod probe;
pub mod read;
pub mod retention;
pub mod state;
pub mod tier_read;
pub mod tiers;
pub mod upkeep;
pub mod url;
pub(crate) mod wal;

pub use error::{Error, Result};
pub use handle::Store;
pub use url::{StoreOptions, StoreUrl};
