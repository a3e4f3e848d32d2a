// SPDX-License-Identifier: Apache-2.0
//! Small formatting and statistics helpers that the detector, the reports
//! and the CLI share (a leaf: none of them imports another for these).

/// A µs timestamp as RFC 3339 UTC to the second (the number itself when it
/// is out of chrono's range).
pub fn rfc3339(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .map_or_else(|| us.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Median (0 for an empty set); reorders `v`. A selection, not a sort: the
/// detector takes the median of every node of a job, per signal, per window.
pub fn median(v: &mut [f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    let (lower, mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let mid = *mid;
    match lower.iter().copied().max_by(f64::total_cmp) {
        Some(below) if n.is_multiple_of(2) => (below + mid) / 2.0,
        _ => mid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_timestamps() {
        assert_eq!(median(&mut []), 0.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [5.0, -1.0, 9.0, 2.0, 2.0, 7.0]), 3.5);
        assert_eq!(median(&mut [1.0, 1.0]), 1.0);
        assert_eq!(rfc3339(1_700_000_000_123_456), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(i64::MAX), i64::MAX.to_string());
    }
}
