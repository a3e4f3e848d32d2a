// SPDX-License-Identifier: Apache-2.0
//! An ingest client for one node over a set of aggregator replicas: it
//! sends to the node's first choice (rendezvous hash, [`crate::route`]),
//! moves to its next choice when that one stops answering, and goes back
//! once the first choice accepts connections again. With one URL it is a
//! plain [`IngestClient`].
//!
//! On every change of replica the caller sends again, oldest first, what
//! the replica left behind acknowledged but has not reported committed:
//! the replica in use then holds every batch of the node not yet in the
//! store, which is what lets writers drop, at commit, whatever another
//! writer committed first (see the aggregator's `store::flush`).

use std::time::{Duration, Instant};

use arrow::array::RecordBatch;

use crate::auth::ClientAuth;
use crate::client::{IngestClient, RetryPolicy, SendError};
use crate::pb::{PushRequest, PushResponse};
use crate::route::rendezvous;
use ingero_model::Table;

/// How long after a move the first choice is tried again.
const RETURN_AFTER: Duration = Duration::from_secs(15);

/// With single-attempt pushes (the caller retries), how long the replica in
/// use may go without answering, over however many pushes, before the next
/// choice takes over. A client that retries itself moves when its own retry
/// budget (`give_up_after`) is spent.
pub const FAILOVER_AFTER: Duration = Duration::from_secs(2);

/// With several replicas, the longest one attempt waits for an answer once
/// its request is uploaded (`RetryPolicy::deadline` adds the upload at the
/// slowest link allowed for, so a spooled backlog is not cut off): a
/// replica that is up acknowledges a batch once its write-ahead log has it
/// (milliseconds); one that is frozen (stopped, swapping, a stalled disk)
/// accepts the connection and never answers, and waiting the single-server
/// deadline (10 s) for it would keep the node's windows from its job's
/// detector that long. Another replica takes the batch instead; a batch both
/// end up with is stored once (the commit-time check).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// `policy` for a node that has other replicas to go to.
fn for_set(mut policy: RetryPolicy, replicas: usize) -> RetryPolicy {
    if replicas > 1 {
        policy.attempt_timeout = policy.attempt_timeout.min(ANSWER_WITHIN);
    }
    policy
}

/// Why the replica in use changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// The replica in use stopped answering: batches it acknowledged but
    /// has not committed may never reach the store and must be sent again.
    Failover,
}

#[derive(Debug, Clone)]
pub struct RoutedClient {
    urls: Vec<String>,
    clients: Vec<IngestClient>,
    /// Indices of `urls` in this node's order of preference.
    order: Vec<usize>,
    /// Position in `order` of the replica in use.
    pos: usize,
    moved_at: Option<Instant>,
    pending: Option<Move>,
    /// Start of the first push of the current run of unanswered ones.
    failing_since: Option<Instant>,
    /// The clients retry within a push (`give_up_after` > 0).
    retries_inside: bool,
}

impl RoutedClient {
    pub fn new(urls: &[String], node: &str, policy: RetryPolicy, auth: &ClientAuth) -> Result<Self, SendError> {
        if urls.is_empty() {
            return Err(SendError::Address(String::new(), "no aggregator address".into()));
        }
        let policy = for_set(policy, urls.len());
        let clients = urls
            .iter()
            .map(|u| IngestClient::with_auth(u, node, policy.clone(), auth))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RoutedClient {
            urls: urls.to_vec(),
            clients,
            order: rendezvous(node, urls),
            pos: 0,
            moved_at: None,
            pending: None,
            failing_since: None,
            retries_inside: !policy.give_up_after.is_zero(),
        })
    }

    /// Over connections shared by many nodes (simulated fleets): one
    /// `(url, channel)` per replica, in the set's order.
    pub fn with_channels(replicas: &[(String, tonic::transport::Channel)], node: &str, policy: RetryPolicy) -> Self {
        let urls: Vec<String> = replicas.iter().map(|(u, _)| u.clone()).collect();
        let policy = for_set(policy, urls.len());
        let clients =
            replicas.iter().map(|(_, ch)| IngestClient::with_channel(ch.clone(), node, policy.clone())).collect();
        RoutedClient {
            order: rendezvous(node, &urls),
            urls,
            clients,
            pos: 0,
            moved_at: None,
            pending: None,
            failing_since: None,
            retries_inside: !policy.give_up_after.is_zero(),
        }
    }

    /// The replica in use.
    pub fn current(&self) -> &str {
        &self.urls[self.order[self.pos]]
    }

    /// Encodes tables into a request with a fresh sequence (one sequence
    /// space per node, whichever replica receives it).
    pub fn request(&mut self, tables: &[(Table, RecordBatch)]) -> Result<PushRequest, SendError> {
        self.clients[0].request(tables)
    }

    pub fn advance_past(&mut self, sequence: u64) {
        self.clients[0].advance_past(sequence);
    }

    /// Takes the replica choice of a clone that did the sending (sequences
    /// stay this client's).
    pub fn adopt_route(&mut self, sender: &RoutedClient) {
        self.pos = sender.pos;
        self.moved_at = sender.moved_at;
        self.pending = sender.pending.or(self.pending);
        self.failing_since = sender.failing_since;
    }

    /// The last change of replica, once.
    pub fn take_move(&mut self) -> Option<Move> {
        self.pending.take()
    }

    /// Sends to the replica in use; when it has not answered for
    /// [`FAILOVER_AFTER`] (this push and the unanswered ones before it), the
    /// next push goes to the next choice.
    pub async fn push(&mut self, req: &PushRequest) -> Result<PushResponse, SendError> {
        let started = Instant::now();
        let res = self.clients[self.order[self.pos]].push(req).await;
        if !matches!(res, Err(SendError::Unavailable { .. })) {
            self.failing_since = None;
            return res;
        }
        let since = *self.failing_since.get_or_insert(started);
        if self.urls.len() > 1 && (self.retries_inside || since.elapsed() >= FAILOVER_AFTER) {
            let from = self.current().to_string();
            self.pos = (self.pos + 1) % self.order.len();
            self.moved_at = Some(Instant::now());
            self.pending = Some(Move::Failover);
            self.failing_since = None;
            tracing::warn!(from = %from, to = %self.current(), "aggregator replica not answering; moving to the next");
        }
        res
    }

    /// After [`RETURN_AFTER`], goes back to the first choice if it accepts
    /// a connection; true when it did. Call it before choosing the next
    /// batch: after a return, the batches the replica left behind has not
    /// committed go first (a replica takes a node's sequences in order).
    pub async fn return_if_due(&mut self) -> bool {
        if self.pos == 0 || self.moved_at.is_none_or(|t| t.elapsed() < RETURN_AFTER) {
            return false;
        }
        self.moved_at = Some(Instant::now());
        let url = self.urls[self.order[0]].clone();
        if reachable(&url).await {
            tracing::info!(to = %url, "first-choice aggregator replica is back; returning");
            self.pos = 0;
            self.failing_since = None;
            return true;
        }
        false
    }
}

/// True when a TCP connection to the URL's host and port opens within 1 s.
async fn reachable(url: &str) -> bool {
    let Ok(u) = url.parse::<tonic::codegen::http::Uri>() else { return false };
    let Some(host) = u.host() else { return false };
    let port = u.port_u16().unwrap_or(if u.scheme_str() == Some("https") { 443 } else { 80 });
    let addr = format!("{}:{port}", host.trim_start_matches('[').trim_end_matches(']'));
    tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr)).await.is_ok_and(|r| r.is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::tests::{closed_port, empty_request};

    #[tokio::test]
    async fn single_attempt_pushes_move_on_only_after_the_replica_has_been_silent_for_failover_after() {
        let urls = vec![closed_port(), closed_port()];
        let mut c = RoutedClient::new(&urls, "node-a", RetryPolicy::single_attempt(), &ClientAuth::default()).unwrap();
        let first = c.current().to_string();
        assert!(matches!(c.push(&empty_request()).await, Err(SendError::Unavailable { .. })));
        assert_eq!(c.take_move(), None, "one refused attempt is not an outage");
        assert_eq!(c.current(), first);
        tokio::time::sleep(FAILOVER_AFTER).await;
        assert!(matches!(c.push(&empty_request()).await, Err(SendError::Unavailable { .. })));
        assert_eq!(c.take_move(), Some(Move::Failover));
        assert_ne!(c.current(), first);
    }

    #[tokio::test]
    async fn a_client_that_retries_itself_moves_on_when_its_own_budget_is_spent() {
        let urls = vec![closed_port(), closed_port()];
        let p = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            give_up_after: Duration::from_millis(100),
            ..Default::default()
        };
        let mut c = RoutedClient::new(&urls, "node-a", p, &ClientAuth::default()).unwrap();
        let first = c.current().to_string();
        assert!(matches!(c.push(&empty_request()).await, Err(SendError::Unavailable { .. })));
        assert_eq!(c.take_move(), Some(Move::Failover));
        assert_ne!(c.current(), first);
    }

    #[tokio::test]
    async fn a_replica_that_accepts_and_never_answers_is_left_within_answer_within() {
        // A frozen replica: the kernel accepts the connection, nobody answers.
        let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let urls = vec![format!("http://{}", frozen.local_addr().unwrap()), closed_port()];
        std::thread::spawn(move || {
            let held: Vec<_> = frozen.incoming().collect();
            drop(held);
        });
        let node = (0..).map(|i| format!("node-{i}")).find(|n| rendezvous(n, &urls)[0] == 0).unwrap();
        let mut c = RoutedClient::new(&urls, &node, RetryPolicy::single_attempt(), &ClientAuth::default()).unwrap();
        assert_eq!(c.current(), urls[0]);
        let t = std::time::Instant::now();
        assert!(matches!(c.push(&empty_request()).await, Err(SendError::Unavailable { .. })));
        assert_eq!(c.take_move(), Some(Move::Failover), "after {:?}", t.elapsed());
        assert_eq!(c.current(), urls[1]);
        assert!(t.elapsed() < ANSWER_WITHIN + Duration::from_secs(1), "left after {:?}", t.elapsed());
    }
}
