// SPDX-License-Identifier: Apache-2.0
//! Diagnosis: cause → effect → contributing factors → fixes, from the data.

use ingero_model::hist::Histogram;
use serde::Serialize;

use super::data::{Point, ReportData, median};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Severity {
    High,
    Medium,
    Low,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Chain {
    /// The share of the report's time (of its processes' thread time for
    /// scheduler causes) this cause accounts for; None for events (OOM).
    #[serde(default)]
    pub explains: Option<f64>,
    pub severity: Severity,
    /// Short machine-readable cause: cpu_contention, io_stall, memory_pressure, oom, slow_gpu, slow_network, straggler, failing_calls, …
    pub cause: String,
    pub title: String,
    pub root_cause: Vec<String>,
    pub effect: Vec<String>,
    pub contributing: Vec<String>,
    pub fixes: Vec<String>,
    /// Where the stalls behind this cause were made, busiest first.
    #[serde(default)]
    pub call_sites: Vec<super::sites::CallSite>,
}

/// Headline numbers the chains are built from.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Summary {
    pub windows: usize,
    pub runq_share: f64,
    pub runq_share_peak: f64,
    /// Run-queue share reached in at least three windows (the third highest):
    /// contention that lasts, not one noisy window.
    #[serde(default)]
    pub runq_share_sustained: f64,
    pub offcpu_share: f64,
    /// Off-CPU outside CUDA/NCCL waits.
    #[serde(default)]
    pub host_offcpu_share: f64,
    pub stall_share: f64,
    pub io_share: f64,
    pub sync_p99_baseline_ns: Option<u64>,
    pub sync_p99_worst_ns: Option<u64>,
    /// Waiting on the GPU and peers (syncs, blocking copies, collectives).
    pub wait_share: f64,
    pub peer_wait_share: Option<f64>,
    /// Waiting for its own GPU in blocking copies.
    #[serde(default)]
    pub copy_share: f64,
    #[serde(default)]
    pub peer_copy_share: Option<f64>,
    pub peer_stall_share: Option<f64>,
    pub launch_rate_baseline: f64,
    pub launch_rate_worst: f64,
    /// Mean step time in the calmest and the most stalled third of the
    /// windows, where the agents found steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_baseline_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_worst_ns: Option<u64>,
    pub mem_events: usize,
    pub oom_kills: usize,
}

/// A share as a percentage; a small one that is not zero says so.
pub(crate) fn pct(x: f64) -> String {
    if x > 0.0 && x < 0.005 { "<1%".into() } else { format!("{:.0}%", x * 100.0) }
}

pub(crate) fn fmt_ns(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{:.2}s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}ms", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.0}µs", n as f64 / 1e3),
        n => format!("{n}ns"),
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// The mean step time of the windows that have one.
fn mean_step<'a>(points: impl Iterator<Item = &'a Point>) -> Option<u64> {
    let steps: Vec<f64> = points.filter_map(|p| p.step_p50_ns).map(|n| n as f64).collect();
    (!steps.is_empty()).then(|| mean(steps.into_iter()) as u64)
}

pub(crate) fn summarize(d: &ReportData) -> Summary {
    let s = &d.series;
    let n = s.len();
    // Baseline: the calmest third of the windows (lowest host stall) — the
    // pod's own normal, whatever time the trouble started.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| (s[a].runq_share + s[a].offcpu_share).total_cmp(&(s[b].runq_share + s[b].offcpu_share)));
    let calm: Vec<usize> = order[..n.div_ceil(3)].to_vec();
    let worst: Vec<usize> = order[n - n.div_ceil(3)..].to_vec();
    let hist_of = |idx: &[usize]| {
        let (mut h, mut longest) = (Histogram::default(), 0);
        for &i in idx {
            if let Some((_, x, m)) = d.sync_hist.iter().find(|(t, ..)| *t == s[i].t_us) {
                h.merge(x);
                longest = longest.max(*m);
            }
        }
        super::data::capped(h.quantile(0.99), longest)
    };
    let peers_n: Vec<f64> = s.iter().filter_map(|p| p.peer_wait_share).collect();
    let peers_c: Vec<f64> = s.iter().filter_map(|p| p.peer_copy_share).collect();
    let peers_s: Vec<f64> = s.iter().filter_map(|p| p.peer_stall_share).collect();
    Summary {
        windows: n,
        runq_share: mean(s.iter().map(|p| p.runq_share)),
        runq_share_peak: s.iter().map(|p| p.runq_share).fold(0.0, f64::max),
        runq_share_sustained: {
            let mut v: Vec<f64> = s.iter().map(|p| p.runq_share).collect();
            v.sort_by(|a, b| b.total_cmp(a));
            v.get(2.min(v.len().saturating_sub(1))).copied().unwrap_or(0.0)
        },
        offcpu_share: mean(s.iter().map(|p| p.offcpu_share)),
        host_offcpu_share: mean(s.iter().map(|p| p.host_offcpu_share)),
        stall_share: mean(s.iter().map(|p| p.runq_share + p.offcpu_share)),
        io_share: mean(s.iter().map(|p| p.io_share)),
        sync_p99_baseline_ns: hist_of(&calm),
        // Only a worst that is worse: stalled windows whose syncs were no
        // slower say the stall did not reach the GPU side.
        sync_p99_worst_ns: hist_of(&worst).filter(|w| hist_of(&calm).is_none_or(|b| *w > b)),
        wait_share: mean(s.iter().map(|p| p.wait_share)),
        peer_wait_share: (!peers_n.is_empty()).then(|| median(peers_n)),
        copy_share: mean(s.iter().map(|p| p.copy_share)),
        peer_copy_share: (!peers_c.is_empty()).then(|| median(peers_c)),
        peer_stall_share: (!peers_s.is_empty()).then(|| median(peers_s)),
        launch_rate_baseline: mean(calm.iter().map(|&i| s[i].launches_per_s)),
        launch_rate_worst: mean(worst.iter().map(|&i| s[i].launches_per_s)),
        step_baseline_ns: mean_step(calm.iter().map(|&i| &s[i])),
        step_worst_ns: mean_step(worst.iter().map(|&i| &s[i])),
        mem_events: d
            .events
            .iter()
            .filter(|e| e.kind != "oom_kill" && matches!(e.kind.as_str(), "mem_pressure" | "swap"))
            .count(),
        oom_kills: d.events.iter().filter(|e| e.kind == "oom_kill").count(),
    }
}

/// Least share of the feeding threads' captured off-CPU time in IO for an
/// IO stall.
const IO_BLOCKED_MIN: f64 = 0.25;

/// The least rise of the sync p99 that is named as an effect.
const SYNC_EFFECT_MIN_NS: u64 = 1_000_000;

/// Effects on the GPU side, shared by the host-side chains.
pub(crate) fn gpu_effects(d: &ReportData, s: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    // A millisecond at least: syncs of microseconds that jitter to tens are
    // not an effect anyone's step feels.
    if let (Some(b), Some(w)) = (s.sync_p99_baseline_ns, s.sync_p99_worst_ns)
        && w as f64 > b as f64 * 1.2
        && w.saturating_sub(b) >= SYNC_EFFECT_MIN_NS
    {
        out.push(format!(
            "cudaStreamSynchronize p99 {} → {} ({:.1}× its own calm windows)",
            fmt_ns(b),
            fmt_ns(w),
            w as f64 / b.max(1) as f64
        ));
    }
    if s.launch_rate_baseline > 0.0 && s.launch_rate_worst < s.launch_rate_baseline * 0.9 {
        out.push(format!(
            "kernel launch rate dropped {:.0}% ({:.0} → {:.0} launches/s)",
            (1.0 - s.launch_rate_worst / s.launch_rate_baseline) * 100.0,
            s.launch_rate_baseline,
            s.launch_rate_worst
        ));
    }
    // What users compare: the cost of each training step.
    if let (Some(b), Some(w)) = (s.step_baseline_ns, s.step_worst_ns)
        && w as f64 > b as f64 * 1.1
    {
        out.push(format!(
            "each training step took {:.0}% longer ({} → {})",
            (w as f64 / b.max(1) as f64 - 1.0) * 100.0,
            fmt_ns(b),
            fmt_ns(w)
        ));
    }
    if let Some(peer) = s.peer_wait_share
        && s.wait_share < peer * 0.7
    {
        out.push(format!(
                "this rank waits on the GPU and peers (syncs, copies, collectives) {} of the time vs {} on the job's other {} nodes — they are waiting for it (straggler)",
                pct(s.wait_share),
                pct(peer),
                d.peers
            ));
    }
    out
}

/// Who a chain talks about: the processes and the neighbours that took CPU.
struct Subject {
    who: String,
    pids: String,
    span_secs: f64,
    neighbours: Vec<String>,
}

impl Subject {
    fn of(d: &ReportData, s: &Summary) -> Subject {
        let neighbours = d
            .neighbours
            .iter()
            .filter(|n| n.cores >= 0.05)
            .map(|n| {
                let owner = match (&n.namespace, &n.pod) {
                    (Some(ns), Some(p)) => format!("pod {ns}/{p}"),
                    _ => format!("cgroup {}", n.cgroup_path),
                };
                format!("{owner} ({}) used {:.1} cores on the same node", n.comm, n.cores)
            })
            .collect();
        Subject {
            who: d.comms.join(", "),
            pids: d.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "),
            span_secs: s.windows as f64 * d.window_secs,
            neighbours,
        }
    }
}

/// Every chain the data supports, most severe first.
pub(crate) fn diagnose(d: &ReportData, s: &Summary) -> Vec<Chain> {
    let who = Subject::of(d, s);
    let mut chains: Vec<Chain> = [oom(d, s), cpu_contention(d, s, &who), io_stall(d, s, &who), memory_pressure(d, s)]
        .into_iter()
        .flatten()
        .collect();
    let host_cause = chains.iter().any(|c| matches!(c.cause.as_str(), "cpu_contention" | "io_stall"));
    // Sleeping inside a sync or a collective is waiting, not a host stall.
    if !host_cause && s.mem_events == 0 {
        chains.extend(host_blocked(d, s, &who));
    }
    // A rank that waits least at collectives but has no host cause: the GPU or the link.
    if chains.iter().all(|c| c.severity != Severity::High) {
        chains.extend(gpu_or_link(d, s));
    }
    chains.sort_by_key(|c| c.severity);
    chains
}

fn oom(d: &ReportData, s: &Summary) -> Option<Chain> {
    if s.oom_kills == 0 {
        return None;
    }
    let victims: Vec<String> = d
        .events
        .iter()
        .filter(|e| e.kind == "oom_kill")
        .map(|e| format!("{} at {}", e.detail.clone().unwrap_or(e.comm.clone()), e.time))
        .collect();
    Some(Chain {
        call_sites: Vec::new(),
        explains: None,
        severity: Severity::High,
        cause: "oom".into(),
        title: "OOM kill → lost work and restarts".into(),
        root_cause: vec![format!("{} OOM kill(s): {}", s.oom_kills, victims.join("; "))],
        effect: vec![
            "the killed process's in-flight steps are lost; the job restarts or hangs at the next collective".into(),
        ],
        contributing: vec![],
        fixes: vec![
            "raise the container memory limit or lower the batch size / number of DataLoader workers".into(),
            "set DataLoader persistent_workers=True and avoid copying the dataset into every worker".into(),
        ],
    })
}

fn cpu_contention(d: &ReportData, s: &Summary, w: &Subject) -> Option<Chain> {
    // The detector flags after three deviant windows; a single window of
    // run-queue wait on a busy host is noise, not a diagnosis. Three windows
    // at 15% are (the mean alone is diluted by calm windows before a fault).
    if s.runq_share < 0.10 && s.runq_share_sustained < 0.15 {
        return None;
    }
    let mut effect = gpu_effects(d, s);
    effect.insert(0, "the GPU idles while the host cannot launch the next step".into());
    Some(Chain {
call_sites: Vec::new(),
        explains: None,
        severity: if s.runq_share >= 0.2 || s.runq_share_sustained >= 0.25 { Severity::High } else { Severity::Medium },
        cause: "cpu_contention".into(),
        title: "CPU scheduling contention → CUDA throughput drop".into(),
        root_cause: vec![format!(
            "training process {} (pid {}) was runnable but waiting for a CPU {} of the time (peak {}) over {:.0}s",
            w.who,
            w.pids,
            pct(s.runq_share),
            pct(s.runq_share_peak),
            w.span_secs
        )],
        effect,
        contributing: if w.neighbours.is_empty() {
            vec!["no single other cgroup dominated: look at DataLoader workers and per-node daemons".into()]
        } else {
            w.neighbours.clone()
        },
        fixes: vec![
            "give the training pod Guaranteed QoS with integer CPU requests and enable the kubelet static CPU manager (cpuManagerPolicy: static) so its threads get exclusive cores".into(),
            "keep batch/best-effort pods off GPU nodes (taint the nodes, or set CPU limits on the neighbours listed above)".into(),
            "size DataLoader num_workers to the cores the pod really has (cores − 2)".into(),
        ],
    })
}

fn io_stall(d: &ReportData, s: &Summary, w: &Subject) -> Option<Chain> {
    if s.io_share < 0.05 || s.offcpu_share < 0.08 {
        return None;
    }
    // The places the feeding threads slept say what they waited for: IO
    // beside off-CPU time spent sleeping or on locks is not its cause (a
    // script's startup reads beside its `time.sleep`).
    if d.blocked_io_share.is_some_and(|x| x < IO_BLOCKED_MIN) {
        return None;
    }
    let mut effect = gpu_effects(d, s);
    effect
        .insert(0, format!("training threads blocked (off-CPU) {} of the time waiting for input", pct(s.offcpu_share)));
    Some(Chain {
        call_sites: Vec::new(),
        explains: None,
        severity: if s.offcpu_share >= 0.2 { Severity::High } else { Severity::Medium },
        cause: "io_stall".into(),
        title: "Block IO stall → input pipeline starves the GPU".into(),
        root_cause: vec![io_root(s.io_share, &w.who)],
        effect,
        contributing: vec![],
        fixes: vec![
            "stage the dataset on local NVMe (or a node-local cache) instead of network storage".into(),
            "raise DataLoader prefetch_factor and num_workers so reads overlap compute".into(),
            "check the volume's IOPS/throughput limits and noisy IO neighbours on the node".into(),
        ],
    })
}

/// The IO a process waits on: summed request latencies over wall time,
/// past 100% when requests overlap (then: how many were in flight).
fn io_root(share: f64, who: &str) -> String {
    let sum = format!("block IO latency adds up to {} of wall time for {who}", pct(share));
    if share > 1.0 { format!("{sum}: {share:.1} requests in flight at a time on average") } else { sum }
}

fn memory_pressure(d: &ReportData, s: &Summary) -> Option<Chain> {
    if s.mem_events == 0 || s.offcpu_share < 0.05 {
        return None;
    }
    let mut effect = gpu_effects(d, s);
    effect.insert(0, format!("threads blocked in reclaim/page faults: off-CPU {}", pct(s.offcpu_share)));
    Some(Chain {
        call_sites: Vec::new(),
        explains: None,
        severity: Severity::Medium,
        cause: "memory_pressure".into(),
        title: "Memory pressure → reclaim stalls the training loop".into(),
        root_cause: vec![format!("{} memory-pressure/swap events", s.mem_events)],
        effect,
        contributing: vec![],
        fixes: vec![
            "raise the pod's memory limit (memory.high reclaim starts below it) or reduce host-side caching".into(),
            "disable swap on GPU nodes; pin_memory buffers cannot be swapped".into(),
        ],
    })
}

fn host_blocked(d: &ReportData, s: &Summary, w: &Subject) -> Option<Chain> {
    if s.host_offcpu_share < 0.25 {
        return None;
    }
    Some(Chain {
        call_sites: Vec::new(),
        explains: None,
        // Half the time or more: the loop is stopped, not slowed (a hang
        // shorter than --stuck-after, a stalled input pipeline).
        severity: if s.host_offcpu_share >= 0.5 { Severity::High } else { Severity::Medium },
        cause: "host_blocked".into(),
        title: "Host threads blocked → GPU waits for work".into(),
        root_cause: vec![format!(
            "{} was off-CPU {} of the time outside CUDA/NCCL waits (locks, sleeps, synchronous host work)",
            w.who,
            pct(s.host_offcpu_share)
        )],
        effect: gpu_effects(d, s),
        contributing: vec![],
        fixes: vec![
            "profile the input pipeline (py-spy dump during a stall) and move blocking work out of the training loop"
                .into(),
        ],
    })
}

fn gpu_or_link(d: &ReportData, s: &Summary) -> Vec<Chain> {
    let Some(peer) = s.peer_wait_share else { return vec![] };
    let mut out = Vec::new();
    let peer_copy = s.peer_copy_share.unwrap_or(0.0);
    // Its own GPU is slow: it waits longer than its peers in the blocking
    // copies that need only its own work (`loss.item()` before the
    // collectives are due), or it waits least overall with a healthy host.
    let own_gpu = s.copy_share > peer_copy * 1.3 && s.copy_share - peer_copy > 0.03;
    if (own_gpu || s.wait_share < peer * 0.7) && s.stall_share < 0.1 {
        out.push(Chain {
call_sites: Vec::new(),
            explains: None,
            severity: Severity::High,
            cause: "slow_gpu".into(),
            title: "Slow GPU → every other rank waits in its syncs".into(),
            root_cause: vec![format!(
                "host is healthy (stall {}) but this rank waits for its own GPU {} of the time in blocking copies vs {} on peers",
                pct(s.stall_share),
                pct(s.copy_share),
                pct(peer_copy)
            )],
            effect: gpu_effects(d, s),
            contributing: vec![],
            fixes: vec![
                "check `nvidia-smi -q -d PERFORMANCE,CLOCK,ECC` for throttling, XID errors or ECC retirement on this node".into(),
                "cordon the node and reschedule the rank to confirm".into(),
            ],
        });
    }
    if !own_gpu && s.wait_share > peer * 1.3 && s.wait_share - peer > 0.05 && s.stall_share < 0.1 {
        out.push(Chain {
            call_sites: Vec::new(),
            explains: None,
            severity: Severity::Medium,
            cause: "slow_network".into(),
            title: "Slow interconnect → longer collectives".into(),
            root_cause: vec![format!(
                "waits on the GPU and peers {} of the time vs {} on peers, with a healthy host and GPU",
                pct(s.wait_share),
                pct(peer)
            )],
            effect: vec!["every step of the job waits for this node's transfers".into()],
            contributing: vec![],
            fixes: vec![
                "check NIC errors/link speed (ethtool -S, ibstat) and NCCL_DEBUG=INFO transport selection on this node"
                    .into(),
            ],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(offcpu: f64, host_offcpu: f64) -> ReportData {
        let series = (0..10)
            .map(|i| Point {
                t_us: i * 1_000_000,
                runq_share: 0.01,
                offcpu_share: offcpu,
                host_offcpu_share: host_offcpu,
                ..Default::default()
            })
            .collect();
        ReportData { series, pids: vec![7], comms: vec!["python".into()], window_secs: 1.0, ..Default::default() }
    }

    fn causes(d: &ReportData) -> Vec<String> {
        diagnose(d, &summarize(d)).into_iter().map(|c| c.cause).collect()
    }

    /// Block IO beside off-CPU time is an IO stall only where the feeding
    /// threads' sleeps say so, or were not captured.
    #[test]
    fn io_is_the_cause_only_where_the_threads_waited_on_it() {
        let mut d = pod(0.3, 0.3);
        d.series[0].io_share = 0.7;
        assert!(causes(&d).contains(&"io_stall".to_string()), "no episodes: the IO stands");
        d.blocked_io_share = Some(0.6);
        assert!(causes(&d).contains(&"io_stall".to_string()));
        d.blocked_io_share = Some(0.05);
        let c = causes(&d);
        assert!(!c.contains(&"io_stall".to_string()) && c.contains(&"host_blocked".to_string()), "{c:?}");
    }

    /// A quantile read from buckets never says more than the longest call.
    #[test]
    fn the_sync_p99_is_never_above_the_longest_sync() {
        let mut d = pod(0.0, 0.0);
        let mut h = Histogram::default();
        h.add(ingero_model::hist::bucket(40_100_000), 59);
        h.record(340_200_000);
        d.sync_hist = d.series.iter().map(|p| (p.t_us, h.clone(), 340_200_000)).collect();
        let s = summarize(&d);
        assert_eq!(s.sync_p99_baseline_ns, Some(340_200_000), "the bucket's bound overshoots");
        d.sync_hist.iter_mut().for_each(|w| w.2 = 0);
        assert!(summarize(&d).sync_p99_baseline_ns.unwrap() > 340_200_000, "the test must overshoot");
    }

    /// The stalled third's steps against the calm third's, where steps were found.
    #[test]
    fn a_stall_that_slows_the_steps_says_by_how_much() {
        let mut d = pod(0.0, 0.0);
        for (i, p) in d.series.iter_mut().enumerate() {
            p.step_p50_ns = Some(95_000_000);
            if i >= 5 {
                p.runq_share = 0.35;
                p.step_p50_ns = Some(145_000_000);
            }
        }
        let s = summarize(&d);
        assert_eq!((s.step_baseline_ns, s.step_worst_ns), (Some(95_000_000), Some(145_000_000)));
        let effects = gpu_effects(&d, &s);
        assert!(effects.contains(&"each training step took 53% longer (95.0ms → 145.0ms)".to_string()), "{effects:?}");
        // No steps found, or steps no slower: nothing said.
        for p in d.series.iter_mut() {
            p.step_p50_ns = p.step_p50_ns.filter(|_| p.runq_share == 0.0);
        }
        let s = summarize(&d);
        assert_eq!(s.step_worst_ns, None);
        assert!(!gpu_effects(&d, &s).iter().any(|e| e.contains("step")), "{s:?}");
    }

    #[test]
    fn one_noisy_window_is_not_cpu_contention_but_three_are() {
        let mut d = pod(0.0, 0.0);
        d.series[4].runq_share = 0.30;
        d.series[7].runq_share = 0.08;
        assert!(!causes(&d).contains(&"cpu_contention".to_string()), "one window at 30%");
        d.series[5].runq_share = 0.30;
        assert!(!causes(&d).contains(&"cpu_contention".to_string()), "two windows at 30%");
        let mut d = pod(0.0, 0.0);
        for p in &mut d.series[5..9] {
            p.runq_share = 0.18; // a quota on a rank: ~20% every window of the fault
        }
        assert!(causes(&d).contains(&"cpu_contention".to_string()), "four windows at 18%");
    }

    #[test]
    fn waiting_inside_a_sync_or_collective_is_not_a_host_stall() {
        // 85% off-CPU, all of it asleep inside ncclAllReduce / cudaStreamSynchronize.
        assert!(!causes(&pod(0.85, 0.02)).contains(&"host_blocked".to_string()));
        // The same off-CPU time outside any CUDA/NCCL call is the host's own.
        assert!(causes(&pod(0.85, 0.85)).contains(&"host_blocked".to_string()));
    }
}
