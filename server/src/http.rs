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
    // The live ranking's gauges come from a collector on the same registry.
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
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
