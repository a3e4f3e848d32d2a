// SPDX-License-Identifier: Apache-2.0
//! Ingero's data model, with no I/O: what every other crate agrees on.
//!
//! - [`schema`]: the Arrow schema of every table, with units and meaning.
//! - [`tables`]: one typed row struct per table; the schema is generated from them.
//! - [`rows`]: builders that turn those rows into batches of the schemas.
//! - [`hist`]: the latency histogram shared with the eBPF programs.
//! - [`values`]: checks on the values of decoded batches.
//! - [`signals`]: the straggler detector's per-window inputs, from the tables.
//! - [`time`]: RFC 3339 and median, shared by the detector, reports and CLI.
//! - [`units`]: sizes on the command line.
//!
//! The wire (gRPC, Arrow IPC, the ingest client) is `ingero-proto`, which
//! re-exports these modules under their old paths.

pub mod column;
pub mod hist;
pub mod job;
pub mod progress;
pub mod rows;
pub mod schema;
pub mod signals;
pub mod table;
pub mod tables;
pub mod time;
pub mod units;
pub mod values;

pub use schema::Table;

/// Batches of several tables, as one window or one request carries them.
pub type Tables = Vec<(Table, arrow::array::RecordBatch)>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input does not follow the contract (maps to INVALID_ARGUMENT).
    #[error("{0}")]
    Invalid(String),
    /// The input is over a configured limit (maps to RESOURCE_EXHAUSTED).
    #[error("{0}")]
    TooLarge(String),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
