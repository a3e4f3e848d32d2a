// SPDX-License-Identifier: Apache-2.0
//! Which replica of `ingero serve` owns a key (a node's ingest, a job's live
//! ranking): rendezvous hashing. Every replica and agent computes the same
//! order from the same list; when a replica leaves, only the keys it owned
//! move, each to its own next choice, so load spreads over the rest.

/// FNV-1a, then a 64-bit finalizer (FNV alone mixes the last bytes poorly).
fn weight(key: &str, replica: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes().chain([0xff]).chain(replica.bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51afd7ed558ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ceb9fe1a85ec53);
    h ^ (h >> 33)
}

/// Indices of `replicas` in the order `key` prefers them.
pub fn rendezvous<S: AsRef<str>>(key: &str, replicas: &[S]) -> Vec<usize> {
    let mut order: Vec<(u64, usize)> = replicas.iter().enumerate().map(|(i, r)| (weight(key, r.as_ref()), i)).collect();
    order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    order.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_evenly_and_only_a_removed_replicas_keys_move() {
        let three = ["http://a:1", "http://b:1", "http://c:1"];
        let two = ["http://a:1", "http://c:1"];
        let mut per = [0usize; 3];
        for n in 0..3000 {
            let key = format!("gpu-node-{n}");
            let first = rendezvous(&key, &three)[0];
            per[first] += 1;
            let after = two[rendezvous(&key, &two)[0]];
            if first != 1 {
                assert_eq!(after, three[first], "{key} moved although its replica stayed");
            }
        }
        for p in per {
            assert!((850..1150).contains(&p), "uneven: {per:?}");
        }
        assert_eq!(rendezvous("x", &three), rendezvous("x", &three), "stable");
        assert!(rendezvous::<&str>("x", &[]).is_empty());
    }
}
