//! Fleet simulator: data-parallel ranks over the real ingest protocol.

pub mod faults;
pub mod fleet;
pub mod model;
