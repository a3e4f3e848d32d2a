// SPDX-License-Identifier: Apache-2.0
//! Waits, off the probe loop, until every program that may still write the
//! half just flipped away from has finished.
//!
//! Programs run inside an RCU read-side section (the kernel's BPF dispatch
//! takes rcu_read_lock), and membarrier(MEMBARRIER_CMD_GLOBAL) is
//! synchronize_rcu(): once a grace period that began after the flip has
//! ended, nothing writes the idle half. A fixed sleep loses the adds of a
//! program whose vCPU was descheduled mid-run (steal time on a cloud VM;
//! seen here as one lost off-CPU interval in ~50 test runs). The wait runs
//! on its own thread because a thread held at a library lookup keeps grace
//! periods from ending until it is released, and the probe loop is what
//! releases it: the loop keeps handling process events meanwhile.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::wake::Wake;

/// A grace-period waiter: `begin` after the flip, then `done` until true.
#[derive(Debug)]
pub(crate) struct Grace {
    requests: mpsc::Sender<u64>,
    /// The last request whose grace period has ended.
    completed: Arc<AtomicU64>,
    asked: u64,
    /// Readable when a request completes (polled with the process events).
    ready: Arc<Wake>,
}

impl Grace {
    pub(crate) fn start() -> Result<Grace> {
        let ready = Arc::new(Wake::new("eventfd for the grace-period waiter")?);
        let completed = Arc::new(AtomicU64::new(0));
        let (requests, rx) = mpsc::channel::<u64>();
        let (done, signal) = (completed.clone(), ready.clone());
        std::thread::Builder::new()
            .name("ingero-grace".into())
            .spawn(move || {
                while let Ok(n) = rx.recv() {
                    synchronize();
                    done.store(n, Ordering::Release);
                    signal.signal();
                }
            })
            .map_err(|cause| Error::Runtime { what: "spawning the grace-period waiter", cause })?;
        Ok(Grace { requests, completed, asked: 0, ready })
    }

    /// Asks for a grace period that begins now (after the flip).
    pub(crate) fn begin(&mut self) {
        self.asked += 1;
        if self.requests.send(self.asked).is_err() {
            // The waiter is gone (it cannot panic; only at teardown): a margin.
            std::thread::sleep(Duration::from_millis(20));
            self.completed.store(self.asked, Ordering::Release);
        }
    }

    /// True once the grace period asked for last has ended.
    pub(crate) fn done(&self) -> bool {
        self.ready.clear();
        self.completed.load(Ordering::Acquire) >= self.asked
    }

    /// Polled beside the process-event ring: readable when a wait ends.
    pub(crate) fn fd(&self) -> RawFd {
        self.ready.fd()
    }
}

/// One grace period, or a generous margin where the kernel refuses it.
fn synchronize() {
    /// MEMBARRIER_CMD_GLOBAL (uapi linux/membarrier.h).
    const GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, GLOBAL, 0 as libc::c_long, 0 as libc::c_long) };
    if r != 0 {
        // nohz_full kernels refuse GLOBAL; seccomp may too.
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            tracing::warn!(error = %std::io::Error::last_os_error(), "membarrier refused: each window waits a 20 ms margin for the probes instead (a probe stalled longer loses its counts)");
        });
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_completes_and_signals_its_fd() {
        let mut g = Grace::start().unwrap();
        for _ in 0..3 {
            g.begin();
            let mut pfd = libc::pollfd { fd: g.fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, 5_000) };
            assert_eq!(n, 1, "the waiter signals its eventfd");
            assert!(g.done());
        }
    }
}
