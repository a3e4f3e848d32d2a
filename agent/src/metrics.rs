// SPDX-License-Identifier: Apache-2.0
//! Agent metrics on `--metrics-addr` (OpenMetrics text, `prometheus-client`
//! as the aggregator's). The counters live in the probe loop's and the
//! shipper's atomics; a collector reads them at scrape time.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::loop_config::LoopStats;
use crate::ship::ShipStats;

use Kind::{Counter, Gauge};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// A sample as exposed: counters by their exposed name (ending `_total`).
type Row = (&'static str, Kind, &'static str, u64);

/// Reads the agent's counters on each scrape.
struct Stats {
    l: Arc<LoopStats>,
    s: Arc<ShipStats>,
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("agent stats")
    }
}

impl Collector for Stats {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, kind, help, v) in rows(&self.l, &self.s) {
            match kind {
                Counter => {
                    // The encoder adds `_total` to a counter's samples.
                    let m = ConstCounter::new(v);
                    m.encode(enc.encode_descriptor(
                        name.strip_suffix("_total").unwrap_or(name),
                        help,
                        None,
                        m.metric_type(),
                    )?)?;
                }
                Gauge => {
                    let m = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
                    m.encode(enc.encode_descriptor(name, help, None, m.metric_type())?)?;
                }
            }
        }
        Ok(())
    }
}

/// The registry `/metrics` encodes: the agent's counters, read when scraped.
fn registry(l: Arc<LoopStats>, s: Arc<ShipStats>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(Stats { l, s }));
    r
}

pub(crate) fn render(r: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail; a collector error would cut the text short.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, r) {
        tracing::warn!(error = %e, "encoding /metrics");
    }
    out
}

fn rows(l: &LoopStats, s: &ShipStats) -> Vec<Row> {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    let rows = [
        ("ingero_agent_windows_total", Counter, "Windows drained from the kernel", g(&l.windows)),
        ("ingero_agent_events_total", Counter, "Probe hits aggregated in the kernel", g(&l.events)),
        (
            "ingero_agent_probe_run_ns_total",
            Counter,
            "eBPF program run time (BPF_STATS_RUN_TIME, measured one window in --probe-time-every and scaled)",
            g(&l.probe_run_ns),
        ),
        (
            "ingero_agent_window_late_max_us",
            Gauge,
            "The latest a window was closed after its end since start (its calls counted in it until then)",
            g(&l.window_late_max_us),
        ),
        ("ingero_agent_libraries", Gauge, "Distinct library files probed now", g(&l.libraries)),
        (
            "ingero_agent_attach_failures_total",
            Counter,
            "Tries to probe a library file that failed (each file retried after 10 min)",
            g(&l.attach_failures),
        ),
        (
            "ingero_agent_libraries_refused_total",
            Counter,
            "New library files not probed: --max-libraries, --max-libraries-per-process, or the agent's open files past half their limit",
            g(&l.libraries_refused),
        ),
        (
            "ingero_agent_rows_invalid_total",
            Counter,
            "Rows refused by the schema check (a bug if ever non-zero; logged)",
            g(&l.rows_invalid),
        ),
        ("ingero_agent_cached_processes", Gauge, "Processes whose attribution is cached", g(&l.cached_processes)),
        (
            "ingero_agent_probe_loop_overruns_total",
            Counter,
            "Probe loop steps that ran past --watchdog (each made /healthz answer 503 while it ran)",
            g(&l.watchdog.overruns),
        ),
        (
            "ingero_agent_kernel_map_bytes",
            Gauge,
            "Kernel memory of the agent's BPF maps (fdinfo memlock), charged to its memory cgroup",
            g(&l.kernel_map_bytes),
        ),
        ("ingero_agent_batches_sent_total", Counter, "Batches acknowledged by the aggregator", g(&s.sent)),
        ("ingero_agent_batches_rejected_total", Counter, "Batches the aggregator refused", g(&s.rejected)),
        (
            "ingero_agent_spool_dropped_total",
            Counter,
            "Batches lost before sending: dropped from a full spool, or not written to it (a disk error)",
            g(&s.dropped),
        ),
        ("ingero_agent_spool_depth", Gauge, "Batches waiting in the spool", g(&s.spooled)),
    ];
    let mut rows = rows.to_vec();
    rows.extend(loss_rows(l));
    rows.extend(hold_rows(l));
    rows.extend(detach_rows(l));
    rows.extend(cost_rows(l));
    if let Some(k) = l.kube.get() {
        rows.extend([
            (
                "ingero_agent_kube_connected",
                Gauge,
                "1 while the pod watch is up (pods are kept while it is down)",
                k.connected.load(Ordering::Relaxed) as u64,
            ),
            ("ingero_agent_kube_watch_errors_total", Counter, "Failed pod watch/list calls", g(&k.errors)),
            ("ingero_agent_kube_pods", Gauge, "Pods of this node known from the API", g(&k.pods)),
        ]);
    }
    rows
}

/// What the kernel side lost: events, marks, switches, Python frames, map updates.
fn loss_rows(l: &LoopStats) -> [Row; 5] {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    [
        (
            "ingero_agent_ringbuf_drops_total",
            Counter,
            "Outlier/process events lost to a full ring buffer",
            g(&l.ringbuf_drops),
        ),
        (
            "ingero_agent_step_marks_dropped_total",
            Counter,
            "Return-probed calls lost to a full marks ring: the windows they fell in ship no steps",
            g(&l.mark_drops),
        ),
        (
            "ingero_agent_sched_events_missed_total",
            Counter,
            "Scheduler switches of traced threads no program saw (the kernel skipped them): each can lose one off-CPU episode",
            g(&l.sched_missed),
        ),
        (
            "ingero_agent_python_stacks_cut_total",
            Counter,
            "Python call sites shipped without some or all of their Python frames: a read of the interpreter's memory failed in the probe (a page not resident)",
            g(&l.py_faults),
        ),
        ("ingero_agent_map_full_total", Counter, "Kernel map updates lost to a full map", g(&l.map_full)),
    ]
}

/// The agent's trap cost to the processes it traces (cost.rs).
fn cost_rows(l: &LoopStats) -> [Row; 4] {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    [
        (
            "ingero_agent_trap_ns",
            Gauge,
            "What one uprobe trap costs a probed call on this node, measured at start (0: not measured)",
            g(&l.trap_ns),
        ),
        (
            "ingero_agent_trap_time_ns_total",
            Counter,
            "Time traced processes spent in the agent's traps (probed calls x ingero_agent_trap_ns)",
            g(&l.trap_time_ns),
        ),
        (
            "ingero_agent_busiest_process_trap_ppm",
            Gauge,
            "Largest share of one CPU a traced process spent in the agent's traps last window (parts per million; goal < 10000)",
            g(&l.busiest_trap_ppm),
        ),
        (
            "ingero_agent_sample_ratio_ppm",
            Gauge,
            "Share of the last window the duty-cycled probes (launch-type calls) were on, in parts per million: 1000000 when every call was seen; below it their counts are estimates (--trap-budget)",
            g(&l.sample_ratio_ppm),
        ),
    ]
}

/// Probes of library files no process maps any more (detacher.rs).
fn detach_rows(l: &LoopStats) -> [Row; 2] {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    [
        (
            "ingero_agent_library_detaches_total",
            Counter,
            "Library files whose probes were detached because no traced process mapped them (--detach-unused-after)",
            g(&l.library_detaches),
        ),
        (
            "ingero_agent_uprobes_detaching",
            Gauge,
            "Uprobe links of detached library files not closed yet (each close waits for RCU grace periods; a uprobe_multi link, Linux 6.6+, holds all of a program's probes on a file)",
            g(&l.uprobes_detaching),
        ),
    ]
}

/// The hold at a new library's first lookup (ebpf/libload.bpf.c).
fn hold_rows(l: &LoopStats) -> [Row; 3] {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    [
        (
            "ingero_agent_library_holds_total",
            Counter,
            "Threads held at a new CUDA/NCCL library's first symbol lookup until it was probed",
            g(&l.lib_holds),
        ),
        (
            "ingero_agent_library_hold_microseconds_total",
            Counter,
            "Time threads were held at a new library's first lookup (each hold at most 1 s)",
            g(&l.lib_hold_ns) / 1_000,
        ),
        (
            "ingero_agent_library_hold_timeouts_total",
            Counter,
            "Holds that ran out (1 s) before the agent had probed the library",
            g(&l.lib_hold_timeouts),
        ),
    ]
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub(crate) async fn serve(addr: std::net::SocketAddr, l: Arc<LoopStats>, s: Arc<ShipStats>) -> std::io::Result<()> {
    let health = (l.clone(), s.clone());
    let reg = Arc::new(registry(l, s));
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let reg = reg.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, OPENMETRICS)], render(&reg)) }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(move || {
                let (l, s) = health.clone();
                async move {
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                    match crate::health::report(&l, &s, now.as_millis() as u64) {
                        (true, body) => (axum::http::StatusCode::OK, body),
                        (false, body) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, body),
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_are_openmetrics_with_each_name_once() {
        let (l, s) = (Arc::new(LoopStats::default()), Arc::new(ShipStats::default()));
        l.windows.store(3, Ordering::Relaxed);
        l.lib_hold_ns.store(5_000, Ordering::Relaxed);
        s.spooled.store(2, Ordering::Relaxed);
        let text = render(&registry(l, s));
        for line in [
            "# TYPE ingero_agent_windows counter",
            "ingero_agent_windows_total 3",
            "# TYPE ingero_agent_spool_depth gauge",
            "ingero_agent_spool_depth 2",
            "ingero_agent_library_hold_microseconds_total 5",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a metric described twice:\n{text}");
        assert!(n >= 20, "{n} metrics:\n{text}");
        assert!(!text.contains("_total_total"), "{text}");
    }
}
