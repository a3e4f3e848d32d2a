// SPDX-License-Identifier: Apache-2.0
//! Straggler ranking: live (the server's, re-exported) and over history
//! (the store's signal tiers through the query engine).

pub use ingero_server::rank::*;

pub mod history;
pub(crate) mod hosts;
mod hung;
pub(crate) mod overlap;
mod replay;
mod step_times;
