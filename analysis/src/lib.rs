// SPDX-License-Identifier: Apache-2.0
//! Ingero analysis: what is read back from the store and explained.
//!
//! [`query`] (DataFusion over the store's Delta tables; `query::service` is
//! the gRPC query service a server adds through `ExtraRoutes`) →
//! [`rank::history`] (straggler ranking over the signal tiers) and
//! [`report`] (per-pod stall reports: cause → effect → fix, text, JSON,
//! HTML). [`import`] turns a trace recorded by the reference product into
//! the same tables. The `ingero` command (crate `ingero`, cli/) is above it.

pub mod error;
pub mod import;
pub mod query;
pub mod rank;
pub mod report;
pub use error::{Error, Result};
