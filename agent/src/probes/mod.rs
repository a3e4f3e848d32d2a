//! The kernel side: load and attach (load), find libraries (libs), read
//! aggregates and events (drain), and the shared layouts (abi, ops).

pub mod abi;
pub mod drain;
pub mod libs;
pub mod load;
pub mod ops;
