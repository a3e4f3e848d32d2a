// SPDX-License-Identifier: Apache-2.0
//! Table properties (`metaData.configuration`) this writer reads and sets.

use std::collections::BTreeMap;
use std::time::Duration;

/// Delta's property: `txn` identifiers not updated for this long expire at
/// the next checkpoint.
pub const TXN_RETENTION_KEY: &str = "delta.setTransactionRetentionDuration";

/// What ingero sets on its tables: a node or replica silent for a week is
/// gone (an agent's sequences are persisted and only grow, so a node that
/// comes back later sends batches above any expired high-water), and the
/// per-node versions of a fleet that churns nodes stay bounded by the nodes
/// of the last week.
pub const TXN_RETENTION_DEFAULT: &str = "interval 7 days";

/// Delta's property: how long log entries a newer checkpoint covers are
/// kept (time travel reaches that far back).
pub const LOG_RETENTION_KEY: &str = "delta.logRetentionDuration";

/// What ingero sets on its tables: two days. Every commit of a dense table
/// carries one `txn` per node (the exactly-once high-waters): ~89 bytes per
/// node and table commit, ~20 GB of log a day at 10,000 nodes flushing
/// every 30 s (BENCHMARKS.md); Delta's default (30 days) would keep ~0.6 TB.
/// ingero itself never reads behind its last checkpoint; an owner who wants
/// longer time travel sets the property and ingero keeps it.
pub const LOG_RETENTION_DEFAULT: &str = "interval 2 days";

/// Delta's default log retention, for tables without the property.
pub const DELTA_LOG_RETENTION: Duration = Duration::from_secs(30 * 86_400);

/// The properties ingero sets on the tables it creates, and adds to older
/// tables that lack them (a value already there is kept).
pub const OURS: [(&str, &str); 2] =
    [(TXN_RETENTION_KEY, TXN_RETENTION_DEFAULT), (LOG_RETENTION_KEY, LOG_RETENTION_DEFAULT)];

/// The table's log retention (Delta's default where absent or unreadable).
pub fn log_retention(config: &BTreeMap<String, String>) -> Duration {
    config.get(LOG_RETENTION_KEY).and_then(|s| parse_interval(s)).unwrap_or(DELTA_LOG_RETENTION)
}

/// The table's transaction retention; `None`: transactions never expire
/// (the property is absent or not an interval we read).
pub fn txn_retention(config: &BTreeMap<String, String>) -> Option<Duration> {
    parse_interval(config.get(TXN_RETENTION_KEY)?)
}

/// A Delta calendar interval as tables write it: `interval 7 days`,
/// `interval 168 hours`, `2 weeks`.
pub fn parse_interval(s: &str) -> Option<Duration> {
    let mut words = s.split_whitespace();
    let mut n = words.next()?;
    if n.eq_ignore_ascii_case("interval") {
        n = words.next()?;
    }
    let n: u64 = n.parse().ok()?;
    let unit = words.next()?.to_ascii_lowercase();
    if words.next().is_some() {
        return None;
    }
    let secs = match unit.trim_end_matches('s') {
        "second" => 1,
        "minute" => 60,
        "hour" => 3600,
        "day" => 86_400,
        "week" => 7 * 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(n.checked_mul(secs)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_as_delta_tables_write_them() {
        let d = |s| parse_interval(s).map(|d| d.as_secs());
        assert_eq!(d("interval 7 days"), Some(7 * 86_400));
        assert_eq!(d("interval 1 day"), Some(86_400));
        assert_eq!(d("168 hours"), Some(168 * 3600));
        assert_eq!(d("INTERVAL 2 Weeks"), Some(14 * 86_400));
        assert_eq!(d("interval 30 minutes"), Some(1800));
        for bad in ["", "interval", "interval seven days", "interval 7 fortnights", "interval 7 days ago"] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
        let mut config = BTreeMap::new();
        assert_eq!(txn_retention(&config), None, "absent: never expire");
        config.insert(TXN_RETENTION_KEY.to_string(), TXN_RETENTION_DEFAULT.to_string());
        assert_eq!(txn_retention(&config), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(log_retention(&config), DELTA_LOG_RETENTION, "absent: Delta's 30 days");
        config.insert(LOG_RETENTION_KEY.to_string(), LOG_RETENTION_DEFAULT.to_string());
        assert_eq!(log_retention(&config), Duration::from_secs(2 * 86_400));
    }
}
