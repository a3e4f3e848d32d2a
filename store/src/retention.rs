// SPDX-License-Identifier: Apache-2.0
//! Data retention: hour partitions older than their table's time to live
//! leave the table (one `remove` commit per table, `dataChange: true`, as a
//! Delta DELETE); vacuum deletes their files once the vacuum retention has
//! passed, so a reader on an older snapshot still finds them meanwhile.
//!
//! Two TTLs: the raw tables (every window row, the ingest bookkeeping and
//! the per-window signal tier, one row per node and window) and the 10 s and
//! 60 s signal tiers (what history ranking reads over long ranges), which
//! are 10-60 times smaller and worth keeping much longer.

use std::time::Duration;

use arrow::datatypes::SchemaRef;

use crate::delta::table::TableLog;
use crate::error::Result;
use crate::tiers::Tier;
use crate::{Store, layout};

/// Default TTL of the raw tables.
pub const RAW_DEFAULT: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default TTL of the signal tiers.
pub const TIERS_DEFAULT: Duration = Duration::from_secs(400 * 24 * 3600);

/// How long each kind of table keeps its rows; `None`: for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub raw: Option<Duration>,
    pub tiers: Option<Duration>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { raw: Some(RAW_DEFAULT), tiers: Some(TIERS_DEFAULT) }
    }
}

impl Retention {
    /// Keeps everything (tests, imports of old traces).
    pub const FOREVER: Retention = Retention { raw: None, tiers: None };

    /// The TTL of one table.
    pub fn ttl(&self, table: &str) -> Option<Duration> {
        let coarse = [Tier::TenSeconds, Tier::Minute].iter().any(|t| t.name() == table);
        if coarse { self.tiers } else { self.raw }
    }
}

/// What one pass removed from one table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub files: usize,
    pub rows: u64,
    pub bytes: u64,
}

/// Removes from `table` every file of an hour partition that ended more
/// than `ttl` before `now_us`.
pub async fn expire(store: &Store, table: &str, logical: &SchemaRef, ttl: Duration, now_us: i64) -> Result<Expired> {
    let mut log = TableLog::open(store, table, logical).await?;
    let cutoff_hour = layout::hour_of(now_us - ttl.as_micros() as i64);
    let mut gone = Vec::new();
    let mut done = Expired::default();
    for (path, add) in &log.snapshot.files {
        // The hour of a file is its partition: an hour that ends before the
        // cutoff (its start is below the cutoff's hour) has expired.
        if partition_hour(add).is_some_and(|h| h < cutoff_hour) {
            gone.push(path.clone());
            done.files += 1;
            // A file without a row count adds nothing to the count.
            done.rows += Some(add.rows()).filter(|&r| r != u64::MAX).unwrap_or(0);
            done.bytes += add.size.max(0) as u64;
        }
    }
    if gone.is_empty() || log.remove_files(store, &gone).await?.is_none() {
        // Nothing expired, or another replica removed them first.
        return Ok(Expired::default());
    }
    Ok(done)
}

/// Hours since the epoch of the file's `date`/`hour` partition.
fn partition_hour(add: &crate::delta::action::Add) -> Option<i64> {
    let date = add.partition_values.get("date")?.as_deref()?;
    let hour: u32 = add.partition_values.get("hour")?.as_deref()?.parse().ok()?;
    let t = chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()?.and_hms_opt(hour, 0, 0)?;
    Some(layout::hour_of(t.and_utc().timestamp_micros()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_tiers_keep_the_long_ttl_everything_else_the_raw_one() {
        let r = Retention { raw: Some(Duration::from_secs(1)), tiers: Some(Duration::from_secs(2)) };
        for t in ["call_windows", "sched_windows", "ingest_batches", "signal_windows"] {
            assert_eq!(r.ttl(t), r.raw, "{t}");
        }
        for t in ["signal_windows_10s", "signal_windows_60s"] {
            assert_eq!(r.ttl(t), r.tiers, "{t}");
        }
    }
}
