// SPDX-License-Identifier: Apache-2.0
//! What the step finder keeps of each return-probed call.

/// One return-probed call: what it was, when it returned, how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub op: u16,
    pub ts_ns: u64,
    pub dur_ns: u64,
}
