// SPDX-License-Identifier: Apache-2.0
//! An eventfd one thread signals and another polls beside its ring buffers.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::error::{Error, Result};

#[derive(Debug)]
pub(crate) struct Wake(OwnedFd);

impl Wake {
    pub(crate) fn new(what: &'static str) -> Result<Wake> {
        // SAFETY: no pointers; the fd returned is ours alone.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::Runtime { what, cause: std::io::Error::last_os_error() });
        }
        // SAFETY: fd is a fresh descriptor nothing else owns.
        Ok(Wake(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the fd readable until the next `clear`.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub(crate) fn clear(&self) {
        let mut buf = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64; non-blocking.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
    }

    /// Sleeps until signalled or `timeout` passes.
    pub(crate) fn wait(&self, timeout: std::time::Duration) {
        let mut pfd = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, timeout.as_millis().max(1) as i32) };
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(w: &Wake) -> bool {
        let mut pfd = libc::pollfd { fd: w.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    #[test]
    fn readable_from_signal_until_clear() {
        let w = Wake::new("test").unwrap();
        assert!(!readable(&w));
        w.signal();
        w.signal();
        assert!(readable(&w));
        w.clear();
        assert!(!readable(&w));
    }
}
