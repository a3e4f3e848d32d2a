// SPDX-License-Identifier: Apache-2.0
//! HTTP side of `ingero serve`: Prometheus metrics, health, readiness and the
//! JSON API.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use crate::rank::LiveRanker;
use ingero_store::metrics::Metrics;

#[derive(Debug)]
pub(crate) struct HttpState {
    pub metrics: Arc<Metrics>,
    /// Set once the WAL is replayed and the gRPC listener is up.
    pub ready: AtomicBool,
    pub ranker: LiveRanker,
    pub replicas: Option<Arc<crate::replicas::Replicas>>,
}

#[derive(Debug, Deserialize)]
struct StragglerQuery {
    job: Option<String>,
    /// With replicas: only this replica's jobs.
    #[serde(default)]
    local_only: bool,
}

/// Probes and metrics are open; the data API needs the bearer token when one is set.
pub(crate) fn router(state: Arc<HttpState>, token: Option<Arc<str>>) -> Router {
    let api = Router::new()
        .route("/api/v1/stragglers", get(stragglers))
        .route_layer(axum::middleware::from_fn(move |req, next| crate::auth::http_check(token.clone(), req, next)));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(api)
        .with_state(state)
}

async fn metrics(State(s): State<Arc<HttpState>>) -> impl IntoResponse {
    let mut text = s.metrics.encode();
    // Straggler gauges are rendered from the live ranking at scrape time, so
    // nodes that leave the ranking disappear instead of going stale.
    let extra = ranking_metrics(&s.ranker.ranking(None), s.ranker.dropped.load(Ordering::Relaxed));
    match text.rfind("# EOF") {
        Some(i) => text.insert_str(i, &extra),
        None => text.push_str(&extra),
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
}

/// The live ranking as gauges: per node its score and flag, and per deviating
/// signal its value and robust z (what the dashboard's per-node panels show).
/// The training job is `training_job`, not `job`: Prometheus gives every
/// series a `job` label of its own (the scrape job) and would rename ours.
fn ranking_metrics(ranking: &crate::rank::Ranking, dropped: u64) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let mut family = |name: &str, help: &str, kind: &str, lines: &mut dyn Iterator<Item = String>| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        lines.for_each(|l| o.push_str(&l));
    };
    let node = |st: &crate::rank::detector::Standing| {
        format!("training_job=\"{}\",node=\"{}\"", label(&st.job), label(&st.node))
    };
    let list = &ranking.stragglers;
    family(
        "ingero_straggler_score",
        "Robust deviation of the node from its job (MAD units).",
        "gauge",
        &mut list.iter().map(|st| format!("ingero_straggler_score{{{}}} {}\n", node(st), st.score)),
    );
    family(
        "ingero_straggler_flagged",
        "1 while the node is flagged as a straggler.",
        "gauge",
        &mut list.iter().map(|st| format!("ingero_straggler_flagged{{{}}} {}\n", node(st), st.flagged as u8)),
    );
    let signals = || {
        list.iter().flat_map(move |st| {
            st.signals.iter().map(move |d| (format!("{},signal=\"{}\"", node(st), label(&d.signal)), d))
        })
    };
    family(
        "ingero_straggler_signal_z",
        "Robust z-score of each signal the node deviates in (MAD units from its job's median).",
        "gauge",
        &mut signals().map(|(l, d)| format!("ingero_straggler_signal_z{{{l}}} {}\n", d.z)),
    );
    family(
        "ingero_straggler_signal_value",
        "The node's value of each signal it deviates in (a share of the window, or a rate).",
        "gauge",
        &mut signals().map(|(l, d)| format!("ingero_straggler_signal_value{{{l}}} {}\n", d.value)),
    );
    family(
        "ingero_ranking_dropped",
        "Batches not ranked because the ranking queue was full.",
        "counter",
        &mut std::iter::once(format!("ingero_ranking_dropped_total {dropped}\n")),
    );
    o
}

/// Escapes a Prometheus label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

async fn stragglers(State(s): State<Arc<HttpState>>, Query(q): Query<StragglerQuery>) -> impl IntoResponse {
    match &s.replicas {
        Some(r) if !q.local_only => Json(r.fleet_ranking(q.job.as_deref()).await),
        _ => Json(s.ranker.ranking(q.job.as_deref())),
    }
}

async fn readyz(State(s): State<Arc<HttpState>>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "replaying write-ahead log\n")
    }
}
