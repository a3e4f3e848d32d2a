// SPDX-License-Identifier: Apache-2.0
//! Ingero's serving layer: `ingero serve` (and the agent's `run --store`)
//! wires the ingest service, the committer, the live ranking ([`rank`]) and
//! the HTTP endpoints together, and shuts down without losing buffered rows.
//!
//! It sits on storage (`ingero-store`) and links no query engine or reports:
//! those are added from above through [`ExtraRoutes`] (`scripts/check-layers.sh`).
//!
//! Requests enter through [`auth`] and [`ratelimit`], rows through [`ingest`]
//! (validate) into `store::commit`; reads go through [`http`] (health, metrics, live
//! ranking) or what a layer above adds ([`ExtraRoutes`]: the query service).

pub mod auth;
pub mod error;
pub(crate) mod http;
pub mod ingest;
pub mod rank;
pub(crate) mod ratelimit;
pub mod replicas;

pub use error::{Error, Result};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ::http::HeaderValue;
use ingero_proto::pb::ingest_server::IngestServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use crate::error::IoContext;
use crate::http::{HttpState, router};
use crate::ingest::{IngestService, Limits};
use crate::rank::LiveRanker;
use crate::rank::detector::DetectorConfig;
use crate::replicas::{ReplicaConfig, Replicas};
use ingero_store::commit::{CommitConfig, Committer};
use ingero_store::metrics::Metrics;
use ingero_store::{Store, StoreOptions, StoreUrl};
use tonic::service::interceptor::InterceptedService;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub store: StoreUrl,
    pub store_options: StoreOptions,
    pub listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub commit: CommitConfig,
    pub limits: Limits,
    pub detector: DetectorConfig,
    /// How long a window waits for late nodes before it is judged anyway.
    pub grace: std::time::Duration,
    pub auth: crate::auth::ServerAuth,
    /// Several replicas as one aggregator (`--replicas`); None for one.
    pub replicas: Option<ReplicaConfig>,
    /// Compact and vacuum the tables this often (None: never).
    pub maintain_every: Option<std::time::Duration>,
    /// Vacuum deletes files removed (or never committed) longer ago than this.
    pub vacuum_retention: std::time::Duration,
    /// How long each kind of table keeps its rows (applied by maintenance).
    pub data_retention: ingero_store::retention::Retention,
    /// gRPC services a layer above adds behind the same token check: the
    /// query service (`query::service::with_query`). None: ingest only, and a
    /// binary that never sets it (the agent's `run --store`) links no query
    /// engine even where a workspace build turns the `query` feature on.
    pub extra_routes: Option<ExtraRoutes>,
    /// Metrics a layer above adds to `/metrics` (remediation's counters).
    pub extra_metrics: Option<ExtraMetrics>,
}

/// Registers metrics of a layer the server does not depend on.
#[derive(Clone)]
pub struct ExtraMetrics(Arc<dyn Fn(&mut prometheus_client::registry::Registry) + Send + Sync>);

impl ExtraMetrics {
    pub fn new(add: impl Fn(&mut prometheus_client::registry::Registry) + Send + Sync + 'static) -> Self {
        ExtraMetrics(Arc::new(add))
    }
}

impl std::fmt::Debug for ExtraMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExtraMetrics(..)")
    }
}

type AddRoutes = dyn Fn(tonic::service::Routes, &Services<'_>) -> tonic::service::Routes + Send + Sync;

/// Adds services to the server's gRPC routes, from a layer the server does
/// not depend on (shared, so the config stays Clone).
#[derive(Clone)]
pub struct ExtraRoutes(Arc<AddRoutes>);

impl ExtraRoutes {
    pub fn new(
        add: impl Fn(tonic::service::Routes, &Services<'_>) -> tonic::service::Routes + Send + Sync + 'static,
    ) -> Self {
        ExtraRoutes(Arc::new(add))
    }
}

impl std::fmt::Debug for ExtraRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExtraRoutes(..)")
    }
}

/// What an added service is built from.
#[derive(Debug)]
pub struct Services<'a> {
    pub cfg: &'a ServeConfig,
    pub store: &'a Store,
    pub committer: &'a Committer,
    pub ranker: &'a LiveRanker,
    pub replicas: &'a Option<Arc<Replicas>>,
    pub check: crate::auth::TokenCheck,
}

/// A running aggregator.
#[derive(Debug)]
pub struct Server {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub committer: Committer,
    pub metrics: Arc<Metrics>,
    pub store: Store,
    pub ranker: LiveRanker,
    pub replicas: Option<Arc<Replicas>>,
    stop: Option<oneshot::Sender<()>>,
    done: JoinHandle<Result<()>>,
}

impl Server {
    /// Replays the WAL, binds both listeners and starts serving.
    pub async fn start(cfg: ServeConfig) -> Result<Server> {
        let store = Store::open(&cfg.store, &cfg.store_options)?;
        if let Some(r) = &cfg.replicas {
            // Replicas race for Delta versions: verified before trusted.
            ingero_store::probe::put_if_absent(&store, &r.urls[r.me]).await?;
        }
        let grpc = TcpListener::bind(cfg.listen).await.ctx(|| format!("binding --listen {}", cfg.listen))?;
        let http =
            TcpListener::bind(cfg.http_listen).await.ctx(|| format!("binding --http-listen {}", cfg.http_listen))?;
        let grpc_addr = grpc.local_addr().ctx(|| "local address".into())?;
        let http_addr = http.local_addr().ctx(|| "local address".into())?;

        let ranker = LiveRanker::start(cfg.detector.clone(), cfg.grace);
        let mut metrics = Metrics::default();
        metrics.registry.register_collector(Box::new(crate::rank::exposition::RankingMetrics(ranker.clone())));
        if let Some(ExtraMetrics(add)) = &cfg.extra_metrics {
            add(&mut metrics.registry);
        }
        let metrics = Arc::new(metrics);
        let replicas = cfg.replicas.clone().map(|r| Replicas::start(r, &ranker)).transpose()?;
        let state = Arc::new(HttpState {
            metrics: metrics.clone(),
            ready: false.into(),
            ranker: ranker.clone(),
            replicas: replicas.clone(),
        });
        let http_task = tokio::spawn({
            let app = router(state.clone(), cfg.auth.token.clone());
            async move { axum::serve(http, app).await }
        });

        let (committer, pipeline) = Committer::start(store.clone(), cfg.commit.clone(), metrics.clone()).await?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let routes = grpc_routes(&cfg, &store, &committer, &ranker, &replicas, &metrics);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = cfg.auth.tls_config() {
            builder = builder.tls_config(tls).map_err(|e| Error::Config(format!("TLS: {e}")))?;
        }
        // Batches are hundreds of KiB: HTTP/2's default 64 KiB windows would
        // make every push wait for window updates.
        let grpc_server = builder
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20))
            .layer(tower::util::MapResponseLayer::new(remap_too_large))
            .add_routes(routes)
            .serve_with_incoming_shutdown(TcpListenerStream::new(grpc), async {
                let _ = stop_rx.await;
            });
        state.ready.store(true, Ordering::Release);
        tracing::info!(grpc = %grpc_addr, http = %http_addr, store = %cfg.store, "ingero serve ready");

        let upkeep = cfg.maintain_every.map(|every| {
            tokio::spawn(maintain(store.clone(), every, upkeep_of(&cfg), replicas.clone(), metrics.clone()))
        });
        let flush = committer.clone();
        let done = tokio::spawn(async move {
            let res = grpc_server.await;
            state.ready.store(false, Ordering::Release);
            // In-flight pushes are answered; write every buffered row before exit.
            let flushed = flush.flush().await;
            drop(flush);
            let _ = pipeline.await;
            http_task.abort();
            if let Some(u) = upkeep {
                u.abort();
            }
            res.map_err(|e| Error::Serve(format!("gRPC server: {e}")))?;
            Ok(flushed?)
        });
        Ok(Server { grpc_addr, http_addr, committer, metrics, store, ranker, replicas, stop: Some(stop_tx), done })
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// Graceful stop: finish in-flight requests, flush everything, return.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        drop(self.committer);
        self.done.await.map_err(|e| Error::Serve(format!("server task: {e}")))?
    }

    /// Runs until `signal` resolves, then shuts down gracefully.
    pub async fn run_until(self, signal: impl std::future::Future<Output = ()>) -> Result<()> {
        signal.await;
        tracing::info!("shutting down: flushing buffered rows");
        self.shutdown().await
    }
}

/// The gRPC services behind the token check: ingest, and what
/// `cfg.extra_routes` adds.
fn grpc_routes(
    cfg: &ServeConfig,
    store: &Store,
    committer: &Committer,
    ranker: &LiveRanker,
    replicas: &Option<Arc<Replicas>>,
    metrics: &Arc<Metrics>,
) -> tonic::service::Routes {
    let rate = Arc::new(crate::ratelimit::RateLimiter::new(cfg.limits.node_rows_per_sec, cfg.limits.node_burst_secs));
    let service = IngestService {
        rate,
        committer: committer.clone(),
        ranker: Some(ranker.clone()),
        limits: cfg.limits.clone(),
        metrics: metrics.clone(),
    };
    // tonic enforces the size limit while decoding; allow a little framing slack
    // so the handler's own check (which names the flag) usually answers first.
    let ingest = IngestServer::new(service)
        .max_decoding_message_size(cfg.limits.max_message_bytes + 1024)
        .accept_compressed(tonic::codec::CompressionEncoding::Zstd)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let check = crate::auth::TokenCheck::new(cfg.auth.token.clone(), metrics.clone());
    let routes = tonic::service::Routes::new(InterceptedService::new(ingest, check.clone()));
    match &cfg.extra_routes {
        Some(ExtraRoutes(add)) => add(routes, &Services { cfg, store, committer, ranker, replicas, check }),
        None => routes,
    }
}

/// tonic answers an over-limit message with OUT_OF_RANGE; gRPC convention
/// (and our contract) is RESOURCE_EXHAUSTED.
fn remap_too_large<B>(mut resp: ::http::Response<B>) -> ::http::Response<B> {
    let h = resp.headers_mut();
    let out_of_range = h.get("grpc-status").is_some_and(|v| v.as_bytes() == b"11");
    // grpc-message is percent-encoded on the wire.
    let msg = h.get("grpc-message").and_then(|m| m.to_str().ok()).unwrap_or_default().replace("%20", " ");
    if out_of_range && msg.contains("too large") {
        h.insert("grpc-status", HeaderValue::from_static("8"));
        if let Ok(v) = HeaderValue::from_str(&format!("batch over --max-message-size: {msg}")) {
            h.insert("grpc-message", v);
        }
    }
    resp
}

/// The retentions maintenance applies.
#[derive(Debug, Clone, Copy)]
struct Upkeep {
    vacuum: std::time::Duration,
    data: ingero_store::retention::Retention,
}

fn upkeep_of(cfg: &ServeConfig) -> Upkeep {
    Upkeep { vacuum: cfg.vacuum_retention, data: cfg.data_retention }
}

/// Expires, compacts and vacuums every `every` the tables this replica looks after
/// (all of them when it is the only one).
async fn maintain(store: Store, every: std::time::Duration, how: Upkeep, set: Option<Arc<Replicas>>, m: Arc<Metrics>) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mine = |t: &str| set.as_ref().is_none_or(|s| s.owns(t));
        match ingero_store::upkeep::run(&store, how.vacuum, &how.data, mine).await {
            Ok(u) if u == Default::default() => {}
            Ok(u) => {
                m.expired_files.inc_by(u.expired.files as u64);
                m.expired_rows.inc_by(u.expired.rows);
                m.expired_bytes.inc_by(u.expired.bytes);
                tracing::info!(
                    expired_files = u.expired.files,
                    expired_rows = u.expired.rows,
                    compacted = u.compacted_files,
                    written = u.written_files,
                    vacuumed = u.deleted_files,
                    log_files_deleted = u.deleted_log_files,
                    high_waters_folded = u.folded_nodes,
                    intents_deleted = u.deleted_intents,
                    "table upkeep"
                );
            }
            Err(e) => tracing::warn!(error = %e, "table upkeep failed; next try in {every:?}"),
        }
    }
}

impl ServeConfig {
    /// Loopback ports chosen by the OS and default limits: for in-process use
    /// (`ingero demo`, tests, benchmarks).
    pub fn ephemeral(store: StoreUrl, store_options: StoreOptions, wal_dir: std::path::PathBuf) -> ServeConfig {
        ServeConfig {
            store,
            store_options,
            listen: "127.0.0.1:0".parse().expect("static address"),
            http_listen: "127.0.0.1:0".parse().expect("static address"),
            commit: CommitConfig { wal_dir, flush_rows: 500_000, flush_age: std::time::Duration::from_secs(30) },
            limits: Limits::default(),
            detector: DetectorConfig::default(),
            grace: std::time::Duration::from_millis(1500),
            auth: Default::default(),
            replicas: None,
            maintain_every: Some(std::time::Duration::from_secs(600)),
            vacuum_retention: std::time::Duration::from_secs(7 * 24 * 3600),
            data_retention: Default::default(),
            extra_routes: None,
            extra_metrics: None,
        }
    }
}
