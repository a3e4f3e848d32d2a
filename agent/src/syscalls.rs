// SPDX-License-Identifier: Apache-2.0
//! Names of the syscalls a thread sleeps in, for off-CPU episodes (their
//! `op`): the blocking ones by name, any other by number.

use std::borrow::Cow;

/// x86-64 numbers (asm/unistd_64.h), the only architecture whose episodes
/// carry sites today.
#[cfg(target_arch = "x86_64")]
const NAMES: &[(u32, &str)] = &[
    (0, "read"),
    (1, "write"),
    (2, "open"),
    (3, "close"),
    (7, "poll"),
    (17, "pread64"),
    (18, "pwrite64"),
    (19, "readv"),
    (20, "writev"),
    (23, "select"),
    (24, "sched_yield"),
    (26, "msync"),
    (34, "pause"),
    (35, "nanosleep"),
    (42, "connect"),
    (43, "accept"),
    (44, "sendto"),
    (45, "recvfrom"),
    (46, "sendmsg"),
    (47, "recvmsg"),
    (61, "wait4"),
    (65, "semop"),
    (70, "msgrcv"),
    (73, "flock"),
    (74, "fsync"),
    (75, "fdatasync"),
    (128, "rt_sigtimedwait"),
    (130, "rt_sigsuspend"),
    (202, "futex"),
    (208, "io_getevents"),
    (220, "semtimedop"),
    (230, "clock_nanosleep"),
    (232, "epoll_wait"),
    (247, "waitid"),
    (257, "openat"),
    (270, "pselect6"),
    (271, "ppoll"),
    (275, "splice"),
    (281, "epoll_pwait"),
    (288, "accept4"),
    (299, "recvmmsg"),
    (307, "sendmmsg"),
    (426, "io_uring_enter"),
    (441, "epoll_pwait2"),
    (449, "futex_waitv"),
];
#[cfg(not(target_arch = "x86_64"))]
const NAMES: &[(u32, &str)] = &[];

/// An off-CPU episode's `op`: its syscall's name, `(timeout only)` after a
/// select or poll that watched no file descriptor (a sleep: CPython before
/// 3.11 sleeps in select).
pub(crate) fn episode(reason: u32) -> Cow<'static, str> {
    use crate::probes::abi::{OFFCPU_NO_FDS, OFFCPU_NR_MASK};
    let n = name(reason & OFFCPU_NR_MASK);
    if reason & OFFCPU_NO_FDS != 0 { Cow::Owned(format!("{n} (timeout only)")) } else { n }
}

/// `futex`, or `syscall_318` for one not in the table.
pub(crate) fn name(nr: u32) -> Cow<'static, str> {
    match NAMES.iter().find(|(n, _)| *n == nr) {
        Some((_, s)) => Cow::Borrowed(s),
        None => Cow::Owned(format!("syscall_{nr}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_syscalls_by_name_others_by_number() {
        if cfg!(target_arch = "x86_64") {
            assert_eq!(name(libc::SYS_futex as u32), "futex");
            assert_eq!(name(libc::SYS_clock_nanosleep as u32), "clock_nanosleep");
            assert_eq!(name(libc::SYS_epoll_wait as u32), "epoll_wait");
            assert_eq!(name(libc::SYS_read as u32), "read");
        }
        assert_eq!(name(100_000), "syscall_100000");
        if cfg!(target_arch = "x86_64") {
            let nr = libc::SYS_pselect6 as u32;
            assert_eq!(episode(nr), "pselect6");
            assert_eq!(episode(nr | crate::probes::abi::OFFCPU_NO_FDS), "pselect6 (timeout only)");
        }
        // The table agrees with libc's numbers throughout.
        #[cfg(target_arch = "x86_64")]
        for (nr, n) in NAMES {
            let want = match *n {
                "futex" => libc::SYS_futex,
                "read" => libc::SYS_read,
                "ppoll" => libc::SYS_ppoll,
                "recvfrom" => libc::SYS_recvfrom,
                "wait4" => libc::SYS_wait4,
                "io_uring_enter" => libc::SYS_io_uring_enter,
                _ => continue,
            };
            assert_eq!(i64::from(*nr), want, "{n}");
        }
    }
}
