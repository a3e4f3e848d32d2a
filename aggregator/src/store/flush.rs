// SPDX-License-Identifier: Apache-2.0
//! A sealed WAL segment → Parquet files → one Delta commit per table, then
//! the `ingest_batches` commit that records the segment and each node's
//! highest sequence. Every commit carries this writer's segment as a
//! transaction version, so a segment replayed after a crash skips the
//! tables it already reached and is never stored twice.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array};
use ingero_proto::Table;

use super::Store;
use super::delta::action::Txn;
use super::delta::{TableLog, table};
use super::layout::{hour_dir, hour_of};
use super::state::{BATCHES_TABLE, batches_schema, node_app, writer_app};
use super::{parquet, tiers};
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

/// A WAL segment ready for the store.
#[derive(Debug)]
pub(crate) struct Sealed {
    pub segment: u64,
    pub tables: BTreeMap<Table, Vec<RecordBatch>>,
    pub rows: usize,
    pub nodes: BTreeMap<String, NodeRange>,
}

/// The Delta logs this writer commits to, opened on first use.
#[derive(Debug)]
pub(crate) struct Logs {
    pub writer: String,
    logs: BTreeMap<String, TableLog>,
}

impl Logs {
    pub(crate) fn new(writer: String) -> Logs {
        Logs { writer, logs: BTreeMap::new() }
    }

    /// Writes a table's files, then commits them unless `guard` holds; returns files written.
    pub(crate) async fn commit_table(
        &mut self,
        store: &Store,
        t: Encoded,
        guard: &Txn,
        info: serde_json::Value,
    ) -> Result<u64> {
        let log = self.get(store, &t.name, &t.schema).await?;
        if log.snapshot.txns.get(&guard.app_id).is_some_and(|&v| v >= guard.version) {
            return Ok(0); // committed before a crash
        }
        let mut adds = Vec::with_capacity(t.files.len());
        let n = t.files.len() as u64;
        for f in t.files {
            let rel = f.key.strip_prefix(&format!("{}/", t.name)).unwrap_or(&f.key).to_string();
            adds.push(table::add(&rel, f.bytes.len(), f.rows));
            store.put_durable(&f.key, f.bytes.into()).await?;
        }
        log.commit(store, adds, vec![guard.clone()], Some(guard), info).await?;
        Ok(n)
    }

    async fn get(&mut self, store: &Store, name: &str, schema: &arrow::datatypes::Schema) -> Result<&mut TableLog> {
        if !self.logs.contains_key(name) {
            let log = TableLog::open(store, name, schema).await?;
            self.logs.insert(name.to_string(), log);
        }
        Ok(self.logs.get_mut(name).expect("inserted above"))
    }
}

/// One encoded file: its store key, bytes and row count.
#[derive(Debug)]
pub(crate) struct EncodedFile {
    pub key: String,
    pub bytes: Vec<u8>,
    pub rows: usize,
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

/// Encodes every table and tier of the segment in parallel.
async fn encode(writer: &str, sealed: &Arc<Sealed>) -> Result<Vec<Encoded>> {
    let mut tasks = Vec::new();
    for &t in sealed.tables.keys() {
        let (s, w) = (sealed.clone(), writer.to_string());
        tasks.push(tokio::task::spawn_blocking(move || -> Result<Vec<Encoded>> {
            let mut files = Vec::new();
            for (part, batch) in parquet::partition(t, &s.tables[&t])? {
                let rows = batch.num_rows();
                for (chunk, offset) in (0..rows).step_by(parquet::FILE_ROWS).enumerate() {
                    let slice = batch.slice(offset, parquet::FILE_ROWS.min(rows - offset));
                    let key = part.file(&w, s.segment, chunk);
                    files.push(EncodedFile { key, bytes: parquet::encode(&slice)?, rows: slice.num_rows() });
                }
            }
            Ok(vec![Encoded { name: t.name().to_string(), schema: t.schema(), files }])
        }));
    }
    let (s, w) = (sealed.clone(), writer.to_string());
    tasks.push(tokio::task::spawn_blocking(move || -> Result<Vec<Encoded>> {
        let name = format!("part-{w}-{:020}", s.segment);
        let mut files = Vec::new();
        for (tier, hour, b) in tiers::build(&s.tables)? {
            let (key, bytes) = (tiers::file_key(tier, hour, &name), tiers::encode(&b)?);
            files.push((tier, EncodedFile { key, bytes, rows: b.num_rows() }));
        }
        Ok(Encoded::tiers(files))
    }));
    let mut out = Vec::new();
    for t in tasks {
        out.extend(t.await.map_err(|e| Error::State(format!("encoder panicked: {e}")))??);
    }
    Ok(out)
}

/// Writes the segment's files and commits them; returns files written.
pub(crate) async fn commit(store: &Store, logs: &mut Logs, sealed: Arc<Sealed>) -> Result<u64> {
    let guard = Txn { app_id: writer_app(&logs.writer), version: sealed.segment as i64, last_updated: None };
    let info = serde_json::json!({"writer": logs.writer, "segment": sealed.segment});
    let mut written = 0;
    for t in encode(&logs.writer, &sealed).await? {
        written += logs.commit_table(store, t, &guard, info.clone()).await?;
    }
    written += commit_batches(store, logs, &sealed, &guard, info).await?;
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
    let sealed = Sealed { segment, tables, rows, nodes: BTreeMap::new() };
    commit(store, &mut Logs::new(writer.to_string()), Arc::new(sealed)).await
}

/// The segment's row in `ingest_batches`, with the node high-waters.
async fn commit_batches(
    store: &Store,
    logs: &mut Logs,
    sealed: &Sealed,
    guard: &Txn,
    info: serde_json::Value,
) -> Result<u64> {
    let now = chrono::Utc::now().timestamp_micros();
    let n = sealed.nodes.len();
    let col = |f: &dyn Fn(&NodeRange) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from(sealed.nodes.values().map(f).collect::<Vec<_>>()))
    };
    let batch = RecordBatch::try_new(
        batches_schema(),
        vec![
            Arc::new(StringArray::from(vec![logs.writer.as_str(); n])),
            Arc::new(UInt64Array::from(vec![sealed.segment; n])),
            Arc::new(StringArray::from(sealed.nodes.keys().map(String::as_str).collect::<Vec<_>>())),
            col(&|r| r.first),
            col(&|r| r.last),
            col(&|r| r.batches),
            col(&|r| r.rows),
            Arc::new(TimestampMicrosecondArray::from(vec![now; n]).with_timezone("UTC")),
        ],
    )?;
    let mut txns = vec![guard.clone()];
    txns.extend(sealed.nodes.iter().map(|(node, r)| Txn {
        app_id: node_app(node),
        version: r.last as i64,
        last_updated: None,
    }));
    let dir = hour_dir(BATCHES_TABLE, hour_of(now));
    let dir = dir.strip_prefix(&format!("{BATCHES_TABLE}/")).unwrap_or(&dir);
    let rel = format!("{dir}/part-{}-{:020}.parquet", logs.writer, sealed.segment);
    let bytes = tiers::encode(&batch)?;
    let adds = if n > 0 { vec![table::add(&rel, bytes.len(), n)] } else { Vec::new() };
    if n > 0 {
        store.put_durable(&format!("{BATCHES_TABLE}/{rel}"), bytes.into()).await?;
    }
    let log = logs.get(store, BATCHES_TABLE, &batches_schema()).await?;
    log.commit(store, adds, txns, Some(guard), info).await?;
    Ok(n.min(1) as u64)
}
