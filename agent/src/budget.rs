// SPDX-License-Identifier: Apache-2.0
//! The trap budget (issue: under 1%): from each window's cost with every
//! probe on (`cost::WindowCost::need`), the share of each cycle the
//! duty-cycled probes stay on next (`probes::duty`). The budget is per
//! traced process; the probes are per file and the driver's file is shared
//! by every pod on a node, so the busiest process sets one ratio for all
//! (each process's counts stay unbiased estimates: the same ratio divides
//! them). Ratios are powers of two, so a rate near a limit does not move
//! the ratio every window, and a step up needs a fifth of room to spare; a
//! step down needs a process over budget for 2 s in a row, so a burst (a
//! job's first second, short processes one after another) keeps its counts
//! exact.

use std::collections::HashMap;
use std::time::Duration;

use crate::probes::duty::MIN_RATIO;

/// The room a step up needs: its cost at most this share of the budget.
const STEP_UP_ROOM: f64 = 0.8;
/// Over budget this long in a row before the probes are cycled less.
const OVER_FOR: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub(crate) struct Budget {
    /// The share of one CPU a traced process's traps may take; None: off.
    share: Option<f64>,
    ratio: f64,
    /// pid → windows in a row it was over budget at the current ratio.
    over: HashMap<u32, u32>,
    /// Windows in `OVER_FOR` (at least 2).
    over_windows: u32,
}

impl Budget {
    /// `window`: the agent's window (the budget is checked at each).
    pub(crate) fn new(share: Option<f64>, window: Duration) -> Budget {
        let over_windows = (OVER_FOR.as_nanos().div_ceil(window.as_nanos().max(1)) as u32).max(2);
        Budget { share, ratio: 1.0, over: HashMap::new(), over_windows }
    }

    pub(crate) fn share(&self) -> Option<f64> {
        self.share
    }

    /// The ratio for the next window, from this window's `need`: per
    /// process (pid, share of a CPU of the probes always on, share of the
    /// duty-cycled ones were they on throughout).
    /// `floor`: the least ratio the duty cycle can run at (1: none).
    pub(crate) fn next(&mut self, need: &[(u32, f64, f64)], floor: f64) -> f64 {
        let Some(share) = self.share else { return 1.0 };
        let costs = |r: f64, on: f64, cycled: f64| on + cycled * r;
        // Each process's streak over budget at the current ratio: only one
        // over for `OVER_FOR` makes the probes cycle less.
        let now: HashMap<u32, u32> = need
            .iter()
            .filter(|&&(_, on, cycled)| costs(self.ratio, on, cycled) > share)
            .map(|&(pid, ..)| (pid, self.over.get(&pid).map_or(1, |n| n + 1)))
            .collect();
        self.over = now;
        let sustained: Vec<(f64, f64)> = need
            .iter()
            .filter(|n| self.over.get(&n.0).is_some_and(|&w| w >= self.over_windows))
            .map(|&(_, on, cycled)| (on, cycled))
            .collect();
        let floor = floor.max(MIN_RATIO);
        let mut r = self.ratio;
        if !sustained.is_empty() {
            while r > floor && sustained.iter().any(|&(on, cycled)| costs(r, on, cycled) > share) {
                r /= 2.0;
            }
        } else {
            // Up as far as every process fits with room to spare.
            let mut up = 1.0;
            while up > r && need.iter().any(|&(_, on, cycled)| costs(up, on, cycled) > share * STEP_UP_ROOM) {
                up /= 2.0;
            }
            r = r.max(up);
        }
        if r != self.ratio {
            self.over.clear();
        }
        self.ratio = r.min(1.0).max(floor.min(1.0));
        self.ratio
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_process_sets_the_largest_ratio_that_keeps_it_in_budget() {
        let mut b = Budget::new(Some(0.01), Duration::from_secs(1));
        // In budget: every probe on.
        assert_eq!(b.next(&[(1, 0.001, 0.005)], MIN_RATIO), 1.0);
        // 2.4% with launches on throughout: half of them is 1.3%, a quarter
        // 0.7%; one window over is a burst, the second one is not.
        assert_eq!(b.next(&[(1, 0.001, 0.005), (2, 0.001, 0.023)], MIN_RATIO), 1.0);
        assert_eq!(b.next(&[(1, 0.001, 0.005), (2, 0.001, 0.023)], MIN_RATIO), 0.25);
        // Never below the floor, even where the timed calls alone are over.
        assert_eq!(b.next(&[(2, 0.02, 0.5)], MIN_RATIO), 0.25, "one window over at 1/4: stays");
        assert_eq!(b.next(&[(2, 0.02, 0.5)], MIN_RATIO), MIN_RATIO);
        assert_eq!(b.next(&[], MIN_RATIO), 1.0);
        assert_eq!(
            Budget::new(None, Duration::from_secs(1)).next(&[(2, 0.02, 0.5)], MIN_RATIO),
            1.0,
            "no budget: always on"
        );
        // A duty cycle of short cycles goes no lower than it can.
        let mut b = Budget::new(Some(0.01), Duration::from_secs(1));
        b.next(&[(2, 0.0, 0.5)], 0.5);
        assert_eq!(b.next(&[(2, 0.0, 0.5)], 0.5), 0.5);
        assert_eq!(b.next(&[(2, 0.0, 0.5)], 1.0), 1.0, "no cycle to run: every probe on");
        // 100-ms windows: 2 s over budget is 20 windows.
        let mut b = Budget::new(Some(0.01), Duration::from_millis(100));
        for _ in 0..19 {
            assert_eq!(b.next(&[(2, 0.0, 0.5)], MIN_RATIO), 1.0);
        }
        assert_eq!(b.next(&[(2, 0.0, 0.5)], MIN_RATIO), MIN_RATIO);
    }

    #[test]
    fn a_step_up_needs_room_so_a_rate_at_the_limit_does_not_flap() {
        let mut b = Budget::new(Some(0.01), Duration::from_secs(1));
        assert_eq!(b.next(&[(1, 0.0, 0.03)], MIN_RATIO), 1.0);
        assert_eq!(b.next(&[(1, 0.0, 0.03)], MIN_RATIO), 0.25);
        // At 1/2 the cost would be 0.95% (in budget, not 0.8% of it): stays at 1/4.
        assert_eq!(b.next(&[(1, 0.0, 0.019)], MIN_RATIO), 0.25);
        assert_eq!(b.next(&[(1, 0.0, 0.019)], MIN_RATIO), 0.25);
        // Room for a half.
        assert_eq!(b.next(&[(1, 0.0, 0.015)], MIN_RATIO), 0.5);
        // A step down needs no room: 0.95% at 1/2 is in budget.
        assert_eq!(b.next(&[(1, 0.0, 0.019)], MIN_RATIO), 0.5);
        assert_eq!(b.next(&[(1, 0.0, 0.001)], MIN_RATIO), 1.0);
        // A burst of two windows: the second goes down.
        assert_eq!(b.next(&[(1, 0.0, 0.05)], MIN_RATIO), 1.0);
        assert_eq!(b.next(&[(1, 0.0, 0.05)], MIN_RATIO), 0.125);
    }
}
