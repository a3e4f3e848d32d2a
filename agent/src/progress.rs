// SPDX-License-Identifier: Apache-2.0
//! What each CUDA process is inside at the end of a window: the calls its
//! threads are in (from the kernel's `thread_calls`) and how long they have
//! been there. A rank hung in a sync shows here while the call has not
//! returned (call_windows only sees it when it does); a rank hung in host
//! code shows as no call in flight and a growing time since its last call.

use std::collections::{BTreeMap, HashMap};

use crate::probes::abi::ThreadCall;
use crate::probes::ops::{self, Op};
use crate::steps::StepStats;

/// One process's row of `progress_windows`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Progress {
    pub pid: u32,
    pub threads_in_call: u32,
    /// The call in flight longest: op, thread, age (ns).
    pub oldest: Option<(Op, u32, u64)>,
    pub last_call_age_ns: Option<u64>,
    pub state: Option<char>,
    /// Steps that ended in the window (None: no step cycle found).
    pub steps: Option<StepStats>,
}

/// Monotonic clock (what bpf_ktime_get_ns reads) → wall clock offset in µs.
pub(crate) fn mono_to_wall_us() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mono_us = ts.tv_sec * 1_000_000 + ts.tv_nsec / 1000;
    chrono::Utc::now().timestamp_micros() - mono_us
}

/// Monotonic clock in ns (what `bpf_ktime_get_ns` reads).
pub(crate) fn mono_now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// State letter of a process's main thread (`/proc/PID/stat`, after the
/// command name, which may itself hold spaces and parentheses).
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    state_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn state_of(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Rows for every process in a call now and every known CUDA process
/// (`last_call_us`: pid → end of its last window with calls, µs).
pub(crate) fn collect(
    in_flight: &[(u32, ThreadCall)],
    last_call_us: &HashMap<u32, i64>,
    now_mono_ns: u64,
    window_end_us: i64,
    state: impl Fn(u32) -> Option<char>,
) -> Vec<Progress> {
    let mut by_pid: BTreeMap<u32, Progress> = BTreeMap::new();
    let new_row = |pid: u32| Progress {
        pid,
        threads_in_call: 0,
        oldest: None,
        last_call_age_ns: last_call_us.get(&pid).map(|&t| (window_end_us - t).max(0) as u64 * 1000),
        state: state(pid),
        steps: None,
    };
    for (tid, c) in in_flight.iter().filter(|(_, c)| c.depth > 0 && c.tgid != 0) {
        let Some(op) = ops::by_id(c.op) else { continue };
        let age = now_mono_ns.saturating_sub(c.since_ns);
        let p = by_pid.entry(c.tgid).or_insert_with(|| new_row(c.tgid));
        p.threads_in_call += 1;
        if p.oldest.is_none_or(|(_, _, a)| age > a) {
            p.oldest = Some((op, *tid, age));
        }
    }
    for &pid in last_call_us.keys() {
        by_pid.entry(pid).or_insert_with(|| new_row(pid));
    }
    by_pid.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tgid: u32, op: &str, since_ns: u64) -> ThreadCall {
        let id = ops::all().iter().find(|o| o.symbol == op).unwrap().id as u32;
        ThreadCall { since_ns, tgid, op: id, depth: 1, ..ThreadCall::default() }
    }

    #[test]
    fn the_oldest_call_per_process_and_idle_known_processes() {
        let in_flight = [
            (11, call(10, "cudaStreamSynchronize", 5_000_000_000)),
            (12, call(10, "ncclAllReduce", 9_000_000_000)),
            (21, call(20, "cudaMemcpy", 9_500_000_000)),
            (99, ThreadCall { depth: 0, ..call(30, "cudaMalloc", 1) }),
        ];
        let last = HashMap::from([(10, 40_000_000), (30, 10_000_000)]);
        let rows = collect(&in_flight, &last, 10_000_000_000, 40_000_000, |p| (p == 30).then_some('S'));
        assert_eq!(rows.len(), 3, "{rows:?}");
        let p10 = &rows[0];
        assert_eq!((p10.pid, p10.threads_in_call, p10.last_call_age_ns), (10, 2, Some(0)));
        let (op, tid, age) = p10.oldest.unwrap();
        assert_eq!((op.symbol, tid, age), ("cudaStreamSynchronize", 11, 5_000_000_000));
        assert_eq!((rows[1].pid, rows[1].last_call_age_ns), (20, None), "in a call, never seen in a window");
        // Known, no call in flight (depth 0 is a finished call): hung in host code?
        let p30 = &rows[2];
        assert_eq!((p30.threads_in_call, p30.oldest, p30.state), (0, None, Some('S')));
        assert_eq!(p30.last_call_age_ns, Some(30_000_000_000));
    }

    #[test]
    fn reads_the_state_past_a_command_name_with_parentheses() {
        assert_eq!(state_of("4242 (pt_data (w) 1) S 1 4242 4242 0 -1"), Some('S'));
        assert!(matches!(proc_state(std::process::id()), Some('R' | 'S')));
        assert_eq!(proc_state(u32::MAX), None);
    }
}
