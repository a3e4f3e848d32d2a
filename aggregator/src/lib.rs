//! Ingero aggregator: ingest, persistence, ranking, queries and reports.
//!
//! Data flows one way: `ingest` (validate) → `store::commit` (WAL, buffer,
//! flush) → `store::parquet` (files in the object store).

pub mod auth;
pub mod cli;
pub mod commands;
pub mod error;
pub mod http;
pub mod import;
pub mod ingest;
pub mod load;
pub mod metrics;
pub mod query;
pub mod query_service;
pub mod rank;
pub mod ratelimit;
pub mod report;
pub mod serve;
pub mod simulate;
pub mod store;

pub use error::{Error, Result};
