// SPDX-License-Identifier: Apache-2.0
//! A sealed WAL segment → its intent → Parquet files → one Delta commit per
//! table, then the `ingest_batches` commit that records the segment (its
//! completion; each node's highest sequence is in the intent until
//! maintenance folds it into a node version, `crate::fold`). Every commit
//! carries this writer's segment as a transaction version, so a segment
//! replayed after a crash skips the tables it already reached and is never
//! stored twice.
//!
//! A node that moved between replicas while batches were in flight can have
//! them in two writers' segments (a replica cut off but alive, or one
//! restarted and replaying its WAL, commits late); agents send everything
//! not yet committed to the replica they move to, so the writer that
//! commits second drops, table by table, the node's batches at or below
//! what the table already holds — learnt from the completed high-waters and
//! other writers' intents (`crate::intent`), so data commits carry no
//! per-node versions once a node has settled at a writer. Commits are
//! serialized by put-if-absent, so the check and the commit see the same
//! version.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array};
use ingero_model::Table;
use ingero_model::signals::{BatchSignals, NodeWindowKey, Signals};

use super::Store;
use super::batches::{BATCHES_TABLE, batches_schema, node_app, writer_app};
use super::delta::action::{Add, Txn};
use super::delta::{TableLog, table};
use super::layout::{hour_dir, hour_of};
use super::{fold, held, intent, parquet, tiers};
use crate::error::{Error, Result};

/// What one node contributed to a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeRange {
    pub first: u64,
    pub last: u64,
    pub batches: u64,
    pub rows: u64,
}

impl NodeRange {
    pub(crate) fn add(ranges: &mut BTreeMap<String, NodeRange>, node: &str, seq: u64, rows: u64) {
        let r = ranges.entry(node.to_string()).or_insert(NodeRange { first: seq, last: seq, batches: 0, rows: 0 });
        r.first = r.first.min(seq);
        r.last = r.last.max(seq);
        r.batches += 1;
        r.rows += rows;
    }
}

/// Where a buffered record batch came from.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub node: Arc<str>,
    pub seq: u64,
    pub rows: usize,
}

impl Origin {
    /// Whether this push is still to be stored: above what the table
    /// already holds of its node (another writer may have stored it first).
    fn kept(&self, stored: &Stored) -> bool {
        stored.get(&*self.node).is_none_or(|&hw| self.seq > hw)
    }
}

/// A WAL segment ready for the store.
#[derive(Debug)]
pub(crate) struct Sealed {
    pub segment: u64,
    pub tables: BTreeMap<Table, Vec<RecordBatch>>,
    /// Per table, the push each record batch came from (same order).
    pub origins: BTreeMap<Table, Vec<Origin>>,
    /// Every push of the segment (rows over all tables).
    pub pushes: Vec<Origin>,
    pub rows: usize,
    pub nodes: BTreeMap<String, NodeRange>,
    /// Each push's signals, computed once when it was accepted (the live
    /// detector got the same); `None`: rows written without a push.
    pub signals: Vec<(Option<Origin>, BatchSignals)>,
}

/// Per node, the highest sequence stored: batches at or below it are dropped.
pub(crate) type Stored = BTreeMap<String, u64>;

impl Sealed {
    /// The nodes of this segment whose batches a table already holds in
    /// part, from per-node high-waters: node → the table's highest sequence.
    fn stored_of(&self, hw: &BTreeMap<String, u64>) -> Stored {
        self.nodes.iter().filter_map(|(n, r)| hw.get(n).filter(|&&v| v >= r.first).map(|&v| (n.clone(), v))).collect()
    }

    /// The tables without the batches `stored` covers.
    fn tables_without(&self, stored: &Stored) -> BTreeMap<Table, Vec<RecordBatch>> {
        let keep = |o: &Origin| o.kept(stored);
        self.tables
            .iter()
            .map(|(t, batches)| {
                let origins = self.origins.get(t).map(Vec::as_slice).unwrap_or_default();
                (*t, batches.iter().zip(origins).filter(|(_, o)| keep(o)).map(|(b, _)| b.clone()).collect())
            })
            .collect()
    }

    /// The signals of the pushes `stored` does not cover.
    fn signals_without<'a>(&'a self, stored: &'a Stored) -> impl Iterator<Item = &'a (NodeWindowKey, Signals)> + 'a {
        self.signals.iter().filter(move |(o, _)| o.as_ref().is_none_or(|o| o.kept(stored))).flat_map(|(_, s)| s)
    }

    /// Each node's range, without the batches `stored` covers.
    fn ranges_without(&self, stored: &Stored) -> BTreeMap<String, NodeRange> {
        let mut out = BTreeMap::new();
        for p in self.pushes.iter().filter(|o| o.kept(stored)) {
            NodeRange::add(&mut out, &p.node, p.seq, p.rows as u64);
        }
        out
    }

    /// Table `name`'s `node:<name>` versions: only nodes still arriving here
    /// (see [`ARRIVING`]) with rows in it.
    fn arriving_txns<'a>(&'a self, name: &str, logs: &'a Logs) -> impl Iterator<Item = Txn> + 'a {
        let with_rows: Option<std::collections::BTreeSet<&str>> =
            Table::from_name(name).map(|t| self.origins.get(&t).into_iter().flatten().map(|o| &*o.node).collect());
        self.nodes
            .iter()
            .filter(move |(n, _)| logs.arrived.get(n.as_str()).is_none_or(|&c| c < ARRIVING))
            .filter(move |(n, _)| with_rows.as_ref().is_none_or(|w| w.contains(n.as_str())))
            .map(|(n, r)| node_txn(n, r.last))
    }
}

fn node_txn(node: &str, last: u64) -> Txn {
    Txn { app_id: node_app(node), version: last as i64, last_updated: None }
}

/// A node's first segments at a writer also carry its version in every
/// table: replicas of an ingero before intents read only a table's own node
/// versions, and the batches they may commit late are the ones the node sent
/// them before it moved here — re-sent, so in its first segments here (a
/// rolling upgrade moves nodes exactly so).
const ARRIVING: u8 = 2;

/// The Delta logs this writer commits to, opened on first use.
#[derive(Debug)]
pub struct Logs {
    pub writer: String,
    logs: BTreeMap<String, TableLog>,
    intents: held::Intents,
    /// Per node, segments committed here since start (up to [`ARRIVING`]).
    arrived: std::collections::HashMap<String, u8>,
}

impl Logs {
    pub fn new(writer: String) -> Logs {
        Logs { writer, logs: BTreeMap::new(), intents: Default::default(), arrived: Default::default() }
    }

    fn settle(&mut self, sealed: &Sealed) {
        for n in sealed.nodes.keys() {
            let c = self.arrived.entry(n.clone()).or_default();
            *c = (*c + 1).min(ARRIVING);
        }
    }

    /// Writes a table's files, then commits them unless `guard` holds; when
    /// the table already holds some of the segment's batches, they are left
    /// out first. Returns files written.
    async fn commit_table(
        &mut self,
        store: &Store,
        sealed: &Arc<Sealed>,
        mut t: Encoded,
        guard: &Txn,
        info: &serde_json::Value,
    ) -> Result<u64> {
        let writer = self.writer.clone();
        self.get(store, &t.name, &t.schema).await?;
        let txns: Vec<Txn> = std::iter::once(guard.clone()).chain(sealed.arriving_txns(&t.name, self)).collect();
        let Logs { logs, intents, .. } = self;
        let log = logs.get_mut(&t.name).expect("opened above");
        let (mut left_out, mut on_store, mut written) = (Stored::new(), false, 0);
        loop {
            log.prepare(store).await?;
            if log.snapshot.txns.get(&guard.app_id).is_some_and(|&v| v >= guard.version) {
                return Ok(written); // committed before a crash
            }
            let stored = sealed.stored_of(&intents.stored(store, &writer, &log.snapshot, &sealed.nodes).await?);
            if stored != left_out {
                tracing::info!(table = %t.name, segment = sealed.segment, nodes = ?stored,
                    "another writer stored some of these batches first; leaving them out");
                t = reencode(&writer, sealed, &t.name, &stored).await?;
                (left_out, on_store) = (stored, false);
            }
            if !on_store {
                for f in &t.files {
                    store.put_durable(&f.key, f.bytes.clone()).await?;
                }
                (on_store, written) = (true, written + t.files.len() as u64);
            }
            let adds = t.files.iter().map(|f| f.add(&t.name)).collect();
            if log.try_commit(store, adds, txns.clone(), info.clone()).await?.is_some() {
                return Ok(written);
            }
        }
    }

    /// Writes files no other writer can hold (`store::bulk`), then commits
    /// them unless `guard` holds; returns files written.
    pub(crate) async fn commit_files(
        &mut self,
        store: &Store,
        t: Encoded,
        guard: &Txn,
        info: serde_json::Value,
    ) -> Result<u64> {
        let log = self.get(store, &t.name, &t.schema).await?;
        log.prepare(store).await?;
        if log.snapshot.txns.get(&guard.app_id).is_some_and(|&v| v >= guard.version) {
            return Ok(0); // committed before
        }
        let mut adds = Vec::with_capacity(t.files.len());
        for f in &t.files {
            adds.push(f.add(&t.name));
            store.put_durable(&f.key, f.bytes.clone()).await?;
        }
        if log.commit(store, adds, vec![guard.clone()], Some(guard), info).await?.is_none() {
            // Committed meanwhile by an earlier attempt: these files are
            // referenced by no version, so no reader can be reading them.
            for f in &t.files {
                let _ = object_store::ObjectStoreExt::delete(&store.object_store, &store.key(&f.key)).await;
            }
            return Ok(0);
        }
        Ok(t.files.len() as u64)
    }

    async fn get(&mut self, store: &Store, name: &str, schema: &arrow::datatypes::Schema) -> Result<&mut TableLog> {
        if !self.logs.contains_key(name) {
            let log = TableLog::open(store, name, schema).await?;
            self.logs.insert(name.to_string(), log);
        }
        Ok(self.logs.get_mut(name).expect("inserted above"))
    }
}

/// One encoded file: its store key, bytes and Delta statistics.
#[derive(Debug)]
pub(crate) struct EncodedFile {
    pub key: String,
    pub bytes: bytes::Bytes,
    pub stats: String,
}

impl EncodedFile {
    pub(crate) fn new(key: String, f: parquet::ParquetFile) -> EncodedFile {
        EncodedFile { key, bytes: f.bytes.into(), stats: f.stats }
    }

    fn add(&self, table: &str) -> Add {
        table::add(self.rel(table), self.bytes.len(), self.stats.clone())
    }

    /// The path relative to the table directory, as the log names it.
    fn rel<'a>(&'a self, table: &str) -> &'a str {
        self.key.strip_prefix(table).and_then(|k| k.strip_prefix('/')).unwrap_or(&self.key)
    }
}

/// One table's new files.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub name: String,
    pub schema: arrow::datatypes::SchemaRef,
    pub files: Vec<EncodedFile>,
}

impl Encoded {
    /// Groups tier files by tier.
    pub(crate) fn tiers(files: Vec<(tiers::Tier, EncodedFile)>) -> Vec<Encoded> {
        let mut by: BTreeMap<&str, Vec<EncodedFile>> = BTreeMap::new();
        for (tier, f) in files {
            by.entry(tier.name()).or_default().push(f);
        }
        by.into_iter().map(|(n, files)| Encoded { name: n.to_string(), schema: tiers::schema(), files }).collect()
    }
}

/// One data table's files, encoded one after another.
fn encode_table(writer: &str, segment: u64, t: Table, batches: &[RecordBatch]) -> Result<Encoded> {
    let files: Result<Vec<_>> =
        chunks(writer, segment, t, batches)?.into_iter().map(|(key, rows)| encode_file(t, key, &rows)).collect();
    Ok(Encoded { name: t.name().to_string(), schema: t.schema(), files: files? })
}

/// A table's rows cut into the files they will be: (key, rows) per file.
fn chunks(writer: &str, segment: u64, t: Table, batches: &[RecordBatch]) -> Result<Vec<(String, Vec<RecordBatch>)>> {
    Ok(parquet::files(t, batches)?.into_iter().map(|(part, n, rows)| (part.file(writer, segment, n), rows)).collect())
}

fn encode_file(t: Table, key: String, rows: &[RecordBatch]) -> Result<EncodedFile> {
    let batch = arrow::compute::concat_batches(&t.schema(), rows)?;
    Ok(EncodedFile::new(key, parquet::encode(&batch)?))
}

/// Every signal tier's files.
fn encode_tiers<'a>(
    writer: &str,
    segment: u64,
    signals: impl IntoIterator<Item = &'a (NodeWindowKey, Signals)>,
) -> Result<Vec<Encoded>> {
    let name = format!("part-{writer}-{segment:020}-{}", crate::layout::unique());
    let mut files = Vec::new();
    for (tier, hour, b) in tiers::build(signals)? {
        files.push((tier, EncodedFile::new(tiers::file_key(tier, hour, &name), tiers::encode(&b)?)));
    }
    Ok(Encoded::tiers(files))
}

/// Encodes every table and tier of the segment in parallel, each file of a
/// table on its own blocking task (a flush is mostly one big table; file by
/// file it would use one core while the other waits).
async fn encode(writer: &str, sealed: &Arc<Sealed>) -> Result<Vec<Encoded>> {
    let (s, w) = (sealed.clone(), writer.to_string());
    let tiers = tokio::task::spawn_blocking(move || encode_tiers(&w, s.segment, s.signals.iter().flat_map(|(_, v)| v)));
    let mut cut = Vec::new();
    for &t in sealed.tables.keys() {
        let (s, w) = (sealed.clone(), writer.to_string());
        cut.push((t, tokio::task::spawn_blocking(move || chunks(&w, s.segment, t, &s.tables[&t]))));
    }
    let mut tables = Vec::new();
    for (t, task) in cut {
        let files: Vec<_> = joined(task.await)?
            .into_iter()
            .map(|(key, rows)| tokio::task::spawn_blocking(move || encode_file(t, key, &rows)))
            .collect();
        tables.push((t, files));
    }
    let mut out = Vec::new();
    for (t, files) in tables {
        let mut done = Vec::with_capacity(files.len());
        for f in files {
            done.push(joined(f.await)?);
        }
        out.push(Encoded { name: t.name().to_string(), schema: t.schema(), files: done });
    }
    out.extend(joined(tiers.await)?);
    Ok(out)
}

fn joined<T>(r: std::result::Result<Result<T>, tokio::task::JoinError>) -> Result<T> {
    r.map_err(|e| Error::State(format!("encoder panicked: {e}")))?
}

/// One table (or tier) of the segment again, without the batches `stored` covers.
async fn reencode(writer: &str, sealed: &Arc<Sealed>, name: &str, stored: &Stored) -> Result<Encoded> {
    let (s, w, name, stored) = (sealed.clone(), writer.to_string(), name.to_string(), stored.clone());
    joined(
        tokio::task::spawn_blocking(move || {
            if let Some(t) = Table::from_name(&name) {
                let tables = s.tables_without(&stored);
                return encode_table(&w, s.segment, t, tables.get(&t).map(Vec::as_slice).unwrap_or_default());
            }
            let tier = encode_tiers(&w, s.segment, s.signals_without(&stored))?.into_iter().find(|e| e.name == name);
            Ok(tier.unwrap_or(Encoded { name, schema: tiers::schema(), files: Vec::new() }))
        })
        .await,
    )
}

/// Writes the segment's files and commits them; returns files written.
pub(crate) async fn commit(store: &Store, logs: &mut Logs, sealed: Arc<Sealed>) -> Result<u64> {
    let guard = Txn { app_id: writer_app(&logs.writer), version: sealed.segment as i64, last_updated: None };
    let info = serde_json::json!({"writer": logs.writer, "segment": sealed.segment});
    // Before any table names the segment: others read what it holds from here.
    let ranges = sealed.nodes.iter().map(|(n, r)| (n.as_str(), [r.first, r.last])).collect();
    intent::write(store, &logs.writer, sealed.segment, &ranges).await?;
    let mut written = 0;
    for t in encode(&logs.writer, &sealed).await? {
        written += logs.commit_table(store, &sealed, t, &guard, &info).await?;
    }
    written += commit_batches(store, logs, &sealed, &guard, info).await?;
    logs.settle(&sealed);
    Ok(written)
}

/// Writes and commits rows as segment `segment` of `writer` (benchmarks
/// and tools that build a store without the ingest service).
pub async fn write_segment(
    store: &Store,
    writer: &str,
    segment: u64,
    tables: BTreeMap<Table, Vec<RecordBatch>>,
) -> Result<u64> {
    let rows = tables.values().flatten().map(|b| b.num_rows()).sum();
    let sigs = ingero_model::signals::from_tables(&tables).into_iter().collect();
    let (origins, pushes, nodes) = (BTreeMap::new(), Vec::new(), BTreeMap::new());
    let sealed = Sealed { segment, tables, origins, pushes, rows, nodes, signals: vec![(None, sigs)] };
    commit(store, &mut Logs::new(writer.to_string()), Arc::new(sealed)).await
}

/// The segment's rows in `ingest_batches` (one per node, without what
/// another writer stored first), with the node high-waters.
async fn commit_batches(
    store: &Store,
    logs: &mut Logs,
    sealed: &Sealed,
    guard: &Txn,
    info: serde_json::Value,
) -> Result<u64> {
    let writer = logs.writer.clone();
    logs.get(store, BATCHES_TABLE, &batches_schema()).await?;
    // Node versions only for nodes still arriving here (the others' are
    // folded in by maintenance, `crate::fold`), and only where they raise;
    // every node's while a replica of an ingero before folds is about.
    let arriving: Vec<Txn> = sealed.arriving_txns(BATCHES_TABLE, logs).collect();
    let all: Vec<Txn> = sealed.nodes.iter().map(|(n, r)| node_txn(n, r.last)).collect();
    let folds = Txn { app_id: fold::folds_app(&writer), version: 1, last_updated: None };
    let Logs { logs, intents, .. } = logs;
    let log = logs.get_mut(BATCHES_TABLE).expect("opened above");
    let mut written = 0;
    loop {
        log.prepare(store).await?;
        if log.snapshot.txns.get(&guard.app_id).is_some_and(|&v| v >= guard.version) {
            return Ok(written);
        }
        let completed =
            intents.completed.high_waters_of(store, &log.snapshot, |n| sealed.nodes.contains_key(n)).await?;
        let ranges = sealed.ranges_without(&sealed.stored_of(&completed));
        let mut adds = Vec::new();
        if !ranges.is_empty() {
            let now = chrono::Utc::now().timestamp_micros();
            let batch = batches_rows(&writer, sealed.segment, &ranges, now)?;
            let dir = hour_dir(BATCHES_TABLE, hour_of(now));
            let dir = dir.strip_prefix(&format!("{BATCHES_TABLE}/")).unwrap_or(&dir);
            let rel = format!("{dir}/part-{writer}-{:020}-{}.parquet", sealed.segment, crate::layout::unique());
            let file = tiers::encode(&batch)?;
            adds.push(table::add(&rel, file.bytes.len(), file.stats));
            store.put_durable(&format!("{BATCHES_TABLE}/{rel}"), file.bytes.into()).await?;
            written = 1;
        }
        let old = fold::old_writer_active(&log.snapshot, chrono::Utc::now().timestamp_millis());
        let raises = |t: &&Txn| log.snapshot.txns.get(&t.app_id).is_none_or(|&v| t.version > v);
        let nodes = if old { &all } else { &arriving };
        let txns = [guard.clone(), folds.clone()].into_iter().chain(nodes.iter().filter(raises).cloned()).collect();
        if log.try_commit(store, adds, txns, info.clone()).await?.is_some() {
            let backlog = fold::backlog(&log.snapshot, &writer);
            if backlog >= fold::SELF_FOLD {
                // Maintenance is off (or failing): fold here, so that readers
                // never list and read more than a bounded number of intents.
                tracing::info!(backlog, "folding node high-waters (no maintenance has for a while)");
                if let Err(e) = fold::fold(store).await {
                    tracing::warn!(error = %e, "folding node high-waters failed; next segment tries again");
                }
            }
            return Ok(written);
        }
    }
}

fn batches_rows(writer: &str, segment: u64, ranges: &BTreeMap<String, NodeRange>, now: i64) -> Result<RecordBatch> {
    let n = ranges.len();
    let col = |f: &dyn Fn(&NodeRange) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from(ranges.values().map(f).collect::<Vec<_>>()))
    };
    Ok(RecordBatch::try_new(
        batches_schema(),
        vec![
            Arc::new(StringArray::from(vec![writer; n])),
            Arc::new(UInt64Array::from(vec![segment; n])),
            Arc::new(StringArray::from(ranges.keys().map(String::as_str).collect::<Vec<_>>())),
            col(&|r| r.first),
            col(&|r| r.last),
            col(&|r| r.batches),
            col(&|r| r.rows),
            Arc::new(TimestampMicrosecondArray::from(vec![now; n]).with_timezone("UTC")),
        ],
    )?)
}

#[cfg(test)]
#[path = "flush_tests.rs"]
mod tests;
