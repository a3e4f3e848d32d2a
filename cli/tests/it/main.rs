// SPDX-License-Identifier: Apache-2.0
//! The `ingero` binary's integration tests, one test binary: each module
//! would otherwise link the whole aggregator and query engine again (~280 MB
//! each in a debug build; one binary saves CI ~3 GB of disk and a dozen links).
//! nextest runs every test in its own process, so tests that set process-wide
//! state (environment variables, a fixed S3 port) stay apart.

mod fixtures;

mod auth;
mod cli;
mod coowner;
mod cost;
mod crash;
mod dashboard;
mod delta;
mod estimated;
mod evaluate;
mod export;
mod history;
mod hung;
mod import;
mod import_current;
mod ingest;
mod long_stall;
mod mcp;
mod ranking;
mod remediate;
mod replicas;
mod report_truth;
mod s3;
mod sql_ranking;
