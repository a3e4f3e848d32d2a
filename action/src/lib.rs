// SPDX-License-Identifier: Apache-2.0
//! From flag to action: on a confirmed straggler, remediation marks the node
//! in Kubernetes (condition `IngeroStraggler` with the cause and where the
//! report is, Events on the node and the job's pods, and a `NoSchedule` taint
//! only when asked), within budgets and after minimum evidence, and undoes it
//! once the node is healthy again. It never evicts.
//!
//! Off by default. The stages: [`policy`] decides (pure), [`cluster`] applies
//! through the API server, [`journal`] keeps what was done and not done in
//! the store (`ingero actions`), [`metrics`] counts it, [`controller`] loops.

pub mod cluster;
pub mod config;
pub mod controller;
pub mod journal;
pub mod metrics;
pub mod policy;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{Config, Mode};
pub use controller::Controller;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Config(String),
    #[error("store: {0}")]
    Store(#[from] ingero_store::Error),
    #[error("object store: {0}")]
    Object(#[from] object_store::Error),
    #[error("action record {path}: {source}")]
    Record { path: String, source: serde_json::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
