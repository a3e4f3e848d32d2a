// SPDX-License-Identifier: Apache-2.0
//! Ingero's wire protocol: gRPC, Arrow IPC and the ingest client.
//!
//! - [`pb`]: gRPC messages and services generated from `ingero.proto`.
//! - [`ipc`]: Arrow IPC encode/decode with validation against the data model's
//!   schema (`ingero_model::schema`; the model itself has no I/O).
//! - [`client`]: the ingest client with retry and backoff.
//! - [`received`]: the servers' codec, which keeps a pushed batch's frame
//!   for the write-ahead log.
//!
//! Feature `grpc` (default): the client, servers, codec and auth. Without it
//! the messages and [`ipc`] only (the fuzz target: no tonic, no tokio).

#[cfg(feature = "grpc")]
pub mod auth;
#[cfg(feature = "grpc")]
pub mod client;
pub mod ipc;
#[cfg(feature = "grpc")]
pub mod received;
pub mod route;
#[cfg(feature = "grpc")]
pub mod routed;

/// The kubelet PodResources API (v1), client and server (tests serve it).
pub mod podresources {
    include!(concat!(env!("OUT_DIR"), "/v1.rs"));
    #[cfg(feature = "grpc")]
    include!(concat!(env!("OUT_DIR"), "/servers/v1.rs"));
}

/// Generated protobuf and tonic code.
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/ingero.v1.rs"));
    // The servers, generated with `received::FrameCodec` (see build.rs).
    #[cfg(feature = "grpc")]
    include!(concat!(env!("OUT_DIR"), "/servers/ingero.v1.rs"));
}
