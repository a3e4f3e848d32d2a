// SPDX-License-Identifier: Apache-2.0
//! Ingest client used by the agent and the tools: encodes tables, assigns
//! sequences, and retries with exponential backoff until the aggregator
//! acknowledges or refuses for good.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow::array::RecordBatch;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::auth::ClientAuth;
use crate::ipc;
use crate::pb::ingest_client::IngestClient as Raw;
use crate::pb::{PushRequest, PushResponse, TableBatch};
use ingero_model::{Error, Table};

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Give up after this long without an acknowledgement (the caller spools).
    pub give_up_after: Duration,
    /// Per-attempt deadline.
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            give_up_after: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The aggregator refused the batch; retrying the same bytes cannot help.
    #[error("aggregator refused the batch: {} ({:?})", .0.message(), .0.code())]
    Rejected(Status),
    /// No acknowledgement within the retry budget; keep the batch and try later.
    #[error("aggregator unavailable after {attempts} attempts: {} ({:?})", .last.message(), .last.code())]
    Unavailable { attempts: u32, last: Status },
    #[error("bad server address `{0}`: {1}")]
    Address(String, String),
    #[error(transparent)]
    Encode(#[from] Error),
}

/// A lazily connected, unauthenticated channel to an aggregator's gRPC address.
pub fn channel(server: &str) -> Result<Channel, SendError> {
    crate::auth::channel(server, &ClientAuth::default()).map_err(|e| SendError::Address(server.into(), e.to_string()))
}

/// Whether a status is worth retrying with the same batch.
pub fn is_retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Internal | Code::Aborted | Code::Cancelled
    )
}

/// A connection to one aggregator for one node.
#[derive(Debug, Clone)]
pub struct IngestClient {
    raw: Raw<Channel>,
    node: String,
    last_sequence: u64,
    policy: RetryPolicy,
    authorization: Option<MetadataValue<Ascii>>,
}

impl IngestClient {
    /// Creates a client; the connection is made on first use, so a server that
    /// is down now is not an error.
    pub fn new(server: &str, node: &str, policy: RetryPolicy) -> Result<Self, SendError> {
        Ok(Self::with_channel(channel(server)?, node, policy))
    }

    /// Like [`Self::new`], with a bearer token and/or TLS.
    pub fn with_auth(server: &str, node: &str, policy: RetryPolicy, auth: &ClientAuth) -> Result<Self, SendError> {
        let ch = crate::auth::channel(server, auth).map_err(|e| SendError::Address(server.into(), e.to_string()))?;
        let mut c = Self::with_channel(ch, node, policy);
        c.authorization = auth.header();
        Ok(c)
    }

    /// A client for one node over a shared connection (many simulated nodes).
    pub fn with_channel(channel: Channel, node: &str, policy: RetryPolicy) -> Self {
        let max = 256 << 20;
        let raw = Raw::new(channel).max_encoding_message_size(max).max_decoding_message_size(max);
        IngestClient { raw, node: node.to_string(), last_sequence: 0, policy, authorization: None }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Next batch sequence. Starts from the wall clock in µs, so sequences keep
    /// increasing across agent restarts without any state on disk.
    pub fn next_sequence(&mut self) -> u64 {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as u64;
        self.last_sequence = now.max(self.last_sequence + 1);
        self.last_sequence
    }

    /// Makes sure later sequences are above one seen before (e.g. in a spool).
    pub fn advance_past(&mut self, sequence: u64) {
        self.last_sequence = self.last_sequence.max(sequence);
    }

    /// Encodes tables into a request with a fresh sequence.
    pub fn request(&mut self, tables: &[(Table, RecordBatch)]) -> Result<PushRequest, SendError> {
        let mut out = Vec::with_capacity(tables.len());
        for (t, b) in tables {
            if b.num_rows() == 0 {
                continue;
            }
            out.push(TableBatch {
                table: t.name().to_string(),
                arrow_ipc: ipc::encode(&t.schema(), std::slice::from_ref(b))?.into(),
            });
        }
        Ok(PushRequest { node: self.node.clone(), sequence: self.next_sequence(), tables: out })
    }

    /// Sends one request, retrying transient failures with exponential
    /// backoff and jitter. The same sequence is reused on every attempt, so
    /// the aggregator stores it at most once.
    pub async fn push(&mut self, req: &PushRequest) -> Result<PushResponse, SendError> {
        let started = tokio::time::Instant::now();
        let mut backoff = self.policy.initial_backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut r = tonic::Request::new(req.clone());
            r.set_timeout(self.policy.attempt_timeout);
            if let Some(a) = &self.authorization {
                r.metadata_mut().insert("authorization", a.clone());
            }
            let err = match tokio::time::timeout(self.policy.attempt_timeout, self.raw.push(r)).await {
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) if !is_retryable(status.code()) => return Err(SendError::Rejected(status)),
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded("no answer within the attempt timeout"),
            };
            if started.elapsed() + backoff > self.policy.give_up_after {
                return Err(SendError::Unavailable { attempts, last: err });
            }
            tracing::debug!(attempts, code = ?err.code(), message = err.message(), "push failed; retrying");
            tokio::time::sleep(jitter(backoff)).await;
            backoff = (backoff * 2).min(self.policy.max_backoff);
        }
    }

    /// Encodes and sends in one call.
    pub async fn send(&mut self, tables: &[(Table, RecordBatch)]) -> Result<PushResponse, SendError> {
        let req = self.request(tables)?;
        self.push(&req).await
    }
}

/// 50–100 % of `d`, so many agents restarting together do not retry in lockstep.
fn jitter(d: Duration) -> Duration {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos() as u64;
    let mut x = nanos ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    d / 2 + Duration::from_nanos(x % (d.as_nanos() as u64 / 2 + 1))
}
