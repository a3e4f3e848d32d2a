// SPDX-License-Identifier: Apache-2.0
//! A hung rank in stored history: the fleet ranking over the store names
//! its node `stuck`, as the live detector does, at the agents' windows and
//! at coarser bins; a job that only waits briefly is not. A straggler's step
//! time is shown against its job's.

use std::time::Duration;

use crate::fixtures::{Hang, T0};
use ingero_analysis::query::QueryEngine;
use ingero_analysis::rank::history::{self, HistoryRequest};
use ingero_server::rank::detector::DetectorConfig;
use ingero_store::Store;

const SECS: i64 = 60;
const HANG_AT: i64 = 20;

async fn store(dir: &std::path::Path, hang: bool) -> Store {
    let hangs = hang.then_some(HANG_AT..SECS).into_iter().collect();
    Hang { nodes: 6, windows: SECS, hangs, culprit: 3, starved: vec![] }.write(dir, 1).await
}

async fn rank(store: &Store, resolution: Option<Duration>) -> ingero_analysis::rank::Ranking {
    let engine = QueryEngine::open(store, Default::default()).await.unwrap();
    let req = HistoryRequest { start_us: T0, end_us: T0 + SECS * 1_000_000, job: None, resolution };
    let cfg = DetectorConfig { stuck_after: Duration::from_secs(10), ..Default::default() };
    history::rank(&engine, &req, cfg).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_names_the_hung_ranks_node_stuck_at_every_resolution() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), true).await;
    for resolution in [None, Some(Duration::from_secs(10))] {
        let r = rank(&store, resolution).await;
        let flagged: Vec<_> = r.stragglers.iter().filter(|s| s.flagged).collect();
        assert_eq!(flagged.len(), 1, "{resolution:?}: {:#?}", r.stragglers);
        let s = flagged[0];
        assert_eq!((s.node.as_str(), s.stuck), ("node-3", true), "{resolution:?}: {s:#?}");
        let text = &s.signals[0].text;
        for want in
            ["job stuck", "no CUDA/NCCL call in flight", "5 rank(s) on 5 other node(s)", "cudaStreamSynchronize"]
        {
            assert!(text.contains(want), "{resolution:?}: `{want}` missing from: {text}");
        }
        // Flagged from the first bin in which the waiters had waited 10 s.
        let since = s.since_us.unwrap();
        assert!((T0 + (HANG_AT + 9) * 1_000_000 - 10_000_000..=T0 + (HANG_AT + 9) * 1_000_000).contains(&since));
        let episode = r.episodes.iter().find(|e| e.node == "node-3").expect("an episode of the hang");
        assert_eq!(episode.cause, "stuck", "{episode:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_ranks_only_wait_briefly_is_not_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), false).await;
    let r = rank(&store, None).await;
    assert!(r.stragglers.iter().all(|s| !s.flagged && !s.stuck), "{:#?}", r.stragglers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stragglers_step_time_is_shown_against_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        Hang { nodes: 6, windows: SECS, hangs: vec![], culprit: 3, starved: std::iter::once(10..SECS).collect() }
            .write(dir.path(), 10)
            .await;
    let r = rank(&store, None).await;
    let s = r.stragglers.iter().find(|s| s.flagged).unwrap_or_else(|| panic!("{:#?}", r.stragglers));
    assert_eq!(s.node, "node-3");
    let step = s.step.as_ref().unwrap_or_else(|| panic!("{s:#?}"));
    // Its median over the range (50 of 60 windows starved) against its job's (the others').
    assert_eq!((step.seconds, step.job_seconds, step.ratio), (0.48, 0.31, 1.55), "{step:?}");
    // The other nodes step at the job's pace.
    for p in r.stragglers.iter().filter(|p| p.node != "node-3") {
        assert_eq!(p.step.as_ref().map(|x| x.ratio), Some(1.0), "{p:#?}");
    }
}

/// A waiting rank's report says its last step had not ended when the data
/// ends, and for how long: no step ends while the job hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_ranks_report_shows_the_step_that_never_ended() {
    let dir = tempfile::tempdir().unwrap();
    store(dir.path(), true).await;
    let since = format!("--since={}", ingero_model::time::rfc3339(T0));
    let store = format!("--store=file://{}", dir.path().display());
    let args = ["report", "--node=node-1", store.as_str(), since.as_str(), "--format=json"].map(String::from);
    let o = tokio::task::spawn_blocking(move || crate::fixtures::ingero(&args)).await.unwrap();
    let (out, err) = crate::fixtures::text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let u = &v["steps"]["unfinished"];
    // Steps end in windows 0..=19; windows 20..=59 follow the loop, none ends.
    assert_eq!(u["start_us"].as_i64(), Some(T0 + (HANG_AT - 1) * 1_000_000), "{:#}", v["steps"]);
    assert_eq!(u["seconds"].as_f64(), Some((SECS - HANG_AT) as f64), "{:#}", v["steps"]);
    // The same, as a person reads it.
    let args = ["report", "--node=node-1", store.as_str(), since.as_str()].map(String::from);
    let o = tokio::task::spawn_blocking(move || crate::fixtures::ingero(&args)).await.unwrap();
    let text = crate::fixtures::text(&o).0;
    assert!(text.contains("The last step had not ended when the data ends: none ended for 40.00s"), "{text}");
    // Without the hang, no step is open.
    let calm = tempfile::tempdir().unwrap();
    self::store(calm.path(), false).await;
    let store = format!("--store=file://{}", calm.path().display());
    let args = ["report", "--node=node-1", store.as_str(), since.as_str(), "--format=json"].map(String::from);
    let o = tokio::task::spawn_blocking(move || crate::fixtures::ingero(&args)).await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&crate::fixtures::text(&o).0).unwrap();
    assert!(v["steps"]["count"].as_u64() > Some(0) && v["steps"].get("unfinished").is_none(), "{:#}", v["steps"]);
}
