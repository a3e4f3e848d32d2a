// SPDX-License-Identifier: Apache-2.0
//! Persistence: object-store selection, WAL, commit pipeline, Parquet layout.

// Only the importer (feature `query`) writes in bulk today.
#[cfg_attr(not(feature = "query"), allow(dead_code))]
pub(crate) mod bulk;
pub mod commit;
pub mod delta;
pub mod flush;
pub mod handle;
pub(crate) mod layout;
pub mod parquet;
pub mod read;
pub mod state;
pub mod tiers;
pub mod upkeep;
pub mod url;
pub(crate) mod wal;

pub use handle::Store;
pub use url::{StoreOptions, StoreUrl};
