// SPDX-License-Identifier: Apache-2.0
//! Ingero's synthetic producers and shared test support.
//!
//! - [`fleet`], [`model`], [`faults`]: `ingero simulate`, virtual agents that
//!   speak the real ingest protocol, one rank of a data-parallel job each,
//!   with injected faults.
//! - [`backfill`]: `ingero simulate --backfill`, the same model over a past
//!   range pushed as fast as the server takes it (history benchmarks).
//! - [`loadgen`]: `ingero load`, many nodes pushing synthetic windows as fast
//!   as the server takes them (benchmarks and tests use it too).
//! - `seaweed`, `child` (feature `testing`): a real S3 server for the test
//!   suites of every crate; test children that die with their test.

pub mod backfill;
#[cfg(feature = "testing")]
pub mod child;
pub mod faults;
pub mod fleet;
pub mod fleetday;
pub mod hang;
pub mod loadgen;
pub mod model;
pub mod scoring;
#[cfg(feature = "testing")]
pub mod seaweed;
