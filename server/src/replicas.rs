// SPDX-License-Identifier: Apache-2.0
//! Several `ingero serve` replicas as one aggregator. Agents pick a replica
//! per node (rendezvous hash of the node over the replica list, see
//! `ingero_proto::route`); here, each job's live ranking runs on the replica
//! the job hashes to: signals of jobs owned elsewhere are forwarded there,
//! and a live straggler query on any replica asks all of them and merges.
//! A replica that does not answer is passed over until it answers again (a
//! probe every half second, or any message from it): its jobs move to their
//! next choice, and answers name it. Each job's next choice (its
//! standby) keeps the job's recent signals too, and a replica that starts
//! ranking a job asks the others for them (see `rank::intake`): the job's
//! new owner goes on from where the old one was.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingero_proto::auth::ClientAuth;
use ingero_proto::pb::ingest_client::IngestClient;
use ingero_proto::pb::query_client::QueryClient;
use ingero_proto::pb::{ForwardRequest, HandoverRequest, StragglersRequest};
use ingero_proto::route::rendezvous;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::error::{Error, Result};
use crate::rank::{LiveRanker, Ranking, ReplicaAnswer, Routed, SignalRouter, Sigs};

/// Deadline of a call to another replica. Every call between replicas is
/// answered from memory in milliseconds; one that takes a second comes from
/// a replica that is frozen (stopped, swapping, a stalled disk), whose jobs
/// are better ranked by their standby, and a user's `ingero stragglers`
/// must not wait it out.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a replica passed over is asked whether it is back.
const PROBE_EVERY: Duration = Duration::from_millis(500);

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
    /// Since when it is passed over (None: up).
    down_since: Mutex<Option<Instant>>,
    /// (to the job's standby?, signals) for the forwarder.
    tx: Option<mpsc::Sender<(bool, Sigs)>>,
}

impl Peer {
    fn is_down(&self) -> bool {
        self.down_since.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    fn mark_down(&self, why: &str) {
        let mut d = self.down_since.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_none() {
            tracing::warn!(replica = %self.url, error = why, "replica not answering; its jobs move to the next replica");
            *d = Some(Instant::now());
        }
    }

    fn mark_up(&self) {
        if let Some(since) = self.down_since.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let after = format!("{:.1}s", since.elapsed().as_secs_f64());
            tracing::info!(replica = %self.url, after, "replica answering again; its jobs move back");
        }
    }

    fn request<T>(&self, msg: T, auth: &ClientAuth) -> tonic::Request<T> {
        request(msg, auth, CALL_TIMEOUT)
    }
}

fn request<T>(msg: T, auth: &ClientAuth, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    if let Some(h) = auth.header() {
        r.metadata_mut().insert("authorization", h);
    }
    r
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
            let (tx, rx) = mpsc::channel::<(bool, Sigs)>(1024);
            let tx = (i != cfg.me).then_some(tx);
            rxs.push((i, rx));
            peers.push(Peer {
                url: url.clone(),
                query: QueryClient::new(ch.clone()),
                // A hand-over of a large job is several megabytes of JSON.
                ingest: IngestClient::new(ch).max_decoding_message_size(256 << 20),
                down_since: Mutex::new(None),
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
        tokio::spawn(hello(Arc::downgrade(&set)));
        tokio::spawn(probe(Arc::downgrade(&set)));
        Ok(set)
    }

    /// The replica that ranks `job` now (its first choice that is up) and
    /// its standby (the next one that is up, if any).
    fn owners(&self, job: &str) -> (usize, Option<usize>) {
        let order = rendezvous(job, &self.cfg.urls);
        let mut up = order.into_iter().filter(|&i| i == self.cfg.me || !self.peers[i].is_down());
        let owner = up.next().unwrap_or(self.cfg.me);
        (owner, up.next())
    }

    fn owner(&self, job: &str) -> usize {
        self.owners(job).0
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
            // One passed over is not waited for; its jobs are ranked elsewhere now.
            if let Some(since) = *p.down_since.lock().unwrap_or_else(|e| e.into_inner()) {
                return (p.url.clone(), Err(format!("not answering for {:.0}s", since.elapsed().as_secs_f64())));
            }
            let req =
                StragglersRequest { job: job.unwrap_or_default().to_string(), local_only: true, ..Default::default() };
            let r = p.query.clone().stragglers(request(req, &self.cfg.auth, CALL_TIMEOUT)).await;
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
                    merged.nodes += rk.nodes;
                    merged.stragglers.extend(rk.stragglers);
                    merged.unranked.extend(rk.unranked);
                    answers.push(ReplicaAnswer { replica: url, answered: true, error: None });
                }
                Err(e) => answers.push(ReplicaAnswer { replica: url, answered: false, error: Some(e) }),
            }
        }
        merged
            .stragglers
            .sort_by(|a, b| b.flagged.cmp(&a.flagged).then(b.score.total_cmp(&a.score)).then(a.node.cmp(&b.node)));
        merged.unranked.sort_by(|a, b| a.job.cmp(&b.job));
        merged.replicas = answers;
        merged
    }
}

impl SignalRouter for Replicas {
    fn route(&self, sigs: Sigs) -> Routed {
        let mut routed = Routed::default();
        let mut others: Vec<(Sigs, Sigs)> = vec![Default::default(); self.peers.len()];
        let me = self.cfg.me;
        for (k, s) in sigs {
            let (owner, standby) = self.owners(&k.job);
            match standby {
                Some(i) if i == me => routed.keep.push((k.clone(), s.clone())),
                Some(i) => others[i].1.push((k.clone(), s.clone())),
                None => {}
            }
            match owner {
                i if i == me => routed.rank.push((k, s)),
                i => others[i].0.push((k, s)),
            }
        }
        for (i, (rank, keep)) in others.into_iter().enumerate() {
            for (standby, batch) in [(false, rank), (true, keep)].into_iter().filter(|(_, b)| !b.is_empty()) {
                let sent = self.peers[i].tx.as_ref().is_some_and(|tx| tx.try_send((standby, batch)).is_ok());
                if !sent {
                    self.local.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        routed
    }

    fn owns(&self, job: &str) -> bool {
        self.owner(job) == self.cfg.me
    }

    fn ask_handover(&self, job: String) {
        let from = self.cfg.urls[self.cfg.me].clone();
        let asks: Vec<_> = (self.peers.iter().enumerate())
            .filter(|(i, p)| *i != self.cfg.me && !p.is_down())
            .map(|(_, p)| {
                let req =
                    request(HandoverRequest { job: job.clone(), from: from.clone() }, &self.cfg.auth, CALL_TIMEOUT);
                let mut client = p.ingest.clone();
                async move { client.handover(req).await }
            })
            .collect();
        let local = self.local.clone();
        tokio::spawn(async move {
            let mut sigs = Vec::new();
            for answer in futures::future::join_all(asks).await {
                // A replica that cannot answer has nothing to hand over; the
                // others (or this replica's own copy) do.
                if let Ok(Ok(mut got)) = answer.map(|r| decode(&r.into_inner().signals_json)) {
                    sigs.append(&mut got);
                }
            }
            local.handed_over(job, sigs);
        });
    }

    fn heard_from(&self, replica: &str) {
        if let Some(p) = self.peers.iter().find(|p| p.url == replica) {
            p.mark_up();
        }
    }
}

/// Tells every other replica this one is up (a restart): they stop passing
/// it over at once instead of when their down mark runs out.
async fn hello(set: std::sync::Weak<Replicas>) {
    let Some(set) = set.upgrade() else { return };
    let from = set.cfg.urls[set.cfg.me].clone();
    let calls = set.peers.iter().filter(|p| p.tx.is_some()).map(|p| {
        let req =
            p.request(ForwardRequest { from: from.clone(), signals_json: "[]".into(), standby: true }, &set.cfg.auth);
        let mut client = p.ingest.clone();
        async move { client.forward(req).await }
    });
    futures::future::join_all(calls).await;
}

/// Asks every replica passed over whether it is back, every [`PROBE_EVERY`].
async fn probe(set: std::sync::Weak<Replicas>) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    loop {
        tick.tick().await;
        let Some(set) = set.upgrade() else { return };
        let from = set.cfg.urls[set.cfg.me].clone();
        let calls = set.peers.iter().filter(|p| p.tx.is_some() && p.is_down()).map(|p| {
            let req = ForwardRequest { from: from.clone(), signals_json: "[]".into(), standby: true };
            let req = request(req, &set.cfg.auth, CALL_TIMEOUT);
            let mut client = p.ingest.clone();
            async move { (p, client.forward(req).await.is_ok()) }
        });
        for (p, up) in futures::future::join_all(calls).await {
            if up {
                p.mark_up();
            }
        }
    }
}

/// Sends one peer's signals in batches; on failure marks it down and
/// routes the signals again (to their next owner, possibly this replica).
/// A standby's copy that fails is dropped: the job's owner has the signals.
async fn forwarder(set: std::sync::Weak<Replicas>, peer: usize, mut rx: mpsc::Receiver<(bool, Sigs)>) {
    while let Some(first) = rx.recv().await {
        let (mut rank, mut keep) = (Sigs::new(), Sigs::new());
        for (standby, more) in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            if standby { keep.extend(more) } else { rank.extend(more) }
        }
        let Some(set) = set.upgrade() else { return };
        let p = &set.peers[peer];
        let from = set.cfg.urls[set.cfg.me].clone();
        for (standby, batch) in [(false, rank), (true, keep)] {
            if batch.is_empty() {
                continue;
            }
            let json = serde_json::to_string(&batch).unwrap_or_default();
            let req = ForwardRequest { from: from.clone(), signals_json: json, standby };
            let res = p.ingest.clone().forward(p.request(req, &set.cfg.auth)).await;
            match res {
                Ok(_) => p.mark_up(),
                Err(s) => {
                    p.mark_down(s.message());
                    if !standby {
                        let routed = set.route(batch);
                        set.local.feed_kept(routed.keep);
                        set.local.feed_signals(routed.rank);
                    }
                }
            }
        }
    }
}

/// Decodes forwarded signals.
pub(crate) fn decode(json: &str) -> std::result::Result<Sigs, String> {
    serde_json::from_str(json).map_err(|e| format!("bad signals: {e}"))
}
