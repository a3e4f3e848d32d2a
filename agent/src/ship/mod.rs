// SPDX-License-Identifier: Apache-2.0
//! Shipping windows to the aggregator: spool first, send in order, retry.

pub(crate) mod spool;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ingero_model::Tables;
use ingero_proto::client::{Backoff, RetryPolicy, SendError};
use ingero_proto::pb::{PushRequest, PushResponse};
use ingero_proto::routed::{Move, RoutedClient};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Code;

use spool::Spool;

/// Counters shared with the metrics endpoint and the node_windows rows.
#[derive(Default)]
pub(crate) struct ShipStats {
    pub sent: AtomicU64,
    pub rejected: AtomicU64,
    /// Shared with the probe loop, which reports it in node_windows.
    pub dropped: Arc<AtomicU64>,
    pub spooled: AtomicU64,
    /// Windows in a row that could not be spooled (lost), and why the last
    /// could not: `/healthz` is unhealthy while the agent is losing data.
    pub lost_in_a_row: AtomicU64,
    pub lost_why: std::sync::Mutex<String>,
    /// Since when (ms since the Unix epoch) the aggregator has not taken a
    /// batch; 0 while it does. And which one was tried last.
    pub unreachable_since_ms: AtomicU64,
    pub target: std::sync::Mutex<String>,
}

impl ShipStats {
    fn lost(&self, why: String) {
        self.lost_in_a_row.fetch_add(1, Ordering::Relaxed);
        *self.lost_why.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = why;
    }

    fn reached(&self, yes: bool, target: &str) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        if yes {
            self.unreachable_since_ms.store(0, Ordering::Relaxed);
        } else {
            let _ = self.unreachable_since_ms.compare_exchange(
                0,
                now.as_millis() as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        *self.target.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = target.to_string();
    }
}

/// Ships every window it receives: spool first, then send the oldest
/// spooled batch, in order, with retry; a window that arrives while a send
/// is retrying goes to disk at once.
pub(crate) struct Shipper {
    rx: mpsc::Receiver<Tables>,
    client: RoutedClient,
    spool: Spool,
    stats: Arc<ShipStats>,
    /// After the probe loop stops, how long to keep trying to empty the spool.
    drain_timeout: Duration,
    closing: Option<Instant>,
    /// Waits before the next try while the aggregator does not answer.
    backoff: Backoff,
}

/// The one retry policy of the agent -> aggregator edge: the client makes a
/// single attempt per push and this loop waits and tries again (spooling
/// what arrives meanwhile), so no retry loop sits inside another.
pub(crate) fn policy() -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(5),
        ..RetryPolicy::single_attempt()
    }
}

impl Shipper {
    pub(crate) fn new(
        rx: mpsc::Receiver<Tables>,
        mut client: RoutedClient,
        spool: Spool,
        stats: Arc<ShipStats>,
        drain_timeout: Duration,
    ) -> Shipper {
        client.advance_past(spool.max_sequence());
        Shipper { rx, client, spool, stats, drain_timeout, closing: None, backoff: policy().backoff() }
    }

    /// Returns when the channel closes and the spool is empty, or when
    /// `drain_timeout` passes after that with the aggregator still down.
    pub(crate) async fn run(mut self) {
        self.ship().await;
        // As they are at the end (the stop's log line reads them): the last
        // batch sent is no longer waiting.
        self.publish();
    }

    fn publish(&self) {
        self.stats.dropped.store(self.spool.dropped, Ordering::Relaxed);
        self.stats.spooled.store(self.spool.files().len() as u64, Ordering::Relaxed);
    }

    async fn ship(&mut self) {
        while self.take_new().await {
            self.publish();
            if self.client.return_if_due().await {
                // The replica left behind commits what it acknowledged, but
                // the first choice must hold it too: whichever commits
                // first stores it, the other drops it (oldest first, so the
                // first choice takes the node's sequences in order).
                let n = self.spool.requeue_acked();
                tracing::info!(to = %self.client.current(), resent = n, "back to the first-choice replica");
            }
            let Some((path, req)) = self.spool.oldest() else { continue };
            let pushed = self.push_accepting(&req).await;
            if self.client.take_move() == Some(Move::Failover) {
                // The replica left behind may never commit what it acknowledged.
                let n = self.spool.requeue_acked();
                tracing::warn!(to = %self.client.current(), resent = n, "sending uncommitted batches to the next replica");
            }
            match pushed {
                Ok(resp) => {
                    self.stats.reached(true, self.client.current());
                    if resp.reports_commits {
                        self.spool.mark_acked(&path);
                        self.spool.forget_committed(resp.committed_sequence);
                    } else {
                        self.spool.remove(&path);
                    }
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                    self.backoff = policy().backoff();
                }
                Err(SendError::Rejected(s)) if !credentials_refused(&s) => {
                    tracing::error!(sequence = req.sequence, status = %s.message(), "aggregator refused a batch; dropping it");
                    self.spool.remove(&path);
                    self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    if self.closing.is_some_and(|c| Instant::now() >= c) {
                        tracing::warn!(
                            spooled = self.spool.files().len(),
                            "aggregator still unreachable at shutdown; batches stay in the spool for the next start"
                        );
                        return;
                    }
                    self.wait_backoff(e).await;
                }
            }
        }
    }

    /// Takes new windows, without waiting while the spool has work; false
    /// once there is nothing left to do.
    async fn take_new(&mut self) -> bool {
        let pending = self.spool.files().len();
        let next = if pending == 0 && self.closing.is_none() {
            self.rx.recv().await
        } else {
            match self.rx.try_recv() {
                Ok(t) => Some(t),
                Err(mpsc::error::TryRecvError::Empty) => None,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.start_closing();
                    None
                }
            }
        };
        match next {
            Some(tables) => {
                self.accept(&tables);
                true
            }
            None => !(pending == 0 && (self.closing.is_some() || self.rx.is_closed())),
        }
    }

    /// Spools a window and every other one already waiting: the probe
    /// thread must never block on a full channel during an outage.
    fn accept(&mut self, tables: &Tables) {
        to_spool(&mut self.client, &mut self.spool, &self.stats, tables);
        while let Ok(more) = self.rx.try_recv() {
            to_spool(&mut self.client, &mut self.spool, &self.stats, &more);
        }
        // At once, not at the next send: during an outage there is none,
        // and the metrics would hide the batches lost meanwhile.
        self.publish();
    }

    fn on_recv(&mut self, t: Option<Tables>) {
        match t {
            Some(tables) => self.accept(&tables),
            None => self.start_closing(),
        }
    }

    fn start_closing(&mut self) {
        self.closing.get_or_insert_with(|| Instant::now() + self.drain_timeout);
    }

    /// Sends one batch; windows that arrive meanwhile go to the spool, so an
    /// agent killed during an outage loses nothing it had drained.
    async fn push_accepting(&mut self, req: &PushRequest) -> Result<PushResponse, SendError> {
        let mut pusher = self.client.clone();
        let res = {
            let push = pusher.push(req);
            tokio::pin!(push);
            loop {
                tokio::select! {
                    r = &mut push => break r,
                    t = self.rx.recv(), if self.closing.is_none() => self.on_recv(t),
                }
            }
        };
        self.client.adopt_route(&pusher);
        res
    }

    async fn wait_backoff(&mut self, e: SendError) {
        let mut wait = self.backoff.next().unwrap_or(policy().max_backoff);
        // Stopping: one more try at the drain deadline at the latest, so a
        // stop during an outage takes `drain_timeout`, not that plus a backoff.
        if let Some(c) = self.closing {
            wait = wait.min(c.saturating_duration_since(Instant::now()));
        }
        if let SendError::Rejected(s) = &e {
            // Wrong or missing credentials are a configuration problem, not a
            // bad batch: keep it in the spool until the token is fixed.
            tracing::error!(status = %s.message(), "aggregator refused our credentials (check --token-file / TLS); keeping batches in the spool");
        } else {
            self.stats.reached(false, self.client.current());
            tracing::warn!(to = %self.client.current(), error = %e, spooled = self.spool.files().len(), retry_in = ?wait, "aggregator unreachable; spooling");
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            t = self.rx.recv(), if self.closing.is_none() => self.on_recv(t),
        }
    }
}

fn credentials_refused(s: &tonic::Status) -> bool {
    matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied)
}

/// Encodes a window's tables with the next sequence and writes them to the spool.
fn to_spool(client: &mut RoutedClient, spool: &mut Spool, stats: &ShipStats, tables: &Tables) {
    let why = match client.request(tables) {
        Ok(req) => match spool.push(req) {
            Ok(()) => {
                stats.lost_in_a_row.store(0, Ordering::Relaxed);
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot spool a batch; it is lost");
                spool.dropped += 1;
                format!("cannot spool: {e}")
            }
        },
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a batch");
            format!("cannot encode: {e}")
        }
    };
    stats.lost(why);
}

#[cfg(test)]
mod tests {
    use ingero_proto::auth::ClientAuth;

    use super::*;

    #[tokio::test]
    async fn a_stop_during_an_outage_takes_the_drain_timeout_not_a_backoff_more() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(&dir.path().join("batches"), 1 << 20).unwrap();
        // Nothing listens on the discard port: every push fails at once.
        let client =
            RoutedClient::new(&["http://127.0.0.1:9".into()], "node-a", policy(), &ClientAuth::default()).unwrap();
        let (tx, rx) = mpsc::channel(4);
        let drain = Duration::from_millis(300);
        let task = tokio::spawn(Shipper::new(rx, client, spool, Arc::new(ShipStats::default()), drain).run());
        tx.send(Tables::default()).await.unwrap();
        // Long enough an outage for the backoff to have grown past a second.
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let stopping = Instant::now();
        drop(tx);
        task.await.unwrap();
        let took = stopping.elapsed();
        assert!(took < drain + Duration::from_millis(1200), "stopped in {took:?}");
        assert_eq!(
            Spool::open(&dir.path().join("batches"), 1 << 20).unwrap().files().len(),
            1,
            "the batch stays spooled"
        );
    }
}
