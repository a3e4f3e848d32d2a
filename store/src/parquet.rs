// SPDX-License-Identifier: Apache-2.0
//! Buffered rows → sorted, hour-partitioned, zstd Parquet files.

use std::collections::BTreeMap;

use arrow::array::{Array, RecordBatch, StringArray, TimestampMicrosecondArray, UInt32Array};
use arrow::compute::{SortColumn, concat_batches, lexsort_to_indices, take_record_batch};
use ingero_model::Table;
use ingero_model::tables::common;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use super::layout::{Partition, hour_of};
use crate::error::{Error, Result};

/// Column order rows are sorted by (node, window_start, pid): one node's rows
/// are contiguous and in time order, so page statistics prune node and time.
/// Rows per Parquet file (and row group): big enough that 1,000 nodes do not
/// make tiny files, small enough that a flush encodes files in parallel.
pub const FILE_ROWS: usize = 256 * 1024;

const SORT_COLUMNS: [usize; 3] = [0, 10, 7];

/// Splits one table's buffered batches into hour partitions, with rows
/// grouped by node and in time order, one batch per partition.
pub fn partition(table: Table, batches: &[RecordBatch]) -> Result<BTreeMap<Partition, RecordBatch>> {
    let mut out = BTreeMap::new();
    for (part, list) in ordered(table, batches)? {
        out.insert(part, concat_batches(&table.schema(), &list)?);
    }
    Ok(out)
}

/// One table's buffered batches cut into the files they become: per file
/// its partition, its number within the partition and its rows (slices of
/// the pushed batches, not yet copied: the copy into one batch happens in
/// the file's own encoding task, in parallel with the others).
pub fn files(table: Table, batches: &[RecordBatch]) -> Result<Vec<(Partition, usize, Vec<RecordBatch>)>> {
    let mut out = Vec::new();
    for (part, list) in ordered(table, batches)? {
        out.extend(cut(list, FILE_ROWS).into_iter().enumerate().map(|(n, rows)| (part, n, rows)));
    }
    Ok(out)
}

/// Batches in order, cut into groups of `per_file` rows (the last shorter).
fn cut(list: Vec<RecordBatch>, per_file: usize) -> Vec<Vec<RecordBatch>> {
    let (mut out, mut cur, mut rows) = (Vec::new(), Vec::new(), 0);
    for b in list {
        let mut off = 0;
        while off < b.num_rows() {
            let take = (per_file - rows).min(b.num_rows() - off);
            cur.push(b.slice(off, take));
            (rows, off) = (rows + take, off + take);
            if rows == per_file {
                out.push(std::mem::take(&mut cur));
                rows = 0;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Each hour partition's batches, ordered.
///
/// Each pushed batch comes from one node, so ordering whole batches by
/// (node, first window) makes every node's rows contiguous without a per-row
/// sort; [`encode`] then sorts only when a batch spans several windows.
fn ordered(table: Table, batches: &[RecordBatch]) -> Result<BTreeMap<Partition, Vec<RecordBatch>>> {
    let mut order: Vec<(&str, i64, usize)> = batches
        .iter()
        .enumerate()
        .filter(|(_, b)| b.num_rows() > 0)
        .map(|(i, b)| (first_node(b), first_ts(b), i))
        .collect();
    order.sort_unstable();
    let mut out: BTreeMap<Partition, Vec<RecordBatch>> = BTreeMap::new();
    for (_, _, i) in order {
        for (hour, b) in by_hour(&batches[i])? {
            out.entry(Partition { table, hour }).or_default().push(b);
        }
    }
    Ok(out)
}

/// A batch's rows per hour of their window (almost always one hour: the
/// batch itself).
fn by_hour(batch: &RecordBatch) -> Result<Vec<(i64, RecordBatch)>> {
    let ts = batch
        .column(common::WINDOW_START)
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .ok_or_else(|| Error::State("window_start is not a µs timestamp".into()))?;
    let values = ts.values();
    let first = hour_of(values[0]);
    if values.iter().all(|&v| hour_of(v) == first) {
        return Ok(vec![(first, batch.clone())]);
    }
    let mut rows: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
    for (i, &v) in values.iter().enumerate() {
        rows.entry(hour_of(v)).or_default().push(i as u32);
    }
    rows.into_iter().map(|(hour, idx)| Ok((hour, take_record_batch(batch, &UInt32Array::from(idx))?))).collect()
}

/// An encoded Parquet file with its Delta statistics.
#[derive(Debug)]
pub struct ParquetFile {
    pub bytes: Vec<u8>,
    /// The `add` action's `stats` JSON ([`super::delta::stats`]).
    pub stats: String,
}

/// Encodes a partition as one zstd Parquet file with page statistics,
/// sorted by (node, window_start, pid).
pub fn encode(batch: &RecordBatch) -> Result<ParquetFile> {
    let sorted = super::delta::schema::to_storage(&sort_if_needed(batch)?)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(FILE_ROWS))
        .set_sorting_columns(Some(
            SORT_COLUMNS
                .iter()
                .map(|&i| SortingColumn { column_idx: i as i32, descending: false, nulls_first: true })
                .collect(),
        ))
        .set_created_by(format!("ingero {}", env!("CARGO_PKG_VERSION")))
        .build();
    let mut buf = Vec::with_capacity(sorted.get_array_memory_size() / 4);
    let mut w = ArrowWriter::try_new(&mut buf, sorted.schema(), Some(props))?;
    w.write(&sorted)?;
    let md = w.close()?;
    Ok(ParquetFile { bytes: buf, stats: super::delta::stats::of_file(&sorted, &md) })
}

fn first_node(b: &RecordBatch) -> &str {
    b.column(common::NODE).as_any().downcast_ref::<StringArray>().map_or("", |a| a.value(0))
}

fn first_ts(b: &RecordBatch) -> i64 {
    b.column(common::WINDOW_START).as_any().downcast_ref::<TimestampMicrosecondArray>().map_or(0, |a| a.value(0))
}

/// Sorts by (node, window_start, pid) unless already in that order (the
/// usual case for agent data: one batch per node per window, pids ascending).
fn sort_if_needed(batch: &RecordBatch) -> Result<RecordBatch> {
    let node = batch.column(common::NODE).as_any().downcast_ref::<StringArray>();
    let pid = batch.column(common::PID).as_any().downcast_ref::<UInt32Array>();
    let ts = batch.column(common::WINDOW_START).as_any().downcast_ref::<TimestampMicrosecondArray>();
    if let (Some(node), Some(pid), Some(ts)) = (node, pid, ts) {
        let sorted = (1..batch.num_rows()).all(|i| {
            let a = (node.value(i - 1), ts.value(i - 1), pid.value(i - 1));
            let b = (node.value(i), ts.value(i), pid.value(i));
            a <= b
        });
        if sorted {
            return Ok(batch.clone());
        }
    }
    let sort: Vec<SortColumn> =
        SORT_COLUMNS.iter().map(|&i| SortColumn { values: batch.column(i).clone(), options: None }).collect();
    let idx = lexsort_to_indices(&sort, None)?;
    Ok(take_record_batch(batch, &idx)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingero_model::rows::{BatchBuilder, TimestampUs};
    use ingero_model::tables::{CgroupRow, Common};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use std::sync::Arc;

    #[test]
    fn files_are_cut_at_the_row_limit_in_order() {
        let b = |from: u32, n: u32| {
            RecordBatch::try_from_iter([("v", Arc::new(UInt32Array::from_iter_values(from..from + n)) as _)]).unwrap()
        };
        let files = cut(vec![b(0, 3), b(3, 5), b(8, 2)], 4);
        let sizes: Vec<Vec<usize>> = files.iter().map(|f| f.iter().map(RecordBatch::num_rows).collect()).collect();
        assert_eq!(sizes, vec![vec![3, 1], vec![4], vec![2]]);
        let values: Vec<u32> = files
            .iter()
            .flatten()
            .flat_map(|b| b.column(0).as_any().downcast_ref::<UInt32Array>().unwrap().values().to_vec())
            .collect();
        assert_eq!(values, (0..10).collect::<Vec<_>>());
        assert!(cut(vec![b(0, 0)], 4).is_empty());
    }

    #[test]
    fn partitions_by_hour_and_sorts_rows() {
        let mut b = BatchBuilder::new(Table::CgroupWindows);
        let hour = 3_600_000_000i64;
        for (node, pid, t) in [("b", 2, 0), ("a", 9, hour + 5), ("a", 1, 10), ("a", 1, 5)] {
            let c = Common {
                node: node.into(),
                pid,
                comm: "x".into(),
                window_start_us: TimestampUs(1_000 * hour + t),
                window_us: 1,
                ..Default::default()
            };
            b.append(&c, &CgroupRow { cgroup_path: "/", on_cpu_ns: 1, runq_wait_ns: 0, switches: 0 }).unwrap();
        }
        let parts = partition(Table::CgroupWindows, &[b.finish().unwrap()]).unwrap();
        let rows: Vec<usize> = parts.values().map(|b| b.num_rows()).collect();
        assert_eq!(rows, vec![3, 1]);
        let first = parts.values().next().unwrap();
        let bytes = encode(first).unwrap().bytes;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap();
        let md = reader.metadata().clone();
        let back: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
        let back = concat_batches(&back[0].schema(), &back).unwrap();
        let back = crate::delta::schema::to_logical(&back, &Table::CgroupWindows.schema()).unwrap();
        let pids = back.column(7).as_any().downcast_ref::<UInt32Array>().unwrap();
        let ts = back.column(10).as_any().downcast_ref::<TimestampMicrosecondArray>().unwrap();
        assert_eq!(pids.values().to_vec(), vec![1, 1, 2]);
        assert_eq!(ts.value(0) % hour, 5);
        assert_eq!(ts.value(1) % hour, 10);
        let col = md.row_group(0).column(0);
        assert_eq!(col.compression(), Compression::ZSTD(ZstdLevel::try_new(1).unwrap()));
        assert!(col.statistics().is_some());
    }
}
