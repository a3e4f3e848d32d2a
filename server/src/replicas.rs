// SPDX-License-Identifier: Apache-2.0
//! Several `ingero serve` replicas as one aggregator. Agents pick a replica
//! per node (rendezvous hash of the node over the replica list, see
//! `ingero_proto::route`); here, each job's live ranking runs on the replica
//! the job hashes to: signals of jobs owned elsewhere are forwarded there,
//! and a live straggler query on any replica asks all of them and merges.
//! A replica that does not answer is skipped for a while: its jobs move to
//! their next choice, and answers name it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingero_proto::auth::ClientAuth;
use ingero_proto::pb::ingest_client::IngestClient;
use ingero_proto::pb::query_client::QueryClient;
use ingero_proto::pb::{ForwardRequest, StragglersRequest};
use ingero_proto::route::rendezvous;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::error::{Error, Result};
use crate::rank::signals::{NodeWindowKey, Signals};
use crate::rank::{LiveRanker, Ranking, ReplicaAnswer, SignalRouter};

/// How long a replica that failed a call is passed over.
const DOWN_FOR: Duration = Duration::from_secs(5);
/// Deadline of a call to another replica.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

type Sigs = Vec<(NodeWindowKey, Signals)>;

/// The replica set, as `--replicas` lists it (the same order everywhere).
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// gRPC URL of every replica.
    pub urls: Vec<String>,
    /// Index of this replica in `urls`.
    pub me: usize,
    /// How this replica calls the others (the set's token, TLS CA).
    pub auth: ClientAuth,
}

impl ReplicaConfig {
    /// From `--replicas` and `--replica-self`; refuses a self missing from the list.
    pub fn new(urls: Vec<String>, me: &str, auth: ClientAuth) -> Result<ReplicaConfig> {
        let me = urls.iter().position(|u| u == me).ok_or_else(|| {
            Error::Config(format!("--replica-self {me} is not one of --replicas ({})", urls.join(", ")))
        })?;
        Ok(ReplicaConfig { urls, me, auth })
    }
}

#[derive(Debug)]
struct Peer {
    url: String,
    query: QueryClient<Channel>,
    ingest: IngestClient<Channel>,
    down_until: Mutex<Option<Instant>>,
    tx: Option<mpsc::Sender<Sigs>>,
}

impl Peer {
    fn is_down(&self) -> bool {
        self.down_until.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|t| Instant::now() < t)
    }

    fn mark_down(&self, why: &str) {
        let mut d = self.down_until.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_none_or(|t| Instant::now() >= t) {
            tracing::warn!(replica = %self.url, error = why, "replica not answering; its jobs move to the next replica");
        }
        *d = Some(Instant::now() + DOWN_FOR);
    }

    fn request<T>(&self, msg: T, auth: &ClientAuth) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(CALL_TIMEOUT);
        if let Some(h) = auth.header() {
            r.metadata_mut().insert("authorization", h);
        }
        r
    }
}

/// A running replica's view of the set.
#[derive(Debug)]
pub struct Replicas {
    cfg: ReplicaConfig,
    peers: Vec<Peer>,
    local: LiveRanker,
}

impl Replicas {
    /// Connects (lazily) to every other replica and routes `ranker`'s signals.
    pub fn start(cfg: ReplicaConfig, ranker: &LiveRanker) -> Result<Arc<Replicas>> {
        let mut rxs = Vec::new();
        let mut peers = Vec::new();
        for (i, url) in cfg.urls.iter().enumerate() {
            let ch =
                ingero_proto::auth::channel(url, &cfg.auth).map_err(|e| Error::Config(format!("--replicas: {e}")))?;
            let (tx, rx) = mpsc::channel::<Sigs>(1024);
            let tx = (i != cfg.me).then_some(tx);
            rxs.push((i, rx));
            peers.push(Peer {
                url: url.clone(),
                query: QueryClient::new(ch.clone()),
                ingest: IngestClient::new(ch),
                down_until: Mutex::new(None),
                tx,
            });
        }
        let set = Arc::new(Replicas { cfg, peers, local: ranker.clone() });
        for (i, rx) in rxs {
            if i != set.cfg.me {
                tokio::spawn(forwarder(Arc::downgrade(&set), i, rx));
            }
        }
        ranker.set_router(set.clone());
        Ok(set)
    }

    /// The replica that ranks `job` now: its first choice that is up.
    fn owner(&self, job: &str) -> usize {
        let order = rendezvous(job, &self.cfg.urls);
        order.iter().copied().find(|&i| i == self.cfg.me || !self.peers[i].is_down()).unwrap_or(self.cfg.me)
    }

    /// Whether this replica looks after `key` now (table upkeep).
    pub fn owns(&self, key: &str) -> bool {
        self.owner(key) == self.cfg.me
    }

    /// The live ranking of every replica, merged; replicas that did not
    /// answer are named.
    pub async fn fleet_ranking(&self, job: Option<&str>) -> Ranking {
        let mut merged = self.local.ranking(job);
        let mut answers = Vec::new();
        let calls = self.peers.iter().enumerate().filter(|(i, _)| *i != self.cfg.me).map(|(_, p)| async move {
            let req =
                StragglersRequest { job: job.unwrap_or_default().to_string(), local_only: true, ..Default::default() };
            let r = p.query.clone().stragglers(p.request(req, &self.cfg.auth)).await;
            let parsed = r
                .map_err(|s| s.message().to_string())
                .and_then(|r| serde_json::from_str::<Ranking>(&r.into_inner().json).map_err(|e| e.to_string()));
            if let Err(e) = &parsed {
                p.mark_down(e);
            }
            (p.url.clone(), parsed)
        });
        answers.push(ReplicaAnswer { replica: self.cfg.urls[self.cfg.me].clone(), answered: true, error: None });
        for (url, r) in futures::future::join_all(calls).await {
            match r {
                Ok(rk) => {
                    merged.jobs += rk.jobs;
                    merged.stragglers.extend(rk.stragglers);
                    answers.push(ReplicaAnswer { replica: url, answered: true, error: None });
                }
                Err(e) => answers.push(ReplicaAnswer { replica: url, answered: false, error: Some(e) }),
            }
        }
        merged
            .stragglers
            .sort_by(|a, b| b.flagged.cmp(&a.flagged).then(b.score.total_cmp(&a.score)).then(a.node.cmp(&b.node)));
        merged.replicas = answers;
        merged
    }
}

impl SignalRouter for Replicas {
    fn route(&self, sigs: Sigs) -> Sigs {
        let mut mine = Vec::new();
        let mut others: Vec<Sigs> = vec![Vec::new(); self.peers.len()];
        for (k, s) in sigs {
            match self.owner(&k.job) {
                i if i == self.cfg.me => mine.push((k, s)),
                i => others[i].push((k, s)),
            }
        }
        for (i, batch) in others.into_iter().enumerate().filter(|(_, b)| !b.is_empty()) {
            let sent = self.peers[i].tx.as_ref().is_some_and(|tx| tx.try_send(batch).is_ok());
            if !sent {
                self.local.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        mine
    }
}

/// Sends one peer's signals in batches; on failure marks it down and
/// routes the signals again (to their next owner, possibly this replica).
async fn forwarder(set: std::sync::Weak<Replicas>, peer: usize, mut rx: mpsc::Receiver<Sigs>) {
    while let Some(mut batch) = rx.recv().await {
        while let Ok(more) = rx.try_recv() {
            batch.extend(more);
        }
        let Some(set) = set.upgrade() else { return };
        let p = &set.peers[peer];
        let json = serde_json::to_string(&batch).unwrap_or_default();
        let from = set.cfg.urls[set.cfg.me].clone();
        let res = p.ingest.clone().forward(p.request(ForwardRequest { from, signals_json: json }, &set.cfg.auth)).await;
        if let Err(s) = res {
            p.mark_down(s.message());
            let mine = set.route(batch);
            set.local.feed_signals(mine);
        }
    }
}

/// Decodes forwarded signals.
pub(crate) fn decode(json: &str) -> std::result::Result<Sigs, String> {
    serde_json::from_str(json).map_err(|e| format!("bad signals: {e}"))
}
