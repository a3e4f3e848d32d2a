// SPDX-License-Identifier: Apache-2.0
//! The probes placed on a library file, as the kernel holds them: perf-event
//! uprobes that aya keeps (one per probe), or uprobe_multi links the agent
//! keeps itself (one per program and file, `multi.rs`).

use std::os::fd::OwnedFd;

use aya::programs::uprobe::UProbeLinkId;

/// One uprobe_multi link: its probes go when it is dropped.
#[derive(Debug)]
pub(crate) struct MultiLink {
    /// Held, never read: closing it removes the link's probes.
    pub(crate) _fd: OwnedFd,
}

#[derive(Debug)]
pub(crate) enum Link {
    /// (program name, aya's id of the link).
    Perf(String, UProbeLinkId),
    Multi(MultiLink),
}

/// The probes on one file.
pub(crate) type Links = Vec<Link>;

/// A link taken off its program, closed when dropped (slowly for a perf
/// event: the detacher drops these off the probe loop).
pub(crate) type Closing = Box<dyn Send>;
