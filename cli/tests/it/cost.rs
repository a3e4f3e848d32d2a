// SPDX-License-Identifier: Apache-2.0
//! How close the detector's "job time lost" comes to the truth. The
//! simulator knows each window's true step time with and without the fault
//! (same noise), so the time the job really lost is known; the detector
//! only sees the ranks' signals. Printed per fault kind (BENCHMARKS.md
//! quotes it): host-side stragglers (CPU, IO, memory) within 10 % (the
//! simulator reports whole steps per window, 7.7 steps as 8, which moves
//! its shares by a few %); a slow GPU is seen only through its blocking
//! copies, so it is under-counted, never over-counted.

use std::time::Duration;

use ingero_server::rank::cost::Prices;
use ingero_server::rank::detector::{Detector, DetectorConfig};
use ingero_server::rank::signals::NodeWindowKey;
use ingero_sim::faults::{FaultKind, Injection, Target};
use ingero_sim::model::{Rng, signals, step_job};

const NODES: usize = 8;
const WINDOWS: u64 = 300;
const FAULT_AT: u64 = 20;
const FAULT_FOR: u64 = 200;

/// (estimated, true) job seconds lost to a `kind` fault on node 3.
fn lost(kind: FaultKind) -> (f64, f64) {
    let ranks: Vec<usize> = (0..NODES).collect();
    let fault = [Injection {
        kind,
        target: Target::Node(3),
        at: Duration::from_secs(FAULT_AT),
        duration: Some(Duration::from_secs(FAULT_FOR)),
    }];
    let prices = Prices { rules: vec![Prices::parse_rule("default=1").unwrap()], gpus_per_node: 1 };
    let mut det = Detector::new(DetectorConfig { prices, ..Default::default() });
    let (mut faulty_rng, mut healthy_rng) = (Rng::new(11), Rng::new(11));
    let mut truth = 0.0;
    for w in 0..WINDOWS {
        let t = Duration::from_secs(w);
        let faulty = step_job(&ranks, t, &fault, 0.03, &mut faulty_rng);
        let healthy = step_job(&ranks, t, &[], 0.03, &mut healthy_rng);
        // A window of 1 s holds `steps` steps: the share of it lost is
        // 1 - (healthy step time / faulty step time).
        truth += 1.0 - faulty[0].steps / healthy[0].steps;
        for (node, r) in faulty.iter().enumerate() {
            let key =
                NodeWindowKey { job: "j".into(), node: format!("node-{node}"), window_start_us: w as i64 * 1_000_000 };
            det.add(key, &signals(r));
        }
        det.drain();
    }
    let eps = det.episodes();
    assert!(eps.iter().all(|e| e.node == "node-3"), "{kind:?}: {eps:?}");
    (eps.iter().map(|e| e.lost_s).sum(), truth)
}

#[test]
fn job_time_lost_is_close_to_the_truth_for_host_stragglers_and_a_lower_bound_for_a_slow_gpu() {
    for (kind, lo, hi) in
        [(FaultKind::Cpu, 0.9, 1.1), (FaultKind::Io, 0.9, 1.1), (FaultKind::Mem, 0.9, 1.1), (FaultKind::Gpu, 0.2, 1.0)]
    {
        let (est, truth) = lost(kind);
        println!("{kind:?}: estimated {est:.1} s of job time lost, true {truth:.1} s, ratio {:.3}", est / truth);
        assert!(truth > 20.0, "{kind:?}: the fault cost the job {truth} s");
        assert!(est / truth >= lo && est / truth <= hi, "{kind:?}: estimated {est} s, true {truth} s");
    }
}
