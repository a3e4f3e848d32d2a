// SPDX-License-Identifier: Apache-2.0
//! The probes' own run time (BPF_STATS_RUN_TIME), sampled. While the
//! kernel's run-time accounting is on, every BPF program on the node pays
//! two clock reads and a counter update a run (~50 ns measured here, the
//! same for an empty program: as much as a third of what Ingero's launch
//! program costs, and paid by other tools' programs too). So it is on for
//! one window in `every`, and that window's time is scaled by `every`: an
//! estimate of the whole period, exact when the load is steady.

use std::os::fd::OwnedFd;

use crate::probes::load::Probes;

#[derive(Debug)]
pub(crate) struct RunTimeSampler {
    /// Holds the accounting on while open (the kernel counts holders).
    on: Option<OwnedFd>,
    every: u32,
    windows: u64,
    /// The programs' total when the accounting went on.
    start_ns: u64,
}

impl RunTimeSampler {
    /// `every`: measure one window in this many (0: never).
    pub(crate) fn new(every: u32) -> Self {
        RunTimeSampler { on: None, every, windows: 0, start_ns: 0 }
    }

    /// Ends a window: its estimated program time (0 for a window that was
    /// not measured; the measured one stands for `every` windows), and
    /// turns the accounting on or off for the next.
    pub(crate) fn window_end(&mut self, probes: &Probes) -> u64 {
        let estimate = match self.on.take() {
            Some(_on) => total_run_ns(probes).saturating_sub(self.start_ns).saturating_mul(u64::from(self.every)),
            None => 0,
        };
        self.windows += 1;
        if self.due() {
            self.start_ns = total_run_ns(probes);
            self.on = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        }
        estimate
    }

    /// Whether the next window is measured.
    fn due(&self) -> bool {
        self.every != 0 && self.windows.is_multiple_of(u64::from(self.every))
    }
}

fn total_run_ns(probes: &Probes) -> u64 {
    probes.ebpf.programs().filter_map(|(_, p)| p.info().ok()).map(|i| i.run_time().as_nanos() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_window_in_every_is_measured() {
        let mut s = RunTimeSampler::new(3);
        let due: Vec<bool> = (0..7)
            .map(|_| {
                s.windows += 1;
                s.due()
            })
            .collect();
        assert_eq!(due, [false, false, true, false, false, true, false]);
        let mut never = RunTimeSampler::new(0);
        never.windows = 30;
        assert!(!never.due());
    }
}
