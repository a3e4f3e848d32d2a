// SPDX-License-Identifier: Apache-2.0
//! Ingero analysis: what is read back from the store and explained.
//!
//! [`query`] (DataFusion over the store's Delta tables; `query::service` is
//! the gRPC query service a server adds through `ExtraRoutes`) →
//! [`rank::history`] (straggler ranking over the signal tiers) and
//! [`report`] (per-pod stall reports: cause → effect → fix, text, JSON,
//! HTML). [`import`] turns a trace recorded by the reference product into
//! the same tables. The `ingero` command (crate `ingero`, cli/) is above it.

pub mod import;
pub mod query;
pub mod rank;
pub mod report;
pub use ingero_model::time;
// Storage and serving are crates of their own; these keep the paths the
// rest of the crate uses.
pub use ingero_server as server;
pub use ingero_store::{self as store, Error, Result, error};
