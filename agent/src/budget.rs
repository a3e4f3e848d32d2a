// SPDX-License-Identifier: Apache-2.0
//! The trap budget (issue: under 1%): from each window's cost with every
//! probe on (`cost::WindowCost::need`), the share of each cycle the
//! duty-cycled probes stay on next (`probes::duty`). The budget is per
//! traced process; the probes are per file and the driver's file is shared
//! by every pod on a node, so the busiest process sets one ratio for all
//! (each process's counts stay unbiased estimates: the same ratio divides
//! them). Ratios are powers of two, so a rate near a limit does not move
//! the ratio every window, and a step up needs a fifth of room to spare.

use crate::probes::duty::MIN_RATIO;

/// The room a step up needs: its cost at most this share of the budget.
const STEP_UP_ROOM: f64 = 0.8;

#[derive(Debug)]
pub(crate) struct Budget {
    /// The share of one CPU a traced process's traps may take; None: off.
    share: Option<f64>,
    ratio: f64,
}

impl Budget {
    pub(crate) fn new(share: Option<f64>) -> Budget {
        Budget { share, ratio: 1.0 }
    }

    pub(crate) fn share(&self) -> Option<f64> {
        self.share
    }

    /// The ratio for the next window, from this window's `need`: per
    /// process (pid, share of a CPU of the probes always on, share of the
    /// duty-cycled ones were they on throughout).
    pub(crate) fn next(&mut self, need: &[(u32, f64, f64)]) -> f64 {
        let Some(share) = self.share else { return 1.0 };
        let fits = |r: f64| {
            let room = if r > self.ratio { share * STEP_UP_ROOM } else { share };
            need.iter().all(|&(_, on, cycled)| on + cycled * r <= room)
        };
        let mut r = 1.0;
        while r > MIN_RATIO && !fits(r) {
            r /= 2.0;
        }
        self.ratio = r;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_process_sets_the_largest_ratio_that_keeps_it_in_budget() {
        let mut b = Budget::new(Some(0.01));
        // In budget: every probe on.
        assert_eq!(b.next(&[(1, 0.001, 0.005)]), 1.0);
        // 2.4% with launches on throughout: half of them is 1.3%, a quarter 0.7%.
        assert_eq!(b.next(&[(1, 0.001, 0.005), (2, 0.001, 0.023)]), 0.25);
        // Never below the floor, even where the timed calls alone are over.
        assert_eq!(b.next(&[(2, 0.02, 0.5)]), MIN_RATIO);
        assert_eq!(b.next(&[]), 1.0);
        assert_eq!(Budget::new(None).next(&[(2, 0.02, 0.5)]), 1.0, "no budget: always on");
    }

    #[test]
    fn a_step_up_needs_room_so_a_rate_at_the_limit_does_not_flap() {
        let mut b = Budget::new(Some(0.01));
        assert_eq!(b.next(&[(1, 0.0, 0.03)]), 0.25);
        // At 1/2 the cost would be 0.95% (in budget, not 0.8% of it): stays at 1/4.
        assert_eq!(b.next(&[(1, 0.0, 0.019)]), 0.25);
        assert_eq!(b.next(&[(1, 0.0, 0.019)]), 0.25);
        // Room for a half.
        assert_eq!(b.next(&[(1, 0.0, 0.015)]), 0.5);
        // A step down needs no room: 0.95% at 1/2 is in budget.
        assert_eq!(b.next(&[(1, 0.0, 0.019)]), 0.5);
        assert_eq!(b.next(&[(1, 0.0, 0.001)]), 1.0);
    }
}
