// SPDX-License-Identifier: Apache-2.0
//! Agent metrics on `--metrics-addr` (Prometheus text).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::loop_config::LoopStats;
use crate::ship::ShipStats;

pub(crate) fn render(l: &LoopStats, s: &ShipStats) -> String {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    let rows = [
        ("ingero_agent_windows_total", "counter", "Windows drained from the kernel", g(&l.windows)),
        ("ingero_agent_events_total", "counter", "Probe hits aggregated in the kernel", g(&l.events)),
        (
            "ingero_agent_ringbuf_drops_total",
            "counter",
            "Outlier/process events lost to a full ring buffer",
            g(&l.ringbuf_drops),
        ),
        ("ingero_agent_map_full_total", "counter", "Kernel map updates lost to a full map", g(&l.map_full)),
        (
            "ingero_agent_probe_run_ns_total",
            "counter",
            "eBPF program run time (BPF_STATS_RUN_TIME, measured one window in --probe-time-every and scaled)",
            g(&l.probe_run_ns),
        ),
        (
            "ingero_agent_window_late_max_us",
            "gauge",
            "The latest a window was closed after its end since start (its calls counted in it until then)",
            g(&l.window_late_max_us),
        ),
        ("ingero_agent_libraries", "gauge", "Distinct library files probed now", g(&l.libraries)),
        (
            "ingero_agent_attach_failures_total",
            "counter",
            "Library files that could not be probed (retried on the next scan)",
            g(&l.attach_failures),
        ),
        (
            "ingero_agent_rows_invalid_total",
            "counter",
            "Rows refused by the schema check (a bug if ever non-zero; logged)",
            g(&l.rows_invalid),
        ),
        ("ingero_agent_cached_processes", "gauge", "Processes whose attribution is cached", g(&l.cached_processes)),
        (
            "ingero_agent_probe_loop_overruns_total",
            "counter",
            "Probe loop steps that ran past --watchdog (each made /healthz answer 503 while it ran)",
            g(&l.watchdog.overruns),
        ),
        (
            "ingero_agent_kernel_map_bytes",
            "gauge",
            "Kernel memory of the agent's BPF maps (fdinfo memlock), charged to its memory cgroup",
            g(&l.kernel_map_bytes),
        ),
        ("ingero_agent_batches_sent_total", "counter", "Batches acknowledged by the aggregator", g(&s.sent)),
        ("ingero_agent_batches_rejected_total", "counter", "Batches the aggregator refused", g(&s.rejected)),
        ("ingero_agent_spool_dropped_total", "counter", "Batches dropped from a full spool", g(&s.dropped)),
        ("ingero_agent_spool_depth", "gauge", "Batches waiting in the spool", g(&s.spooled)),
    ];
    let mut rows = rows.to_vec();
    rows.extend(hold_rows(l));
    rows.extend(detach_rows(l));
    rows.extend(cost_rows(l));
    if let Some(k) = l.kube.get() {
        rows.extend([
            (
                "ingero_agent_kube_connected",
                "gauge",
                "1 while the pod watch is up (pods are kept while it is down)",
                k.connected.load(Ordering::Relaxed) as u64,
            ),
            ("ingero_agent_kube_watch_errors_total", "counter", "Failed pod watch/list calls", g(&k.errors)),
            ("ingero_agent_kube_pods", "gauge", "Pods of this node known from the API", g(&k.pods)),
        ]);
    }
    let mut out = String::new();
    for (name, kind, help, v) in rows {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
    }
    out
}

/// The agent's trap cost to the processes it traces (cost.rs).
fn cost_rows(l: &LoopStats) -> [(&'static str, &'static str, &'static str, u64); 3] {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    [
        (
            "ingero_agent_trap_ns",
            "gauge",
            "What one uprobe trap costs a probed call on this node, measured at start (0: not measured)",
            g(&l.trap_ns),
        ),
        (
            "ingero_agent_trap_time_ns_total",
            "counter",
            "Time traced processes spent in the agent's traps (probed calls x ingero_agent_trap_ns)",
            g(&l.trap_time_ns),
        ),
        (
            "ingero_agent_busiest_process_trap_ppm",
            "gauge",
            "Largest share of one CPU a traced process spent in the agent's traps last window (parts per million; goal < 10000)",
            g(&l.busiest_trap_ppm),
        ),
    ]
}

/// Probes of library files no process maps any more (detacher.rs).
fn detach_rows(l: &LoopStats) -> [(&'static str, &'static str, &'static str, u64); 2] {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    [
        (
            "ingero_agent_library_detaches_total",
            "counter",
            "Library files whose probes were detached because no traced process mapped them (--detach-unused-after)",
            g(&l.library_detaches),
        ),
        (
            "ingero_agent_uprobes_detaching",
            "gauge",
            "Uprobes of detached library files not closed yet (each close waits for RCU grace periods)",
            g(&l.uprobes_detaching),
        ),
    ]
}

/// The hold at a new library's first lookup (ebpf/libload.bpf.c).
fn hold_rows(l: &LoopStats) -> [(&'static str, &'static str, &'static str, u64); 3] {
    let g = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    [
        (
            "ingero_agent_library_holds_total",
            "counter",
            "Threads held at a new CUDA/NCCL library's first symbol lookup until it was probed",
            g(&l.lib_holds),
        ),
        (
            "ingero_agent_library_hold_microseconds_total",
            "counter",
            "Time threads were held at a new library's first lookup (each hold at most 1 s)",
            g(&l.lib_hold_ns) / 1_000,
        ),
        (
            "ingero_agent_library_hold_timeouts_total",
            "counter",
            "Holds that ran out (1 s) before the agent had probed the library",
            g(&l.lib_hold_timeouts),
        ),
    ]
}

pub(crate) async fn serve(addr: std::net::SocketAddr, l: Arc<LoopStats>, s: Arc<ShipStats>) -> std::io::Result<()> {
    let health = l.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let (l, s) = (l.clone(), s.clone());
                async move { render(&l, &s) }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(move || {
                let l = health.clone();
                async move {
                    match l.watchdog.health() {
                        Ok(()) => (axum::http::StatusCode::OK, "ok\n".to_string()),
                        Err(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {why}\n")),
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
