// SPDX-License-Identifier: Apache-2.0
//! The durable ingest pipeline: group-commit to the WAL, acknowledge, buffer,
//! and flush sealed segments to Parquet in order.
//!
//! One task owns the WAL and the buffer (no locks on the hot path); a second
//! task writes sealed segments to the store and commits the state. A bounded
//! queue between them applies back-pressure when the store is slow.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use bytes::Bytes;
use ingero_model::Table;
use ingero_model::signals::BatchSignals;
use ingero_proto::ipc;
use ingero_proto::pb::PushRequest;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::Store;
use super::flush::{self, Logs, NodeRange, Origin, Sealed};
use super::state::{CommitState, SharedHighWater, writer_id};
use super::wal::Wal;
use crate::error::{Error, Result};
use crate::metrics::{Metrics, Outcome, OutcomeLabel, TableLabel};

/// Flush policy and WAL location.
#[derive(Debug, Clone)]
pub struct CommitConfig {
    pub wal_dir: PathBuf,
    /// Flush when this many rows are buffered.
    pub flush_rows: usize,
    /// Flush when the oldest buffered row is this old.
    pub flush_age: Duration,
}

/// A validated batch ready to be made durable.
#[derive(Debug)]
pub struct Accepted {
    pub node: String,
    pub sequence: u64,
    /// The request's protobuf bytes as received; they go into the WAL.
    pub raw: Bytes,
    pub tables: Vec<(Table, Vec<RecordBatch>)>,
    /// The batch's signals (`ingero_model::signals::of_tables`), computed
    /// once: the live detector and the signal tiers both take them.
    pub signals: BatchSignals,
    pub rows: u64,
    pub ipc_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub duplicate: bool,
    pub rows: u64,
}

enum Cmd {
    Push(Box<Accepted>, oneshot::Sender<Result<Ack>>),
    Flush(oneshot::Sender<Result<()>>),
}

enum FlushJob {
    Segment(Sealed),
    Barrier(oneshot::Sender<Result<()>>),
}

#[derive(Default)]
pub(crate) struct Buffer {
    tables: BTreeMap<Table, Vec<RecordBatch>>,
    origins: BTreeMap<Table, Vec<Origin>>,
    pushes: Vec<Origin>,
    rows: usize,
    nodes: BTreeMap<String, NodeRange>,
    signals: Vec<(Option<Origin>, BatchSignals)>,
    since: Option<Instant>,
}

impl Buffer {
    pub(crate) fn add(&mut self, node: &str, seq: u64, tables: Vec<(Table, Vec<RecordBatch>)>, signals: BatchSignals) {
        let mut rows = 0;
        let node: Arc<str> = node.into();
        for (t, batches) in tables {
            rows += batches.iter().map(|b| b.num_rows()).sum::<usize>();
            let origins = self.origins.entry(t).or_default();
            origins.extend(batches.iter().map(|b| Origin { node: node.clone(), seq, rows: b.num_rows() }));
            self.tables.entry(t).or_default().extend(batches);
        }
        self.rows += rows;
        NodeRange::add(&mut self.nodes, &node, seq, rows as u64);
        self.signals.push((Some(Origin { node: node.clone(), seq, rows }), signals));
        self.pushes.push(Origin { node, seq, rows });
        self.since.get_or_insert_with(Instant::now);
    }

    pub(crate) fn seal(self, segment: u64) -> Sealed {
        let Buffer { tables, origins, pushes, rows, nodes, signals, .. } = self;
        Sealed { segment, tables, origins, pushes, rows, nodes, signals }
    }
}

/// Handle to the pipeline; cheap to clone.
#[derive(Debug, Clone)]
pub struct Committer {
    tx: mpsc::Sender<Cmd>,
    committed: Committed,
}

/// Highest sequence per node known to be in the store (what agents may
/// forget); shared by the flusher, which raises it, and the ingest service.
pub(crate) type Committed = Arc<std::sync::RwLock<std::collections::HashMap<String, u64>>>;

fn raise(committed: &Committed, nodes: &BTreeMap<String, NodeRange>) {
    let mut c = committed.write().unwrap_or_else(|e| e.into_inner());
    for (node, r) in nodes {
        let v = c.entry(node.clone()).or_insert(0);
        *v = (*v).max(r.last);
    }
}

impl Committer {
    /// Replays the WAL into the store, then starts the pipeline tasks.
    pub async fn start(store: Store, cfg: CommitConfig, metrics: Arc<Metrics>) -> Result<(Committer, JoinHandle<()>)> {
        let dir = cfg.wal_dir.clone();
        let writer =
            tokio::task::spawn_blocking(move || writer_id(&dir)).await.map_err(|e| Error::State(e.to_string()))??;
        let mut state = CommitState::load(&store, &writer).await?;
        let mut logs = Logs::new(writer);
        let dir = cfg.wal_dir.clone();
        let committed = state.committed_segment;
        let (wal, replay) = tokio::task::spawn_blocking(move || Wal::open(&dir, committed))
            .await
            .map_err(|e| Error::State(e.to_string()))??;
        for seg in replay {
            let mut buf = Buffer::default();
            for rec in &seg.records {
                let req = PushRequest::decode(rec.as_slice()).map_err(|e| Error::Wal {
                    path: cfg.wal_dir.display().to_string(),
                    reason: format!("segment {} has an undecodable record: {e}", seg.segment),
                })?;
                if state.is_duplicate(&req.node, req.sequence) {
                    continue;
                }
                let tables = decode_tables(&req)?;
                let signals = ingero_model::signals::of_tables(&tables);
                state.record(&req.node, req.sequence);
                buf.add(&req.node, req.sequence, tables, signals);
            }
            tracing::info!(segment = seg.segment, rows = buf.rows, "replaying write-ahead log segment");
            commit_segment(&store, &cfg.wal_dir, &mut logs, Arc::new(buf.seal(seg.segment)), &metrics).await?;
        }

        let committed: Committed = Arc::new(std::sync::RwLock::new(state.high_water.clone().into_iter().collect()));
        let (tx, rx) = mpsc::channel(4096);
        let (ftx, frx) = mpsc::channel(2);
        let flusher =
            tokio::spawn(flusher(store.clone(), cfg.wal_dir.clone(), (logs, committed.clone()), frx, metrics.clone()));
        let shared = SharedHighWater::new(store.clone());
        let owner = tokio::spawn(wal_owner(wal, (state.high_water, shared), cfg, rx, ftx, metrics));
        let handle = tokio::spawn(async move {
            let _ = owner.await;
            let _ = flusher.await;
        });
        Ok((Committer { tx, committed }, handle))
    }

    /// Makes a batch durable; resolves once it is fsynced (or found to be a duplicate).
    pub async fn push(&self, batch: Accepted) -> Result<Ack> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Push(Box::new(batch), tx)).await.map_err(|_| Error::ShuttingDown)?;
        rx.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Highest sequence of `node` in the store (0 when none).
    pub fn committed(&self, node: &str) -> u64 {
        self.committed.read().unwrap_or_else(|e| e.into_inner()).get(node).copied().unwrap_or(0)
    }

    /// Writes everything acknowledged so far to the store.
    pub async fn flush(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Flush(tx)).await.map_err(|_| Error::ShuttingDown)?;
        rx.await.map_err(|_| Error::ShuttingDown)?
    }
}

fn decode_tables(req: &PushRequest) -> Result<Vec<(Table, Vec<RecordBatch>)>> {
    req.tables
        .iter()
        .map(|t| {
            let table = Table::from_name(&t.table)
                .ok_or_else(|| Error::State(format!("unknown table `{}` in WAL", t.table)))?;
            Ok((table, ipc::decode(table, &t.arrow_ipc, usize::MAX)?))
        })
        .collect()
}

type PushReply = oneshot::Sender<Result<Ack>>;
type Fresh = Vec<(Box<Accepted>, PushReply)>;

/// Owns the WAL: group-commits pushes (one fsync per group), answers them,
/// and seals segments by size, by age and on request.
async fn wal_owner(
    mut wal: Wal,
    (mut high_water, mut shared): (BTreeMap<String, u64>, SharedHighWater),
    cfg: CommitConfig,
    mut rx: mpsc::Receiver<Cmd>,
    ftx: mpsc::Sender<FlushJob>,
    metrics: Arc<Metrics>,
) {
    let mut buf = Buffer::default();
    let mut tick = tokio::time::interval(cfg.flush_age.clamp(Duration::from_millis(10), Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            cmd = rx.recv() => match cmd { Some(c) => c, None => break },
            _ = tick.tick() => {
                if buf.since.is_some_and(|s| s.elapsed() >= cfg.flush_age) {
                    wal = seal(wal, &mut buf, &ftx, &metrics).await;
                }
                continue;
            }
        };
        let (pushes, flushes) = take_group(first, &mut rx);
        shared.merge(pushes.iter().map(|(a, _)| a.node.as_str()), &mut high_water).await;
        let (mut fresh, dups) = split_duplicates(pushes, &high_water);
        let (w, res) = append(wal, &mut fresh, &metrics).await;
        wal = w;
        let wal_dir = wal.dir().display().to_string();
        answer(res, fresh, dups, &mut high_water, &mut buf, &metrics, &wal_dir);
        metrics.buffered_rows.set(buf.rows as i64);
        if buf.rows >= cfg.flush_rows || (!flushes.is_empty() && buf.rows > 0) {
            wal = seal(wal, &mut buf, &ftx, &metrics).await;
        }
        for reply in flushes {
            let _ = ftx.send(FlushJob::Barrier(reply)).await;
        }
    }
    // Channel closed: flush what is left so shutdown loses nothing buffered.
    if buf.rows > 0 {
        let _ = seal(wal, &mut buf, &ftx, &metrics).await;
    }
}

/// The first command and everything already queued behind it (at most 1024).
fn take_group(first: Cmd, rx: &mut mpsc::Receiver<Cmd>) -> (Fresh, Vec<oneshot::Sender<Result<()>>>) {
    let mut group = vec![first];
    while group.len() < 1024 {
        match rx.try_recv() {
            Ok(c) => group.push(c),
            Err(_) => break,
        }
    }
    let (mut pushes, mut flushes) = (Vec::new(), Vec::new());
    for c in group {
        match c {
            Cmd::Push(a, reply) => pushes.push((a, reply)),
            Cmd::Flush(reply) => flushes.push(reply),
        }
    }
    (pushes, flushes)
}

/// Duplicates are decided against what is stored plus what this group adds.
fn split_duplicates(pushes: Fresh, high_water: &BTreeMap<String, u64>) -> (Fresh, Vec<PushReply>) {
    let (mut fresh, mut dups) = (Vec::new(), Vec::new());
    let mut group_hw: BTreeMap<String, u64> = BTreeMap::new();
    for (a, reply) in pushes {
        let hw = group_hw.get(&a.node).or(high_water.get(&a.node)).copied();
        if hw.is_some_and(|hw| a.sequence <= hw) {
            dups.push(reply);
        } else {
            group_hw.insert(a.node.clone(), a.sequence);
            fresh.push((a, reply));
        }
    }
    (fresh, dups)
}

/// Appends the group's records with one fsync, off the async threads.
async fn append(wal: Wal, fresh: &mut Fresh, metrics: &Metrics) -> (Wal, Result<()>) {
    let records: Vec<Bytes> = fresh.iter_mut().map(|(a, _)| std::mem::take(&mut a.raw)).collect();
    if records.is_empty() {
        return (wal, Ok(()));
    }
    let started = Instant::now();
    let (wal, res) = tokio::task::spawn_blocking(move || {
        let mut wal = wal;
        let res = wal.append_durable(records.iter().map(|r| r.as_ref()));
        (wal, res)
    })
    .await
    .expect("WAL writer thread panicked");
    metrics.wal_sync_seconds.observe(started.elapsed().as_secs_f64());
    (wal, res)
}

/// Acknowledges a durable group (its rows join the buffer), or refuses it.
fn answer(
    res: Result<()>,
    fresh: Fresh,
    dups: Vec<PushReply>,
    high_water: &mut BTreeMap<String, u64>,
    buf: &mut Buffer,
    metrics: &Metrics,
    wal_dir: &str,
) {
    match res {
        Ok(()) => {
            for (a, reply) in fresh {
                high_water.insert(a.node.clone(), a.sequence);
                for (t, batches) in &a.tables {
                    let n: usize = batches.iter().map(|b| b.num_rows()).sum();
                    metrics.rows.get_or_create(&TableLabel { table: t.name().to_string() }).inc_by(n as u64);
                }
                metrics.bytes.inc_by(a.ipc_bytes);
                metrics.batches.get_or_create(&OutcomeLabel { outcome: Outcome::stored }).inc();
                let rows = a.rows;
                buf.add(&a.node, a.sequence, a.tables, a.signals);
                let _ = reply.send(Ok(Ack { duplicate: false, rows }));
            }
            for reply in dups {
                metrics.batches.get_or_create(&OutcomeLabel { outcome: Outcome::duplicate }).inc();
                let _ = reply.send(Ok(Ack { duplicate: true, rows: 0 }));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "write-ahead log write failed; refusing batches");
            let msg = e.to_string();
            for (_, reply) in fresh {
                metrics.reject("wal_unavailable");
                let _ = reply.send(Err(Error::Wal { path: wal_dir.to_string(), reason: msg.clone() }));
            }
            for reply in dups {
                let _ = reply.send(Ok(Ack { duplicate: true, rows: 0 }));
            }
        }
    }
}

/// Seals the current segment and queues its rows for the store.
async fn seal(mut wal: Wal, buf: &mut Buffer, ftx: &mpsc::Sender<FlushJob>, metrics: &Metrics) -> Wal {
    if buf.rows == 0 {
        return wal;
    }
    let (wal, segment) = loop {
        let (w, res) = tokio::task::spawn_blocking(move || {
            let r = wal.seal();
            (wal, r)
        })
        .await
        .expect("WAL writer thread panicked");
        wal = w;
        match res {
            Ok(seg) => break (wal, seg),
            Err(e) => {
                tracing::error!(error = %e, "cannot seal WAL segment; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let sealed = std::mem::take(buf).seal(segment);
    metrics.buffered_rows.set(0);
    // Bounded: when the store falls behind, ingest waits here (back-pressure).
    let _ = ftx.send(FlushJob::Segment(sealed)).await;
    wal
}

async fn flusher(
    store: Store,
    wal_dir: PathBuf,
    (mut logs, committed): (Logs, Committed),
    mut rx: mpsc::Receiver<FlushJob>,
    metrics: Arc<Metrics>,
) {
    while let Some(job) = rx.recv().await {
        match job {
            FlushJob::Barrier(reply) => {
                let _ = reply.send(Ok(()));
            }
            FlushJob::Segment(sealed) => {
                let mut backoff = Duration::from_millis(200);
                let segment = sealed.segment;
                let sealed = Arc::new(sealed);
                loop {
                    match commit_segment(&store, &wal_dir, &mut logs, sealed.clone(), &metrics).await {
                        Ok(()) => {
                            raise(&committed, &sealed.nodes);
                            break;
                        }
                        Err(e) => {
                            metrics.flush_errors.inc();
                            tracing::warn!(segment, error = %e, retry_in = ?backoff, "flush failed; data is safe in the WAL");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(30));
                        }
                    }
                }
            }
        }
    }
}

/// Commits a sealed segment to the store, then drops its WAL file.
async fn commit_segment(
    store: &Store,
    wal_dir: &std::path::Path,
    logs: &mut Logs,
    sealed: Arc<Sealed>,
    metrics: &Metrics,
) -> Result<()> {
    let started = Instant::now();
    let files = flush::commit(store, logs, sealed.clone()).await?;
    metrics.files_written.inc_by(files);
    let dir = wal_dir.to_path_buf();
    let seg = sealed.segment;
    tokio::task::spawn_blocking(move || Wal::remove(&dir, seg)).await.map_err(|e| Error::State(e.to_string()))??;
    metrics.flushes.inc();
    metrics.flush_seconds.observe(started.elapsed().as_secs_f64());
    tracing::debug!(segment = seg, rows = sealed.rows, elapsed = ?started.elapsed(), "segment committed");
    Ok(())
}
