// SPDX-License-Identifier: Apache-2.0
//! Ingero's wire protocol: gRPC, Arrow IPC and the ingest client.
//!
//! - [`pb`]: gRPC messages and services generated from `ingero.proto`.
//! - [`ipc`]: Arrow IPC encode/decode with validation against the data model's
//!   schema (`ingero_model::schema`; the model itself has no I/O).
//! - [`client`]: the ingest client with retry and backoff.
//! - [`received`]: the servers' codec, which keeps a pushed batch's frame
//!   for the write-ahead log.

pub mod auth;
pub mod client;
pub mod ipc;
pub mod received;
pub mod route;
pub mod routed;

/// The kubelet PodResources API (v1), client and server (tests serve it).
pub mod podresources {
    tonic::include_proto!("v1");
    include!(concat!(env!("OUT_DIR"), "/servers/v1.rs"));
}

/// Generated protobuf and tonic code.
pub mod pb {
    tonic::include_proto!("ingero.v1");
    // The servers, generated with `received::FrameCodec` (see build.rs).
    include!(concat!(env!("OUT_DIR"), "/servers/ingero.v1.rs"));
}
