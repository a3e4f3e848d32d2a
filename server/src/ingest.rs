// SPDX-License-Identifier: Apache-2.0
//! gRPC `Ingest` service: validate a pushed batch, hand it to the committer,
//! acknowledge once durable.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use ingero_model::Table;
use ingero_model::tables::common;
use ingero_proto::ipc;
use ingero_proto::pb::ingest_server::Ingest;
use ingero_proto::pb::{ForwardRequest, ForwardResponse, HandoverRequest, HandoverResponse, PushResponse};
use ingero_proto::received::ReceivedPush;
use tonic::{Request, Response, Status};

use ingero_store::commit::{Accepted, Committer};
use ingero_store::error::Error;
use ingero_store::metrics::Metrics;

/// Limits applied to every pushed batch.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest accepted request (encoded protobuf bytes).
    pub max_message_bytes: usize,
    /// Largest decoded row count of one request.
    pub max_rows: usize,
    /// How far in the future a window may start (clock skew allowance).
    pub max_future: Duration,
    /// How far in the past a window may start (spooled data arrives late).
    pub max_age: Duration,
    /// Rows per second one node may push (0 = unlimited), with a burst of
    /// `node_burst_secs` seconds of it (a spool drained after an outage).
    pub node_rows_per_sec: u64,
    pub node_burst_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 64 << 20,
            max_rows: 4_000_000,
            max_future: Duration::from_secs(600),
            max_age: Duration::from_secs(7 * 24 * 3600),
            node_rows_per_sec: 0,
            node_burst_secs: 60,
        }
    }
}

#[derive(Debug)]
pub struct IngestService {
    pub committer: Committer,
    pub ranker: Option<crate::rank::LiveRanker>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub rate: Arc<crate::ratelimit::RateLimiter>,
}

#[tonic::async_trait]
impl Ingest for IngestService {
    async fn push(&self, request: Request<ReceivedPush>) -> Result<Response<PushResponse>, Status> {
        let req = request.into_inner();
        let accepted = match validate(req, &self.limits) {
            Ok(a) => a,
            Err(status) => {
                let reason = match status.code() {
                    tonic::Code::ResourceExhausted => "too_large",
                    _ => "invalid_argument",
                };
                self.metrics.reject(reason);
                tracing::debug!(reason, message = status.message(), "batch refused");
                return Err(status);
            }
        };
        if !self.rate.admit(&accepted.node, accepted.rows, std::time::Instant::now()) {
            self.metrics.reject("rate_limited");
            return Err(Status::unavailable(format!(
                "node `{}` is over its {} rows/s; keep the batch and retry later (--node-rows-per-sec)",
                accepted.node, self.limits.node_rows_per_sec
            )));
        }
        let node = accepted.node.clone();
        // The signals were computed once, at validation: the tiers get them
        // with the batch, the live detector a copy (a few per node-window).
        let for_ranking = self.ranker.as_ref().map(|_| accepted.signals.clone());
        match self.committer.push(accepted).await {
            Ok(ack) => {
                if let (Some(r), Some(t), false) = (&self.ranker, for_ranking, ack.duplicate) {
                    r.feed(t);
                }
                Ok(Response::new(PushResponse {
                    duplicate: ack.duplicate,
                    rows: ack.rows,
                    committed_sequence: self.committer.committed(&node),
                    reports_commits: true,
                }))
            }
            Err(e @ Error::ShuttingDown) => Err(Status::unavailable(e.to_string())),
            Err(e) => Err(Status::unavailable(format!("batch not stored, retry later: {e}"))),
        }
    }

    async fn forward(&self, request: Request<ForwardRequest>) -> Result<Response<ForwardResponse>, Status> {
        let req = request.into_inner();
        let sigs = crate::replicas::decode(&req.signals_json).map_err(Status::invalid_argument)?;
        let n = sigs.len() as u64;
        let Some(r) = &self.ranker else { return Err(Status::unimplemented("this server does not rank")) };
        r.heard_from(&req.from);
        match req.standby {
            true if n > 0 => r.feed_kept(sigs),
            true => {}
            false => r.feed_signals(sigs),
        }
        tracing::trace!(from = %req.from, signals = n, standby = req.standby, "forwarded signals");
        Ok(Response::new(ForwardResponse { accepted: n }))
    }

    async fn handover(&self, request: Request<HandoverRequest>) -> Result<Response<HandoverResponse>, Status> {
        let req = request.into_inner();
        let Some(r) = &self.ranker else { return Err(Status::unimplemented("this server does not rank")) };
        r.heard_from(&req.from);
        let sigs = r.recent_of(&req.job);
        tracing::debug!(from = %req.from, job = %req.job, signals = sigs.len(), "job's recent windows handed over");
        let signals_json = serde_json::to_string(&sigs).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(HandoverResponse { signals_json }))
    }
}

/// Checks a request against the contract; every refusal names the problem.
/// The WAL gets the frame as received (no second encoding).
pub fn validate(push: ReceivedPush, limits: &Limits) -> Result<Accepted, Status> {
    let ReceivedPush { request: req, frame } = push;
    let size = frame.len();
    if size > limits.max_message_bytes {
        return Err(Status::resource_exhausted(format!(
            "batch is {size} bytes, the limit is {} bytes (--max-message-size)",
            limits.max_message_bytes
        )));
    }
    if req.node.is_empty() || req.node.len() > 253 || req.node.chars().any(|c| c.is_control()) {
        return Err(Status::invalid_argument("`node` must be 1-253 printable characters"));
    }
    if req.sequence == 0 {
        return Err(Status::invalid_argument("`sequence` must be > 0"));
    }
    if req.tables.is_empty() {
        return Err(Status::invalid_argument("batch has no tables"));
    }
    let now_us = chrono::Utc::now().timestamp_micros();
    let lo = now_us - limits.max_age.as_micros() as i64;
    let hi = now_us + limits.max_future.as_micros() as i64;
    let mut tables: Vec<(Table, Vec<RecordBatch>)> = Vec::with_capacity(req.tables.len());
    let mut rows = 0usize;
    let mut ipc_bytes = 0u64;
    for t in &req.tables {
        let table = Table::from_name(&t.table).ok_or_else(|| {
            let known: Vec<_> = Table::ALL.iter().map(|t| t.name()).collect();
            Status::invalid_argument(format!("unknown table `{}` (known: {})", t.table, known.join(", ")))
        })?;
        if tables.iter().any(|(seen, _)| *seen == table) {
            return Err(Status::invalid_argument(format!("table `{table}` appears twice in one batch")));
        }
        let batches = ipc::decode(table, &t.arrow_ipc, limits.max_rows - rows).map_err(|e| match e {
            ingero_model::Error::TooLarge(m) => Status::resource_exhausted(format!("{m} (--max-batch-rows)")),
            other => Status::invalid_argument(other.to_string()),
        })?;
        for b in &batches {
            check_rows(table, b, &req.node, lo, hi)?;
            ingero_model::values::check(table, b).map_err(Status::invalid_argument)?;
            rows += b.num_rows();
        }
        ipc_bytes += t.arrow_ipc.len() as u64;
        tables.push((table, batches));
    }
    let signals = ingero_model::signals::of_tables(&tables);
    Ok(Accepted { node: req.node, sequence: req.sequence, raw: frame, tables, signals, rows: rows as u64, ipc_bytes })
}

/// Value checks: rows belong to the sending node and windows are in a sane time range.
fn check_rows(table: Table, b: &RecordBatch, node: &str, lo: i64, hi: i64) -> Result<(), Status> {
    let nodes = b.column(common::NODE).as_any().downcast_ref::<StringArray>();
    if let Some(nodes) = nodes
        && let Some(i) = (0..nodes.len()).find(|&i| nodes.value(i) != node)
    {
        return Err(Status::invalid_argument(format!(
            "{table}: row {i} has node `{}` but the batch is from `{node}`",
            nodes.value(i)
        )));
    }
    if let Some(ts) = b.column(common::WINDOW_START).as_any().downcast_ref::<TimestampMicrosecondArray>() {
        let (min, max) = (arrow::compute::min(ts), arrow::compute::max(ts));
        if let (Some(min), Some(max)) = (min, max)
            && (min < lo || max > hi)
        {
            let bad = if min < lo { min } else { max };
            return Err(Status::invalid_argument(format!(
                "{table}: window_start {} is outside the accepted range [{}, {}] (--max-age / --max-future)",
                fmt_us(bad),
                fmt_us(lo),
                fmt_us(hi)
            )));
        }
    }
    Ok(())
}

fn fmt_us(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us).map_or_else(|| us.to_string(), |t| t.to_rfc3339())
}
