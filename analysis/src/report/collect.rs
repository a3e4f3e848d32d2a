// SPDX-License-Identifier: Apache-2.0
//! Everything a report needs, read from the store with a few time-pruned
//! queries: the target's own series, its node's other cgroups, its job's
//! peers. One step per query, each filling its part of [`ReportData`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int64Type, TimestampMicrosecondType, UInt8Type, UInt32Type, UInt64Type};
use ingero_model::hist::Histogram;

use super::data::{Event, Neighbour, OpStat, Point, ReportData, Target, capped, median};
use crate::error::{Error, Result};
use crate::query::columns::Columns;
use crate::query::{QueryEngine, quote, time_predicate, wait_predicates};
use crate::rank::signals::{is_blocking_copy, is_device_wait, is_launch, is_sync_op};
use ingero_model::table::names::{
    CALL_WINDOWS, CGROUP_WINDOWS, HOST_EVENTS, IO_WINDOWS, PROGRESS_WINDOWS, SCHED_WINDOWS,
};
use ingero_model::time::rfc3339;

/// Window start as µs, for grouping.
const W: &str = "CAST(window_start AS BIGINT)";

/// A DOUBLE result column by name, nulls as 0.
fn f64s(b: &RecordBatch, name: &str) -> Result<Vec<f64>> {
    let c = b.primitives::<Float64Type>(name)?;
    Ok((0..c.len()).map(|j| if c.is_null(j) { 0.0 } else { c.value(j) }).collect())
}

fn strs(b: &RecordBatch, name: &str) -> Result<Vec<Option<String>>> {
    let c = b.strings(name)?;
    Ok((0..c.len()).map(|j| (!c.is_null(j)).then(|| c.value(j).to_string())).collect())
}

/// Each process's current name (that of its latest window), and the names
/// processes had before (renamed since), each list sorted and once.
fn current_names(names: BTreeMap<(String, u32), Vec<(i64, String)>>) -> (Vec<String>, Vec<String>) {
    let (mut current, mut former) = (BTreeSet::new(), BTreeSet::new());
    for mut seen in names.into_values() {
        seen.sort();
        if let Some((_, now)) = seen.pop() {
            former.extend(seen.into_iter().map(|(_, c)| c).filter(|c| *c != now));
            current.insert(now);
        }
    }
    let former = former.difference(&current).cloned().collect();
    (current.into_iter().collect(), former)
}

/// Reads the report's data for `target` in [start_us, end_us).
pub(crate) async fn collect(engine: &QueryEngine, target: &Target, start_us: i64, end_us: i64) -> Result<ReportData> {
    let time = time_predicate("window_start", start_us, end_us);
    let mut c = Collector {
        engine,
        target,
        range: (start_us, end_us),
        filter: format!("{} AND {time}", target.filter()),
        time,
        d: ReportData::default(),
        points: BTreeMap::new(),
        window_us: 1e6,
    };
    c.who().await?;
    let off_cpu = c.sched().await?;
    let waiting = c.calls().await?;
    c.host_share(off_cpu, waiting);
    c.io().await?;
    c.steps().await?;
    c.events().await?;
    c.neighbours().await?;
    c.reference().await?;
    c.peers().await?;
    let mut d = c.d;
    d.series = c.points.into_iter().map(|(t, p)| Point { t_us: t, ..p }).collect();
    Ok(d)
}

struct Collector<'a> {
    engine: &'a QueryEngine,
    target: &'a Target,
    range: (i64, i64),
    /// The target's rows in the range.
    filter: String,
    /// Any rows in the range.
    time: String,
    d: ReportData,
    points: BTreeMap<i64, Point>,
    window_us: f64,
}

impl Collector<'_> {
    async fn sql(&self, q: &str) -> Result<Vec<RecordBatch>> {
        self.engine.sql(q).await
    }

    /// Who: nodes, jobs, processes; no rows at all is the caller's error.
    async fn who(&mut self) -> Result<()> {
        let f = &self.filter;
        let cols = "node, job, pid, comm, window_start";
        let who = self
            .sql(&format!(
                "SELECT node, job, pid, comm, MAX(window_start) AS last FROM \
                 (SELECT {cols} FROM {SCHED_WINDOWS} WHERE {f} UNION ALL SELECT {cols} FROM {CALL_WINDOWS} WHERE {f}) \
                 GROUP BY node, job, pid, comm"
            ))
            .await?;
        let (mut nodes, mut jobs, mut pids) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        // Each process's names and when each was last seen: a process that
        // renamed itself goes by the name of its latest window.
        let mut names: BTreeMap<(String, u32), Vec<(i64, String)>> = BTreeMap::new();
        for b in &who {
            let pid = b.primitives::<UInt32Type>("pid")?;
            let last = b.primitives::<TimestampMicrosecondType>("last")?;
            let comm = strs(b, "comm")?;
            for (i, (n, j)) in strs(b, "node")?.into_iter().zip(strs(b, "job")?).enumerate() {
                jobs.extend(j);
                pids.insert(pid.value(i));
                let key = (n.clone().unwrap_or_default(), pid.value(i));
                nodes.extend(n);
                names.entry(key).or_default().extend(comm[i].clone().map(|c| (last.value(i), c)));
            }
        }
        if nodes.is_empty() {
            return Err(Error::NoData(format!(
                "no data for {} between {} and {}: check the name, --since and --store/--server ({})",
                self.target.describe(),
                rfc3339(self.range.0),
                rfc3339(self.range.1),
                self.seen_instead().await?
            )));
        }
        if let Target::Pid { pid, node: None } = self.target
            && nodes.len() > 1
        {
            // One pid on several nodes is several processes: merged, their
            // shares and totals would describe none of them.
            let shown: Vec<&str> = nodes.iter().take(5).map(String::as_str).collect();
            let more = if nodes.len() > 5 { ", …" } else { "" };
            return Err(Error::Ambiguous(format!(
                "pid {pid} ran on {} nodes in that range ({}{more}): give one as NODE:PID, e.g. --pid {}:{pid}",
                nodes.len(),
                shown.join(", "),
                shown[0]
            )));
        }
        let (current, former) = current_names(names);
        self.d.nodes = nodes.into_iter().collect();
        self.d.jobs = jobs.into_iter().collect();
        self.d.pids = pids.into_iter().collect();
        self.d.comms = current;
        self.d.former_comms = former;
        Ok(())
    }

    /// The names of the target's kind that have data in the range, a few
    /// of them, for a name the user got wrong.
    async fn seen_instead(&self) -> Result<String> {
        const SHOWN: usize = 5;
        let (name, kind) = self.target.spelled();
        // Utf8: `concat` of a CAST gives a view type. No ORDER BY/LIMIT:
        // DataFusion 55 cuts DISTINCT too early under a LIMIT (apache/
        // datafusion#24927); the names in a range fit in memory.
        let q = format!(
            "SELECT DISTINCT arrow_cast({name}, 'Utf8') AS name FROM {SCHED_WINDOWS} \
             WHERE {} AND {name} IS NOT NULL AND {name} <> '' AND {name} <> '/'",
            self.time
        );
        let mut names = BTreeSet::new();
        for b in &self.sql(&q).await? {
            names.extend(strs(b, "name")?.into_iter().flatten());
        }
        let n = names.len();
        let names: Vec<String> = names.into_iter().take(SHOWN).collect();
        Ok(match n {
            0 => format!("no {kind} have data in that range"),
            n if n <= SHOWN => format!("{kind} with data then: {}", names.join(", ")),
            n => format!("{kind} with data then: {}, … {n} in all", names.join(", ")),
        })
    }

    /// Run-queue and off-CPU shares. Agents measure, in the kernel, which
    /// off-CPU time was spent inside a CUDA/NCCL call (waiting for the
    /// device or peers): only the rest is the host blocking. Rows without
    /// that split (imported traces) are returned per window as (off-CPU ns,
    /// all thread time ns) for [`Self::host_share`] to estimate.
    async fn sched(&mut self) -> Result<BTreeMap<i64, (f64, f64)>> {
        let sched = self
            .sql(&format!(
                "SELECT {W} AS t, SUM(CAST(runq_wait_ns AS DOUBLE)) AS runq, SUM(CAST(off_cpu_ns AS DOUBLE)) AS off, SUM(CAST(on_cpu_ns AS DOUBLE)) AS on_cpu, \
                 MAX(CAST(window_us AS DOUBLE)) AS wu, SUM(CAST(off_cpu_in_call_ns AS DOUBLE)) AS in_call, \
                 CAST(COUNT(off_cpu_in_call_ns) AS DOUBLE) AS split FROM {SCHED_WINDOWS} WHERE {} GROUP BY 1",
                self.filter
            ))
            .await?;
        let mut unsplit = BTreeMap::new();
        for b in &sched {
            let t = b.primitives::<Int64Type>("t")?;
            let (runq, off, on, wu) = (f64s(b, "runq")?, f64s(b, "off")?, f64s(b, "on_cpu")?, f64s(b, "wu")?);
            let (in_call, split) = (f64s(b, "in_call")?, f64s(b, "split")?);
            for i in 0..b.num_rows() {
                let total = (runq[i] + off[i] + on[i]).max(1.0);
                let p = self.points.entry(t.value(i)).or_default();
                p.runq_share = runq[i] / total;
                if split[i] > 0.0 {
                    let host = (off[i] - in_call[i]).max(0.0) / total;
                    p.offcpu_share = host;
                    p.host_offcpu_share = host;
                } else {
                    p.offcpu_share = off[i] / total;
                    unsplit.insert(t.value(i), (off[i], total));
                }
                self.window_us = wu[i].max(1.0);
            }
        }
        self.d.window_secs = self.window_us / 1e6;
        Ok(unsplit)
    }

    /// Per-op latency, sync p99, collective share and launch rate; returns
    /// per window the time spent inside calls that wait for the GPU or peers.
    async fn calls(&mut self) -> Result<BTreeMap<i64, f64>> {
        let calls = self
            .sql(&format!(
                "SELECT {W} AS t, library, op, count, errors, total_ns, hist_bucket, hist_count, window_us, max_ns, sampled, sample_ratio FROM {CALL_WINDOWS} WHERE {}",
                self.filter
            ))
            .await?;
        let mut hists: BTreeMap<i64, (Histogram, u64)> = BTreeMap::new();
        let mut ops: BTreeMap<String, OpStat> = BTreeMap::new();
        let mut waiting: BTreeMap<i64, f64> = BTreeMap::new();
        for b in &calls {
            let (t, lib, op) = (b.primitives::<Int64Type>("t")?, b.strings("library")?, b.strings("op")?);
            let (count, total) = (b.primitives::<UInt64Type>("count")?, b.primitives::<UInt64Type>("total_ns")?);
            let errors = b.primitives::<UInt64Type>("errors")?;
            let (hb, hc) = (b.lists("hist_bucket")?, b.lists("hist_count")?);
            let (wu, mx) = (b.primitives::<UInt64Type>("window_us")?, b.primitives::<UInt64Type>("max_ns")?);
            let (sampled, ratio) = (b.booleans("sampled")?, b.primitives::<Float64Type>("sample_ratio")?);
            for i in 0..b.num_rows() {
                let (l, o, t) = (lib.value(i), op.value(i), t.value(i));
                let (bk, ct) = (hb.value(i), hc.value(i));
                let hist = Histogram::from_sparse(
                    bk.as_primitive::<UInt8Type>().values(),
                    ct.as_primitive::<UInt64Type>().values(),
                );
                let st = ops.entry(o.to_string()).or_insert_with(|| OpStat {
                    library: l.into(),
                    op: o.into(),
                    kind: ingero_model::signals::op_kind(l, o).into(),
                    ..Default::default()
                });
                st.count += count.value(i);
                st.errors += errors.value(i);
                st.total_ns += total.value(i);
                st.max_ns = st.max_ns.max(mx.value(i));
                st.sampled |= sampled.value(i);
                st.seen += seen_calls(count.value(i), ratio.is_valid(i).then(|| ratio.value(i)));
                st.hist.merge(&hist);
                if is_device_wait(l, o) || o.contains("Memcpy") {
                    *waiting.entry(t).or_default() += total.value(i) as f64;
                }
                let secs = (wu.value(i) as f64 / 1e6).max(1e-6);
                let p = self.points.entry(t).or_default();
                if is_device_wait(l, o) {
                    p.wait_share += total.value(i) as f64 / (secs * 1e9);
                }
                if is_blocking_copy(o) {
                    p.copy_share += total.value(i) as f64 / (secs * 1e9);
                }
                if is_sync_op(o) {
                    self.d.sync_calls += count.value(i);
                    let (h, longest) = hists.entry(t).or_default();
                    h.merge(&hist);
                    *longest = (*longest).max(mx.value(i));
                } else if is_launch(o) {
                    self.d.launches += count.value(i);
                    p.launches_per_s += count.value(i) as f64 / secs;
                }
            }
        }
        for (t, (h, longest)) in &hists {
            self.points.entry(*t).or_default().sync_p99_ns = capped(h.quantile(0.99), *longest);
        }
        self.d.sync_hist = hists.into_iter().map(|(t, (h, longest))| (t, h, longest)).collect();
        self.d.ops = finish_ops(ops);
        Ok(waiting)
    }

    /// For rows without the kernel's split: a thread asleep inside
    /// cudaStreamSynchronize, a device-to-host copy or a collective waits for
    /// the GPU or for its peers, not the host stalling, so the time spent in
    /// such calls is taken off the off-CPU time (an estimate).
    fn host_share(&mut self, off_cpu: BTreeMap<i64, (f64, f64)>, waiting: BTreeMap<i64, f64>) {
        for (t, (off, total)) in off_cpu {
            let inside = waiting.get(&t).copied().unwrap_or(0.0);
            self.points.entry(t).or_default().host_offcpu_share = (off - inside).max(0.0) / total;
        }
    }

    async fn io(&mut self) -> Result<()> {
        let io = self
            .sql(&format!(
                "SELECT {W} AS t, SUM(CAST(total_ns AS DOUBLE)) AS total, MAX(CAST(window_us AS DOUBLE)) AS wu FROM {IO_WINDOWS} WHERE {} GROUP BY 1",
                self.filter
            ))
            .await?;
        for b in &io {
            let t = b.primitives::<Int64Type>("t")?;
            let (tot, wu) = (f64s(b, "total")?, f64s(b, "wu")?);
            for i in 0..b.num_rows() {
                self.points.entry(t.value(i)).or_default().io_share = tot[i] / (wu[i].max(1.0) * 1e3);
            }
        }
        Ok(())
    }

    /// Each window's step time: the median of its processes' (found by the agents).
    async fn steps(&mut self) -> Result<()> {
        let steps = self
            .sql(&format!(
                "SELECT {W} AS t, CAST(median(step_p50_ns) AS DOUBLE) AS p50 FROM {PROGRESS_WINDOWS} \
                 WHERE step_p50_ns IS NOT NULL AND {} GROUP BY 1",
                self.filter
            ))
            .await?;
        for b in &steps {
            let (t, p50) = (b.primitives::<Int64Type>("t")?, f64s(b, "p50")?);
            for (i, ns) in p50.iter().enumerate() {
                // Only windows the target's other rows made: a step time alone draws no point.
                if let Some(p) = self.points.get_mut(&t.value(i)) {
                    p.step_p50_ns = Some(*ns as u64);
                }
            }
        }
        Ok(())
    }

    async fn events(&mut self) -> Result<()> {
        let ev = self
            .sql(&format!(
                "SELECT CAST(event_time AS BIGINT) AS t, kind, value, detail, comm FROM {HOST_EVENTS} WHERE {} AND kind <> 'annotation' ORDER BY t LIMIT 500",
                self.filter
            ))
            .await?;
        for b in &ev {
            let (t, v) = (b.primitives::<Int64Type>("t")?, b.primitives::<Int64Type>("value")?);
            let (kind, detail, comm) = (strs(b, "kind")?, strs(b, "detail")?, strs(b, "comm")?);
            for i in 0..b.num_rows() {
                self.d.events.push(Event {
                    time: rfc3339(t.value(i)),
                    kind: kind[i].clone().unwrap_or_default(),
                    value: v.value(i),
                    detail: detail[i].clone(),
                    comm: comm[i].clone().unwrap_or_default(),
                });
            }
        }
        Ok(())
    }

    fn node_list(&self) -> String {
        self.d.nodes.iter().map(|n| quote(n)).collect::<Vec<_>>().join(", ")
    }

    /// Other cgroups on the same node(s): who took the CPU.
    async fn neighbours(&mut self) -> Result<()> {
        let not_self = match self.target {
            Target::Pod { namespace, name } => {
                format!("NOT (COALESCE(namespace, '') = {} AND COALESCE(pod, '') = {})", quote(namespace), quote(name))
            }
            Target::Pid { pid, .. } => format!("pid <> {pid}"),
            Target::Node(_) => {
                format!("pid NOT IN ({})", self.d.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "))
            }
        };
        let (start_us, end_us) = self.range;
        let first = self.points.keys().next().copied().unwrap_or(start_us);
        let last = self.points.keys().last().copied().unwrap_or(end_us) + self.window_us as i64;
        let (lo, hi) = (start_us.max(first), end_us.min(last));
        let span_ns = (hi - lo).max(1) as f64 * 1e3;
        // CPU over the span it is divided by: the target's windows, not the
        // whole range (a 10-minute range around a 20-s process said 6 cores
        // on a 2-CPU node).
        let nb = self
            .sql(&format!(
                "SELECT namespace, pod, comm, cgroup_path, SUM(CAST(on_cpu_ns AS DOUBLE)) AS cpu FROM {CGROUP_WINDOWS} \
                 WHERE node IN ({}) AND {} AND {not_self} GROUP BY 1, 2, 3, 4 ORDER BY cpu DESC LIMIT 5",
                self.node_list(),
                time_predicate("window_start", lo, hi)
            ))
            .await?;
        for b in &nb {
            let (ns, pod, comm) = (strs(b, "namespace")?, strs(b, "pod")?, strs(b, "comm")?);
            let (path, cpu) = (strs(b, "cgroup_path")?, f64s(b, "cpu")?);
            for i in 0..b.num_rows() {
                self.d.neighbours.push(Neighbour {
                    namespace: ns[i].clone(),
                    pod: pod[i].clone(),
                    comm: comm[i].clone().unwrap_or_default(),
                    cgroup_path: path[i].clone().unwrap_or_default(),
                    cores: cpu[i] / span_ns,
                });
            }
        }
        Ok(())
    }

    /// Diagnoses the source product stored in an imported trace.
    async fn reference(&mut self) -> Result<()> {
        let refs = self
            .sql(&format!(
                "SELECT detail FROM {HOST_EVENTS} WHERE kind = 'reference_chain' AND node IN ({}) AND {} ORDER BY event_time",
                self.node_list(),
                self.time
            ))
            .await?;
        for b in &refs {
            self.d.reference.extend(strs(b, "detail")?.into_iter().flatten());
        }
        Ok(())
    }

    /// The job's other nodes, window by window: their median device-wait,
    /// blocking-copy and host-stall shares.
    async fn peers(&mut self) -> Result<()> {
        let Some(job) = self.d.jobs.first() else { return Ok(()) };
        let jf = format!("job = {} AND {} AND node NOT IN ({})", quote(job), self.time, self.node_list());
        let (copy, wait) = wait_predicates();
        let share = |cond: &str| {
            format!(
                "SELECT node, {W} AS t, SUM(CASE WHEN {cond} THEN CAST(total_ns AS DOUBLE) ELSE 0 END) / MAX(CAST(window_us AS DOUBLE) * 1000) AS share FROM {CALL_WINDOWS} WHERE {jf} GROUP BY 1, 2"
            )
        };
        let pw = self.sql(&share(&wait)).await?;
        let pc = self.sql(&share(&copy)).await?;
        let ps = self
            .sql(&format!(
                "SELECT node, {W} AS t, SUM(CAST(runq_wait_ns + off_cpu_ns - COALESCE(off_cpu_in_call_ns, 0) AS DOUBLE)) / SUM(CAST(runq_wait_ns + off_cpu_ns + on_cpu_ns AS DOUBLE)) AS share FROM {SCHED_WINDOWS} WHERE {jf} GROUP BY 1, 2"
            ))
            .await?;
        let mut peers = BTreeSet::new();
        let wait = by_window(&pw, &mut peers)?;
        let copy = by_window(&pc, &mut peers)?;
        let stall = by_window(&ps, &mut peers)?;
        self.d.peers = peers.len();
        for (t, p) in self.points.iter_mut() {
            p.peer_wait_share = wait.get(t).map(|v| median(v.clone()));
            p.peer_copy_share = copy.get(t).map(|v| median(v.clone()));
            p.peer_stall_share = stall.get(t).map(|v| median(v.clone()));
        }
        Ok(())
    }
}

/// (node, t, share) rows → shares per window; the nodes seen go to `peers`.
fn by_window(batches: &[RecordBatch], peers: &mut BTreeSet<String>) -> Result<HashMap<i64, Vec<f64>>> {
    let mut by_t: HashMap<i64, Vec<f64>> = HashMap::new();
    for b in batches {
        let (t, v) = (b.primitives::<Int64Type>("t")?, f64s(b, "share")?);
        for (i, n) in strs(b, "node")?.into_iter().enumerate() {
            peers.extend(n);
            by_t.entry(t.value(i)).or_default().push(v[i]);
        }
    }
    Ok(by_t)
}

/// Quantiles per op, busiest first.
/// The calls a row's probe saw: its count is the calls seen divided by the
/// share of the window the probe was attached (`sample_ratio`, the agent's
/// duty cycle); null (older files, imported traces, full capture) means all.
fn seen_calls(count: u64, sample_ratio: Option<f64>) -> f64 {
    match sample_ratio {
        Some(r) if r.is_finite() && r > 0.0 && r < 1.0 => count as f64 * r,
        _ => count as f64,
    }
}

fn finish_ops(ops: BTreeMap<String, OpStat>) -> Vec<OpStat> {
    let mut ops: Vec<OpStat> = ops
        .into_values()
        .map(|mut o| {
            o.p50_ns = capped(o.hist.quantile(0.5), o.max_ns);
            o.p99_ns = capped(o.hist.quantile(0.99), o.max_ns);
            // Below the count (by more than rounding): part of it is an estimate.
            o.seen_share = (o.seen + 0.5 < o.count as f64).then(|| o.seen / o.count.max(1) as f64);
            o
        })
        .collect();
    ops.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)));
    ops
}

#[cfg(test)]
mod tests {
    use super::seen_calls;

    #[test]
    fn a_count_is_all_seen_unless_a_ratio_in_0_to_1_says_otherwise() {
        assert_eq!(seen_calls(4_000, Some(0.25)), 1_000.0);
        // Null (full capture, older files), a full window, or a value no
        // agent writes: the count stands as seen.
        for r in [None, Some(1.0), Some(0.0), Some(-0.5), Some(1.5), Some(f64::NAN), Some(f64::INFINITY)] {
            assert_eq!(seen_calls(4_000, r), 4_000.0, "{r:?}");
        }
    }
}
