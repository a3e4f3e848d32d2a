//! Persistence: object-store selection, WAL, commit pipeline, Parquet layout.

pub mod commit;
pub mod handle;
pub mod layout;
pub mod parquet;
pub mod read;
pub mod state;
pub mod url;
pub mod wal;

pub use handle::Store;
pub use url::{StoreOptions, StoreUrl};
