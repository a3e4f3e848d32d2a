// SPDX-License-Identifier: Apache-2.0
//! How the detector judges each signal: which direction is bad, the least
//! deviation that matters, whether it is a cause, and how it is written.

use super::signals::Signal;
use super::standing::Deviation;

/// Which direction is bad, the smallest deviation that matters, and whether
/// the signal is a cause (vs. the effect on the other ranks).
#[derive(Debug)]
pub(crate) struct SignalSpec {
    pub signal: Signal,
    pub name: &'static str,
    pub label: &'static str,
    /// The label in a terminal table's column ("host-blocked").
    pub short: &'static str,
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
        short: "run-queue",
        direction: 1.0,
        min_effect: 0.05,
        percent: true,
        cause: true,
    },
    SignalSpec {
        signal: Signal::OffCpuShare,
        name: "offcpu_share",
        label: "host-blocked (off-CPU outside CUDA/NCCL calls)",
        short: "host-blocked",
        direction: 1.0,
        min_effect: 0.08,
        percent: true,
        cause: true,
    },
    SignalSpec {
        signal: Signal::CopyWaitShare,
        name: "copy_wait_share",
        label: "waiting for its own GPU in blocking copies",
        short: "copy wait",
        direction: 1.0,
        min_effect: 0.05,
        percent: true,
        cause: true,
    },
    SignalSpec {
        signal: Signal::IoShare,
        name: "io_share",
        // Latencies of overlapping requests add up past the wall time.
        label: "block IO latency summed over wall time",
        short: "block IO",
        direction: 1.0,
        min_effect: 0.05,
        percent: true,
        cause: true,
    },
    SignalSpec {
        signal: Signal::MemEvents,
        name: "mem_events",
        label: "memory events",
        short: "memory events",
        direction: 1.0,
        min_effect: 1.0,
        percent: false,
        cause: true,
    },
    SignalSpec {
        signal: Signal::DeviceWaitShare,
        name: "device_wait_share",
        label: "waiting on the device and peers (syncs, copies, collectives)",
        short: "device wait",
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
    short: "device wait",
    direction: 1.0,
    min_effect: 0.08,
    percent: true,
    cause: true,
};

/// A signal's label for a terminal table ("host-blocked"); one it does not
/// know (a newer server's), as named.
pub fn short_label(signal: &str) -> &str {
    if signal == "stuck" {
        return "stuck";
    }
    SPECS.iter().chain([&DEVICE_WAIT_HIGH]).find(|s| s.name == signal).map_or(signal, |s| s.short)
}

impl Deviation {
    /// The deviation in a few words, for a terminal table's column:
    /// "host-blocked 41% (job 3%)", "peers waited 45 s"; `text` says it in full.
    pub fn brief(&self) -> String {
        if self.signal == "stuck" {
            return format!("peers waited {:.0} s", self.value);
        }
        match SPECS.iter().chain([&DEVICE_WAIT_HIGH]).find(|s| s.name == self.signal) {
            Some(s) => format!("{} {} (job {})", s.short, fmt_value(s, self.value), fmt_value(s, self.job_median)),
            None => self.text.clone(),
        }
    }
}

/// Formats a signal value for explanations ("41%", "3 events").
pub(crate) fn fmt_value(spec: &SignalSpec, v: f64) -> String {
    if spec.percent { format!("{:.0}%", v * 100.0) } else { format!("{v:.0}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_brief_fits_a_table_column_with_its_numbers() {
        let dev = |signal: &str, value, job_median| Deviation {
            signal: signal.into(),
            value,
            job_median,
            z: 9.0,
            text: "in full".into(),
        };
        assert_eq!(dev("offcpu_share", 0.41, 0.03).brief(), "host-blocked 41% (job 3%)");
        assert_eq!(dev("mem_events", 3.0, 0.0).brief(), "memory events 3 (job 0)");
        assert_eq!(dev("stuck", 95.2, 0.0).brief(), "peers waited 95 s");
        assert_eq!(dev("something new", 1.0, 0.0).brief(), "in full");
        assert_eq!((short_label("io_share"), short_label("stuck"), short_label("new")), ("block IO", "stuck", "new"));
        // Every signal's, at two-digit shares: within the 26 columns a row leaves.
        for s in SPECS.iter().chain([&DEVICE_WAIT_HIGH]) {
            let b = dev(s.name, 0.99, 0.50).brief();
            assert!(b.starts_with(s.short) && b.chars().count() <= 26, "{b}");
        }
    }
}
