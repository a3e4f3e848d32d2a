//! Ingero aggregator: ingest, persistence, ranking, queries and reports.
//!
//! Data flows one way: [`server`] (authenticate, validate) → [`store`]
//! (WAL, buffer, flush to Parquet in an object store) → [`query`]
//! (DataFusion over the store) → [`rank`] (straggler detection, live and
//! over history) and [`report`] (per-pod stall reports). [`import`] turns a
//! trace recorded by the reference product into the same tables.
//! The `ingero` binary (`src/bin/ingero`) holds the CLI.

pub mod error;
pub mod import;
pub(crate) mod metrics;
pub mod query;
pub mod rank;
pub mod report;
pub mod server;
pub mod store;

pub use error::{Error, Result};
