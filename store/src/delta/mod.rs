// SPDX-License-Identifier: Apache-2.0
//! Every table of the store is a Delta Lake table: Parquet files plus a
//! `_delta_log/` of atomic commits that Spark, Trino, DuckDB, Polars and
//! delta-rs read as they are. Written here without a Delta library (the
//! node agent's embedded store links this too); checked against delta-rs
//! in the tests.

pub mod action;
mod adds;
pub mod checkpoint;
pub mod evolve;
pub mod log;
pub mod maintain;
pub mod props;
pub mod protocol;
pub mod schema;
pub mod snapshot;
pub mod stats;
pub mod table;
pub mod visible;

pub use props::txn_retention;
pub use snapshot::Snapshot;
pub use table::TableLog;
