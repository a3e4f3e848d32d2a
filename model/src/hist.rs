// SPDX-License-Identifier: Apache-2.0
//! Log-linear latency histogram shared by the eBPF programs, the agent, the
//! simulator and the reports.
//!
//! Bucket index for a value `v` (ns): `v` itself below 4; otherwise, with `m`
//! the index of the highest set bit, `4*(m-1) + next two bits`. Four buckets
//! per power of two bound the relative error of a percentile to ±12.5%, and
//! the index is computable in eBPF with a few shifts (ebpf/common.bpf.h holds
//! the same function). The largest index is 251, so it fits in a `u8`.

/// Number of buckets (indices 0..=251 are used).
pub const BUCKETS: usize = 252;

/// Bucket index of a value in ns.
#[inline]
pub fn bucket(v: u64) -> u8 {
    if v < 4 {
        return v as u8;
    }
    let m = 63 - v.leading_zeros() as u64;
    let sub = (v >> (m - 2)) & 3;
    (4 * (m - 1) + sub) as u8
}

/// Inclusive lower bound of a bucket.
pub fn lower(idx: u8) -> u64 {
    let idx = idx as u64;
    if idx < 4 {
        return idx;
    }
    let m = idx / 4 + 1;
    (4 + idx % 4) << (m - 2)
}

/// Exclusive upper bound of a bucket (saturating at `u64::MAX`).
pub fn upper(idx: u8) -> u64 {
    if (idx as usize) + 1 >= BUCKETS {
        return u64::MAX;
    }
    lower(idx + 1)
}

/// A dense histogram used while aggregating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: Box::new([0; BUCKETS]) }
    }
}

impl Histogram {
    pub fn record(&mut self, v: u64) {
        self.counts[bucket(v) as usize] += 1;
    }

    pub fn add(&mut self, idx: u8, n: u64) {
        if let Some(c) = self.counts.get_mut(idx as usize) {
            *c += n;
        }
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Sparse form as stored in the `hist_bucket` / `hist_count` columns.
    pub fn sparse(&self) -> (Vec<u8>, Vec<u64>) {
        let mut b = Vec::new();
        let mut c = Vec::new();
        for (i, &n) in self.counts.iter().enumerate() {
            if n > 0 {
                b.push(i as u8);
                c.push(n);
            }
        }
        (b, c)
    }

    pub fn from_sparse(buckets: &[u8], counts: &[u64]) -> Histogram {
        let mut h = Histogram::default();
        for (&b, &n) in buckets.iter().zip(counts) {
            h.add(b, n);
        }
        h
    }

    /// Estimated quantile `q` in [0, 1] (ns), interpolated inside the bucket.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0u64;
        for (i, &n) in self.counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if (seen + n) as f64 >= rank {
                let lo = lower(i as u8) as f64;
                let hi = upper(i as u8).min(lower(i as u8).saturating_mul(2).max(4)) as f64;
                let frac = (rank - seen as f64) / n as f64;
                return Some((lo + (hi - lo) * frac) as u64);
            }
            seen += n;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_monotonic() {
        for idx in 0..(BUCKETS as u8 - 1) {
            assert!(lower(idx) < upper(idx), "bucket {idx}");
            assert_eq!(bucket(lower(idx)), idx);
            assert_eq!(bucket(upper(idx) - 1), idx);
        }
        assert_eq!(bucket(u64::MAX), 251);
    }

    #[test]
    fn quantiles_within_bucket_error() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        for (q, want) in [(0.5, 5_000_000.0), (0.95, 9_500_000.0), (0.99, 9_900_000.0)] {
            let got = h.quantile(q).unwrap() as f64;
            assert!((got - want).abs() / want < 0.125, "q{q}: {got} vs {want}");
        }
        let (b, c) = h.sparse();
        assert_eq!(Histogram::from_sparse(&b, &c), h);
    }
}
