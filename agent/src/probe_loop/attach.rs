// SPDX-License-Identifier: Apache-2.0
//! Probing one library file: ahead of use, or as a process maps it, within
//! what the guard admits (`probes::guard`: caps, fd headroom, files that
//! failed wait before their next try).

use std::sync::atomic::Ordering;

use crate::probes::libs;
use crate::probes::load::Attached;

impl super::ProbeLoop {
    /// Libraries named on the command line or in the usual places are probed
    /// before any process maps them, so a first process is traced from its first call.
    pub(super) fn attach_well_known(&mut self) {
        for f in libs::well_known(&self.cfg.libs) {
            match self.probes.attach_found(&f) {
                Ok(Attached::Now(syms)) if !syms.is_empty() => {
                    tracing::info!(library = %f.path.display(), probes = syms.len(), "attached ahead of use");
                }
                Ok(_) => {}
                Err(e) => {
                    self.stats.attach_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(library = %f.path.display(), error = %e, "cannot attach");
                }
            }
        }
        self.stats.libraries.store(self.probes.probed_files() as u64, Ordering::Relaxed);
    }

    pub(super) fn attach(&mut self, pid: u32, f: &libs::Found) {
        // A file probed for another process costs nothing new: no limit applies.
        if !self.probes.probed_elsewhere(f)
            && let Err(r) = self.guard.admit(f, self.probes.probed_files())
        {
            let limit = matches!(r, crate::probes::guard::Refused::Limit(_));
            self.stats.libraries_refused.fetch_add(u64::from(limit), Ordering::Relaxed);
            return;
        }
        match self.probes.attach_found(f) {
            Ok(Attached::Now(syms)) => {
                self.stats.libraries.store(self.probes.probed_files() as u64, Ordering::Relaxed);
                tracing::info!(pid, library = %f.mapped_as, probes = syms.len(), "attached");
            }
            Ok(Attached::Already) => {}
            // A process that exited since the scan (a short-lived CUDA
            // tool: its root is gone) is no failure; the exit event forgets it.
            Err(e) if !std::path::Path::new(&format!("/proc/{pid}")).exists() => {
                tracing::debug!(pid, library = %f.mapped_as, error = %e, "process exited before its attach");
            }
            // Not marked attached: retried after guard::RETRY_AFTER, said once.
            Err(e) => {
                self.stats.attach_failures.fetch_add(1, Ordering::Relaxed);
                if self.guard.failed(f) {
                    tracing::warn!(pid, library = %f.mapped_as, error = %e, "cannot attach; will retry in 10 min");
                } else {
                    tracing::debug!(pid, library = %f.mapped_as, error = %e, "cannot attach");
                }
            }
        }
    }
}
