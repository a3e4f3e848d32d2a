//! The kernel side: load and attach (load), find libraries (libs), read
//! aggregates and events (drain), identify probed files (files), and the
//! shared layouts (abi, ops).

pub mod abi;
#[cfg(test)]
mod arch_check;
pub mod drain;
pub mod files;
pub mod libs;
pub mod load;
pub mod memory;
pub mod ops;
pub mod statics;
