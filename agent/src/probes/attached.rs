// SPDX-License-Identifier: Apache-2.0
//! The library files probed, each with the probes placed on it, so a file no
//! traced process maps any more can be detached. Without this, every
//! container image's copy of libcudart left ~60 uprobes (and their fds) on
//! the node for the agent's lifetime: a node that runs many short jobs would
//! reach the fd limit and stop attaching.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::files::FileId;
use super::link::Links;

#[derive(Debug)]
struct Attachment {
    links: Links,
    /// Probed ahead of use (`--lib`, the usual CUDA directories, the host's
    /// libc): kept for the agent's lifetime.
    pinned: bool,
    /// Since when no scanned process has mapped it.
    unused_since: Option<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct Attachments {
    files: HashMap<FileId, Attachment>,
}

impl Attachments {
    pub(crate) fn contains(&self, id: &FileId) -> bool {
        self.files.contains_key(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.files.len()
    }

    pub(crate) fn insert(&mut self, id: FileId, links: Links, pinned: bool) {
        self.files.insert(id, Attachment { links, pinned, unused_since: None });
    }

    /// Files (not pinned) that no process in `in_use` has mapped for at least
    /// `ttl`, removed here with their links for the caller to detach. A file
    /// mapped again before `ttl` starts its count afresh next time it is unused.
    pub(crate) fn take_unused(
        &mut self,
        in_use: &HashSet<&FileId>,
        now: Instant,
        ttl: Duration,
    ) -> Vec<(FileId, Links)> {
        let mut gone = Vec::new();
        for (id, a) in &mut self.files {
            if a.pinned || in_use.contains(id) {
                a.unused_since = None;
                continue;
            }
            let since = *a.unused_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= ttl {
                gone.push(id.clone());
            }
        }
        gone.into_iter().filter_map(|id| self.files.remove(&id).map(|a| (id, a.links))).collect()
    }

    /// Every file's probes (the agent stops).
    pub(crate) fn take_all(&mut self) -> Vec<(FileId, Links)> {
        self.files.drain().map(|(id, a)| (id, a.links)).collect()
    }

    /// The files the kernel may key by device and inode (`probed_files`).
    pub(crate) fn inodes(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.files.keys().filter_map(|id| match id {
            FileId::Inode(dev, ino) => Some((*dev, *ino)),
            FileId::Overlay(..) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> FileId {
        FileId::Inode(1, n)
    }

    #[test]
    fn a_file_is_detached_only_after_it_has_been_unused_for_the_ttl() {
        let mut a = Attachments::default();
        a.insert(id(1), vec![], false);
        a.insert(id(2), vec![], false);
        a.insert(id(3), vec![], true);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        let two = id(2);
        let in_use: HashSet<&FileId> = [&two].into();
        // Unused from now on: not yet gone.
        assert!(a.take_unused(&in_use, t0, ttl).is_empty());
        assert!(a.take_unused(&in_use, t0 + Duration::from_secs(59), ttl).is_empty());
        let gone = a.take_unused(&in_use, t0 + ttl, ttl);
        assert_eq!(gone.iter().map(|g| g.0.clone()).collect::<Vec<_>>(), vec![id(1)]);
        assert!(!a.contains(&id(1)) && a.contains(&id(2)) && a.contains(&id(3)), "in use and pinned stay");
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn a_file_mapped_again_starts_its_count_afresh() {
        let mut a = Attachments::default();
        a.insert(id(1), vec![], false);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let one = id(1);
        assert!(a.take_unused(&HashSet::new(), t0, ttl).is_empty());
        // Mapped again at 8 s, unused again at 9 s: 10 s from then, not from t0.
        assert!(a.take_unused(&[&one].into(), t0 + Duration::from_secs(8), ttl).is_empty());
        assert!(a.take_unused(&HashSet::new(), t0 + Duration::from_secs(9), ttl).is_empty());
        assert!(a.take_unused(&HashSet::new(), t0 + Duration::from_secs(18), ttl).is_empty());
        assert_eq!(a.take_unused(&HashSet::new(), t0 + Duration::from_secs(19), ttl).len(), 1);
    }

    #[test]
    fn only_plain_inodes_are_keyed_for_the_kernel() {
        let mut a = Attachments::default();
        a.insert(id(7), vec![], false);
        a.insert(FileId::Overlay(1, vec![1, 2]), vec![], false);
        assert_eq!(a.inodes().collect::<Vec<_>>(), vec![(1, 7)]);
    }
}
