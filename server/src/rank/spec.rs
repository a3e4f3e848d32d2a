// SPDX-License-Identifier: Apache-2.0
//! How the detector judges each signal: which direction is bad, the least
//! deviation that matters, whether it is a cause, and how it is written.

use super::signals::Signal;

/// Which direction is bad, the smallest deviation that matters, and whether
/// the signal is a cause (vs. the effect on the other ranks).
#[derive(Debug)]
pub(crate) struct SignalSpec {
    pub signal: Signal,
    pub name: &'static str,
    pub label: &'static str,
    /// +1: high is bad; -1: low is bad (a straggler waits least in its syncs).
    pub direction: f64,
    pub min_effect: f64,
    pub percent: bool,
    pub cause: bool,
}

pub(crate) const SPECS: [SignalSpec; 6] = [
    SignalSpec {
        signal: Signal::RunqShare,
        name: "runq_share",
        label: "run-queue wait",
        direction: 1.0,
        min_effect: 0.05,
        percent: true,
        cause: true,
    },
    SignalSpec {
        signal: Signal::OffCpuShare,
        name: "offcpu_share",
        label: "host-blocked (off-CPU outside CUDA/NCCL calls)",
        direction: 1.0,
        min_effect: 0.08,
        percent: true,
        cause: true,
    },
    SignalSpec {
        signal: Signal::CopyWaitShare,
        name: "copy_wait_share",
        label: "waiting for its own GPU in blocking copies",
        direction: 1.0,
        min_effect: 0.05,
        percent: true,
        cause: true,
    },
    SignalSpec {
        signal: Signal::IoShare,
        name: "io_share",
        label: "block IO wait",
        direction: 1.0,
        min_effect: 0.05,
        percent: true,
        cause: true,
    },
    SignalSpec {
        signal: Signal::MemEvents,
        name: "mem_events",
        label: "memory events",
        direction: 1.0,
        min_effect: 1.0,
        percent: false,
        cause: true,
    },
    SignalSpec {
        signal: Signal::DeviceWaitShare,
        name: "device_wait_share",
        label: "waiting on the device and peers (syncs, copies, collectives)",
        direction: -1.0,
        min_effect: 0.08,
        percent: true,
        cause: false,
    },
];

/// Waiting longer on the device and peers than the peers that are not
/// themselves waiting less: its own collectives finish last (a slow link).
pub(crate) const DEVICE_WAIT_HIGH: SignalSpec = SignalSpec {
    signal: Signal::DeviceWaitShare,
    name: "device_wait_share_high",
    label: "waiting on the device and peers",
    direction: 1.0,
    min_effect: 0.08,
    percent: true,
    cause: true,
};

/// Formats a signal value for explanations ("41%", "3 events").
pub(crate) fn fmt_value(spec: &SignalSpec, v: f64) -> String {
    if spec.percent { format!("{:.0}%", v * 100.0) } else { format!("{v:.0}") }
}
