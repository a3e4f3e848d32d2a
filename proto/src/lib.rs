// SPDX-License-Identifier: Apache-2.0
//! Ingero's one definition of the wire protocol and the tables.
//!
//! - [`pb`]: gRPC messages and services generated from `ingero.proto`.
//! - [`schema`]: the Arrow schema of every table, with units and meaning.
//! - [`ipc`]: Arrow IPC encode/decode with validation against [`schema`].
//! - [`hist`]: the latency histogram shared with the eBPF programs.
//! - [`tables`]: one typed row struct per table; the schema is generated from them.
//! - [`rows`]: builders that turn those rows into batches of the schemas.
//! - [`client`]: the ingest client with retry and backoff.
//! - [`units`]: sizes on the command line.

pub mod auth;
pub mod client;
pub mod column;
pub mod hist;
pub mod ipc;
pub mod route;
pub mod routed;
pub mod rows;
pub mod schema;
pub mod table;
pub mod tables;
pub mod units;
pub mod values;

/// The kubelet PodResources API (v1), client and server (tests serve it).
pub mod podresources {
    tonic::include_proto!("v1");
}

/// Generated protobuf and tonic code.
pub mod pb {
    tonic::include_proto!("ingero.v1");
}

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
