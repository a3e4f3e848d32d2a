//! Kernel aggregates of one window → Arrow batches in the shared schema.

use std::collections::HashMap;

use arrow::array::RecordBatch;
use ingero_proto::hist::Histogram;
use ingero_proto::rows::{BatchBuilder, Common, Val};
use ingero_proto::Table;

use crate::attribution::{Attributor, ProcInfo};
use crate::probes::abi::{Counters, ProcEvent, StallEvent, HIST_BUCKETS, PROC_EXEC, PROC_EXIT, PROC_FORK, PROC_OOM};
use crate::probes::drain::Drained;
use crate::probes::ops;

/// Identity of this node and the window being built.
pub struct WindowCtx<'a> {
    pub node: &'a str,
    pub window_start_us: i64,
    pub window_us: u64,
    /// Converts kernel monotonic ns to wall-clock µs.
    pub mono_to_wall_us: i64,
    pub counters_delta: Counters,
    pub spool_dropped: u64,
    pub probe_run_ns: u64,
    pub host: &'a HostFacts,
    /// Scoped by --cgroup-root: cgroups outside the subtree are another
    /// "node's" and are left out of cgroup_windows.
    pub cgroup_scoped: bool,
}

#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    pub kernel: Option<String>,
    pub cpu_model: Option<String>,
    pub cpu_cores: Option<u32>,
}

impl HostFacts {
    pub fn read() -> HostFacts {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string());
        let cpu_cores = std::thread::available_parallelism().ok().map(|n| n.get() as u32);
        HostFacts { kernel, cpu_model, cpu_cores }
    }
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
        window_start_us: ctx.window_start_us,
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

/// Builds every table for the window. Rows that cannot be built are counted,
/// never silently dropped.
pub fn build(
    ctx: &WindowCtx<'_>,
    d: &Drained,
    stalls: &[StallEvent],
    events: &[ProcEvent],
    attr: &mut Attributor,
    cgroup_paths: &HashMap<u64, String>,
) -> Vec<(Table, RecordBatch)> {
    let mut calls = BatchBuilder::new(Table::CallWindows);
    for (k, v) in &d.calls {
        let Some(op) = ops::by_id(k.op) else { continue };
        let p = attr.get(k.tgid).clone();
        let (b, c) = sparse(&v.hist);
        let row = [
            Val::Str(op.lib.name()),
            Val::Str(op.symbol),
            Val::U(v.count),
            Val::U(v.errors),
            Val::U(v.total_ns),
            Val::U(v.max_ns),
            Val::Bool(false),
            Val::U8s(&b),
            Val::U64s(&c),
        ];
        let _ = calls.push(&common(ctx, k.tgid, &p), &row);
    }
    let mut sched = BatchBuilder::new(Table::SchedWindows);
    for (tgid, v) in &d.sched {
        let p = attr.get(*tgid).clone();
        let threads = std::fs::read_dir(format!("/proc/{tgid}/task")).map(|d| d.count() as u64).unwrap_or(1);
        let row = [
            Val::U(threads),
            Val::U(v.on_ns),
            Val::U(v.off_ns),
            Val::U(v.runq_ns),
            Val::U(v.runq_max_ns),
            Val::U(v.voluntary),
            Val::U(v.involuntary),
            Val::U(v.wakeups),
        ];
        let _ = sched.push(&common(ctx, *tgid, &p), &row);
    }
    let mut cg = BatchBuilder::new(Table::CgroupWindows);
    for (id, v) in &d.cgroups {
        let path = match cgroup_paths.get(id) {
            Some(p) => p.clone(),
            None if ctx.cgroup_scoped => continue,
            None => String::new(),
        };
        let owner = crate::attribution::cgroup::parse(&path);
        let pod = attr.pod(owner.pod_uid.as_deref());
        let c = Common {
            node: ctx.node.to_string(),
            namespace: pod.as_ref().map(|m| m.namespace.clone()),
            pod: pod.as_ref().map(|m| m.name.clone()),
            job: pod.as_ref().map(|m| m.job.clone()),
            container: pod
                .as_ref()
                .and_then(|m| m.container(owner.container_id.as_deref()))
                .map(String::from)
                .or_else(|| owner.container_id.as_ref().map(|c| c[..12].to_string())),
            comm: path.rsplit('/').next().filter(|s| !s.is_empty()).unwrap_or("/").to_string(),
            cgroup_id: *id,
            window_start_us: ctx.window_start_us,
            window_us: ctx.window_us,
            ..Default::default()
        };
        let _ = cg.push(&c, &[Val::Str(&path), Val::U(v.on_ns), Val::U(0), Val::U(v.switches)]);
    }
    let mut io = BatchBuilder::new(Table::IoWindows);
    for (k, v) in &d.io {
        let p = attr.get(k.tgid).clone();
        let dev = format!("{}:{}", k.dev >> 20, k.dev & 0xfffff);
        let op = match k.op {
            0 => "read",
            1 => "write",
            2 => "flush",
            3 => "discard",
            _ => "other",
        };
        let (b, c) = sparse(&v.hist);
        let row = [
            Val::Str(&dev),
            Val::Str(op),
            Val::U(v.count),
            Val::U(v.bytes),
            Val::U(v.total_ns),
            Val::U(v.max_ns),
            Val::U8s(&b),
            Val::U64s(&c),
        ];
        let _ = io.push(&common(ctx, k.tgid, &p), &row);
    }
    let mut st = BatchBuilder::new(Table::StallEvents);
    for e in stalls {
        let Some(op) = ops::by_id(e.op) else { continue };
        let p = attr.get(e.tgid).clone();
        let t = (e.ts_ns / 1000) as i64 + ctx.mono_to_wall_us;
        let row = [
            Val::Ts(t),
            Val::U(e.tid as u64),
            Val::Str(op.lib.name()),
            Val::Str(op.symbol),
            Val::U(e.duration_ns),
            Val::U(e.threshold_ns),
            Val::Str("threshold"),
        ];
        let _ = st.push(&common(ctx, e.tgid, &p), &row);
    }
    let mut ev = BatchBuilder::new(Table::HostEvents);
    for e in events {
        let kind = match e.kind {
            PROC_EXEC => "exec",
            PROC_EXIT => "exit",
            PROC_FORK => "fork",
            PROC_OOM => "oom_kill",
            _ => continue,
        };
        let comm = String::from_utf8_lossy(&e.comm).trim_end_matches('\0').to_string();
        let p = attr.get(e.tgid).clone();
        let mut c = common(ctx, e.tgid, &p);
        if c.comm.starts_with("pid-") {
            c.comm = comm.clone();
        }
        let value = match e.kind {
            PROC_FORK => e.other as i64,
            PROC_EXIT => exit_status(e.value),
            _ => e.value as i64,
        };
        let t = (e.ts_ns / 1000) as i64 + ctx.mono_to_wall_us;
        let _ = ev.push(&c, &[Val::Ts(t), Val::Str(kind), Val::I(value), Val::Str(&comm)]);
    }
    let mut node = BatchBuilder::new(Table::NodeWindows);
    let me = Common {
        node: ctx.node.to_string(),
        pid: std::process::id(),
        comm: "ingero-agent".into(),
        window_start_us: ctx.window_start_us,
        window_us: ctx.window_us,
        ..Default::default()
    };
    let h = ctx.host;
    let c = &ctx.counters_delta;
    let _ = node.push(
        &me,
        &[
            Val::U(c.events),
            Val::U(c.ringbuf_drops),
            Val::U(c.map_full + c.inflight_full),
            Val::U(ctx.spool_dropped),
            Val::U(ctx.probe_run_ns),
            h.kernel.as_deref().into(),
            h.cpu_model.as_deref().into(),
            h.cpu_cores.map_or(Val::Null, |n| Val::U(n as u64)),
            Val::Null,
            Val::Null,
            Val::Null,
        ],
    );
    let mut out = Vec::new();
    for mut b in [calls, sched, cg, io, st, ev, node] {
        if !b.is_empty() {
            let t = b.table();
            if let Ok(batch) = b.finish() {
                out.push((t, batch));
            }
        }
    }
    out
}

/// Process metadata rows for processes seen for the first time or changed.
pub fn process_meta(ctx: &WindowCtx<'_>, pids: &[u32], attr: &mut Attributor) -> Option<(Table, RecordBatch)> {
    let mut b = BatchBuilder::new(Table::ProcessMeta);
    for &pid in pids {
        let p = attr.get(pid).clone();
        let libs = p.libraries.join(",");
        let row = [
            Val::Str(&p.cmdline),
            p.owner.container_id.as_deref().into(),
            p.owner.pod_uid.as_deref().into(),
            Val::Str(&p.cgroup_path),
            p.env.local_rank.map_or(Val::Null, |r| Val::I(r as i64)),
            p.env.master.as_deref().into(),
            p.nccl_comm.as_deref().into(),
            p.gpus.as_deref().into(),
            Val::Str(&libs),
            p.pod.as_ref().map(|m| m.labels_json.as_str()).into(),
        ];
        let _ = b.push(&common(ctx, pid, &p), &row);
    }
    (!b.is_empty()).then(|| Some((Table::ProcessMeta, b.finish().ok()?))).flatten()
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
