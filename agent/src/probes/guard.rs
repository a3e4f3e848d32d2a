// SPDX-License-Identifier: Apache-2.0
//! What keeps a pod's files from costing the node (every file in a pod is
//! hostile input). A file that cannot be probed (truncated, fuzzed, a FIFO
//! named `libcudart.so.12`) is retried after [`RETRY_AFTER`], not at every
//! rescan: 188 such files once logged 100 warnings a second. New files are
//! refused past a cap on files probed in all and per process, and while the
//! agent's open files near their limit: 5,500 mapped copies of a library
//! once took all 20,000 of its fds, and windows were lost.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::libs::Found;
use super::ops::Lib;

/// How long a file that could not be probed waits for its next try.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(600);
/// Failed files remembered before the expired ones are let go.
const MAX_FAILED: usize = 10_000;
/// How often a refusal for the same cause is logged.
const WARN_EVERY: Duration = Duration::from_secs(600);

/// Why a new file is not probed now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It failed before; the next try is later.
    Failed,
    /// A cap or the fd headroom: not probed, said once in a while.
    Limit(String),
}

#[derive(Debug)]
pub(crate) struct AttachGuard {
    max_files: usize,
    per_process: usize,
    /// (device, inode) of a file that failed → when to try it again.
    failed: HashMap<(u64, u64), Instant>,
    /// Processes already said to map more files than their cap.
    over_cap: HashSet<u32>,
    warned: HashMap<&'static str, Instant>,
}

impl AttachGuard {
    /// The headroom for new files is judged against the soft open-file
    /// limit, which the agent raises at start (`fd_limit`).
    pub(crate) fn new(max_files: usize, per_process: usize) -> AttachGuard {
        AttachGuard { max_files, per_process, failed: HashMap::new(), over_cap: HashSet::new(), warned: HashMap::new() }
    }

    /// Of one process's files: the C library, those probed already (they
    /// cost nothing more) and the first others in /proc/PID/maps order, up
    /// to `per_process` CUDA/NCCL files.
    pub(crate) fn of_process<'a>(
        &mut self,
        pid: u32,
        found: &'a [Found],
        probed: impl Fn(&Found) -> bool,
    ) -> Vec<&'a Found> {
        let cuda = |f: &&Found| f.lib != Lib::Libc;
        let n = found.iter().filter(cuda).count();
        let mut room = self.per_process.saturating_sub(found.iter().filter(cuda).filter(|f| probed(f)).count());
        let kept: Vec<&Found> = found
            .iter()
            .filter(|f| {
                let new = cuda(f) && !probed(f);
                let keep = !new || room > 0;
                room -= usize::from(new && keep);
                keep
            })
            .collect();
        if self.over_cap.len() >= 4_096 {
            self.over_cap.clear(); // pids of long-gone processes
        }
        if n > self.per_process && self.over_cap.insert(pid) {
            tracing::warn!(
                pid,
                files = n,
                cap = self.per_process,
                "process maps more CUDA/NCCL library files than --max-libraries-per-process; the rest are not probed"
            );
        }
        kept
    }

    /// Whether a file not probed yet may be tried now, with `probed` files
    /// probed in all.
    pub(crate) fn admit(&mut self, f: &Found, probed: usize) -> Result<(), Refused> {
        if self.failed.get(&f.id).is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return Err(Refused::Failed);
        }
        let why = if probed >= self.max_files {
            Some(("cap", format!("{probed} library files probed, the --max-libraries cap")))
        } else {
            fds_near_limit().map(|w| ("fds", w))
        };
        match why {
            None => Ok(()),
            Some((kind, why)) => {
                if self.warned.get(kind).is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    self.warned.insert(kind, Instant::now());
                    tracing::warn!(library = %f.mapped_as, pid = f.pid, "{why}: new library files are not probed");
                }
                Err(Refused::Limit(why))
            }
        }
    }

    /// Notes a failed attach; true the first time for this file (say it
    /// loudly once, then quietly).
    pub(crate) fn failed(&mut self, f: &Found) -> bool {
        if self.failed.len() >= MAX_FAILED {
            // A pod that makes new bad files without end: keep the recent.
            self.failed.retain(|_, at| at.elapsed() < RETRY_AFTER);
        }
        self.failed.insert(f.id, Instant::now()).is_none()
    }
}

/// "N of M open files in use" once half the soft limit is in use.
fn fds_near_limit() -> Option<String> {
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let limit = crate::fd_limit::open_file_limit()?.0;
    (open.saturating_mul(2) >= limit).then(|| format!("{open} of {limit} open files in use"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(lib: Lib, ino: u64) -> Found {
        Found {
            id: (1, ino),
            path: format!("/x/{ino}").into(),
            map_file: None,
            mapped_as: format!("/x/{ino}"),
            lib,
            pid: 7,
        }
    }

    #[test]
    fn a_process_gets_its_probed_files_its_first_others_and_libc() {
        let mut g = AttachGuard::new(100, 2);
        let files = [found(Lib::Cudart, 1), found(Lib::Libc, 2), found(Lib::Cuda, 3), found(Lib::Nccl, 4)];
        let kept: Vec<u64> = g.of_process(7, &files, |_| false).iter().map(|f| f.id.1).collect();
        assert_eq!(kept, [1, 2, 3]);
        // One probed already (the runtime the program calls) keeps its place.
        let kept: Vec<u64> = g.of_process(7, &files, |f| f.id.1 == 4).iter().map(|f| f.id.1).collect();
        assert_eq!(kept, [1, 2, 4]);
    }

    #[test]
    fn a_failed_file_waits_and_the_cap_refuses_new_ones() {
        let mut g = AttachGuard::new(3, 8);
        let f = found(Lib::Cudart, 1);
        assert_eq!(g.admit(&f, 0), Ok(()));
        assert!(g.failed(&f), "first failure");
        assert!(!g.failed(&f), "said once");
        assert_eq!(g.admit(&f, 0), Err(Refused::Failed));
        let other = found(Lib::Cudart, 2);
        assert_eq!(g.admit(&other, 2), Ok(()));
        assert!(matches!(g.admit(&other, 3), Err(Refused::Limit(w)) if w.contains("--max-libraries")));
    }
}
