// SPDX-License-Identifier: Apache-2.0
//! Map syscalls that cannot blind the kernel's probes (kernels 5.11–5.18).

use super::features::Features;

/// Keeps the calling thread from being preempted by ordinary tasks while
/// it lives, on kernels that need it. Before Linux 5.19 a uprobe runs its
/// programs through trace_call_bpf, which skips them on a CPU whose
/// `bpf_prog_active` is raised, and every map syscall raises it for its
/// duration under `migrate_disable`, preemptible since 5.11 (up to 5.10 it
/// disables preemption: no gap there, and harmless to ask): were this thread
/// preempted inside one, the call a workload made on that CPU meanwhile would
/// go uncounted. At real-time priority the syscall runs to its end before any
/// workload's code runs there. Held for the window's map reads and writes only (milliseconds a
/// second); without CAP_SYS_NICE it is a no-op, logged once.
#[derive(Debug)]
pub(crate) struct Unpreempted(bool);

impl Unpreempted {
    /// For map syscalls made while workloads run: real-time priority only
    /// where the kernel needs it. Sleepable uprobes came with the uprobe
    /// dispatch that ignores bpf_prog_active (5.19): one probe tells both.
    pub(crate) fn for_maps(features: &Features) -> Unpreempted {
        Self::new(!features.has(super::features::SLEEPABLE_UPROBE))
    }

    fn new(needed: bool) -> Unpreempted {
        if !needed {
            return Unpreempted(false);
        }
        let p = libc::sched_param { sched_priority: 1 };
        // SAFETY: pid 0 is this thread; the param outlives the call.
        let ok = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } == 0;
        if !ok {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::warn!(error = %std::io::Error::last_os_error(), "no real-time priority for the drain (CAP_SYS_NICE): on this kernel a call made while the drain is preempted may go uncounted");
            });
        }
        Unpreempted(ok)
    }
}

impl Drop for Unpreempted {
    fn drop(&mut self) {
        if self.0 {
            let p = libc::sched_param { sched_priority: 0 };
            // SAFETY: as above; back to the normal policy (nice is kept).
            unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) };
        }
    }
}
