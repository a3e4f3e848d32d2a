// SPDX-License-Identifier: Apache-2.0
//! The data-parallel job model: each rank's step time and the rows an agent
//! would ship for it, on real CUDA/NCCL semantics: launches and collectives
//! enqueue and return at once; a rank waits for its own GPU in a blocking
//! device-to-host copy (`loss.item()` after the forward pass) and for the
//! slowest rank's collective in its end-of-step stream sync.

use ingero_model::hist::Histogram;
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::signals::Signals;
use ingero_model::tables::{CallRow, CgroupRow, Common, HostEventRow, IoRow, ProcessMetaRow, ProgressRow, SchedRow};
use ingero_model::{Table, Tables};

use crate::faults::{FaultKind, Injection};

/// Per-step costs of a healthy rank (ms).
const HOST_MS: f64 = 20.0;
const COMPUTE_MS: f64 = 60.0;
const ALLREDUCE_MS: f64 = 15.0;
const KERNELS_PER_STEP: f64 = 150.0;
/// Part of the device time that is the forward pass (waited for by `loss.item()`).
const FORWARD_SHARE: f64 = 0.4;

/// Deterministic per-run noise.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Multiplicative jitter around 1.0 (±pct, triangular).
    pub fn jitter(&mut self, pct: f64) -> f64 {
        1.0 + pct * (self.uniform() + self.uniform() - 1.0)
    }
}

/// What one rank did in one window.
#[derive(Debug, Clone, Default)]
pub struct RankWindow {
    pub steps: f64,
    /// Each step's time (ms): the job's pace, alike on every rank.
    pub step_ms: f64,
    pub host_ms: f64,
    pub compute_ms: f64,
    pub runq_ms: f64,
    pub blocked_ms: f64,
    /// Waiting for its own forward pass in a blocking copy.
    pub copy_ms: f64,
    /// Waiting in the end-of-step sync (backward, collectives, peers).
    pub sync_ms: f64,
    pub io_ms: f64,
    pub io_count: f64,
    pub mem_events: u32,
    pub noisy_neighbour: bool,
    /// The job is hung (no step completes): see [`crate::hang`].
    pub hung: Option<crate::hang::Hung>,
}

/// Computes every rank of one job for one window. `t` is the time since start.
pub fn step_job(
    ranks: &[usize],
    t: std::time::Duration,
    faults: &[Injection],
    jitter: f64,
    rng: &mut Rng,
) -> Vec<RankWindow> {
    // A hung job steps no more: each rank only waits (or blocks the others).
    if let Some(hung) = crate::hang::of_job(ranks, t, faults) {
        return hung.into_iter().map(|h| RankWindow { hung: Some(h), ..Default::default() }).collect();
    }
    let mut out: Vec<RankWindow> = Vec::with_capacity(ranks.len());
    let mut net_extra = Vec::with_capacity(ranks.len());
    for &node in ranks {
        let (r, net) = rank_window(node, t, faults, jitter, rng);
        out.push(r);
        net_extra.push(net);
    }
    settle(&mut out, &net_extra);
    out
}

/// One rank's own costs this window, before the job's pace is known; with
/// the extra collective time its own link adds (slow NIC).
pub fn rank_window(
    node: usize,
    t: std::time::Duration,
    faults: &[Injection],
    jitter: f64,
    rng: &mut Rng,
) -> (RankWindow, f64) {
    let mut r = RankWindow {
        host_ms: HOST_MS * rng.jitter(jitter),
        compute_ms: COMPUTE_MS * rng.jitter(jitter),
        io_ms: 0.3 * rng.jitter(jitter),
        io_count: 20.0,
        ..Default::default()
    };
    let mut own_net = 0.0;
    for f in faults.iter().filter(|f| f.active(t) && f.hits(node)) {
        match f.kind {
            FaultKind::Cpu => {
                r.runq_ms += 2.5 * HOST_MS;
                r.noisy_neighbour = true;
            }
            FaultKind::Gpu => r.compute_ms *= 1.8,
            FaultKind::Net => own_net += 50.0,
            FaultKind::Io => {
                r.blocked_ms += 40.0;
                r.io_ms = 8.0;
                r.io_count = 200.0;
            }
            FaultKind::Mem => {
                r.blocked_ms += 35.0;
                r.mem_events += 3;
            }
            FaultKind::JobSlow => r.compute_ms *= 1.5,
            // A one-window spike only.
            FaultKind::Blip if t < f.at + std::time::Duration::from_secs(1) => r.runq_ms += 4.0 * HOST_MS,
            FaultKind::Blip => {}
            // The whole job's: see `step_job`.
            FaultKind::Hang => {}
        }
    }
    (r, own_net)
}

/// Paces every rank of a job by its slowest: steps per window, and how long
/// each waits for its own GPU and for the others.
pub fn settle(out: &mut [RankWindow], net_extra: &[f64]) {
    let host = |r: &RankWindow| r.host_ms + r.runq_ms + r.blocked_ms;
    let slowest = out.iter().map(|r| host(r) + r.compute_ms).fold(0.0, f64::max);
    let slow_net = net_extra.iter().copied().fold(0.0, f64::max);
    // Every rank's collectives complete when the slowest rank has enqueued
    // them. A slow link paces the whole ring: every rank's collectives take
    // longer alike, so from the hosts it looks like a job-wide slowdown.
    let step = slowest + ALLREDUCE_MS + 0.6 * slow_net;
    for r in out.iter_mut() {
        r.steps = (1000.0 / step).max(0.5);
        r.step_ms = step;
        r.copy_ms = FORWARD_SHARE * r.compute_ms;
        r.sync_ms = (step - host(r) - r.copy_ms).max(0.0);
    }
}

/// The node-window signals the aggregator derives from [`rows`] (what
/// `ingero_model::signals::of_tables` computes from them), without building
/// the rows: for simulations of whole fleet-days. A test holds the two equal.
/// Hung windows are not modelled here (fleet-days inject no hangs), nor the
/// processes' progress (`procs`: their steps are shown, never scored).
pub fn signals(r: &RankWindow) -> Signals {
    debug_assert!(r.hung.is_none(), "fleet-day signals of a hung window");
    let count = |x: f64| x.round().max(0.0) as u64;
    let total = |n: u64, ms: f64| if ms > 0.0 && n > 0 { (ms * 1e6 * n as f64) as u64 } else { 0 } as f64;
    let per_step = count(r.steps);
    let copy = total(per_step, r.copy_ms);
    let sched = sched_row(r);
    let io_count = r.io_count.round() as u64;
    Signals {
        runq_ns: sched.runq_wait_ns as f64,
        offcpu_ns: sched.off_cpu_ns as f64,
        oncpu_ns: sched.on_cpu_ns as f64,
        offcpu_call_ns: sched.off_cpu_in_call_ns.unwrap_or(0) as f64,
        copy_ns: copy,
        wait_ns: copy + total(per_step, r.sync_ms.max(0.01)) + total(per_step, 0.02),
        in_call_ns: 0.0,
        io_ns: ((r.io_ms * 1e6) as u64 * io_count) as f64,
        mem_events: r.mem_events as f64,
        launches: count(r.steps * KERNELS_PER_STEP) as f64,
        window_ns: 1e9,
        threads: 1.0,
        procs: Vec::new(),
        measured: true,
        host: None,
    }
}

/// Identity of one simulated rank.
#[derive(Debug)]
pub struct RankId<'a> {
    pub node: &'a str,
    pub job: &'a str,
    pub rank: usize,
    pub world: usize,
    pub window_start_us: i64,
}

fn call_row(b: &mut BatchBuilder, c: &Common, lib: &str, op: &str, count: f64, per_call_ms: f64, rng: &mut Rng) {
    let count = count.round().max(0.0) as u64;
    let mut h = Histogram::default();
    let mut total = 0u64;
    let mut max = 0u64;
    if per_call_ms > 0.0 && count > 0 {
        for _ in 0..count.min(64) {
            let d = (per_call_ms * 1e6 * rng.jitter(0.2)) as u64;
            h.record(d);
            max = max.max(d);
        }
        // Scale the sample up to the full count.
        let (bk, ct) = h.sparse();
        let sample = count.min(64);
        h = Histogram::default();
        for (bi, ci) in bk.iter().zip(ct) {
            h.add(*bi, ci * count / sample);
        }
        total = (per_call_ms * 1e6 * count as f64) as u64;
    }
    let (bk, ct) = h.sparse();
    let row = CallRow {
        library: lib,
        op,
        count,
        errors: 0,
        total_ns: total,
        max_ns: max,
        sampled: false,
        hist_bucket: &bk,
        hist_count: &ct,
        sample_ratio: None,
    };
    b.append(c, &row).expect("simulated row fits the schema");
}

/// The rows an agent on this node would ship for the window.
pub fn rows(id: &RankId<'_>, r: &RankWindow, first: bool, rng: &mut Rng) -> Tables {
    let mut sink = RowSink::default();
    sink.append(id, r, first, rng);
    sink.finish()
}

/// Builders that collect the rows of several windows (a backfill ships
/// many windows per batch without building and concatenating one batch
/// per window and table).
#[derive(Debug)]
pub struct RowSink {
    calls: BatchBuilder,
    sched: BatchBuilder,
    cgroups: BatchBuilder,
    io: BatchBuilder,
    host: BatchBuilder,
    meta: BatchBuilder,
    progress: BatchBuilder,
}

impl Default for RowSink {
    fn default() -> Self {
        RowSink {
            calls: BatchBuilder::new(Table::CallWindows),
            sched: BatchBuilder::new(Table::SchedWindows),
            cgroups: BatchBuilder::new(Table::CgroupWindows),
            io: BatchBuilder::new(Table::IoWindows),
            host: BatchBuilder::new(Table::HostEvents),
            meta: BatchBuilder::new(Table::ProcessMeta),
            progress: BatchBuilder::new(Table::ProgressWindows),
        }
    }
}

impl RowSink {
    /// Appends one rank's window.
    pub fn append(&mut self, id: &RankId<'_>, r: &RankWindow, first: bool, rng: &mut Rng) {
        let common = Common {
            node: id.node.to_string(),
            namespace: Some("ml".into()),
            pod: Some(format!("{}-worker-{}", id.job, id.rank)),
            container: Some("trainer".into()),
            job: Some(id.job.to_string()),
            rank: Some(id.rank as i32),
            world_size: Some(id.world as i32),
            pid: 4242,
            comm: "python3".into(),
            cgroup_id: 10_000 + id.rank as u64,
            window_start_us: TimestampUs(id.window_start_us),
            window_us: 1_000_000,
        };
        if first {
            self.meta.append(&common, &process_meta()).expect("simulated row fits the schema");
        }
        if let Some(h) = &r.hung {
            crate::hang::append(&mut self.sched, &mut self.progress, &common, h);
            return;
        }
        let (s, calls) = (r.steps, &mut self.calls);
        call_row(calls, &common, "cudart", "cudaLaunchKernel", s * KERNELS_PER_STEP, 0.0, rng);
        call_row(calls, &common, "cudart", "cudaMemcpyAsync", s * 4.0, 0.2, rng);
        call_row(calls, &common, "cudart", "cudaMemcpy", s, r.copy_ms, rng);
        call_row(calls, &common, "cudart", "cudaStreamSynchronize", s, r.sync_ms.max(0.01), rng);
        call_row(calls, &common, "nccl", "ncclAllReduce", s, 0.02, rng);
        let sched = sched_row(r);
        self.sched.append(&common, &sched).expect("simulated row fits the schema");
        cgroups(&mut self.cgroups, id, r, &common, &sched);
        io(&mut self.io, r, &common);
        mem_events(&mut self.host, id, r, &common);
        self.progress.append(&common, &progress_row(r)).expect("simulated row fits the schema");
    }

    /// One batch per table that has rows.
    pub fn finish(self) -> Tables {
        [self.calls, self.sched, self.cgroups, self.io, self.host, self.meta, self.progress]
            .into_iter()
            .filter(|b| !b.is_empty())
            .map(|mut b| (b.table(), b.finish().expect("valid")))
            .collect()
    }
}

/// The steps the rank's agent found (every return of the end-of-step sync
/// ends one) and what it is inside at the window's end: between calls, its
/// last sync a moment ago.
fn progress_row(r: &RankWindow) -> ProgressRow<'static> {
    let step_ns = (r.step_ms * 1e6) as u64;
    ProgressRow {
        threads_in_call: 0,
        oldest_library: None,
        oldest_op: None,
        oldest_tid: None,
        oldest_age_ns: None,
        last_call_age_ns: Some(1_000_000),
        proc_state: Some("S"),
        steps: Some(r.steps.round() as u32),
        step_p50_ns: Some(step_ns),
        // Steps within one window vary a little around the job's pace.
        step_max_ns: Some(step_ns + step_ns / 20),
        step_op: Some(crate::hang::STEP_OP),
    }
}

/// Run-queue, host-blocked and in-call waiting time per step become the
/// window's scheduler time (one thread: the rest of the second on CPU).
fn sched_row(r: &RankWindow) -> SchedRow {
    let s = r.steps;
    let runq = (s * r.runq_ms * 1e6).min(0.9e9);
    let in_call = (s * (r.copy_ms + r.sync_ms) * 1e6).min(1e9 - runq);
    let host = (40e6 + s * r.blocked_ms * 1e6).min(1e9 - runq - in_call);
    let on = 1e9 - runq - in_call - host;
    SchedRow {
        threads: 1,
        on_cpu_ns: on as u64,
        off_cpu_ns: (host + in_call) as u64,
        runq_wait_ns: runq as u64,
        runq_max_ns: (r.runq_ms * 1e6) as u64,
        voluntary_switches: (s * 3.0) as u64,
        involuntary_switches: (s * (1.0 + r.runq_ms / 10.0)) as u64,
        wakeups: (s * 3.0) as u64,
        off_cpu_in_call_ns: Some(in_call as u64),
        runq_wait_in_call_ns: Some(0),
    }
}

/// The rank's pod cgroup, and a CPU hog beside it when a noisy neighbour is injected.
fn cgroups(cg: &mut BatchBuilder, id: &RankId<'_>, r: &RankWindow, common: &Common, sched: &SchedRow) {
    let pod_cg = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice", id.rank);
    let row = CgroupRow {
        cgroup_path: &pod_cg,
        on_cpu_ns: sched.on_cpu_ns,
        runq_wait_ns: sched.runq_wait_ns,
        switches: (r.steps * 4.0) as u64,
    };
    cg.append(common, &row).expect("simulated row fits the schema");
    if r.noisy_neighbour {
        let hog = Common {
            namespace: Some("batch".into()),
            pod: Some("video-transcode-7f9c".into()),
            container: Some("ffmpeg".into()),
            job: None,
            rank: None,
            world_size: None,
            pid: 9911,
            comm: "ffmpeg".into(),
            cgroup_id: 77_777,
            ..common.clone()
        };
        let row = CgroupRow {
            cgroup_path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podhog.slice",
            on_cpu_ns: 1_800_000_000,
            runq_wait_ns: 50_000_000,
            switches: 900,
        };
        cg.append(&hog, &row).expect("simulated row fits the schema");
    }
}

fn io(b: &mut BatchBuilder, r: &RankWindow, common: &Common) {
    let io_count = r.io_count.round() as u64;
    let mut h = Histogram::default();
    h.add(ingero_model::hist::bucket((r.io_ms * 1e6) as u64), io_count);
    let (bk, ct) = h.sparse();
    let row = IoRow {
        device: "259:0",
        op: "read",
        count: io_count,
        bytes: io_count * 131_072,
        total_ns: (r.io_ms * 1e6) as u64 * io_count,
        max_ns: (r.io_ms * 1.5e6) as u64,
        hist_bucket: &bk,
        hist_count: &ct,
    };
    b.append(common, &row).expect("simulated row fits the schema");
}

fn mem_events(ev: &mut BatchBuilder, id: &RankId<'_>, r: &RankWindow, common: &Common) {
    for k in 0..r.mem_events {
        let row = HostEventRow {
            event_time: TimestampUs(id.window_start_us + k as i64 * 300_000),
            kind: "mem_pressure",
            value: 512 << 20,
            detail: Some("memory.high reclaim"),
        };
        ev.append(common, &row).expect("simulated row fits the schema");
    }
}

fn process_meta() -> ProcessMetaRow<'static> {
    ProcessMetaRow {
        cmdline: "python3 train.py --model llama-7b",
        container_id: Some("4f1c0d2e9a7b"),
        pod_uid: None,
        cgroup_path: "/kubepods.slice/kubepods-burstable.slice",
        local_rank: Some(0),
        master_addr: Some("10.0.0.1:29500"),
        nccl_comm_id: None,
        gpus: Some("0"),
        libraries: "/usr/lib/x86_64-linux-gnu/libcudart.so.12",
        labels: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Injection;
    use std::time::Duration;

    #[test]
    fn the_straggler_waits_least_in_its_sync() {
        let faults = vec![Injection::parse("cpu@1:0s", 4).unwrap()];
        let mut rng = Rng::new(1);
        let w = step_job(&[0, 1, 2, 3], Duration::from_secs(1), &faults, 0.03, &mut rng);
        assert!(w[1].sync_ms < w[0].sync_ms * 0.6, "{w:?}");
        assert!(w.iter().all(|r| (r.steps - w[0].steps).abs() < 1e-9), "ranks step in lockstep");
        let tables =
            rows(&RankId { node: "node-1", job: "j", rank: 1, world: 4, window_start_us: 0 }, &w[1], true, &mut rng);
        assert!(
            tables.iter().any(|(t, b)| *t == Table::CgroupWindows && b.num_rows() == 2),
            "noisy neighbour cgroup row"
        );
    }

    #[test]
    fn signals_are_what_the_aggregator_derives_from_the_rows() {
        use crate::faults::{FaultKind, Target};
        let faults: Vec<Injection> = [FaultKind::Cpu, FaultKind::Gpu, FaultKind::Io, FaultKind::Mem, FaultKind::Net]
            .iter()
            .enumerate()
            .map(|(i, k)| Injection { kind: *k, target: Target::Node(i), at: Duration::ZERO, duration: None })
            .collect();
        let mut rng = Rng::new(7);
        for w in 0..20 {
            let ranks: Vec<usize> = (0..8).collect();
            for (rank, r) in step_job(&ranks, Duration::from_secs(w), &faults, 0.05, &mut rng).iter().enumerate() {
                let id = RankId { node: "n", job: "j", rank, world: 8, window_start_us: 0 };
                let tables: Vec<(Table, Vec<arrow::array::RecordBatch>)> =
                    rows(&id, r, false, &mut rng).into_iter().map(|(t, b)| (t, vec![b])).collect();
                let mut from_rows = ingero_model::signals::of_tables(&tables);
                assert_eq!(from_rows.len(), 1);
                let procs = std::mem::take(&mut from_rows[0].1.procs);
                assert_eq!(signals(r), from_rows[0].1, "rank {rank} window {w}: {r:?}");
                // The agent found the job's steps: its pace, on every rank.
                assert_eq!(procs.len(), 1, "{procs:?}");
                assert_eq!(procs[0].steps, Some((1000.0 / r.step_ms).round() as u32), "{r:?}");
                assert_eq!(procs[0].step_p50_ns, Some((r.step_ms * 1e6) as u64), "{r:?}");
            }
        }
    }

    /// Before the hang the job steps; during it no call returns, every rank
    /// ships what it is inside, and only the culprit is not in the
    /// all-reduce; after it the job steps again.
    #[test]
    fn a_hung_job_ships_what_each_rank_is_inside_and_no_calls() {
        let faults = vec![Injection::parse("hang@2:10s+30s", 4).unwrap()];
        let mut rng = Rng::new(3);
        let ranks = [0, 2];
        for (t, hung) in [(9, false), (10, true), (39, true), (40, false)] {
            let w = step_job(&ranks, Duration::from_secs(t), &faults, 0.05, &mut rng);
            for (i, r) in w.iter().enumerate() {
                assert_eq!(r.hung.is_some(), hung, "t={t}: {r:?}");
                let node = format!("node-{}", ranks[i]);
                let id = RankId { node: &node, job: "j", rank: i, world: 2, window_start_us: t as i64 * 1_000_000 };
                let tables = rows(&id, r, false, &mut rng);
                let has = |table| tables.iter().any(|(tb, _)| *tb == table);
                assert_eq!((has(Table::CallWindows), has(Table::ProgressWindows)), (!hung, true), "t={t}");
                if !hung {
                    continue;
                }
                let tables: Vec<_> = tables.into_iter().map(|(t, b)| (t, vec![b])).collect();
                let s = &ingero_model::signals::of_tables(&tables)[0].1;
                let p = &s.procs[0];
                let waited = (t - 10 + 1) as f64 * 1e9;
                assert_eq!(p.waits_in("ncclAllReduce", waited), ranks[i] != 2, "t={t} {p:?}");
                assert_eq!(p.last_call_age_ns, Some(waited as u64), "{p:?}");
                assert!(s.measured && s.wait_ns == 0.0, "{s:?}");
            }
        }
    }
}
