// SPDX-License-Identifier: Apache-2.0
//! Prometheus metrics of the aggregator (served on `/metrics`).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // the variant name is the label value
pub enum Outcome {
    stored,
    duplicate,
    rejected,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// Why a batch is refused (`ingero_ingest_rejects_total{reason}`).
pub(crate) const REJECT_REASONS: [&str; 6] =
    ["invalid_argument", "too_large", "rate_limited", "unauthenticated", "bad_token", "wal_unavailable"];

#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    pub batches: Family<OutcomeLabel, Counter>,
    pub rows: Family<TableLabel, Counter>,
    pub bytes: Counter,
    pub rejects: Family<ReasonLabel, Counter>,
    pub buffered_rows: Gauge,
    pub flushes: Counter,
    pub flush_errors: Counter,
    pub flush_seconds: Histogram,
    pub wal_sync_seconds: Histogram,
    pub files_written: Counter,
    pub expired_files: Counter,
    pub expired_rows: Counter,
    pub expired_bytes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ingero");
        let m = Metrics {
            registry: Registry::default(),
            batches: Family::default(),
            rows: Family::default(),
            bytes: Counter::default(),
            rejects: Family::default(),
            buffered_rows: Gauge::default(),
            flushes: Counter::default(),
            flush_errors: Counter::default(),
            flush_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            wal_sync_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            files_written: Counter::default(),
            expired_files: Counter::default(),
            expired_rows: Counter::default(),
            expired_bytes: Counter::default(),
        };
        registry.register("ingest_batches", "Ingest batches by outcome", m.batches.clone());
        registry.register("ingest_rows", "Rows stored, by table", m.rows.clone());
        registry.register("ingest_bytes", "Arrow IPC bytes received in accepted batches", m.bytes.clone());
        registry.register("ingest_rejects", "Rejected batches by reason", m.rejects.clone());
        registry.register("buffered_rows", "Rows acknowledged but not yet in Parquet", m.buffered_rows.clone());
        registry.register("flushes", "Segments flushed to the store", m.flushes.clone());
        registry.register("flush_errors", "Failed flush attempts (retried)", m.flush_errors.clone());
        registry.register("flush_seconds", "Time to write one segment to the store", m.flush_seconds.clone());
        registry.register("wal_sync_seconds", "Write + fsync time of one WAL group commit", m.wal_sync_seconds.clone());
        registry.register("parquet_files_written", "Parquet files written", m.files_written.clone());
        let retention = "removed by data retention (--retention-raw, --retention-tiers)";
        registry.register("retention_files", format!("Files {retention}"), m.expired_files.clone());
        registry.register("retention_rows", format!("Rows {retention}"), m.expired_rows.clone());
        registry.register("retention_bytes", format!("Bytes {retention}"), m.expired_bytes.clone());
        // Every outcome and refusal reason exists at 0 from the start, so
        // rate() and the dashboard's panels have a series before the first one.
        for outcome in [Outcome::stored, Outcome::duplicate, Outcome::rejected] {
            let _ = m.batches.get_or_create(&OutcomeLabel { outcome });
        }
        for reason in REJECT_REASONS {
            let _ = m.rejects.get_or_create(&ReasonLabel { reason: reason.to_string() });
        }
        Metrics { registry, ..m }
    }
}

impl Metrics {
    pub fn reject(&self, reason: &'static str) {
        debug_assert!(REJECT_REASONS.contains(&reason), "undeclared reject reason {reason}");
        self.batches.get_or_create(&OutcomeLabel { outcome: Outcome::rejected }).inc();
        self.rejects.get_or_create(&ReasonLabel { reason: reason.to_string() }).inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
