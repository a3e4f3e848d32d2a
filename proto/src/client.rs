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

/// How one push is retried: the only retry loop on the edge that uses it.
/// A caller with its own loop (the agent's shipper, which spools while it
/// waits) sends with [`RetryPolicy::single_attempt`] and takes its waits
/// from [`RetryPolicy::backoff`].
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Give up after this long without an acknowledgement (the caller spools).
    pub give_up_after: Duration,
    /// Per-attempt deadline for an answer, on top of the time the request
    /// takes to upload at [`SLOWEST_LINK`] ([`RetryPolicy::deadline`]).
    pub attempt_timeout: Duration,
}

/// The slowest node-to-aggregator link an attempt's deadline allows for
/// (bytes/s; 100 Mbit/s): a spooled backlog of 64 MiB must not be cut off
/// every attempt for taking longer to upload than a window takes to answer.
pub const SLOWEST_LINK: u64 = 12_500_000;

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

/// Waits between attempts: exponential, each with 0–100 % added at random
/// so that many agents restarting together do not retry in lockstep.
pub type Backoff = backon::ExponentialBackoff;

impl RetryPolicy {
    /// The deadline of one attempt to send `bytes`: the answer's deadline
    /// plus the upload at [`SLOWEST_LINK`].
    pub fn deadline(&self, bytes: usize) -> Duration {
        self.attempt_timeout + Duration::from_micros(bytes as u64 * 1_000_000 / SLOWEST_LINK)
    }

    /// One attempt per push; the caller decides when to try again.
    pub fn single_attempt() -> Self {
        RetryPolicy { give_up_after: Duration::ZERO, ..Default::default() }
    }

    /// The waits between attempts, without end (`give_up_after` is checked
    /// against the time since the first attempt, which includes the attempts).
    pub fn backoff(&self) -> Backoff {
        use backon::BackoffBuilder;
        backon::ExponentialBuilder::new()
            .with_min_delay(self.initial_backoff)
            .with_max_delay(self.max_backoff)
            .with_jitter()
            .without_max_times()
            .build()
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

    /// Next batch sequence: the wall clock in µs, or one above the last
    /// sequence (this client's, or one given to `advance_past`), whichever is
    /// higher. The agent's spool records its highest sequence and passes it
    /// in at start, so a clock stepped back never reuses a sequence the
    /// aggregator would take for a duplicate.
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
        let mut waits = self.policy.backoff();
        let mut attempts = 0;
        let deadline = self.policy.deadline(prost::Message::encoded_len(req));
        loop {
            attempts += 1;
            let mut r = tonic::Request::new(req.clone());
            r.set_timeout(deadline);
            if let Some(a) = &self.authorization {
                r.metadata_mut().insert("authorization", a.clone());
            }
            let err = match tokio::time::timeout(deadline, self.raw.push(r)).await {
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) if !is_retryable(status.code()) => return Err(SendError::Rejected(status)),
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded("no answer within the attempt timeout"),
            };
            let wait = waits.next().unwrap_or(self.policy.max_backoff);
            if started.elapsed() + wait > self.policy.give_up_after {
                return Err(SendError::Unavailable { attempts, last: err });
            }
            tracing::debug!(attempts, code = ?err.code(), message = err.message(), "push failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// Encodes and sends in one call.
    pub async fn send(&mut self, tables: &[(Table, RecordBatch)]) -> Result<PushResponse, SendError> {
        let req = self.request(tables)?;
        self.push(&req).await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An address nothing listens on: connections are refused at once.
    pub(crate) fn closed_port() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    }

    pub(crate) fn empty_request() -> PushRequest {
        PushRequest { node: "node-a".into(), sequence: 1, tables: vec![] }
    }

    /// The spool recorded a sequence from before the clock stepped back an
    /// hour: the next ones go on above it, not from the clock.
    #[tokio::test]
    async fn after_a_clock_step_back_sequences_continue_above_the_recorded_one() {
        let mut c = IngestClient::new(&closed_port(), "node-a", RetryPolicy::single_attempt()).unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
        let recorded = now + 3_600_000_000;
        c.advance_past(recorded);
        let (a, b) = (c.next_sequence(), c.next_sequence());
        assert!(recorded < a && a < b, "{recorded} {a} {b}");
    }

    #[test]
    fn waits_double_from_the_first_to_the_cap_each_with_up_to_as_much_again_at_random() {
        let p = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..Default::default()
        };
        let waits: Vec<Duration> = p.backoff().take(12).collect();
        assert_eq!(waits.len(), 12, "the schedule must not end: the caller decides when to stop");
        for (i, w) in waits.iter().enumerate() {
            let base = (p.initial_backoff * 2u32.pow(i as u32)).min(p.max_backoff);
            assert!(*w >= base && *w < base * 2, "wait {i} = {w:?}, base {base:?}");
        }
        let again: Vec<Duration> = p.backoff().take(12).collect();
        assert_ne!(waits, again, "two agents must not wait in lockstep");
    }

    /// A frozen aggregator (the kernel accepts, nobody answers): an attempt
    /// gives up at its deadline, which grows with what it has to upload.
    #[tokio::test]
    async fn an_attempt_waits_longer_for_a_bigger_request() {
        let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", frozen.local_addr().unwrap());
        std::thread::spawn(move || {
            let held: Vec<_> = frozen.incoming().collect();
            drop(held);
        });
        let p = RetryPolicy { attempt_timeout: Duration::from_millis(300), ..RetryPolicy::single_attempt() };
        let payload = prost::bytes::Bytes::from(vec![0u8; SLOWEST_LINK as usize]);
        let big = PushRequest {
            tables: vec![TableBatch { table: "call_windows".into(), arrow_ipc: payload }],
            ..empty_request()
        };
        let slow = Duration::from_millis(1300);
        assert!(p.deadline(prost::Message::encoded_len(&big)) >= slow, "a second of upload allowed for");
        let mut c = IngestClient::new(&url, "node-a", p).unwrap();
        let timed = async |c: &mut IngestClient, r: &PushRequest| {
            let t = std::time::Instant::now();
            assert!(matches!(c.push(r).await, Err(SendError::Unavailable { .. })));
            t.elapsed()
        };
        let small = timed(&mut c, &empty_request()).await;
        let large = timed(&mut c, &big).await;
        assert!(large >= slow, "the big request was cut off after {large:?}");
        assert!(small < slow, "the empty request waited {small:?}");
    }

    #[tokio::test]
    async fn a_single_attempt_policy_tries_once_and_leaves_retrying_to_the_caller() {
        let mut c = IngestClient::new(&closed_port(), "node-a", RetryPolicy::single_attempt()).unwrap();
        match c.push(&empty_request()).await {
            Err(SendError::Unavailable { attempts, .. }) => assert_eq!(attempts, 1),
            other => panic!("expected one refused attempt, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_retrying_policy_tries_again_until_its_budget_is_spent() {
        let p = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
            give_up_after: Duration::from_secs(1),
            attempt_timeout: Duration::from_secs(1),
        };
        let mut c = IngestClient::new(&closed_port(), "node-a", p.clone()).unwrap();
        let t = tokio::time::Instant::now();
        match c.push(&empty_request()).await {
            Err(SendError::Unavailable { attempts, .. }) => assert!(attempts >= 3, "{attempts} attempts"),
            other => panic!("expected the budget to run out, got {other:?}"),
        }
        // It never sleeps past the budget; an attempt itself may take a little.
        assert!(t.elapsed() < p.give_up_after + p.attempt_timeout, "{:?}", t.elapsed());
    }
}
