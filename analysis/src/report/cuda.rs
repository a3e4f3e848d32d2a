// SPDX-License-Identifier: Apache-2.0
//! Chains read from the CUDA calls themselves: allocator churn, copies that
//! wait, launch latency tails. (Host time waiting in synchronize is not a
//! chain: a healthy GPU-bound job spends most of its time there.) They name the op, its
//! latency and what in PyTorch usually causes it.

use super::chains::{Chain, Severity, Summary, fmt_ns};
use super::data::{OpStat, ReportData};
use crate::rank::signals::is_launch;

fn is_alloc(op: &str) -> bool {
    op.starts_with("cudaFree")
        || op.starts_with("cudaMalloc")
        || op.starts_with("cuMemAlloc")
        || op.starts_with("cuMemFree")
}

fn is_copy(op: &str) -> bool {
    op.starts_with("cudaMemcpy") || op.starts_with("cuMemcpy")
}

fn ratio(o: &OpStat) -> f64 {
    match (o.p50_ns, o.p99_ns) {
        (Some(a), Some(b)) if a > 0 => b as f64 / a as f64,
        _ => 0.0,
    }
}

fn lat(o: &OpStat) -> String {
    let s = if o.sampled { " (durations partly from a sample)" } else { "" };
    // A count the duty cycle estimated is marked as one, with what was seen.
    let calls = match o.seen_share {
        Some(seen) => format!("≈{} calls ({:.0}% seen, the rest estimated)", o.count, seen * 100.0),
        None => format!("{} calls", o.count),
    };
    format!(
        "{}: {calls}, p50 {}, p99 {}, max {}, {} in total{s}",
        o.op,
        fmt_ns(o.p50_ns.unwrap_or(0)),
        fmt_ns(o.p99_ns.unwrap_or(0)),
        fmt_ns(o.max_ns),
        fmt_ns(o.total_ns)
    )
}

/// Which of our causes explains a tail on `op`.
pub(crate) fn cause_for_op(op: &str) -> &'static str {
    if is_alloc(op) {
        "allocator_churn"
    } else if is_copy(op) {
        "copy_waits"
    } else if is_launch(op) {
        "launch_tail"
    } else if crate::rank::signals::is_sync_op(op) {
        "gpu_wait"
    } else {
        "op_tail"
    }
}

pub(crate) fn chains(d: &ReportData, s: &Summary) -> Vec<Chain> {
    let mut out = Vec::new();
    let span_ns = (s.windows as f64 * d.window_secs * 1e9).max(1.0);
    let offcpu = format!("threads off-CPU {:.0}% of their time", s.offcpu_share * 100.0);

    let frees: Vec<&OpStat> =
        d.ops.iter().filter(|o| o.op.starts_with("cudaFree") || o.op.starts_with("cuMemFree")).collect();
    let allocs: Vec<&OpStat> =
        d.ops.iter().filter(|o| is_alloc(&o.op) && !frees.iter().any(|f| f.op == o.op)).collect();
    let free_slow = frees.iter().any(|o| o.count >= 10 && o.p50_ns.unwrap_or(0) >= 100_000);
    let alloc_ns: u64 = d.ops.iter().filter(|o| is_alloc(&o.op)).map(|o| o.total_ns).sum();
    if free_slow || alloc_ns as f64 >= 0.02 * span_ns {
        let mut root: Vec<String> = frees.iter().chain(allocs.iter()).filter(|o| o.count > 0).map(|o| lat(o)).collect();
        root.push("cudaFree synchronizes the whole device before it returns memory to the driver, and every block freed that way must be cudaMalloc'd again".into());
        out.push(Chain {
call_sites: Vec::new(),
            explains: None,
            severity: if alloc_ns as f64 >= 0.05 * span_ns { Severity::High } else { Severity::Medium },
            cause: "allocator_churn".into(),
            title: "CUDA allocator churn → device-wide syncs in cudaFree".into(),
            root_cause: root,
            effect: vec![
                format!("{} of wall time inside allocation calls; each cudaFree drains the GPU's queue, so kernels queued behind it cannot overlap host work", fmt_ns(alloc_ns)),
            ],
            contributing: vec![offcpu.clone()],
            fixes: vec![
                "remove torch.cuda.empty_cache() from the training/inference loop: it releases cached blocks that the next step must cudaMalloc again".into(),
                "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to fight fragmentation without emptying the cache".into(),
                "if memory still does not come back, something holds references: check torch.cuda.memory_summary() and memory_snapshot() for live tensors (empty_cache frees only unreferenced cached blocks)".into(),
            ],
        });
    }

    for o in
        d.ops.iter().filter(|o| is_copy(&o.op) && o.count >= 20 && ratio(o) >= 10.0 && o.p99_ns.unwrap_or(0) >= 100_000)
    {
        out.push(Chain {
call_sites: Vec::new(),
            explains: None,
            severity: Severity::Medium,
            cause: "copy_waits".into(),
            title: format!("{} that wait → host blocked on copies", o.op),
            root_cause: vec![lat(o), format!("p99 is {:.0}x p50: most copies return at once, some wait for the stream or for a synchronous staging copy", ratio(o))],
            effect: vec!["the Python thread stalls in the copy instead of queuing the next kernels".into()],
            contributing: vec![offcpu.clone()],
            fixes: vec![
                "copy from pinned memory: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, non_blocking=True); from pageable memory an \"async\" copy is staged synchronously".into(),
                "avoid device→host copies inside the step (.item(), .cpu(), printing losses every step)".into(),
            ],
        });
    }

    for o in d.ops.iter().filter(|o| is_launch(&o.op) && o.count >= 100 && ratio(o) >= 3.0) {
        let mut contributing = vec![offcpu.clone()];
        if s.runq_share > 0.0 {
            contributing.push(format!("run-queue wait {:.0}% of the time", s.runq_share * 100.0));
        }
        out.push(Chain {
call_sites: Vec::new(),
            explains: None,
            severity: if s.runq_share >= 0.1 || s.offcpu_share >= 0.25 { Severity::Medium } else { Severity::Low },
            cause: "launch_tail".into(),
            title: format!("{} latency tail → gaps between kernels", o.op),
            root_cause: vec![lat(o), format!("p99 is {:.1}x p50: the launching thread is sometimes descheduled or blocked mid-launch", ratio(o))],
            effect: vec!["when launches fall behind, the GPU runs out of queued work and idles".into()],
            contributing,
            fixes: vec![
                "pin the training process's threads to dedicated cores (taskset, or Guaranteed QoS with the static CPU manager)".into(),
                "capture the step in a CUDA graph (torch.compile mode=\"reduce-overhead\") so one launch replaces hundreds".into(),
            ],
        });
    }

    out
}
