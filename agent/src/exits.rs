// SPDX-License-Identifier: Apache-2.0
//! When an exited process's facts (name, cgroup, pod) may be forgotten:
//! one window after its exit. Its probe state goes at once (the files it
//! mapped can be detached; keeping them a window slowed library churn 1.6×).
//!
//! A window closes by flipping the kernel's aggregates to the other half
//! and then handling the process events that arrived meanwhile. Calls a
//! process makes between the flip and its exit land in the next window's
//! half, while its exit event is handled in this one: forgetting it now
//! would leave those calls with no name, cgroup or pod (a pod's last
//! partial step stored under no pod, seen in the e2e under load).

use crate::probes::abi::{PROC_EXEC, PROC_EXIT, PROC_FORK, ProcEvent};

/// Takes this window's events; returns the processes that exited in the
/// window before it (to forget now) and keeps this window's exits in
/// `pending` for the next call. A pid that a fork or exec names after its
/// exit is a new process (pid reuse): what was kept of the old one is
/// forgotten now, as the new one's facts are read afresh.
pub(crate) fn exited_before(pending: &mut Vec<u32>, events: impl IntoIterator<Item = ProcEvent>) -> Vec<u32> {
    let mut due = std::mem::take(pending);
    for e in events {
        match e.kind {
            PROC_EXIT => pending.push(e.tgid),
            PROC_FORK | PROC_EXEC => {
                let pid = if e.kind == PROC_FORK { e.other } else { e.tgid };
                if let Some(i) = pending.iter().position(|&p| p == pid) {
                    due.push(pending.swap_remove(i));
                }
            }
            _ => {}
        }
    }
    due.sort_unstable();
    due.dedup();
    due
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: u32, tgid: u32, other: u32) -> ProcEvent {
        ProcEvent { kind, tgid, other, ..Default::default() }
    }

    #[test]
    fn an_exit_is_forgotten_one_window_later() {
        let mut pending = Vec::new();
        assert!(exited_before(&mut pending, [ev(PROC_EXIT, 7, 0)]).is_empty());
        assert_eq!(exited_before(&mut pending, []), vec![7]);
        assert!(exited_before(&mut pending, []).is_empty());
    }

    #[test]
    fn a_reused_pid_is_forgotten_at_once() {
        let mut pending = Vec::new();
        exited_before(&mut pending, [ev(PROC_EXIT, 7, 0), ev(PROC_EXIT, 8, 0)]);
        // 7 and 8 are due anyway; 9 exits and is forked again (parent 1) in one window.
        let due = exited_before(&mut pending, [ev(PROC_EXIT, 9, 0), ev(PROC_FORK, 1, 9), ev(PROC_EXEC, 8, 0)]);
        assert_eq!(due, vec![7, 8, 9]);
        assert!(pending.is_empty());
    }
}
