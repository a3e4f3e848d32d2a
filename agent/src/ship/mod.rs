//! Shipping windows to the aggregator: spool first, send in order, retry.

pub mod spool;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use ingero_proto::client::{IngestClient, SendError};
use ingero_proto::Table;
use tokio::sync::mpsc;
use tonic::Code;

use spool::Spool;

/// Counters shared with the metrics endpoint and the node_windows rows.
#[derive(Default)]
pub struct ShipStats {
    pub sent: AtomicU64,
    pub rejected: AtomicU64,
    pub dropped: AtomicU64,
    pub spooled: AtomicU64,
}

/// Ships every batch from `rx`; returns when `rx` closes and the spool is
/// drained (or `drain_timeout` passes with the aggregator still down).
pub async fn run(
    mut rx: mpsc::Receiver<Vec<(Table, RecordBatch)>>,
    mut client: IngestClient,
    mut spool: Spool,
    stats: Arc<ShipStats>,
    drain_timeout: Duration,
) {
    client.advance_past(spool.max_sequence());
    let mut backoff = Duration::from_millis(200);
    let mut closing: Option<tokio::time::Instant> = None;
    loop {
        // Take new windows without waiting while the spool has work.
        let pending = spool.files().len();
        let next = if pending == 0 && closing.is_none() {
            rx.recv().await
        } else {
            match rx.try_recv() {
                Ok(t) => Some(t),
                Err(mpsc::error::TryRecvError::Empty) => None,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closing.get_or_insert_with(|| tokio::time::Instant::now() + drain_timeout);
                    None
                }
            }
        };
        match next {
            Some(tables) => {
                to_spool(&mut client, &mut spool, &tables);
                // Everything else already waiting goes to disk too: the probe
                // thread must never block on a full channel during an outage.
                while let Ok(more) = rx.try_recv() {
                    to_spool(&mut client, &mut spool, &more);
                }
            }
            None if pending == 0 && closing.is_some() => return,
            None if closing.is_none() && rx.is_closed() && pending == 0 => return,
            None => {}
        }
        stats.dropped.store(spool.dropped, Ordering::Relaxed);
        stats.spooled.store(spool.files().len() as u64, Ordering::Relaxed);
        // Send the oldest spooled batch.
        let Some((path, req)) = spool.oldest() else { continue };
        // Windows that arrive while the push is retrying go to disk at once:
        // an agent killed during an outage loses nothing it had drained.
        let mut pusher = client.clone();
        let push = pusher.push(&req);
        tokio::pin!(push);
        let pushed = loop {
            tokio::select! {
                r = &mut push => break r,
                t = rx.recv(), if closing.is_none() => match t {
                    Some(tables) => to_spool(&mut client, &mut spool, &tables),
                    None => {
                        closing.get_or_insert_with(|| tokio::time::Instant::now() + drain_timeout);
                    }
                },
            }
        };
        let res = match pushed {
            // Wrong or missing credentials are a configuration problem, not a
            // bad batch: keep it in the spool until the token is fixed.
            Err(SendError::Rejected(s)) if matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied) => {
                tracing::error!(status = %s.message(), "aggregator refused our credentials (check --token-file / TLS); keeping batches in the spool");
                Err(SendError::Unavailable { attempts: 1, last: s })
            }
            r => r,
        };
        match res {
            Ok(_) => {
                spool.remove(&path);
                stats.sent.fetch_add(1, Ordering::Relaxed);
                backoff = Duration::from_millis(200);
            }
            Err(SendError::Rejected(s)) => {
                tracing::error!(sequence = req.sequence, status = %s.message(), "aggregator refused a batch; dropping it");
                spool.remove(&path);
                stats.rejected.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                if closing.is_some_and(|c| tokio::time::Instant::now() >= c) {
                    tracing::warn!(
                        spooled = spool.files().len(),
                        "aggregator still unreachable at shutdown; batches stay in the spool for the next start"
                    );
                    return;
                }
                tracing::warn!(error = %e, spooled = spool.files().len(), retry_in = ?backoff, "aggregator unreachable; spooling");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    t = rx.recv(), if closing.is_none() => {
                        match t {
                            Some(tables) => {
                                to_spool(&mut client, &mut spool, &tables);
                                while let Ok(more) = rx.try_recv() {
                                    to_spool(&mut client, &mut spool, &more);
                                }
                            }
                            None => { closing.get_or_insert_with(|| tokio::time::Instant::now() + drain_timeout); }
                        }
                    }
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Encodes a window's tables with the next sequence and writes them to the spool.
fn to_spool(client: &mut IngestClient, spool: &mut Spool, tables: &[(Table, RecordBatch)]) {
    match client.request(tables) {
        Ok(req) => {
            if let Err(e) = spool.push(&req) {
                tracing::error!(error = %e, "cannot spool a batch; it is lost");
                spool.dropped += 1;
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot encode a batch"),
    }
}
