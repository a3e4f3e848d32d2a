// SPDX-License-Identifier: Apache-2.0
//! Signal tiers: the detector's per-node, per-window inputs, written at every
//! flush next to the raw tables, at the agents' own windows and rolled up to
//! 10 s and 60 s. History ranking reads the tier that fits its range (a day
//! of 1,000 nodes is 1.4 M rows at 60 s instead of ~800 M raw rows).
//!
//! Every column is a sum, so a bin split over several flushes is several
//! rows that readers add up; `window_us` is the agent-window time a row
//! covers, so a node that reported 3 s of a 10-s bin has shares over 3 s.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, DictionaryArray, RecordBatch, StringArray, TimestampMicrosecondArray,
    UInt64Array,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef, TimeUnit, UInt64Type};
use ingero_model::Table;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use super::layout::{hour_dir, hour_of};
use crate::error::{Error, Result};
use ingero_model::signals::{NodeWindowKey, Signals, from_tables};

/// One resolution of the signals table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// The agents' own windows (1 s by default).
    Window,
    TenSeconds,
    Minute,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Window, Tier::TenSeconds, Tier::Minute];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Window => "signal_windows",
            Tier::TenSeconds => "signal_windows_10s",
            Tier::Minute => "signal_windows_60s",
        }
    }

    /// Bin width; `None` for the agents' windows.
    pub fn width_us(self) -> Option<i64> {
        match self {
            Tier::Window => None,
            Tier::TenSeconds => Some(10_000_000),
            Tier::Minute => Some(60_000_000),
        }
    }

    /// The coarsest tier whose bins fit in `bin_us`.
    pub fn for_bin(bin_us: i64) -> Tier {
        Tier::ALL.into_iter().rev().find(|t| t.width_us().is_none_or(|w| w <= bin_us)).unwrap_or(Tier::Window)
    }
}

/// (name, type, doc) of every column, in order; `proto/README.md` lists them.
pub const COLUMNS: [(&str, &str, &str); 15] = [
    ("job", "dict<utf8>", "Job (`(unlabelled)` for rows without one)"),
    ("node", "dict<utf8>", "Node name"),
    ("window_start", "timestamp[µs, UTC]", "Start of the agent window or tier bin"),
    ("window_us", "uint64", "Agent-window time the row covers (µs; ≤ the bin width)"),
    ("windows", "uint64", "Agent windows summed into the row"),
    ("runq_wait_ns", "uint64", "Run-queue wait of the job's threads"),
    ("off_cpu_ns", "uint64", "Off-CPU time of the job's threads"),
    ("off_cpu_in_call_ns", "uint64", "Part of off_cpu_ns inside CUDA/NCCL calls (not a host stall)"),
    ("on_cpu_ns", "uint64", "On-CPU time of the job's threads"),
    ("threads", "uint64", "Threads covered by the scheduler rows (summed over windows)"),
    ("copy_wait_ns", "uint64", "Time in blocking device-to-host copies"),
    ("device_wait_ns", "uint64", "Time in syncs, blocking copies and collectives"),
    ("io_ns", "uint64", "Block IO latency summed"),
    ("mem_events", "uint64", "OOM kills, memory-pressure and swap events"),
    ("launches", "uint64", "Kernel and graph launches"),
];

/// Extra columns after [`COLUMNS`].
pub const EXTRA: [(&str, &str, &str); 2] = [
    ("measured", "bool", "Calls or scheduler time were reported (not only progress rows)"),
    ("in_call_age_ns", "uint64?", "Oldest CUDA/NCCL call in flight at a window's end (max; null: none)"),
];

fn dict() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// The Arrow schema of every tier.
pub fn schema() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        let mut f = vec![
            Field::new("job", dict(), false),
            Field::new("node", dict(), false),
            Field::new("window_start", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
        ];
        f.extend(COLUMNS[3..].iter().map(|(n, _, _)| Field::new(*n, DataType::UInt64, false)));
        f.push(Field::new("measured", DataType::Boolean, false));
        f.push(Field::new("in_call_age_ns", DataType::UInt64, true));
        Arc::new(Schema::new(f))
    })
    .clone()
}

/// A node-window's signals plus what the tier adds up.
#[derive(Debug, Clone, Default)]
struct Acc {
    s: Signals,
    windows: u64,
    age: Option<u64>,
}

impl Acc {
    fn add(&mut self, o: &Acc) {
        let w = self.s.window_ns + o.s.window_ns;
        self.s.merge(&o.s);
        self.s.window_ns = w;
        self.windows += o.windows;
        self.age = self.age.max(o.age);
    }
}

/// The signal rows of one flush (or import), per tier and hour partition,
/// from the signals each batch was given when it was accepted (merged per
/// node-window here: `Signals::merge` is what `from_tables` does per row,
/// so the result is the one the flush's tables would give).
pub fn build<'a>(
    signals: impl IntoIterator<Item = &'a (NodeWindowKey, Signals)>,
) -> Result<Vec<(Tier, i64, RecordBatch)>> {
    let mut merged: BTreeMap<NodeWindowKey, Signals> = BTreeMap::new();
    for (k, s) in signals {
        match merged.get_mut(k) {
            Some(m) => m.merge(s),
            None => {
                merged.insert(k.clone(), s.clone());
            }
        }
    }
    let base: BTreeMap<NodeWindowKey, Acc> = merged
        .into_iter()
        .map(|(k, mut s)| {
            let age = s.procs.iter().filter_map(|p| p.age_ns).max();
            s.procs = Vec::new();
            (k, Acc { s, windows: 1, age })
        })
        .collect();
    let mut out = Vec::new();
    for tier in Tier::ALL {
        let rows = match tier.width_us() {
            None => base.clone(),
            Some(w) => {
                let mut m: BTreeMap<NodeWindowKey, Acc> = BTreeMap::new();
                for (k, a) in &base {
                    let bin = k.window_start_us.div_euclid(w) * w;
                    let key = NodeWindowKey { window_start_us: bin, ..k.clone() };
                    m.entry(key).or_default().add(a);
                }
                m
            }
        };
        let mut by_hour: BTreeMap<i64, Vec<(&NodeWindowKey, &Acc)>> = BTreeMap::new();
        for (k, a) in &rows {
            by_hour.entry(hour_of(k.window_start_us)).or_default().push((k, a));
        }
        for (hour, rows) in by_hour {
            out.push((tier, hour, to_batch(&rows)?));
        }
    }
    Ok(out)
}

/// [`build`] from tables that arrived without signals (bulk writes: import,
/// benchmarks).
pub fn build_from_tables<'a>(
    tables: impl IntoIterator<Item = (&'a Table, &'a Vec<RecordBatch>)>,
) -> Result<Vec<(Tier, i64, RecordBatch)>> {
    let sigs: Vec<(NodeWindowKey, Signals)> = from_tables(tables).into_iter().collect();
    build(&sigs)
}

fn to_batch(rows: &[(&NodeWindowKey, &Acc)]) -> Result<RecordBatch> {
    let dict_col = |f: &dyn Fn(&NodeWindowKey) -> &str| -> ArrayRef {
        Arc::new(rows.iter().map(|(k, _)| f(k)).collect::<DictionaryArray<Int32Type>>())
    };
    let u = |f: &dyn Fn(&Acc) -> f64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|(_, a)| f(a).max(0.0).round() as u64)))
    };
    let cols: Vec<ArrayRef> = vec![
        dict_col(&|k| k.job.as_str()),
        dict_col(&|k| k.node.as_str()),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(rows.iter().map(|(k, _)| k.window_start_us))
                .with_timezone("UTC"),
        ),
        u(&|a| a.s.window_ns / 1e3),
        u(&|a| a.windows as f64),
        u(&|a| a.s.runq_ns),
        u(&|a| a.s.offcpu_ns),
        u(&|a| a.s.offcpu_call_ns),
        u(&|a| a.s.oncpu_ns),
        u(&|a| a.s.threads),
        u(&|a| a.s.copy_ns),
        u(&|a| a.s.wait_ns),
        u(&|a| a.s.io_ns),
        u(&|a| a.s.mem_events),
        u(&|a| a.s.launches),
        Arc::new(BooleanArray::from_iter(rows.iter().map(|(_, a)| Some(a.s.measured)))),
        Arc::new(UInt64Array::from_iter(rows.iter().map(|(_, a)| a.age))),
    ];
    Ok(RecordBatch::try_new(schema(), cols)?)
}

/// Encodes a tier batch (already sorted by job, node, time) as zstd Parquet.
pub fn encode(batch: &RecordBatch) -> Result<super::parquet::ParquetFile> {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_created_by(format!("ingero {}", env!("CARGO_PKG_VERSION")))
        .build();
    let batch = super::delta::schema::to_storage(batch)?;
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))?;
    w.write(&batch)?;
    let md = w.close()?;
    Ok(super::parquet::ParquetFile { bytes: buf, stats: super::delta::stats::of_file(&batch, &md) })
}

/// Where a tier's file for one hour goes; `name` is unique per writer
/// (`part-<segment>` for flushes, `import-<fingerprint>` for imports).
pub fn file_key(tier: Tier, hour: i64, name: &str) -> String {
    format!("{}/{name}.parquet", hour_dir(tier.name(), hour))
}

/// One row of a tier batch, borrowed.
#[derive(Debug)]
pub struct TierRow<'a> {
    pub job: &'a str,
    pub node: &'a str,
    pub window_start_us: i64,
    pub signals: Signals,
    pub in_call_age_ns: Option<u64>,
}

/// A tier row's signal columns as stored: 112 bytes to copy out in row
/// order, where [`Signals`] is ~180.
#[derive(Debug, Clone, Copy)]
pub struct RawSignals {
    u: [u64; 12],
    measured: bool,
    /// The oldest call in flight at the window's end (0: none).
    in_call_age_ns: u64,
}

impl RawSignals {
    pub fn signals(&self) -> Signals {
        let v = |c: usize| self.u[c] as f64;
        Signals {
            window_ns: v(0) * 1e3,
            runq_ns: v(2),
            offcpu_ns: v(3),
            offcpu_call_ns: v(4),
            oncpu_ns: v(5),
            threads: v(6),
            copy_ns: v(7),
            wait_ns: v(8),
            // The oldest call's part of the row: one process's (the live
            // signals add each process's), at most the row's width.
            in_call_ns: (self.in_call_age_ns as f64).min(v(0) * 1e3),
            io_ns: v(9),
            mem_events: v(10),
            launches: v(11),
            measured: self.measured,
            procs: Vec::new(),
            host: None,
        }
    }
}

/// Typed column access to a tier batch (checked once, not per row).
#[derive(Debug)]
pub struct TierBatch<'a> {
    job: (&'a [i32], &'a StringArray),
    node: (&'a [i32], &'a StringArray),
    ts: &'a TimestampMicrosecondArray,
    u: Vec<&'a UInt64Array>,
    measured: &'a BooleanArray,
    age: &'a UInt64Array,
}

impl<'a> TierBatch<'a> {
    pub fn new(b: &'a RecordBatch) -> Result<TierBatch<'a>> {
        let bad = || Error::State("a signal tier file does not have the signal tier schema".into());
        let dict = |i: usize| -> Result<(&'a [i32], &'a StringArray)> {
            let d = b.column(i).as_dictionary_opt::<Int32Type>().ok_or_else(bad)?;
            let v = d.values().as_string_opt::<i32>().ok_or_else(bad)?;
            Ok((d.keys().values().as_ref(), v))
        };
        if b.num_columns() != schema().fields().len() {
            return Err(bad());
        }
        let u = (3..15).map(|i| b.column(i).as_primitive_opt::<UInt64Type>().ok_or_else(bad)).collect::<Result<_>>()?;
        Ok(TierBatch {
            job: dict(0)?,
            node: dict(1)?,
            ts: b.column(2).as_primitive_opt().ok_or_else(bad)?,
            u,
            measured: b.column(15).as_boolean_opt().ok_or_else(bad)?,
            age: b.column(16).as_primitive_opt::<UInt64Type>().ok_or_else(bad)?,
        })
    }

    pub fn len(&self) -> usize {
        self.ts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }

    pub fn window_start(&self, i: usize) -> i64 {
        self.ts.value(i)
    }

    /// Row `i`'s job and node as indexes into [`Self::names`] (readers that
    /// group rows intern names once per batch, not once per row).
    pub fn name_keys(&self, i: usize) -> (usize, usize) {
        (self.job.0[i] as usize, self.node.0[i] as usize)
    }

    /// The batch's dictionaries of job and node names.
    pub fn names(&self) -> (&'a StringArray, &'a StringArray) {
        (self.job.1, self.node.1)
    }

    /// Row `i`'s oldest CUDA/NCCL call in flight at a window's end (ns).
    pub fn in_call_age(&self, i: usize) -> Option<u64> {
        self.age.is_valid(i).then(|| self.age.value(i))
    }

    /// Row `i`'s signal columns.
    pub fn raw(&self, i: usize) -> RawSignals {
        RawSignals {
            u: std::array::from_fn(|c| self.u[c].value(i)),
            measured: self.measured.value(i),
            in_call_age_ns: self.in_call_age(i).unwrap_or(0),
        }
    }

    pub fn row(&self, i: usize) -> TierRow<'a> {
        let signals = self.raw(i).signals();
        TierRow {
            job: self.job.1.value(self.job.0[i] as usize),
            node: self.node.1.value(self.node.0[i] as usize),
            window_start_us: self.ts.value(i),
            signals,
            in_call_age_ns: self.in_call_age(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingero_model::rows::{BatchBuilder, TimestampUs};
    use ingero_model::tables::{CallRow, Common, SchedRow};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn window(node: &str, t_s: i64, wait_ms: u64) -> Vec<(Table, Vec<RecordBatch>)> {
        let c = Common {
            node: node.into(),
            job: Some("j".into()),
            pid: 1,
            comm: "python3".into(),
            window_start_us: TimestampUs(1_800_000_000_000_000 + t_s * 1_000_000),
            window_us: 1_000_000,
            ..Default::default()
        };
        let mut calls = BatchBuilder::new(Table::CallWindows);
        let h = [ingero_model::hist::bucket(wait_ms * 1_000_000)];
        let n = [1u64];
        for (op, total) in [("cudaStreamSynchronize", wait_ms * 1_000_000), ("cudaLaunchKernel", 5)] {
            let row = CallRow {
                library: "cudart",
                op,
                count: 10,
                errors: 0,
                total_ns: total,
                max_ns: total,
                sampled: false,
                hist_bucket: &h,
                hist_count: &n,
                sample_ratio: None,
            };
            calls.append(&c, &row).unwrap();
        }
        let mut sched = BatchBuilder::new(Table::SchedWindows);
        let row = SchedRow {
            threads: 2,
            on_cpu_ns: 600_000_000,
            off_cpu_ns: 400_000_000,
            runq_wait_ns: 1_000,
            runq_max_ns: 1_000,
            voluntary_switches: 1,
            involuntary_switches: 0,
            wakeups: 1,
            off_cpu_in_call_ns: Some(300_000_000),
            runq_wait_in_call_ns: Some(0),
        };
        sched.append(&c, &row).unwrap();
        vec![(Table::CallWindows, vec![calls.finish().unwrap()]), (Table::SchedWindows, vec![sched.finish().unwrap()])]
    }

    #[test]
    fn tiers_sum_windows_into_bins_and_read_back() {
        // 25 one-second windows of one node, from 5 s before a 10-s boundary.
        let mut all: BTreeMap<Table, Vec<RecordBatch>> = BTreeMap::new();
        for t in 0..25 {
            for (table, b) in window("n1", t, 100) {
                all.entry(table).or_default().extend(b);
            }
        }
        let out = build_from_tables(&all).unwrap();
        let rows = |tier: Tier| -> Vec<TierRow<'_>> {
            out.iter()
                .filter(|(t, _, _)| *t == tier)
                .flat_map(|(_, _, b)| {
                    let tb = TierBatch::new(b).unwrap();
                    (0..tb.len()).map(move |i| tb.row(i))
                })
                .collect()
        };
        let w = rows(Tier::Window);
        assert_eq!(w.len(), 25);
        assert_eq!((w[0].job, w[0].node), ("j", "n1"));
        assert_eq!(w[0].signals.wait_ns, 100e6);
        assert_eq!(w[0].signals.launches, 10.0);
        assert_eq!(w[0].signals.offcpu_call_ns, 300e6);
        assert_eq!(w[0].signals.window_ns, 1e9);
        let ten = rows(Tier::TenSeconds);
        // 1_800_000_000 s is a multiple of 10: bins of 10, 10 and 5 windows.
        let covered: Vec<f64> = ten.iter().map(|r| r.signals.window_ns / 1e9).collect();
        assert_eq!(covered, vec![10.0, 10.0, 5.0]);
        assert_eq!(ten[2].signals.wait_ns, 500e6);
        assert_eq!(ten[0].signals.threads, 20.0);
        // Shares over a bin equal the per-window shares.
        let share = |s: &Signals| s.wait_ns / s.window_ns;
        assert!((share(&ten[2].signals) - share(&w[0].signals)).abs() < 1e-12);
        let minute = rows(Tier::Minute);
        assert_eq!(minute.len(), 1);
        assert_eq!(minute[0].signals.window_ns, 25e9);
    }

    /// Signals computed once per accepted batch and merged at the flush give
    /// the tiers the flush's tables give, however the windows were split
    /// into batches and in whatever order they arrived.
    #[test]
    fn tiers_from_per_batch_signals_equal_tiers_from_the_tables() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for _ in 0..20 {
            // Batches of one node's windows, some windows split over two
            // batches (a window's rows may come in parts), nodes interleaved.
            let mut batches: Vec<Vec<(Table, Vec<RecordBatch>)>> = Vec::new();
            for node in ["a", "b", "c"] {
                for t in 0..(5 + next(30) as i64) {
                    batches.push(window(node, t * (1 + next(3) as i64), 1 + next(900)));
                    if next(4) == 0 {
                        batches.push(window(node, t, 1 + next(50)));
                    }
                }
            }
            for i in (1..batches.len()).rev() {
                batches.swap(i, next(i as u64 + 1) as usize);
            }
            let mut all: BTreeMap<Table, Vec<RecordBatch>> = BTreeMap::new();
            for b in &batches {
                for (t, rb) in b {
                    all.entry(*t).or_default().extend(rb.iter().cloned());
                }
            }
            let per_batch: Vec<_> = batches.iter().flat_map(|b| ingero_model::signals::of_tables(b)).collect();
            let once = build(&per_batch).unwrap();
            let twice = build_from_tables(&all).unwrap();
            assert_eq!(once.len(), twice.len());
            for ((ta, ha, a), (tb, hb, b)) in once.iter().zip(&twice) {
                assert_eq!((ta, ha), (tb, hb));
                assert_eq!(a, b, "tier {ta:?} hour {ha}");
            }
        }
    }

    #[test]
    fn every_column_is_documented_in_the_proto_readme() {
        let readme = include_str!("../../proto/README.md");
        let section = &readme[readme.find("## Signal tiers").expect("README lacks the signal tier section")..];
        for (name, ty, doc) in COLUMNS.iter().chain(EXTRA.iter()) {
            assert!(section.contains(&format!("| `{name}` | {ty} | {doc} |")), "proto/README.md lacks `{name}`");
        }
        let schema = schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let documented: Vec<&str> = COLUMNS.iter().chain(EXTRA.iter()).map(|c| c.0).collect();
        assert_eq!(names, documented, "schema and documented columns differ");
    }

    #[test]
    fn the_tier_for_a_bin_is_the_coarsest_that_fits() {
        assert_eq!(Tier::for_bin(1_000_000), Tier::Window);
        assert_eq!(Tier::for_bin(9_999_999), Tier::Window);
        assert_eq!(Tier::for_bin(10_000_000), Tier::TenSeconds);
        assert_eq!(Tier::for_bin(59_000_000), Tier::TenSeconds);
        assert_eq!(Tier::for_bin(240_000_000), Tier::Minute);
    }

    #[test]
    fn encoded_tiers_keep_their_dictionary_keys() {
        let mut all: BTreeMap<Table, Vec<RecordBatch>> = BTreeMap::new();
        for (node, t) in [("b", 0), ("a", 1)] {
            for (table, b) in window(node, t, 10) {
                all.entry(table).or_default().extend(b);
            }
        }
        let (_, _, b) = &build_from_tables(&all).unwrap()[0];
        let file = encode(b).unwrap();
        let back: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(file.bytes))
            .unwrap()
            .build()
            .unwrap()
            .map(|b| crate::delta::schema::to_logical(&b.unwrap(), &schema()).unwrap())
            .collect();
        let tb = TierBatch::new(&back[0]).unwrap();
        let nodes: Vec<&str> = (0..tb.len()).map(|i| tb.row(i).node).collect();
        assert_eq!(nodes, vec!["a", "b"], "rows sorted by job, node, time");
    }
}
