// SPDX-License-Identifier: Apache-2.0
//! The kernel side: load and attach (load), find libraries (libs), read
//! aggregates and events (drain), identify probed files (files), and the
//! shared layouts (abi, ops).

pub(crate) mod abi;
#[cfg(test)]
mod arch_check;
mod attached;
mod compat;
pub(crate) mod drain;
pub(crate) mod duty;
pub mod features;
pub(crate) mod files;
pub(crate) mod grace;
pub(crate) mod guard;
mod handles;
pub mod libs;
pub(crate) mod link;
pub mod load;
pub mod memory;
pub(crate) mod multi;
#[cfg(test)]
mod object_check;
pub(crate) mod offsets;
pub mod ops;
pub(crate) mod plan;
mod setup;
pub(crate) mod statics;
pub(crate) mod thread_counts;
pub(crate) mod tracepoints;
pub(crate) mod trap_cost;
pub(crate) mod unpreempted;
