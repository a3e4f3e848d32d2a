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

use crate::metrics::Metrics;
use crate::rank::LiveRanker;

#[derive(Debug)]
pub(crate) struct HttpState {
    pub metrics: Arc<Metrics>,
    /// Set once the WAL is replayed and the gRPC listener is up.
    pub ready: AtomicBool,
    pub ranker: LiveRanker,
}

#[derive(Debug, Deserialize)]
struct StragglerQuery {
    job: Option<String>,
}

/// Probes and metrics are open; the data API needs the bearer token when one is set.
pub(crate) fn router(state: Arc<HttpState>, token: Option<Arc<str>>) -> Router {
    let api = Router::new().route("/api/v1/stragglers", get(stragglers)).route_layer(axum::middleware::from_fn(
        move |req, next| crate::server::auth::http_check(token.clone(), req, next),
    ));
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
    let ranking = s.ranker.ranking(None);
    let mut extra = String::new();
    extra.push_str("# HELP ingero_straggler_score Robust deviation of the node from its job (MAD units).\n");
    extra.push_str("# TYPE ingero_straggler_score gauge\n");
    for st in &ranking.stragglers {
        extra.push_str(&format!(
            "ingero_straggler_score{{job=\"{}\",node=\"{}\"}} {}\n",
            label(&st.job),
            label(&st.node),
            st.score
        ));
    }
    extra.push_str("# HELP ingero_straggler_flagged 1 while the node is flagged as a straggler.\n");
    extra.push_str("# TYPE ingero_straggler_flagged gauge\n");
    for st in &ranking.stragglers {
        let f = st.flagged as u8;
        extra.push_str(&format!(
            "ingero_straggler_flagged{{job=\"{}\",node=\"{}\"}} {f}\n",
            label(&st.job),
            label(&st.node)
        ));
    }
    extra.push_str("# HELP ingero_ranking_dropped Batches not ranked because the ranking queue was full.\n");
    extra.push_str("# TYPE ingero_ranking_dropped counter\n");
    extra.push_str(&format!("ingero_ranking_dropped_total {}\n", s.ranker.dropped.load(Ordering::Relaxed)));
    match text.rfind("# EOF") {
        Some(i) => text.insert_str(i, &extra),
        None => text.push_str(&extra),
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
}

/// Escapes a Prometheus label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

async fn stragglers(State(s): State<Arc<HttpState>>, Query(q): Query<StragglerQuery>) -> impl IntoResponse {
    Json(s.ranker.ranking(q.job.as_deref()))
}

async fn readyz(State(s): State<Arc<HttpState>>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "replaying write-ahead log\n")
    }
}
