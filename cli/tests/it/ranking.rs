// SPDX-License-Identifier: Apache-2.0
//! Straggler ranking end to end: simulated agents over real gRPC, the live
//! detector, history over the stored Parquet, reports.

use std::time::Duration;

use crate::fixtures::*;
use ingero_analysis::query::QueryEngine;
use ingero_analysis::rank::history::{self, HistoryRequest};
use ingero_analysis::report::{self, Target};
use ingero_server::rank::detector::DetectorConfig;
use ingero_sim::faults::Injection;
use ingero_sim::fleet::{self, SimConfig};

fn sim(server: &str, nodes: usize, secs: u64, inject: &[&str]) -> SimConfig {
    SimConfig {
        server: server.into(),
        nodes,
        jobs: 1,
        duration: Duration::from_secs(secs),
        injections: inject.iter().map(|s| Injection::parse(s, nodes).unwrap()).collect(),
        jitter: 0.05,
        seed: 42,
        job_prefix: "train".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_kind_is_flagged_fast_and_explained() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let cfg = sim(&server.grpc_url(), 12, 12, &["cpu@1:3s", "gpu@3:3s", "io@5:3s", "mem@7:3s"]);
    let r = fleet::run(&cfg, |l| eprintln!("{l}")).await.unwrap();
    assert_eq!(r.injections.len(), 4);
    for i in &r.injections {
        let after = i.flagged_after_secs.unwrap_or_else(|| panic!("{} not flagged: {r:?}", i.injection));
        assert!(after <= 5.0, "{} flagged after {after:.1}s (goal ≤ 5 s)", i.injection);
        assert!(!i.signals.is_empty(), "{} flagged without an explanation", i.injection);
    }
    assert!(r.false_flags.is_empty(), "false flags: {:?}", r.false_flags);

    // History over the stored Parquet ranks the same nodes first.
    server.committer.flush().await.unwrap();
    let engine = QueryEngine::open(&server.store, Default::default()).await.unwrap();
    let now = chrono::Utc::now().timestamp_micros();
    let req = HistoryRequest {
        start_us: now - 60_000_000,
        end_us: now,
        job: Some("train".into()),
        resolution: Some(Duration::from_secs(1)),
    };
    let ranking = history::rank(&engine, &req, DetectorConfig::default()).await.unwrap();
    let json = serde_json::to_value(&ranking).unwrap();
    let list = json["stragglers"].as_array().unwrap();
    let flagged: Vec<&str> =
        list.iter().filter(|s| s["flagged"] == true).map(|s| s["node"].as_str().unwrap()).collect();
    for n in ["node-1", "node-3", "node-5", "node-7"] {
        assert!(flagged.contains(&n), "history did not flag {n}: {flagged:?}");
    }
    assert_eq!(flagged.len(), 4, "{flagged:?}");
    for s in list {
        for key in ["node", "job", "score", "flagged", "since", "signals"] {
            assert!(s.get(key).is_some(), "entry lacks `{key}`: {s}");
        }
    }
    let scores: Vec<f64> = list.iter().map(|s| s["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "not most deviant first: {scores:?}");

    // Reports name the cause for each kind.
    let start = now - 60_000_000;
    for (rank, cause) in [(1, "cpu_contention"), (5, "io_stall"), (7, "memory_pressure"), (3, "slow_gpu")] {
        let t = Target::Pod { namespace: "ml".into(), name: format!("train-worker-{rank}") };
        let rep = report::build(&engine, &t, start, now, DetectorConfig::default()).await.unwrap();
        assert!(rep.chains.iter().any(|c| c.cause == cause), "worker-{rank}: expected {cause}, got {:#?}", rep.chains);
        assert!(rep.straggler.iter().any(|s| s.flagged), "worker-{rank} report lacks the straggler flag");
        if cause == "cpu_contention" {
            assert!(
                rep.neighbours.iter().any(|n| n.comm == "ffmpeg"),
                "noisy neighbour not named: {:?}",
                rep.neighbours
            );
        }
    }
    let healthy = Target::Pod { namespace: "ml".into(), name: "train-worker-0".into() };
    let rep = report::build(&engine, &healthy, start, now, DetectorConfig::default()).await.unwrap();
    // No stall of its own: it waits for the four.
    let titles: Vec<&str> = rep.chains.iter().map(|c| c.title.as_str()).collect();
    let four = "4 stragglers (node-1, node-3, node-5, node-7) → this rank waits for them";
    assert_eq!(titles, [four], "{:#?}", rep.chains);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noise_is_never_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let mut cfg =
        sim(&server.grpc_url(), 10, 12, &["jobslow@all:4s", "blip@2:3s", "blip@6:7s", "blip@2:9s", "net@8:5s"]);
    cfg.jitter = 0.1;
    let r = fleet::run(&cfg, |l| eprintln!("{l}")).await.unwrap();
    assert!(r.false_flags.is_empty(), "noise flagged: {:?}", r.false_flags);
    assert_eq!(r.batches, 120);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_node_jobs_work_from_the_first_windows() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let r = fleet::run(&sim(&server.grpc_url(), 2, 8, &["cpu@0:2s"]), |_| {}).await.unwrap();
    let after = r.injections[0].flagged_after_secs.expect("2-node straggler not flagged");
    assert!(after <= 5.0, "{after}");
    assert!(r.false_flags.is_empty(), "{:?}", r.false_flags);
    server.shutdown().await.unwrap();
}
