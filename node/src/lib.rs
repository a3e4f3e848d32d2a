// SPDX-License-Identifier: Apache-2.0
//! The `ingero-agent` binary's composition of crates: the agent library
//! and, with feature `store`, the serving and storage layers embedded for
//! single-node use (`run --store`). The binary (main.rs) is its flags.
//! A library target so that the tests can turn `store` on for themselves
//! (a crate names itself as a dev-dependency) while every `cargo build`
//! of the binary stays the lean one.

pub mod embedded;
