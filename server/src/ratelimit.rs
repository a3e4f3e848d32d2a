// SPDX-License-Identifier: Apache-2.0
//! Per-node token buckets on ingested rows: one misbehaving (or compromised)
//! agent cannot crowd out the fleet. Over the limit the batch is answered
//! UNAVAILABLE, so a real agent keeps it in its spool and retries later.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug)]
pub struct RateLimiter {
    rows_per_sec: f64,
    burst_rows: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    /// `rows_per_sec` 0 disables the limit; a bucket holds `burst_secs` of it.
    pub fn new(rows_per_sec: u64, burst_secs: u64) -> RateLimiter {
        RateLimiter {
            rows_per_sec: rows_per_sec as f64,
            burst_rows: (rows_per_sec.saturating_mul(burst_secs.max(1))) as f64,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `rows` from the node's bucket; false when it is over its rate. A
    /// batch larger than the whole bucket passes when the bucket is full (and
    /// leaves it in debt), so no batch size is refused forever.
    pub fn admit(&self, node: &str, rows: u64, now: Instant) -> bool {
        if self.rows_per_sec <= 0.0 {
            return true;
        }
        let mut b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if b.len() > 100_000 {
            // Bounded memory under a flood of made-up node names.
            b.retain(|_, (tokens, _)| *tokens < self.burst_rows);
        }
        let (tokens, last) = b.entry(node.to_string()).or_insert((self.burst_rows, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * self.rows_per_sec).min(self.burst_rows);
        *last = now;
        let rows = rows as f64;
        if rows <= *tokens || *tokens >= self.burst_rows {
            *tokens -= rows;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_node_gets_its_rate_and_burst() {
        let r = RateLimiter::new(1000, 2);
        let t = Instant::now();
        assert!(r.admit("a", 1500, t));
        assert!(r.admit("a", 500, t));
        assert!(!r.admit("a", 1, t), "bucket of 2,000 rows is empty");
        assert!(r.admit("b", 2000, t), "another node has its own bucket");
        assert!(r.admit("a", 900, t + Duration::from_secs(1)), "refilled 1,000 rows in 1 s");
        assert!(!r.admit("a", 200, t + Duration::from_secs(1)));
        // Bigger than the bucket: admitted once the bucket is full, then in debt.
        assert!(r.admit("c", 10_000, t));
        assert!(!r.admit("c", 1, t + Duration::from_secs(7)));
        assert!(r.admit("c", 1, t + Duration::from_secs(10)));
        assert!(RateLimiter::new(0, 1).admit("x", u64::MAX, t), "0 = unlimited");
    }
}
