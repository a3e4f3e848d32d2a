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

pub mod error;
#[cfg(feature = "query")]
pub mod import;
pub(crate) mod metrics;
#[cfg(feature = "query")]
pub mod query;
pub mod rank;
#[cfg(feature = "query")]
pub mod report;
pub mod server;
pub mod store;
pub use ingero_model::time;

pub use error::{Error, Result};
