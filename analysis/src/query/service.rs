// SPDX-License-Identifier: Apache-2.0
//! gRPC `Query` service: live/history stragglers, read-only SQL, reports.
//! The server knows nothing of it: [`with_query`] plugs it in through
//! [`ServeConfig::extra_routes`], behind the same token check as ingest.

use ingero_proto::ipc;
use ingero_proto::pb::query_server::Query;
use ingero_proto::pb::{JsonResponse, ReportRequest, SqlRequest, SqlResponse, StragglersRequest};
use tonic::{Request, Response, Status};

use crate::query::{QueryEngine, QueryLimits};
use crate::rank::LiveRanker;
use crate::rank::detector::DetectorConfig;
use crate::rank::history::{self, HistoryRequest};
use crate::report::{self, Target};
use ingero_server::{ExtraRoutes, ServeConfig, Services};
use ingero_store::Store;
use ingero_store::commit::Committer;

#[derive(Debug)]
pub(crate) struct QueryService {
    pub store: Store,
    pub ranker: LiveRanker,
    pub limits: QueryLimits,
    pub detector: DetectorConfig,
    /// Flushed before a query so it sees every acknowledged row, not only
    /// what `--flush-age` has written out (a report asked right after a
    /// flag must include the windows that caused it).
    pub committer: Committer,
    pub last_flush: tokio::sync::Mutex<Option<std::time::Instant>>,
    pub replicas: Option<std::sync::Arc<ingero_server::replicas::Replicas>>,
}

/// `cfg` serving the query service too (stragglers, SQL, reports), with
/// these limits on every query.
pub fn with_query(mut cfg: ServeConfig, limits: QueryLimits) -> ServeConfig {
    cfg.extra_routes = Some(ExtraRoutes::new(move |routes, s| add_routes(routes, s, limits.clone())));
    cfg
}

fn add_routes(routes: tonic::service::Routes, s: &Services<'_>, limits: QueryLimits) -> tonic::service::Routes {
    use ingero_proto::pb::query_server::QueryServer;
    use tonic::service::interceptor::InterceptedService;
    let mut query = QueryService::new(s.store, s.ranker, s.cfg, s.committer, limits);
    query.replicas = s.replicas.clone();
    routes.add_service(InterceptedService::new(QueryServer::new(query), s.check.clone()))
}

/// Queries within this long of a flush reuse it (no file per query).
const FLUSH_REUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// Start of a range from the request: absolute when given, else `since` ago.
pub(crate) fn range(since_secs: u64, start_us: i64) -> (i64, i64) {
    let now = chrono::Utc::now().timestamp_micros();
    let start = if start_us != 0 { start_us } else { now - since_secs as i64 * 1_000_000 };
    (start, now + 1)
}

fn internal(e: impl Into<crate::Error>) -> Status {
    match e.into() {
        crate::Error::NoData(m) => Status::not_found(m),
        e @ crate::Error::QueryTimeout(_) => Status::deadline_exceeded(e.to_string()),
        e if e.is_input_error() => Status::invalid_argument(e.to_string()),
        other => Status::internal(other.to_string()),
    }
}

impl QueryService {
    pub(crate) fn new(
        store: &Store,
        ranker: &LiveRanker,
        cfg: &ServeConfig,
        committer: &Committer,
        limits: QueryLimits,
    ) -> Self {
        QueryService {
            store: store.clone(),
            ranker: ranker.clone(),
            limits,
            detector: cfg.detector.clone(),
            committer: committer.clone(),
            last_flush: Default::default(),
            replicas: None,
        }
    }

    /// An engine over everything acknowledged so far.
    async fn engine(&self) -> Result<QueryEngine, Status> {
        {
            let mut last = self.last_flush.lock().await;
            if last.is_none_or(|t| t.elapsed() >= FLUSH_REUSE) {
                self.committer.flush().await.map_err(internal)?;
                *last = Some(std::time::Instant::now());
            }
        }
        QueryEngine::open(&self.store, self.limits.clone()).await.map_err(internal)
    }
}

#[tonic::async_trait]
impl Query for QueryService {
    async fn sql(&self, request: Request<SqlRequest>) -> Result<Response<SqlResponse>, Status> {
        let q = request.into_inner().query;
        crate::query::check_read_only(&q).map_err(internal)?;
        let batches = self.engine().await?.sql(&q).await.map_err(internal)?;
        let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
        let bytes = match batches.first() {
            Some(b) => ipc::encode(&b.schema(), &batches).map_err(|e| Status::internal(e.to_string()))?,
            None => Vec::new(),
        };
        Ok(Response::new(SqlResponse { arrow_ipc: bytes.into(), rows }))
    }

    async fn stragglers(&self, request: Request<StragglersRequest>) -> Result<Response<JsonResponse>, Status> {
        let r = request.into_inner();
        let job = (!r.job.is_empty()).then_some(r.job.as_str());
        let ranking = if r.since_secs == 0 && r.start_us == 0 {
            match &self.replicas {
                Some(set) if !r.local_only => set.fleet_ranking(job).await,
                _ => self.ranker.ranking(job),
            }
        } else {
            let (start_us, end_us) = range(r.since_secs, r.start_us);
            let req = HistoryRequest { start_us, end_us, job: job.map(String::from), resolution: None };
            let cfg = DetectorConfig { timeline: r.timeline, ..self.detector.clone() };
            history::rank(&self.engine().await?, &req, cfg).await.map_err(internal)?
        };
        let json = serde_json::to_string(&ranking).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(JsonResponse { json }))
    }

    async fn report(&self, request: Request<ReportRequest>) -> Result<Response<JsonResponse>, Status> {
        let r = request.into_inner();
        let target = Target::parse(&r.kind, &r.target).map_err(Status::invalid_argument)?;
        let (start_us, end_us) = range(r.since_secs, r.start_us);
        let rep = report::build(&self.engine().await?, &target, start_us, end_us, self.detector.clone())
            .await
            .map_err(internal)?;
        let json = serde_json::to_string(&rep).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(JsonResponse { json }))
    }
}
