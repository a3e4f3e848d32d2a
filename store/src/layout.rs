// SPDX-License-Identifier: Apache-2.0
//! Where things live in the store: hive partitions by table, date and hour.

use chrono::{DateTime, Datelike, Timelike, Utc};
use ingero_model::Table;

const HOUR_US: i64 = 3_600_000_000;

/// Hour bucket (hours since the epoch) of a timestamp in µs.
pub(crate) fn hour_of(us: i64) -> i64 {
    us.div_euclid(HOUR_US)
}

/// `<table>/date=YYYY-MM-DD/hour=HH` of an hour (hours since the epoch).
pub(crate) fn hour_dir(table: &str, hour: i64) -> String {
    let t: DateTime<Utc> = DateTime::from_timestamp(hour * 3600, 0).unwrap_or_default();
    format!("{table}/date={:04}-{:02}-{:02}/hour={:02}", t.year(), t.month(), t.day(), t.hour())
}

/// One hive partition: `<table>/date=YYYY-MM-DD/hour=HH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition {
    pub table: Table,
    /// Hours since the epoch.
    pub hour: i64,
}

impl Partition {
    pub fn dir(&self) -> String {
        hour_dir(self.table.name(), self.hour)
    }

    /// File written for this partition by one writer's WAL segment: named
    /// by writer and segment for people, made unique by [`unique`], so no
    /// path is ever written twice (Delta's rule: a reader holding an older
    /// snapshot must not see a file change under it). A replay after a crash
    /// writes new files; the half-finished flush's were never committed and
    /// vacuum deletes them after its retention.
    pub fn file(&self, writer: &str, segment: u64, chunk: usize) -> String {
        format!("{}/part-{writer}-{segment:020}-{chunk:04}-{}.parquet", self.dir(), unique())
    }
}

/// A random suffix that makes each written file's name unique.
pub(crate) fn unique() -> String {
    format!("{:08x}", rand::random::<u32>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_paths_are_hive_style() {
        // 2026-11-21T06:30:00Z
        let us = 1_795_242_600_000_000;
        let p = Partition { table: Table::CallWindows, hour: hour_of(us) };
        assert_eq!(p.dir(), "call_windows/date=2026-11-21/hour=06");
        let (a, b) = (p.file("ab12", 7, 1), p.file("ab12", 7, 1));
        assert!(a.starts_with("call_windows/date=2026-11-21/hour=06/part-ab12-00000000000000000007-0001-"), "{a}");
        assert!(a.ends_with(".parquet"));
        assert_ne!(a, b, "a path is never written twice");
        assert_eq!(hour_of(-1), -1);
    }
}
