// SPDX-License-Identifier: Apache-2.0
//! Raw events + minute aggregates of a reference trace → our window tables.
//!
//! The source stores every event of its first seconds and a sample after
//! that; its minute aggregates count everything it saw after start-up, and
//! `count − stored` is what it discarded (schema_info says so). Totals are
//! therefore: stored raw events + discarded counts. Discarded calls are spread
//! evenly over the traced seconds of their minute, and those rows say
//! `sampled = true`: count and total are exact, the histogram is the sample's.

use std::collections::{BTreeMap, HashMap, HashSet};

use arrow::array::RecordBatch;
use ingero_model::hist::{Histogram, bucket};
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::tables::{CallRow, Common, HostEventRow, IoRow, NodeRow, ProcessMetaRow, SchedRow, StallRow};
use ingero_model::{Table, Tables};

use super::source::{CUDA, DRIVER, Event, HOST, IO, Part, Trace};
use crate::error::Result;

const MINUTE_NS: i64 = 60_000_000_000;

/// The source writes '' for unknown text fields.
fn nonempty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

#[derive(Debug, Default, Clone)]
struct Calls {
    count: u64,
    errors: u64,
    total_ns: u64,
    max_ns: u64,
    sampled: bool,
    hist: Histogram,
}

#[derive(Debug, Default, Clone)]
struct Sched {
    off_ns: u64,
    switches: u64,
    wakeups: u64,
}

#[derive(Debug, Default, Clone)]
struct Io {
    count: u64,
    bytes: u64,
    total_ns: u64,
    max_ns: u64,
}

/// What an import produced, for the summary line and the tests.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FoldStats {
    pub events: u64,
    pub windows: usize,
    /// Calls per op (source names), stored + discarded.
    pub calls: BTreeMap<String, u64>,
    pub discarded_calls: u64,
    pub skipped: BTreeMap<String, u64>,
    /// Time of the first and last event (ns; 0 without events).
    pub first_ns: i64,
    pub last_ns: i64,
    /// Annotations imported, and rows left out as malformed.
    pub annotations: usize,
    pub bad_annotations: u64,
}

#[derive(Debug)]
pub(crate) struct Folder<'a> {
    trace: &'a Trace,
    part: &'a Part,
    node: String,
    job: Option<String>,
    window_ns: i64,
    span: (i64, i64),
    calls: HashMap<(i64, u32, i64, i64), Calls>,
    raw_minute: HashMap<(i64, u32, i64, i64), (u64, u64)>,
    sched: HashMap<(i64, u32), Sched>,
    threads: HashMap<u32, HashSet<u32>>,
    io: HashMap<(i64, u32, i64), Io>,
    host: Vec<(i64, u32, &'static str, i64, String)>,
    slow: Vec<Event>,
    cgroups: HashMap<u32, HashMap<u64, u64>>,
    /// pid → (rank, world size) the recorder knew (0.9+).
    ranks: HashMap<u32, (Option<i32>, Option<i32>)>,
    /// Driver calls inside runtime calls: left out, as the agent leaves them.
    nesting: super::nesting::Nesting,
    /// The whole set's nesting shares, for a file of a rolled-over set.
    set_nesting: Option<super::nesting::Shares>,
    pub stats: FoldStats,
}

/// Our name for a source op (the agent's symbol names).
pub(crate) fn op_name(trace: &Trace, source: i64, op: i64) -> String {
    let n = trace.ops.get(&(source, op)).cloned().unwrap_or_else(|| format!("op{source}.{op}"));
    match n.as_str() {
        "cudaStreamSync" => "cudaStreamSynchronize".into(),
        "cudaDeviceSync" => "cudaDeviceSynchronize".into(),
        _ => n,
    }
}

impl<'a> Folder<'a> {
    pub(crate) fn new(trace: &'a Trace, part: &'a Part, node: &str, job: Option<String>, window_ns: i64) -> Folder<'a> {
        let span = part.session.as_ref().map_or((i64::MAX, i64::MIN), |s| (s.started_ns, s.stopped_ns));
        Folder {
            trace,
            part,
            node: node.into(),
            job,
            window_ns,
            span,
            calls: HashMap::new(),
            raw_minute: HashMap::new(),
            sched: HashMap::new(),
            threads: HashMap::new(),
            io: HashMap::new(),
            host: Vec::new(),
            slow: Vec::new(),
            cgroups: HashMap::new(),
            ranks: HashMap::new(),
            nesting: Default::default(),
            set_nesting: None,
            stats: FoldStats::default(),
        }
    }

    /// Threads known from the rest of a rolled-over set: a process's thread
    /// count (and so its thread time) is the whole trace's, as one file's.
    pub(crate) fn seed_threads(&mut self, threads: &HashMap<u32, HashSet<u32>>) {
        for (pid, tids) in threads {
            self.threads.entry(*pid).or_default().extend(tids);
        }
    }

    fn win(&self, ts: i64) -> i64 {
        ts.div_euclid(self.window_ns) * self.window_ns
    }

    pub(crate) fn event(&mut self, e: Event) {
        self.stats.events += 1;
        if self.stats.events == 1 {
            self.stats.first_ns = e.ts_ns;
        }
        self.stats.last_ns = e.ts_ns;
        self.span = (self.span.0.min(e.ts_ns), self.span.1.max(e.ts_ns));
        if e.pid == 0 {
            return;
        }
        *self.cgroups.entry(e.pid).or_default().entry(e.cgroup_id).or_default() += 1;
        self.threads.entry(e.pid).or_default().insert(e.tid);
        if e.rank.is_some() || e.world_size.is_some() {
            self.ranks.insert(e.pid, (e.rank, e.world_size));
        }
        let w = self.win(e.ts_ns);
        let minute = e.ts_ns.div_euclid(MINUTE_NS) * MINUTE_NS;
        let m = self.raw_minute.entry((minute, e.pid, e.source, e.op)).or_default();
        m.0 += 1;
        m.1 += e.dur_ns;
        match (e.source, e.op) {
            // Not counted again; an outlier among them stays an event, drawn
            // inside its runtime call on a timeline.
            (CUDA | DRIVER, _) if self.nesting.nested(&e) => {
                if e.dur_ns >= 1_000_000 {
                    self.slow.push(e);
                }
            }
            (CUDA | DRIVER, _) => {
                let c = self.calls.entry((w, e.pid, e.source, e.op)).or_default();
                c.count += 1;
                c.errors += (e.ret != 0) as u64;
                c.total_ns += e.dur_ns;
                c.max_ns = c.max_ns.max(e.dur_ns);
                c.hist.add(bucket(e.dur_ns), 1);
                if e.dur_ns >= 1_000_000 {
                    self.slow.push(e);
                }
            }
            (HOST, 1) => {
                // Off-CPU time ends at the switch back in: spread it over the
                // windows it covers so no window holds more than it lasted.
                let (mut from, to) = (e.ts_ns - e.dur_ns as i64, e.ts_ns);
                self.sched.entry((w, e.pid)).or_default().switches += 1;
                while from < to {
                    let ws = self.win(from);
                    let end = (ws + self.window_ns).min(to);
                    self.sched.entry((ws, e.pid)).or_default().off_ns += (end - from) as u64;
                    from = end;
                }
            }
            (HOST, 2) => self.sched.entry((w, e.pid)).or_default().wakeups += 1,
            (HOST, 4) => self.host.push((e.ts_ns, e.pid, "oom_kill", e.arg0, String::new())),
            (HOST, 5) => self.host.push((e.ts_ns, e.pid, "exec", 0, String::new())),
            (HOST, 6) => self.host.push((e.ts_ns, e.pid, "exit", e.ret, String::new())),
            // The Go recorder puts the child's pid in arg1.
            (HOST, 7) => self.host.push((e.ts_ns, e.pid, "fork", e.arg1, String::new())),
            (HOST, 12) => self.host.push((e.ts_ns, e.pid, "oom_kill", e.arg0, "pod OOM kill".into())),
            (IO, op) => {
                let i = self.io.entry((w, e.pid, op)).or_default();
                i.count += 1;
                i.bytes += e.arg0.max(0) as u64;
                i.total_ns += e.dur_ns;
                i.max_ns = i.max_ns.max(e.dur_ns);
            }
            _ => *self.stats.skipped.entry(op_name(self.trace, e.source, e.op)).or_default() += 1,
        }
    }

    /// The nesting shares of the whole rolled-over set this file is part of.
    pub(crate) fn seed_nesting(&mut self, shares: &super::nesting::Shares) {
        self.set_nesting = Some(shares.clone());
    }

    /// Adds what the source counted but did not store.
    fn discarded(&mut self) {
        let aggs = self.part.aggregates.clone();
        for a in aggs.iter().filter(|a| a.pid != 0) {
            let (raw_n, raw_sum) =
                self.raw_minute.get(&(a.bucket_ns, a.pid, a.source, a.op)).copied().unwrap_or((0, 0));
            // Stored events missing from the file (pruned) count as discarded.
            let kept = a.stored.min(raw_n);
            let (mut n, mut sum) = (a.count.saturating_sub(kept), 0);
            if n > 0 {
                let kept_sum = if raw_n == 0 { 0 } else { (raw_sum as u128 * kept as u128 / raw_n as u128) as u64 };
                sum = a.sum_ns.saturating_sub(kept_sum);
            }
            if a.source == DRIVER {
                // Discarded driver calls nest as the stored ones did.
                let shares = self.set_nesting.as_ref().unwrap_or(&self.nesting.shares);
                let outer = |x| super::nesting::outer(shares, a.pid, a.op, x);
                (n, sum) = (outer(n), outer(sum));
            }
            if n == 0 {
                continue;
            }
            let lo = a.bucket_ns.max(self.win(self.span.0));
            let hi = (a.bucket_ns + MINUTE_NS).min(self.span.1 + 1);
            let wins: Vec<i64> = if lo < hi {
                (0..).map(|k| self.win(lo) + k * self.window_ns).take_while(|w| *w < hi).collect()
            } else {
                vec![self.win(a.bucket_ns)]
            };
            let k = wins.len() as u64;
            for (i, &w) in wins.iter().enumerate() {
                let share = n / k + ((i as u64) < n % k) as u64;
                let share_sum = (sum as u128 * share as u128 / n as u128) as u64;
                if share == 0 {
                    continue;
                }
                match a.source {
                    CUDA | DRIVER => {
                        let c = self.calls.entry((w, a.pid, a.source, a.op)).or_default();
                        c.count += share;
                        c.total_ns += share_sum;
                        c.sampled = true;
                        // At their mean duration: the recorder keeps slow calls
                        // and samples the rest, so its stored sample alone put a
                        // launch p99 at 11 ms where 29 of 31,980 took over 1 ms.
                        c.hist.add(bucket(share_sum / share), share);
                        c.max_ns = c.max_ns.max(if i == 0 { a.max_ns } else { share_sum / share });
                    }
                    HOST if a.op == 1 => {
                        let s = self.sched.entry((w, a.pid)).or_default();
                        s.switches += share;
                        s.off_ns += share_sum;
                    }
                    HOST if a.op == 2 => self.sched.entry((w, a.pid)).or_default().wakeups += share,
                    IO => {
                        let io = self.io.entry((w, a.pid, a.op)).or_default();
                        io.count += share;
                        io.total_ns += share_sum;
                    }
                    _ => {}
                }
            }
            if matches!(a.source, CUDA | DRIVER) {
                self.stats.discarded_calls += n;
            }
        }
        // Page allocations are only counted per minute; > 1 GiB in a minute
        // is what the source itself treats as memory pressure.
        for a in aggs.iter().filter(|a| a.source == HOST && a.op == 3 && a.sum_arg0 >= 1 << 30) {
            self.host.push((a.bucket_ns, a.pid, "mem_pressure", a.sum_arg0 as i64, "mm_page_alloc".into()));
        }
    }

    fn common(&self, pid: u32, w: i64) -> Common {
        let cg = self.cgroups.get(&pid).and_then(|m| m.iter().max_by_key(|(_, n)| **n).map(|(id, _)| *id));
        let meta = cg.and_then(|id| self.trace.cgroups.get(&id));
        Common {
            node: self.node.clone(),
            namespace: meta.and_then(|m| nonempty(&m.namespace)),
            pod: meta.and_then(|m| nonempty(&m.pod)),
            container: meta.and_then(|m| nonempty(&m.container_id)).map(|c| c[..12.min(c.len())].to_string()),
            job: self.job.clone(),
            rank: self.ranks.get(&pid).and_then(|r| r.0),
            world_size: self.ranks.get(&pid).and_then(|r| r.1),
            pid,
            comm: self.part.names.get(&pid).cloned().unwrap_or_else(|| format!("pid-{pid}")),
            cgroup_id: cg.unwrap_or(0),
            window_start_us: TimestampUs(w / 1000),
            window_us: (self.window_ns / 1000) as u64,
        }
    }

    /// Every table, ready to write.
    pub(crate) fn finish(mut self) -> Result<(Tables, FoldStats)> {
        self.discarded();
        self.stats.annotations = self.part.annotations.len();
        let mut windows: HashSet<i64> = HashSet::new();
        let mut medians: HashMap<(i64, i64), Histogram> = HashMap::new();
        let mut out = vec![
            (Table::CallWindows, self.call_windows(&mut windows, &mut medians)?),
            (Table::SchedWindows, self.sched_windows(&mut windows)?),
            (Table::IoWindows, self.io_windows()?),
            (Table::HostEvents, self.host_events()?),
            (Table::StallEvents, self.stall_events(&medians)?),
            (Table::ProcessMeta, self.process_meta()?),
            (Table::NodeWindows, self.node_windows(windows)?),
        ];
        out.retain(|(_, b)| b.num_rows() > 0);
        Ok((out, self.stats))
    }

    fn call_windows(
        &mut self,
        windows: &mut HashSet<i64>,
        medians: &mut HashMap<(i64, i64), Histogram>,
    ) -> Result<RecordBatch> {
        let mut t = BatchBuilder::new(Table::CallWindows);
        let mut keys: Vec<_> = self.calls.keys().copied().collect();
        keys.sort_unstable();
        for k @ (w, pid, src, op) in keys {
            let c = &self.calls[&k];
            windows.insert(w);
            medians.entry((src, op)).or_default().merge(&c.hist);
            let name = op_name(self.trace, src, op);
            *self.stats.calls.entry(name.clone()).or_default() += c.count;
            let (b, n) = c.hist.sparse();
            let row = CallRow {
                library: if src == CUDA { "cudart" } else { "cuda" },
                op: &name,
                count: c.count,
                errors: c.errors,
                total_ns: c.total_ns,
                max_ns: c.max_ns,
                sampled: c.sampled,
                hist_bucket: &b,
                hist_count: &n,
                sample_ratio: None,
            };
            t.append(&self.common(pid, w), &row)?;
        }
        Ok(t.finish()?)
    }

    fn sched_windows(&self, windows: &mut HashSet<i64>) -> Result<RecordBatch> {
        let mut t = BatchBuilder::new(Table::SchedWindows);
        let mut keys: Vec<_> = self.sched.keys().copied().collect();
        keys.sort_unstable();
        for k @ (w, pid) in keys {
            let s = &self.sched[&k];
            windows.insert(w);
            let threads = self.threads.get(&pid).map_or(1, |t| t.len()).max(1) as u32;
            // The source records only off-CPU time: the rest of each thread's
            // window counts as on-CPU (so shares are of thread time).
            let on = (threads as u64 * self.window_ns as u64).saturating_sub(s.off_ns);
            let row = SchedRow {
                threads,
                on_cpu_ns: on,
                off_cpu_ns: s.off_ns,
                runq_wait_ns: 0,
                runq_max_ns: 0,
                voluntary_switches: s.switches,
                involuntary_switches: 0,
                wakeups: s.wakeups,
                // The source does not say which off-CPU time was inside a call.
                off_cpu_in_call_ns: None,
                runq_wait_in_call_ns: None,
            };
            t.append(&self.common(pid, w), &row)?;
        }
        Ok(t.finish()?)
    }

    fn io_windows(&self) -> Result<RecordBatch> {
        let mut t = BatchBuilder::new(Table::IoWindows);
        for (&(w, pid, op), i) in &self.io {
            let op = match op {
                1 => "read",
                2 => "write",
                3 => "discard",
                _ => "other",
            };
            let row = IoRow {
                device: "unknown",
                op,
                count: i.count,
                bytes: i.bytes,
                total_ns: i.total_ns,
                max_ns: i.max_ns,
                // The source keeps no IO latency distribution.
                hist_bucket: &[],
                hist_count: &[],
            };
            t.append(&self.common(pid, w), &row)?;
        }
        Ok(t.finish()?)
    }

    /// Host events, the job's annotations as `annotation` rows, and the
    /// source's own diagnoses as `reference_chain` rows.
    fn host_events(&self) -> Result<RecordBatch> {
        let mut t = BatchBuilder::new(Table::HostEvents);
        for (ts, pid, kind, value, detail) in &self.host {
            let mut c = self.common(*pid, self.win(*ts));
            if *pid == 0 {
                c.comm = "node".into();
            }
            let row = HostEventRow { event_time: TimestampUs(ts / 1000), kind, value: *value, detail: Some(detail) };
            t.append(&c, &row)?;
        }
        for a in &self.part.annotations {
            let mut c = self.common(a.pid, self.win(a.ts_ns));
            if a.pid == 0 {
                c.comm = "annotation".into();
            }
            let row = HostEventRow {
                event_time: TimestampUs(a.ts_ns / 1000),
                kind: "annotation",
                value: a.span_ns,
                detail: Some(&a.labels),
            };
            t.append(&c, &row)?;
        }
        for ch in &self.part.chains {
            let mut c = self.common(0, self.win(ch.detected_ns));
            c.comm = "reference".into();
            let sev = match ch.severity.as_str() {
                "HIGH" => 3,
                "MEDIUM" => 2,
                _ => 1,
            };
            let json = serde_json::to_string(ch).unwrap_or_default();
            let row = HostEventRow {
                event_time: TimestampUs(ch.detected_ns / 1000),
                kind: "reference_chain",
                value: sev,
                detail: Some(&json),
            };
            t.append(&c, &row)?;
        }
        Ok(t.finish()?)
    }

    /// The calls the source kept because they were slow: > 10 × the op's median.
    fn stall_events(&self, medians: &HashMap<(i64, i64), Histogram>) -> Result<RecordBatch> {
        let mut t = BatchBuilder::new(Table::StallEvents);
        for e in &self.slow {
            let med = medians.get(&(e.source, e.op)).and_then(|h| h.quantile(0.5)).unwrap_or(0);
            let thr = (med * 10).max(1_000_000);
            if e.dur_ns < thr {
                continue;
            }
            let name = op_name(self.trace, e.source, e.op);
            let row = StallRow {
                event_time: TimestampUs(e.ts_ns / 1000),
                tid: e.tid,
                library: if e.source == CUDA { "cudart" } else { "cuda" },
                op: &name,
                duration_ns: e.dur_ns,
                threshold_ns: thr,
                reason: "median_multiple",
                stack_id: None,
                feeds_gpu: None,
                thread_name: None,
            };
            t.append(&self.common(e.pid, self.win(e.ts_ns)), &row)?;
        }
        Ok(t.finish()?)
    }

    fn process_meta(&self) -> Result<RecordBatch> {
        let mut t = BatchBuilder::new(Table::ProcessMeta);
        let mut pids: Vec<u32> = self.cgroups.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            let c = self.common(pid, self.win(self.span.0));
            let meta = self.trace.cgroups.get(&c.cgroup_id);
            let cid = meta.and_then(|m| nonempty(&m.container_id));
            let path = meta.map(|m| m.path.clone()).unwrap_or_default();
            let row = ProcessMetaRow {
                cmdline: &c.comm,
                container_id: cid.as_deref(),
                pod_uid: None,
                cgroup_path: &path,
                local_rank: None,
                master_addr: None,
                nccl_comm_id: None,
                gpus: None,
                libraries: "",
                labels: None,
            };
            t.append(&c, &row)?;
        }
        Ok(t.finish()?)
    }

    /// One row per window with the host facts the source recorded.
    fn node_windows(&mut self, windows: HashSet<i64>) -> Result<RecordBatch> {
        let mut t = BatchBuilder::new(Table::NodeWindows);
        let s = self.part.session.clone().unwrap_or_default();
        let opt = |v: &str| (!v.is_empty()).then(|| v.to_string());
        let (kernel, cpu_model, gpu_model) = (opt(&s.kernel), opt(&s.cpu_model), opt(&s.gpu_model));
        let (driver_version, cuda_version) = (opt(&s.gpu_driver), opt(&s.cuda_version));
        let mut ws: Vec<i64> = windows.into_iter().collect();
        ws.sort_unstable();
        self.stats.windows = ws.len();
        for w in ws {
            let mut c = self.common(0, w);
            c.comm = "import".into();
            let row = NodeRow {
                events: 0,
                ringbuf_drops: 0,
                map_full: 0,
                spool_dropped: 0,
                probe_run_ns: 0,
                kernel: kernel.as_deref(),
                cpu_model: cpu_model.as_deref(),
                cpu_cores: (s.cpu_cores > 0).then_some(s.cpu_cores),
                gpu_model: gpu_model.as_deref(),
                driver_version: driver_version.as_deref(),
                cuda_version: cuda_version.as_deref(),
                gpu_count: None,
            };
            t.append(&c, &row)?;
        }
        Ok(t.finish()?)
    }
}
