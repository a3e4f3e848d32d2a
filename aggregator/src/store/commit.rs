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
use ingero_proto::pb::PushRequest;
use ingero_proto::{Table, ipc};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::Store;
use super::parquet;
use super::state::CommitState;
use super::tiers;
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
    /// The request as it goes into the WAL.
    pub raw: Vec<u8>,
    pub tables: Vec<(Table, Vec<RecordBatch>)>,
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

struct Sealed {
    segment: u64,
    tables: BTreeMap<Table, Vec<RecordBatch>>,
    rows: usize,
    high_water: BTreeMap<String, u64>,
}

enum FlushJob {
    Segment(Sealed),
    Barrier(oneshot::Sender<Result<()>>),
}

#[derive(Default)]
struct Buffer {
    tables: BTreeMap<Table, Vec<RecordBatch>>,
    rows: usize,
    since: Option<Instant>,
}

impl Buffer {
    fn add(&mut self, tables: Vec<(Table, Vec<RecordBatch>)>) {
        for (t, batches) in tables {
            self.rows += batches.iter().map(|b| b.num_rows()).sum::<usize>();
            self.tables.entry(t).or_default().extend(batches);
        }
        self.since.get_or_insert_with(Instant::now);
    }
}

/// Handle to the pipeline; cheap to clone.
#[derive(Debug, Clone)]
pub struct Committer {
    tx: mpsc::Sender<Cmd>,
}

impl Committer {
    /// Replays the WAL into the store, then starts the pipeline tasks.
    pub async fn start(store: Store, cfg: CommitConfig, metrics: Arc<Metrics>) -> Result<(Committer, JoinHandle<()>)> {
        let mut state = CommitState::load(&store).await?;
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
                state.record(&req.node, req.sequence);
                buf.add(tables);
            }
            tracing::info!(segment = seg.segment, rows = buf.rows, "replaying write-ahead log segment");
            let sealed = Sealed {
                segment: seg.segment,
                tables: buf.tables,
                rows: buf.rows,
                high_water: state.high_water.clone(),
            };
            commit_segment(&store, &cfg.wal_dir, &mut state, sealed, &metrics).await?;
        }

        let (tx, rx) = mpsc::channel(4096);
        let (ftx, frx) = mpsc::channel(2);
        let flusher = tokio::spawn(flusher(store, cfg.wal_dir.clone(), state.clone(), frx, metrics.clone()));
        let owner = tokio::spawn(wal_owner(wal, state.high_water, cfg, rx, ftx, metrics));
        let handle = tokio::spawn(async move {
            let _ = owner.await;
            let _ = flusher.await;
        });
        Ok((Committer { tx }, handle))
    }

    /// Makes a batch durable; resolves once it is fsynced (or found to be a duplicate).
    pub async fn push(&self, batch: Accepted) -> Result<Ack> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Push(Box::new(batch), tx)).await.map_err(|_| Error::ShuttingDown)?;
        rx.await.map_err(|_| Error::ShuttingDown)?
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
    mut high_water: BTreeMap<String, u64>,
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
                    wal = seal(wal, &mut buf, &high_water, &ftx, &metrics).await;
                }
                continue;
            }
        };
        let (pushes, flushes) = take_group(first, &mut rx);
        let (mut fresh, dups) = split_duplicates(pushes, &high_water);
        let (w, res) = append(wal, &mut fresh, &metrics).await;
        wal = w;
        let wal_dir = wal.dir().display().to_string();
        answer(res, fresh, dups, &mut high_water, &mut buf, &metrics, &wal_dir);
        metrics.buffered_rows.set(buf.rows as i64);
        if buf.rows >= cfg.flush_rows || (!flushes.is_empty() && buf.rows > 0) {
            wal = seal(wal, &mut buf, &high_water, &ftx, &metrics).await;
        }
        for reply in flushes {
            let _ = ftx.send(FlushJob::Barrier(reply)).await;
        }
    }
    // Channel closed: flush what is left so shutdown loses nothing buffered.
    if buf.rows > 0 {
        let _ = seal(wal, &mut buf, &high_water, &ftx, &metrics).await;
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
    let records: Vec<Vec<u8>> = fresh.iter_mut().map(|(a, _)| std::mem::take(&mut a.raw)).collect();
    if records.is_empty() {
        return (wal, Ok(()));
    }
    let started = Instant::now();
    let (wal, res) = tokio::task::spawn_blocking(move || {
        let mut wal = wal;
        let res = wal.append_durable(records.iter().map(|r| r.as_slice()));
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
                buf.add(a.tables);
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
async fn seal(
    mut wal: Wal,
    buf: &mut Buffer,
    high_water: &BTreeMap<String, u64>,
    ftx: &mpsc::Sender<FlushJob>,
    metrics: &Metrics,
) -> Wal {
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
    let b = std::mem::take(buf);
    metrics.buffered_rows.set(0);
    let sealed = Sealed { segment, tables: b.tables, rows: b.rows, high_water: high_water.clone() };
    // Bounded: when the store falls behind, ingest waits here (back-pressure).
    let _ = ftx.send(FlushJob::Segment(sealed)).await;
    wal
}

async fn flusher(
    store: Store,
    wal_dir: PathBuf,
    mut state: CommitState,
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
                    match commit_segment_arc(&store, &wal_dir, &mut state, sealed.clone(), &metrics).await {
                        Ok(()) => break,
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

async fn commit_segment(
    store: &Store,
    wal_dir: &std::path::Path,
    state: &mut CommitState,
    sealed: Sealed,
    metrics: &Metrics,
) -> Result<()> {
    commit_segment_arc(store, wal_dir, state, Arc::new(sealed), metrics).await
}

/// Writes a sealed segment's files, then the state, then drops the WAL segment.
async fn commit_segment_arc(
    store: &Store,
    wal_dir: &std::path::Path,
    state: &mut CommitState,
    sealed: Arc<Sealed>,
    metrics: &Metrics,
) -> Result<()> {
    let started = Instant::now();
    // Partition on one thread per table, then encode chunks in parallel: a
    // chunk is a file, so the names stay a pure function of the segment.
    let mut parts = Vec::new();
    for &table in sealed.tables.keys() {
        let s = sealed.clone();
        parts.push(tokio::task::spawn_blocking(move || parquet::partition(table, &s.tables[&table])));
    }
    let mut encodes = Vec::new();
    for p in parts {
        let p = p.await.map_err(|e| Error::State(format!("partitioner panicked: {e}")))??;
        for (part, batch) in p {
            let rows = batch.num_rows();
            for (chunk, offset) in (0..rows).step_by(parquet::FILE_ROWS).enumerate() {
                let slice = batch.slice(offset, parquet::FILE_ROWS.min(rows - offset));
                let key = part.file(sealed.segment, chunk);
                encodes.push(tokio::task::spawn_blocking(move || -> Result<Vec<(String, Vec<u8>)>> {
                    Ok(vec![(key, parquet::encode(&slice)?)])
                }));
            }
        }
    }
    // The detector's inputs at every tier, from the same rows (a replayed
    // segment rewrites the same keys).
    let s = sealed.clone();
    encodes.push(tokio::task::spawn_blocking(move || -> Result<Vec<(String, Vec<u8>)>> {
        let name = format!("part-{:020}", s.segment);
        tiers::build(&s.tables)?
            .into_iter()
            .map(|(tier, hour, b)| Ok((tiers::file_key(tier, hour, &name), tiers::encode(&b)?)))
            .collect()
    }));
    for e in encodes {
        let files = e.await.map_err(|e| Error::State(format!("encoder panicked: {e}")))??;
        for (key, bytes) in files {
            store.put_durable(&key, bytes.into()).await?;
            metrics.files_written.inc();
        }
    }
    let mut next = state.clone();
    next.committed_segment = sealed.segment;
    next.high_water = sealed.high_water.clone();
    next.save(store).await?;
    *state = next;
    let dir = wal_dir.to_path_buf();
    let seg = sealed.segment;
    tokio::task::spawn_blocking(move || Wal::remove(&dir, seg)).await.map_err(|e| Error::State(e.to_string()))??;
    metrics.flushes.inc();
    metrics.flush_seconds.observe(started.elapsed().as_secs_f64());
    tracing::debug!(segment = seg, rows = sealed.rows, elapsed = ?started.elapsed(), "segment committed");
    Ok(())
}
