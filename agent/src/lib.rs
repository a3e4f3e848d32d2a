// SPDX-License-Identifier: Apache-2.0
//! Ingero agent: eBPF probes (probe) → kernel windows (window) → process and
//! pod attribution (attribution) → shipping with a disk spool (ship).

pub mod agent;
pub(crate) mod attribution;
pub(crate) mod budget;
pub mod check;
pub(crate) mod cost;
pub(crate) mod detacher;
pub mod error;
pub(crate) mod exits;
pub mod fd_limit;
pub(crate) mod health;
pub mod heap;
pub(crate) mod host;
pub mod loop_config;
pub(crate) mod metrics;
pub(crate) mod podfs;
pub mod probe_loop;
pub mod probes;
pub(crate) mod procmaps;
pub(crate) mod progress;
pub(crate) mod run_time;
pub(crate) mod sampling;
pub(crate) mod ship;
pub(crate) mod stacks;
pub mod steps;
pub(crate) mod syscalls;
pub(crate) mod thresholds;
pub(crate) mod wake;
pub mod watchdog;
pub(crate) mod window;
