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

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::error::{Error, Result};

/// A grace-period waiter: `begin` after the flip, then `done` until true.
#[derive(Debug)]
pub(crate) struct Grace {
    requests: mpsc::Sender<u64>,
    /// The last request whose grace period has ended.
    completed: Arc<AtomicU64>,
    asked: u64,
    /// Readable when a request completes (polled with the process events).
    ready: Arc<OwnedFd>,
}

impl Grace {
    pub(crate) fn start() -> Result<Grace> {
        // SAFETY: no pointers; the fd returned is ours alone.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::Runtime {
                what: "eventfd for the grace-period waiter",
                cause: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let ready = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let completed = Arc::new(AtomicU64::new(0));
        let (requests, rx) = mpsc::channel::<u64>();
        let (done, signal) = (completed.clone(), ready.clone());
        std::thread::Builder::new()
            .name("ingero-grace".into())
            .spawn(move || {
                while let Ok(n) = rx.recv() {
                    synchronize();
                    done.store(n, Ordering::Release);
                    let one: u64 = 1;
                    // SAFETY: writes 8 bytes from a live u64 to our eventfd.
                    unsafe { libc::write(signal.as_raw_fd(), (&one as *const u64).cast(), 8) };
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
        let mut buf = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64; non-blocking.
        unsafe { libc::read(self.ready.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
        self.completed.load(Ordering::Acquire) >= self.asked
    }

    /// Polled beside the process-event ring: readable when a wait ends.
    pub(crate) fn fd(&self) -> RawFd {
        self.ready.as_raw_fd()
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
