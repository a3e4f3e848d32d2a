// SPDX-License-Identifier: Apache-2.0
//! Reading a signal tier over a time range: whole (the 60-s tier, small),
//! or file by file in time order ([`stream`]), so a 10,000-node hour is
//! never whole in memory and decoding the next file overlaps the caller's
//! work on this one.

use std::pin::Pin;
use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::file::metadata::{FooterTail, ParquetMetaDataReader};
use parquet::file::statistics::Statistics;

use super::Store;
use super::layout::hour_of;
use super::tiers::{Tier, schema};
use crate::error::{Error, Result};

/// Every live file of a tier (its Delta snapshot) whose hour partition
/// overlaps [start, end).
pub async fn files_in_range(store: &Store, tier: Tier, start_us: i64, end_us: i64) -> Result<Vec<String>> {
    Ok(sized_in_range(store, tier, start_us, end_us).await?.into_iter().map(|(k, _)| k.to_string()).collect())
}

/// [`files_in_range`] with each file's size (from its `add`: no HEAD).
async fn sized_in_range(store: &Store, tier: Tier, start_us: i64, end_us: i64) -> Result<Vec<(Path, u64)>> {
    let (lo, hi) = (hour_of(start_us), hour_of(end_us.saturating_sub(1)));
    let snap = super::delta::log::current(store, tier.name()).await?;
    let mut files: Vec<(Path, u64)> = snap
        .files
        .iter()
        .filter(|(rel, _)| partition_hour(rel).is_some_and(|h| (lo..=hi).contains(&h)))
        .map(|(rel, add)| (store.key(&format!("{}/{rel}", snap.table)), add.size.max(0) as u64))
        .collect();
    files.sort();
    Ok(files)
}

/// Hours since the epoch of a key's `date=YYYY-MM-DD/hour=HH` partition.
fn partition_hour(key: &str) -> Option<i64> {
    let d = key.find("date=")? + 5;
    let date = chrono::NaiveDate::parse_from_str(key.get(d..d + 10)?, "%Y-%m-%d").ok()?;
    let h = key.find("/hour=")? + 6;
    let hour: i64 = key.get(h..h + 2)?.parse().ok()?;
    let midnight = date.and_hms_opt(0, 0, 0)?.and_utc().timestamp();
    Some(midnight / 3600 + hour)
}

/// Reads the files of a tier's hour partitions overlapping [start, end),
/// decoding them in parallel; the caller filters rows by time.
pub async fn read(store: &Store, tier: Tier, start_us: i64, end_us: i64) -> Result<Vec<RecordBatch>> {
    let files = sized_in_range(store, tier, start_us, end_us).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for (key, _) in files {
        let os = store.object_store.clone();
        tasks.spawn(async move {
            let bytes = os.get(&key).await?.bytes().await?;
            decode(move || ParquetRecordBatchReaderBuilder::try_new(bytes)).await
        });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.extend(r.map_err(|e| Error::State(format!("tier reader panicked: {e}")))??);
    }
    Ok(out)
}

/// One file of a [`stream`], decoded.
#[derive(Debug)]
pub struct Piece {
    pub batches: Vec<RecordBatch>,
    /// No later piece holds a window starting before this (`i64::MAX`:
    /// this was the last): every bin ending by then is complete.
    pub rest_from_us: i64,
}

/// The pieces of a [`stream`], in order.
pub struct Pieces(Pin<Box<dyn Stream<Item = Result<Piece>> + Send>>);

impl std::fmt::Debug for Pieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pieces")
    }
}

impl Pieces {
    pub async fn next(&mut self) -> Option<Result<Piece>> {
        self.0.next().await
    }
}

/// The tier's files overlapping [start, end), decoded one at a time in the
/// order of their first window (from the footers' statistics), `ahead`
/// files decoding while the caller works on the current one.
pub async fn stream(store: &Store, tier: Tier, start_us: i64, end_us: i64, ahead: usize) -> Result<Pieces> {
    let os = store.object_store.clone();
    let footers = sized_in_range(store, tier, start_us, end_us).await?.into_iter().map(|(key, size)| {
        let os = os.clone();
        async move {
            let meta = footer(&*os, &key, size).await?;
            Ok::<_, Error>((first_window(&meta), key, meta))
        }
    });
    let mut files: Vec<(i64, Path, ArrowReaderMetadata)> =
        futures::stream::iter(footers).buffer_unordered(16).try_collect().await?;
    files.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let rest: Vec<i64> = files.iter().skip(1).map(|f| f.0).chain([i64::MAX]).collect();
    let pieces = futures::stream::iter(files.into_iter().zip(rest))
        .map(move |((_, key, meta), rest_from_us)| {
            let os = os.clone();
            async move {
                let bytes = os.get(&key).await?.bytes().await?;
                let batches =
                    decode(move || Ok(ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, meta))).await?;
                Ok(Piece { batches, rest_from_us })
            }
        })
        .buffered(ahead.max(1));
    Ok(Pieces(Box::pin(pieces)))
}

/// A Parquet file's footer, in two ranged reads.
async fn footer(os: &dyn object_store::ObjectStore, key: &Path, size: u64) -> Result<ArrowReaderMetadata> {
    let bad = |why: &str| Error::State(format!("{key}: not a Parquet file ({why})"));
    let tail = os.get_range(key, size.checked_sub(8).ok_or_else(|| bad("under 8 bytes"))?..size).await?;
    let tail: &[u8; 8] = tail.as_ref().try_into().map_err(|_| bad("short read"))?;
    let len = FooterTail::try_new(tail)?.metadata_length() as u64;
    let at = (size - 8).checked_sub(len).ok_or_else(|| bad("footer longer than the file"))?;
    let buf = os.get_range(key, at..size - 8).await?;
    let meta = ParquetMetaDataReader::decode_metadata(&buf)?;
    Ok(ArrowReaderMetadata::try_new(Arc::new(meta), Default::default())?)
}

/// The earliest `window_start` a file's row groups say they hold
/// (`i64::MIN` where a row group has no statistics: read it first).
fn first_window(meta: &ArrowReaderMetadata) -> i64 {
    let col = meta.parquet_schema().columns().iter().position(|c| c.name() == "window_start");
    let groups = meta.metadata().row_groups();
    let min = |g: &parquet::file::metadata::RowGroupMetaData| match col.and_then(|c| g.column(c).statistics()) {
        Some(Statistics::Int64(s)) => s.min_opt().copied(),
        _ => None,
    };
    groups.iter().map(min).try_fold(i64::MAX, |acc, m| m.map(|m| acc.min(m))).unwrap_or(i64::MIN)
}

/// Decodes one tier file on a blocking thread (a file is seconds of CPU
/// at 10,000 nodes).
async fn decode(
    builder: impl FnOnce() -> parquet::errors::Result<ParquetRecordBatchReaderBuilder<bytes::Bytes>> + Send + 'static,
) -> Result<Vec<RecordBatch>> {
    let target = schema();
    tokio::task::spawn_blocking(move || -> Result<Vec<RecordBatch>> {
        let reader = builder()?.with_batch_size(64 * 1024).build()?;
        reader.map(|b| super::delta::schema::to_logical(&b?, &target)).collect()
    })
    .await
    .map_err(|e| Error::State(format!("tier reader panicked: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_hours_round_trip_through_keys() {
        for us in [0i64, 1_795_242_600_000_000, 4_102_444_799_000_000] {
            let h = hour_of(us);
            let key = crate::tiers::file_key(Tier::Minute, h, "part-1");
            assert_eq!(partition_hour(&format!("prefix/{key}")), Some(h), "{key}");
        }
        assert_eq!(partition_hour("signal_windows/x.parquet"), None);
    }

    /// Commits one 10-s tier file per `(first second, seconds)` of two
    /// nodes' 1-s windows, in the order given.
    async fn tier_files(store: &Store, spans: &[(i64, i64)]) {
        use crate::delta::action::Txn;
        use crate::flush::{Encoded, EncodedFile, Logs};
        use ingero_model::signals::{NodeWindowKey, Signals};
        let mut logs = Logs::new("test".into());
        for (k, &(from, secs)) in spans.iter().enumerate() {
            let sigs: Vec<(NodeWindowKey, Signals)> = (from..from + secs)
                .flat_map(|t| ["n1", "n2"].map(|n| (t, n)))
                .map(|(t, n)| {
                    let key = NodeWindowKey { job: "j".into(), node: n.into(), window_start_us: T0 + t * 1_000_000 };
                    (key, Signals { window_ns: 1e9, wait_ns: t as f64, measured: true, ..Default::default() })
                })
                .collect();
            let files = crate::tiers::build(&sigs)
                .unwrap()
                .into_iter()
                .filter(|(tier, _, _)| *tier == Tier::TenSeconds)
                .map(|(tier, hour, b)| {
                    let key = crate::tiers::file_key(tier, hour, &format!("part-{k}"));
                    (tier, EncodedFile::new(key, crate::tiers::encode(&b).unwrap()))
                })
                .collect();
            let guard = Txn { app_id: format!("test-{k}"), version: 1, last_updated: None };
            for t in Encoded::tiers(files) {
                logs.commit_files(store, t, &guard, serde_json::json!({})).await.unwrap();
            }
        }
    }

    /// An hour boundary: 2026-11-28T13:00:00Z.
    const T0: i64 = 1_795_870_800_000_000;

    #[tokio::test]
    async fn a_stream_gives_files_in_time_order_with_what_later_ones_can_hold() {
        let (_dir, store) = crate::fixtures::temp_store();
        // Committed out of order; the last is one file over all (as a
        // co-owner's compaction writes), and one crosses the hour.
        tier_files(&store, &[(600, 300), (0, 300), (300, 300), (3590, 20), (0, 900)]).await;
        let mut pieces = stream(&store, Tier::TenSeconds, T0, T0 + 7_200_000_000, 2).await.unwrap();
        let mut got = Vec::new();
        while let Some(p) = pieces.next().await {
            let p = p.unwrap();
            let windows: Vec<i64> = p
                .batches
                .iter()
                .flat_map(|b| {
                    let t = crate::tiers::TierBatch::new(b).unwrap();
                    (0..t.len()).map(|i| t.window_start(i)).collect::<Vec<_>>()
                })
                .collect();
            let first = *windows.iter().min().unwrap();
            got.push(((first - T0) / 1_000_000, p.rest_from_us.saturating_sub(T0) / 1_000_000, windows.len()));
        }
        // (first second, later pieces start at or after, rows): the two
        // files from 0 s in either order, then 300, 600, then the hour's
        // crossing file in its two hour partitions.
        let rest: Vec<i64> = got.iter().map(|g| g.1).collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [0, 0, 300, 600, 3590, 3600], "{got:?}");
        assert_eq!(rest, [0, 300, 600, 3590, 3600, (i64::MAX - T0) / 1_000_000], "{got:?}");
        let rows: usize = got.iter().map(|g| g.2).sum();
        // 10-s bins of two nodes: 90 + 30 + 30 + 30, then one each side of the hour.
        assert_eq!(rows, 2 * (90 + 30 + 30 + 30) + 2 + 2, "{got:?}");
    }
}
