// SPDX-License-Identifier: Apache-2.0
//! Ingero aggregator: ingest, persistence, ranking, queries and reports.
//!
//! Data flows one way: [`server`] (authenticate, validate) → [`store`]
//! (WAL, buffer, flush to Parquet in an object store) → [`query`]
//! (DataFusion over the store) → [`rank`] (straggler detection, live and
//! over history) and [`report`] (per-pod stall reports). [`import`] turns a
//! trace recorded by the reference product into the same tables.
//! The `ingero` binary (`src/bin/ingero`) holds the CLI.
//!
//! Feature `query` (default): DataFusion, SQLite import, history ranking,
//! reports and the gRPC query service. Without it the crate is the ingest
//! and storage half only, what `ingero-agent run --store` embeds.

#[cfg(feature = "query")]
pub mod import;
#[cfg(feature = "query")]
pub mod query;
pub mod rank;
#[cfg(feature = "query")]
pub mod report;
pub use ingero_model::time;
// Storage is its own crate; these keep the paths the rest of the crate uses.
pub use ingero_store::{self as store, Error, Result, error, metrics};
// So is serving (ingest, live ranking, HTTP).
pub use ingero_server as server;
