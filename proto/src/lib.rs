// SPDX-License-Identifier: Apache-2.0
//! Ingero's wire protocol: gRPC, Arrow IPC and the ingest client.
//!
//! - [`pb`]: gRPC messages and services generated from `ingero.proto`.
//! - [`schema`], [`tables`], [`rows`], [`hist`]: the data model, re-exported
//!   from `ingero-model`.
//! - [`ipc`]: Arrow IPC encode/decode with validation against [`schema`].
//! - [`client`]: the ingest client with retry and backoff.

pub mod auth;
pub mod client;
pub mod ipc;
pub mod route;
pub mod routed;

// The data model lives in ingero-model; these keep the paths every crate uses.
pub use ingero_model::{Error, Result, Table, Tables};
pub use ingero_model::{column, hist, rows, schema, table, tables, units, values};

/// The kubelet PodResources API (v1), client and server (tests serve it).
pub mod podresources {
    tonic::include_proto!("v1");
}

/// Generated protobuf and tonic code.
pub mod pb {
    tonic::include_proto!("ingero.v1");
}
