// SPDX-License-Identifier: Apache-2.0
//! Driver calls made inside a runtime call on the same thread (the
//! runtime's own cuMemAlloc under cudaMalloc, cuLaunchKernel under
//! cudaLaunchKernel): the Go recorder stores both, the agent counts the
//! outer call only (its time is the same time). Events come by start time,
//! so the runtime call is seen first. The share of each driver op's stored
//! calls found nested is the share left out of the calls the recorder
//! counted but did not store; over a rolled-over set it is the set's.

use std::collections::HashMap;

use super::source::{CUDA, DRIVER, Event};

/// (pid, driver op) → (stored calls, those nested in a runtime call).
pub(crate) type Shares = HashMap<(u32, i64), (u64, u64)>;

#[derive(Debug, Default)]
pub(crate) struct Nesting {
    /// (pid, tid) → the span of its latest runtime call (start, end ns).
    in_runtime: HashMap<(u32, u32), (i64, i64)>,
    pub(crate) shares: Shares,
}

impl Nesting {
    /// Notes a call; true for a driver call inside the thread's latest
    /// runtime call.
    pub(crate) fn nested(&mut self, e: &Event) -> bool {
        let span = (e.ts_ns, e.ts_ns.saturating_add(e.dur_ns as i64));
        match e.source {
            CUDA => {
                self.in_runtime.insert((e.pid, e.tid), span);
                false
            }
            DRIVER => {
                let inside = self.in_runtime.get(&(e.pid, e.tid)).is_some_and(|r| r.0 <= span.0 && span.1 <= r.1);
                let n = self.shares.entry((e.pid, e.op)).or_default();
                n.0 += 1;
                n.1 += u64::from(inside);
                inside
            }
            _ => false,
        }
    }
}

/// `x` discarded calls of a driver op as the stored ones nested: the outer
/// part (all of them where none was stored).
pub(crate) fn outer(shares: &Shares, pid: u32, op: i64, x: u64) -> u64 {
    match shares.get(&(pid, op)) {
        Some(&(seen, nested)) if seen > 0 => (x as u128 * (seen - nested) as u128 / seen as u128) as u64,
        _ => x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(source: i64, op: i64, tid: u32, ts_ns: i64, dur_ns: u64) -> Event {
        Event { ts_ns, pid: 1, tid, source, op, dur_ns, ..Default::default() }
    }

    #[test]
    fn a_driver_call_inside_the_threads_runtime_call_is_nested() {
        let mut n = Nesting::default();
        assert!(!n.nested(&ev(CUDA, 1, 7, 1_000, 350)));
        assert!(n.nested(&ev(DRIVER, 5, 7, 1_026, 300)), "inside cudaMalloc");
        assert!(!n.nested(&ev(DRIVER, 5, 8, 1_026, 300)), "another thread's");
        assert!(!n.nested(&ev(DRIVER, 5, 7, 2_000, 10)), "after it ended");
        assert_eq!(n.shares[&(1, 5)], (3, 1));
        assert_eq!(outer(&n.shares, 1, 5, 300), 200);
        assert_eq!(outer(&n.shares, 1, 9, 300), 300, "none stored: all counted");
    }
}
