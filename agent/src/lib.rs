//! Ingero agent: eBPF probes (probe) → kernel windows (window) → process and
//! pod attribution (attribution) → shipping with a disk spool (ship).

pub mod agent;
pub mod attribution;
pub mod check;
pub mod embedded;
pub mod error;
pub mod metrics;
pub mod probe_loop;
pub mod probes;
pub mod ship;
pub mod window;
