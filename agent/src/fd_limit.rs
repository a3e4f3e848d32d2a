// SPDX-License-Identifier: Apache-2.0
//! The agent's open-file limit. Each probed library holds file descriptors
//! (its uprobe links), so the agent raises its soft limit to the hard one
//! once, at start, before loading anything; the attach guard judges its
//! headroom against it.

/// (soft, hard) RLIMIT_NOFILE.
pub(crate) fn open_file_limit() -> Option<(u64, u64)> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0).then_some((r.rlim_cur, r.rlim_max))
}

/// Raises the soft open-file limit to the hard one (at most 2^20, as
/// systemd's default hard limit). Returns the soft limit now in force.
pub fn raise_open_file_limit() -> Option<u64> {
    let (soft, hard) = open_file_limit()?;
    let want = hard.min(1 << 20);
    if want > soft {
        let r = libc::rlimit { rlim_cur: want, rlim_max: hard };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
            tracing::debug!(soft, hard, "cannot raise the open-file limit");
            return Some(soft);
        }
    }
    Some(want.max(soft))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
        let now = raise_open_file_limit().unwrap();
        let (soft, hard) = open_file_limit().unwrap();
        assert_eq!((soft, now), (hard.min(1 << 20).max(soft), soft));
    }
}
