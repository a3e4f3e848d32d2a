// SPDX-License-Identifier: Apache-2.0
//! Kernel aggregates of one window → Arrow batches in the shared schema.

use std::collections::HashMap;

use ingero_model::hist::Histogram;
use ingero_model::rows::{BatchBuilder, Row, TimestampUs};
use ingero_model::tables::{
    CallRow, CgroupRow, Common, HostEventRow, IoRow, NodeRow, ProcessMetaRow, ProgressRow, SchedRow, StackRow, StallRow,
};
use ingero_model::{Table, Tables};

use crate::attribution::{Attributor, ProcInfo};
use crate::probes::abi::{
    Counters, HIST_BUCKETS, OFFCPU_FEEDS, OP_OFFCPU, PROC_EXEC, PROC_EXIT, PROC_FORK, PROC_OOM, ProcEvent,
};
use crate::probes::drain::Drained;
use crate::probes::ops;
use crate::progress::Progress;
use crate::stacks::{Stack, Stall};

/// Identity of this node and the window being built.
pub(crate) struct WindowCtx<'a> {
    pub node: &'a str,
    pub window_start_us: i64,
    pub window_us: u64,
    /// Converts kernel monotonic ns to wall-clock µs.
    pub mono_to_wall_us: i64,
    pub counters_delta: Counters,
    pub spool_dropped: u64,
    pub probe_run_ns: u64,
    pub host: &'a crate::host::HostFacts,
    /// Scoped by --cgroup-root: cgroups outside the subtree are another
    /// "node's" and are left out of cgroup_windows.
    pub cgroup_scoped: bool,
    /// Per process sampled, the share of its duty-cycled calls seen: their
    /// counts are estimates (`crate::sampling`). Empty: every call seen.
    pub sample_shares: &'a HashMap<u32, f64>,
}

fn common(ctx: &WindowCtx<'_>, pid: u32, p: &ProcInfo) -> Common {
    Common {
        node: ctx.node.to_string(),
        namespace: p.pod.as_ref().map(|m| m.namespace.clone()),
        pod: p.pod.as_ref().map(|m| m.name.clone()),
        // Without Kubernetes metadata the container id is the best name we have.
        container: p.container(),
        job: p.job(),
        rank: p.nccl_rank.map(|r| r.0).or(p.env.rank),
        world_size: p.nccl_rank.map(|r| r.1).or(p.env.world_size),
        pid,
        comm: if p.comm.is_empty() { format!("pid-{pid}") } else { p.comm.clone() },
        cgroup_id: p.cgroup_id,
        window_start_us: TimestampUs(ctx.window_start_us),
        window_us: ctx.window_us,
    }
}

fn sparse(hist: &[u32; HIST_BUCKETS]) -> (Vec<u8>, Vec<u64>) {
    let mut h = Histogram::default();
    for (i, &n) in hist.iter().enumerate() {
        if n > 0 {
            h.add(i as u8, n as u64);
        }
    }
    h.sparse()
}

/// The batches of one window, and the rows that could not be built.
#[derive(Debug, Default)]
pub(crate) struct Built {
    pub tables: Tables,
    /// Rows refused by the schema check (a bug, never expected): counted in
    /// `ingero_agent_rows_invalid_total` and logged, not silently dropped.
    pub invalid_rows: u64,
}

/// Builds the tables of one window, one named step per table.
pub(crate) struct WindowBuilder<'a, 'c> {
    ctx: &'a WindowCtx<'c>,
    attr: &'a mut Attributor,
    out: Built,
}

impl<'a, 'c> WindowBuilder<'a, 'c> {
    pub(crate) fn new(ctx: &'a WindowCtx<'c>, attr: &'a mut Attributor) -> Self {
        WindowBuilder { ctx, attr, out: Built::default() }
    }

    /// Every table of the drained window.
    pub(crate) fn build(
        mut self,
        d: &Drained,
        stalls: &[Stall],
        events: &[ProcEvent],
        cgroup_paths: &HashMap<u64, String>,
    ) -> Built {
        self.calls(d);
        self.sched(d);
        self.cgroups(d, cgroup_paths);
        self.io(d);
        self.stalls(stalls);
        self.host_events(events);
        self.node();
        self.out
    }

    /// Appends one row; a refused row is counted, never silently dropped.
    fn add<R: Row>(&mut self, b: &mut BatchBuilder, common: &Common, row: &R) {
        if let Err(e) = b.append(common, row) {
            self.out.invalid_rows += 1;
            tracing::warn!(table = %R::TABLE, error = %e, "row refused by the schema");
        }
    }

    fn finish(&mut self, mut b: BatchBuilder) {
        if b.is_empty() {
            return;
        }
        let n = b.len() as u64;
        match b.finish() {
            Ok(batch) => self.out.tables.push((b.table(), batch)),
            Err(e) => {
                self.out.invalid_rows += n;
                tracing::warn!(table = %b.table(), error = %e, "batch refused");
            }
        }
    }

    fn common(&mut self, pid: u32) -> Common {
        let p = self.attr.get(pid);
        common(self.ctx, pid, p)
    }

    fn calls(&mut self, d: &Drained) {
        let mut b = BatchBuilder::new(Table::CallWindows);
        for (k, v) in &d.calls {
            let Some(op) = ops::by_id(k.op) else { continue };
            let (hist_bucket, hist_count) = sparse(&v.hist);
            let row = CallRow {
                library: op.lib.name(),
                op: op.symbol,
                count: v.count,
                errors: v.errors,
                total_ns: v.total_ns,
                max_ns: v.max_ns,
                sampled: false,
                hist_bucket: &hist_bucket,
                hist_count: &hist_count,
                sample_ratio: self.ctx.sample_shares.get(&k.tgid).copied().filter(|_| op.duty_cycled()),
            };
            let c = self.common(k.tgid);
            self.add(&mut b, &c, &row);
        }
        self.finish(b);
    }

    fn sched(&mut self, d: &Drained) {
        let mut b = BatchBuilder::new(Table::SchedWindows);
        for (tgid, both) in &d.sched {
            // A process that feeds the GPU is its feeding threads: the others
            // (watchdogs, idle pools) sleep by design, and their sleep would
            // read as host stalls. One that never does (a data-loading
            // worker) is all its threads.
            let p = self.attr.get(*tgid);
            p.feeds_gpu |= both.feed.any();
            let v = if p.feeds_gpu { both.feed } else { both.feed.plus(&both.other) };
            let threads = std::fs::read_dir(format!("/proc/{tgid}/task")).map(|d| d.count() as u32).unwrap_or(1);
            let row = SchedRow {
                threads,
                on_cpu_ns: v.on_ns,
                off_cpu_ns: v.off_ns,
                runq_wait_ns: v.runq_ns,
                runq_max_ns: v.runq_max_ns,
                voluntary_switches: v.voluntary,
                involuntary_switches: v.involuntary,
                wakeups: v.wakeups,
                off_cpu_in_call_ns: Some(v.off_call_ns),
                runq_wait_in_call_ns: Some(v.runq_call_ns),
            };
            let c = self.common(*tgid);
            self.add(&mut b, &c, &row);
        }
        self.finish(b);
    }

    fn cgroups(&mut self, d: &Drained, cgroup_paths: &HashMap<u64, String>) {
        let mut b = BatchBuilder::new(Table::CgroupWindows);
        for (id, v) in &d.cgroups {
            let path = match cgroup_paths.get(id) {
                Some(p) => p.as_str(),
                None if self.ctx.cgroup_scoped => continue,
                None => "",
            };
            let c = self.cgroup_common(*id, path);
            let row = CgroupRow { cgroup_path: path, on_cpu_ns: v.on_ns, runq_wait_ns: 0, switches: v.switches };
            self.add(&mut b, &c, &row);
        }
        self.finish(b);
    }

    /// A cgroup's row names its pod and container when the path holds them.
    fn cgroup_common(&mut self, id: u64, path: &str) -> Common {
        let owner = crate::attribution::cgroup::parse(path);
        let pod = self.attr.pod(owner.pod_uid.as_deref());
        Common {
            node: self.ctx.node.to_string(),
            namespace: pod.as_ref().map(|m| m.namespace.clone()),
            pod: pod.as_ref().map(|m| m.name.clone()),
            job: pod.as_ref().map(|m| m.job.clone()),
            container: pod
                .as_ref()
                .and_then(|m| m.container(owner.container_id.as_deref()))
                .map(String::from)
                .or_else(|| owner.container_id.as_ref().map(|c| c[..12].to_string())),
            comm: path.rsplit('/').next().filter(|s| !s.is_empty()).unwrap_or("/").to_string(),
            cgroup_id: id,
            window_start_us: TimestampUs(self.ctx.window_start_us),
            window_us: self.ctx.window_us,
            ..Default::default()
        }
    }

    fn io(&mut self, d: &Drained) {
        let mut b = BatchBuilder::new(Table::IoWindows);
        for (k, v) in &d.io {
            let device = format!("{}:{}", k.dev >> 20, k.dev & 0xfffff);
            let op = match k.op {
                0 => "read",
                1 => "write",
                2 => "flush",
                3 => "discard",
                _ => "other",
            };
            let (hist_bucket, hist_count) = sparse(&v.hist);
            let row = IoRow {
                device: &device,
                op,
                count: v.count,
                bytes: v.bytes,
                total_ns: v.total_ns,
                max_ns: v.max_ns,
                hist_bucket: &hist_bucket,
                hist_count: &hist_count,
            };
            let c = self.common(k.tgid);
            self.add(&mut b, &c, &row);
        }
        self.finish(b);
    }

    fn stalls(&mut self, stalls: &[Stall]) {
        let mut b = BatchBuilder::new(Table::StallEvents);
        let mut stacks: Vec<(u32, &Stack)> = Vec::new();
        for Stall { event: e, stack, thread } in stalls {
            // An off-CPU episode outside calls: the syscall it slept in.
            let (library, op, reason, feeds_gpu) = if e.op == OP_OFFCPU {
                ("kernel", crate::syscalls::episode(e.reason), "off_cpu", Some(e.reason & OFFCPU_FEEDS != 0))
            } else {
                let Some(op) = ops::by_id(e.op) else { continue };
                (op.lib.name(), op.symbol.into(), "threshold", None)
            };
            let row = StallRow {
                event_time: TimestampUs((e.ts_ns / 1000) as i64 + self.ctx.mono_to_wall_us),
                tid: e.tid,
                library,
                op: &op,
                duration_ns: e.duration_ns,
                threshold_ns: e.threshold_ns,
                reason,
                stack_id: stack.as_ref().map(|s| s.id),
                feeds_gpu,
                thread_name: thread.as_deref(),
            };
            let c = self.common(e.tgid);
            self.add(&mut b, &c, &row);
            if let Some(s) = stack.as_deref().filter(|s| !stacks.iter().any(|(_, x)| x.id == s.id)) {
                stacks.push((e.tgid, s));
            }
        }
        self.finish(b);
        self.stacks(&stacks);
    }

    /// Each stack the window's rows name, once, one row per frame.
    fn stacks(&mut self, stacks: &[(u32, &Stack)]) {
        let mut b = BatchBuilder::new(Table::Stacks);
        for (pid, s) in stacks {
            let c = self.common(*pid);
            for (depth, f) in s.frames.iter().enumerate() {
                let row = StackRow {
                    stack_id: s.id,
                    depth: depth as u32,
                    kind: f.kind.name(),
                    file: &f.file,
                    function: &f.function,
                    line: f.line,
                    offset: f.offset,
                };
                self.add(&mut b, &c, &row);
            }
        }
        self.finish(b);
    }

    fn host_events(&mut self, events: &[ProcEvent]) {
        let mut b = BatchBuilder::new(Table::HostEvents);
        for e in events {
            let kind = match e.kind {
                PROC_EXEC => "exec",
                PROC_EXIT => "exit",
                PROC_FORK => "fork",
                PROC_OOM => "oom_kill",
                _ => continue,
            };
            let comm = String::from_utf8_lossy(&e.comm).trim_end_matches('\0').to_string();
            let mut c = self.common(e.tgid);
            if c.comm.starts_with("pid-") {
                c.comm = comm.clone();
            }
            let value = match e.kind {
                PROC_FORK => e.other as i64,
                PROC_EXIT => exit_status(e.value),
                _ => e.value as i64,
            };
            let event_time = TimestampUs((e.ts_ns / 1000) as i64 + self.ctx.mono_to_wall_us);
            self.add(&mut b, &c, &HostEventRow { event_time, kind, value, detail: Some(&comm) });
        }
        self.finish(b);
    }

    /// The agent's own health and the host's facts.
    fn node(&mut self) {
        let mut b = BatchBuilder::new(Table::NodeWindows);
        let me = Common {
            node: self.ctx.node.to_string(),
            pid: std::process::id(),
            comm: "ingero-agent".into(),
            window_start_us: TimestampUs(self.ctx.window_start_us),
            window_us: self.ctx.window_us,
            ..Default::default()
        };
        let (h, c) = (self.ctx.host, &self.ctx.counters_delta);
        let row = NodeRow {
            events: c.events,
            ringbuf_drops: c.ringbuf_drops,
            map_full: c.map_full + c.inflight_full,
            spool_dropped: self.ctx.spool_dropped,
            probe_run_ns: self.ctx.probe_run_ns,
            kernel: h.kernel.as_deref(),
            cpu_model: h.cpu_model.as_deref(),
            cpu_cores: h.cpu_cores,
            gpu_model: h.gpu_model.as_deref(),
            driver_version: h.driver_version.as_deref(),
            cuda_version: None,
            gpu_count: h.gpu_count,
        };
        self.add(&mut b, &me, &row);
        self.finish(b);
    }

    /// Process metadata rows for processes seen for the first time or changed.
    pub(crate) fn process_meta(mut self, pids: &[u32]) -> Built {
        let mut b = BatchBuilder::new(Table::ProcessMeta);
        for &pid in pids {
            let c = self.common(pid);
            let p = self.attr.get(pid).clone();
            let libraries = p.libraries.join(",");
            let row = ProcessMetaRow {
                cmdline: &p.cmdline,
                container_id: p.owner.container_id.as_deref(),
                pod_uid: p.owner.pod_uid.as_deref(),
                cgroup_path: &p.cgroup_path,
                local_rank: p.env.local_rank,
                master_addr: p.env.master.as_deref(),
                nccl_comm_id: p.nccl_comm.as_deref(),
                gpus: p.gpus.as_deref(),
                libraries: &libraries,
                labels: p.pod.as_ref().map(|m| m.labels_json.as_str()),
            };
            self.add(&mut b, &c, &row);
        }
        self.finish(b);
        self.out
    }

    /// `progress_windows`: what each CUDA process is inside at the end of the window.
    pub(crate) fn progress(mut self, rows: &[Progress]) -> Built {
        let mut b = BatchBuilder::new(Table::ProgressWindows);
        for p in rows {
            let c = self.common(p.pid);
            let state = p.state.map(String::from);
            let row = ProgressRow {
                threads_in_call: p.threads_in_call,
                oldest_library: p.oldest.map(|(op, _, _)| op.lib.name()),
                oldest_op: p.oldest.map(|(op, _, _)| op.symbol),
                oldest_tid: p.oldest.map(|(_, tid, _)| tid),
                oldest_age_ns: p.oldest.map(|(_, _, age)| age),
                last_call_age_ns: p.last_call_age_ns,
                proc_state: state.as_deref(),
                steps: p.steps.as_ref().map(|s| s.steps),
                step_p50_ns: p.steps.as_ref().and_then(|s| s.p50_ns),
                step_max_ns: p.steps.as_ref().and_then(|s| s.max_ns),
                step_op: p.steps.as_ref().and_then(|s| ops::by_id(u32::from(s.op))).map(|op| op.symbol),
            };
            self.add(&mut b, &c, &row);
        }
        self.finish(b);
        self.out
    }
}

/// The kernel's exit_code, `(status << 8) | signal`, as Kubernetes and
/// shells report it: the status, or 128 + the signal that killed it
/// (137 for SIGKILL, 134 for SIGABRT).
fn exit_status(code: i32) -> i64 {
    match code & 0x7f {
        0 => ((code >> 8) & 0xff) as i64,
        sig => 128 + sig as i64,
    }
}

#[cfg(test)]
mod exit_tests {
    #[test]
    fn exit_status_keeps_the_signal() {
        assert_eq!(super::exit_status(3 << 8), 3);
        assert_eq!(super::exit_status(9), 137);
        assert_eq!(super::exit_status(6 | 0x80), 134, "SIGABRT with a core dump");
        assert_eq!(super::exit_status(0), 0);
    }
}
