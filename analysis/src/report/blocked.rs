// SPDX-License-Identifier: Apache-2.0
//! Where the host blocked: off-CPU episodes outside any CUDA/NCCL call
//! (`stall_events` rows with reason `off_cpu`, shipped with the stack the
//! thread slept with) grouped by site, each with its share of the target's
//! thread time (the denominator of the host-blocked share) and what the
//! thread was waiting on. The threads that feed the GPU (they have made a
//! CUDA/NCCL call) come first: their waits hold its work back. The others
//! (a producer, a watchdog, an idle pool) follow apart, each as a share of
//! one thread's time: their waits matter through a feeding thread's wait
//! for them (a queue, a lock), which is named above them.

use arrow::array::Array;
use arrow::datatypes::UInt64Type;
use serde::{Deserialize, Serialize};

use super::sites::{self, CallSite, OFF_CPU, SiteFrame};
use crate::error::Result;
use crate::query::QueryEngine;
use crate::query::columns::Columns;
use ingero_model::table::names::SCHED_WINDOWS;

/// One place the target's threads blocked, busiest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlockedSite {
    /// The episodes there (`op`: the syscall slept in; frames innermost first).
    pub site: CallSite,
    /// Their time over all the target's thread time in the range.
    pub share: f64,
    /// The first frame of the program's own code (not the interpreter's
    /// library): where to look. None when no frame was captured.
    pub at: Option<SiteFrame>,
    /// What the thread waited on: "a queue", "a lock", "a sleep", …
    pub waiting_on: String,
    /// The thread had made a CUDA/NCCL call (or it is not known: imported
    /// traces). False: another thread of the process, whose share is of one
    /// thread's time (the process's windows), not of the feeding threads'.
    #[serde(default = "feeds")]
    pub feeds_gpu: bool,
}

fn feeds() -> bool {
    true
}

/// Of the GPU-feeding threads' off-CPU time at these sites, the share spent
/// in reads, writes and disk flushes; None when they show no such thread.
pub(crate) fn io_share(sites: &[BlockedSite]) -> Option<f64> {
    let feeding: Vec<&BlockedSite> = sites.iter().filter(|b| b.feeds_gpu).collect();
    let total: f64 = feeding.iter().map(|b| b.share).sum();
    let io: f64 = feeding
        .iter()
        .filter(|b| matches!(b.waiting_on.as_str(), "a read" | "a write" | "a disk flush"))
        .map(|b| b.share)
        .sum();
    (total > 0.0).then(|| io / total)
}

impl BlockedSite {
    /// `28% at loader.py:212 in _next_batch, waiting on a queue`.
    pub fn label(&self) -> String {
        let at = match &self.at {
            Some(f) => {
                let file = f.file.rsplit('/').next().unwrap_or(&f.file);
                let line = f.line.map_or(String::new(), |l| format!(":{l}"));
                let func = if f.function.is_empty() { String::new() } else { format!(" in {}", f.function) };
                format!("{file}{line}{func}")
            }
            None => "(no stack captured)".into(),
        };
        format!("{} at {at}, waiting on {}", super::chains::pct(self.share), self.waiting_on)
    }
}

/// The target's blocked sites (`filter`: its rows in the range): those of
/// the threads that feed the GPU, busiest first, then the others'.
pub(crate) async fn collect(engine: &QueryEngine, filter: &str, stacks_filter: &str) -> Result<Vec<BlockedSite>> {
    let off = format!("{filter} AND reason = '{OFF_CPU}'");
    let feeding = sites::collect_where(engine, &format!("{off} AND feeds_gpu IS NOT FALSE"), stacks_filter).await?;
    let others = sites::collect_where(engine, &format!("{off} AND feeds_gpu = false"), stacks_filter).await?;
    if feeding.is_empty() && others.is_empty() {
        return Ok(Vec::new());
    }
    // Scheduler rows are the feeding threads' time; their windows, one
    // thread's time per process.
    let q = format!(
        "SELECT CAST(SUM(runq_wait_ns + off_cpu_ns + on_cpu_ns) AS BIGINT UNSIGNED) AS t, \
         CAST(SUM(window_us) * 1000 AS BIGINT UNSIGNED) AS span FROM {SCHED_WINDOWS} WHERE {filter}"
    );
    let (mut thread_ns, mut span_ns) = (0u64, 0u64);
    for b in engine.sql(&q).await? {
        let sum = |name: &str| -> Result<u64> {
            let t = b.primitives::<UInt64Type>(name)?;
            Ok((0..t.len()).filter(|&i| t.is_valid(i)).map(|i| t.value(i)).sum())
        };
        thread_ns += sum("t")?;
        span_ns += sum("span")?;
    }
    let mut out: Vec<BlockedSite> = feeding.into_iter().map(|s| blocked(s, thread_ns, true)).collect();
    out.extend(others.into_iter().map(|s| blocked(s, span_ns, false)));
    Ok(out)
}

fn blocked(site: CallSite, thread_ns: u64, feeds_gpu: bool) -> BlockedSite {
    // Without scheduler rows (their windows fell outside), the episodes are the time.
    let share = site.total_ns as f64 / (thread_ns.max(site.total_ns).max(1)) as f64;
    let at = site.frames.iter().find(|f| !is_runtime(&f.file)).or(site.frames.first()).cloned();
    let waiting_on = waits_on(&site);
    BlockedSite { site, share, at, waiting_on, feeds_gpu }
}

/// The interpreter's own library (CPython's stdlib, frozen modules) or the
/// C library: frames that say how a thread waits, not why.
fn is_runtime(file: &str) -> bool {
    let stdlib = file.contains("/lib/python3") && !file.contains("-packages/");
    let base = file.rsplit('/').next().unwrap_or(file);
    let libc = ["libc.so", "libc-", "libpthread", "ld-linux"].iter().any(|l| base.starts_with(l));
    stdlib || file.starts_with("<frozen ") || libc
}

/// What the thread waited on. The library frame nearest the program's own
/// code says what the program called (a queue is a condition, a lock and a
/// futex underneath); without one, the syscall.
fn waits_on(site: &CallSite) -> String {
    let library = site.frames.iter().take_while(|f| is_runtime(&f.file)).last();
    if let Some(w) = library.and_then(by_library) {
        return w.into();
    }
    if site.op.ends_with("(timeout only)") {
        return "a sleep".into();
    }
    let by_syscall = match site.op.as_str() {
        "futex" | "futex_waitv" => "a lock",
        "clock_nanosleep" | "nanosleep" | "pause" => "a sleep",
        "read" | "pread64" | "readv" | "recvfrom" | "recvmsg" | "recvmmsg" | "msgrcv" => "a read",
        "write" | "pwrite64" | "writev" | "sendto" | "sendmsg" | "sendmmsg" => "a write",
        "poll" | "ppoll" | "select" | "pselect6" | "epoll_wait" | "epoll_pwait" | "epoll_pwait2" => "I/O readiness",
        "wait4" | "waitid" => "a child process",
        "accept" | "accept4" | "connect" => "a connection",
        "fsync" | "fdatasync" | "msync" => "a disk flush",
        "io_getevents" | "io_uring_enter" => "asynchronous I/O",
        "open" | "openat" => "opening a file",
        other => return other.to_string(),
    };
    by_syscall.into()
}

/// What a call into the interpreter's library waits on, by module and function.
fn by_library(f: &SiteFrame) -> Option<&'static str> {
    let name = f.file.rsplit('/').next().unwrap_or(&f.file);
    let func = f.function.rsplit('.').next().unwrap_or(&f.function);
    Some(match name {
        "queue.py" => "a queue",
        "threading.py" if func == "join" || func.starts_with("_wait_for_tstate_lock") => "a thread to finish",
        "threading.py" if f.function.starts_with("Event") => "an event",
        "threading.py" if f.function.starts_with("Barrier") => "a barrier",
        "threading.py" if f.function.contains("Semaphore") => "a semaphore",
        "threading.py" => "a lock or condition",
        "socket.py" | "ssl.py" => "the network",
        "subprocess.py" => "a child process",
        "selectors.py" => "I/O readiness",
        _ if f.file.contains("/multiprocessing/") => "another process (multiprocessing)",
        _ if f.file.contains("/concurrent/futures/") => "a future",
        _ if f.file.contains("/asyncio/") => "the event loop",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, function: &str, line: u32) -> SiteFrame {
        SiteFrame { file: file.into(), function: function.into(), line: Some(line) }
    }

    fn site(op: &str, frames: Vec<SiteFrame>, total_ms: u64) -> CallSite {
        CallSite {
            op: op.into(),
            library: "kernel".into(),
            count: 3,
            total_ns: total_ms * 1_000_000,
            p99_ns: 0,
            max_ns: 0,
            frames,
            native: vec![],
            threads: vec![],
        }
    }

    #[test]
    fn a_queue_wait_is_named_at_the_programs_own_line() {
        let lib = "/usr/lib/python3.12";
        let frames = vec![
            frame(&format!("{lib}/threading.py"), "Condition.wait", 355),
            frame(&format!("{lib}/queue.py"), "Queue.get", 171),
            frame("/w/data/loader.py", "Loader._next_batch", 212),
            frame("/w/train.py", "<module>", 9),
        ];
        let b = blocked(site("futex", frames, 280), 1_000_000_000, true);
        assert_eq!(b.label(), "28% at loader.py:212 in Loader._next_batch, waiting on a queue");
    }

    #[test]
    fn a_sleep_and_a_read_by_their_syscalls() {
        let sleep = blocked(site("clock_nanosleep", vec![frame("/w/train.py", "step", 40)], 50), 1_000_000_000, true);
        assert_eq!(sleep.label(), "5% at train.py:40 in step, waiting on a sleep");
        // Installed packages are the program's code, not the interpreter's.
        let pkg = "/venv/lib/python3.11/site-packages/datasets/io.py";
        let read = blocked(site("read", vec![frame(pkg, "load", 7)], 10), 1_000_000_000, true);
        assert_eq!(read.label(), "1% at io.py:7 in load, waiting on a read");
        let old =
            blocked(site("pselect6 (timeout only)", vec![frame("/w/train.py", "step", 41)], 10), 1_000_000_000, true);
        assert_eq!(old.waiting_on, "a sleep", "CPython before 3.11 sleeps in select");
        let join = vec![
            frame("/usr/lib/python3.9/threading.py", "_wait_for_tstate_lock", 1080),
            frame("/usr/lib/python3.9/threading.py", "join", 1060),
            frame("/w/train.py", "main", 3),
        ];
        assert_eq!(blocked(site("futex", join, 10), 1_000_000_000, true).waiting_on, "a thread to finish");
        let other = blocked(site("syscall_999", vec![], 10), 0, true);
        assert_eq!(other.label(), "100% at (no stack captured), waiting on syscall_999");
    }
}
