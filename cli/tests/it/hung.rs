// SPDX-License-Identifier: Apache-2.0
//! A hung rank in stored history: the fleet ranking over the store names
//! its node `stuck`, as the live detector does, at the agents' windows and
//! at coarser bins; a job that only waits briefly is not.

use std::collections::BTreeMap;
use std::time::Duration;

use arrow::array::RecordBatch;
use ingero_analysis::query::QueryEngine;
use ingero_analysis::rank::history::{self, HistoryRequest};
use ingero_model::Table;
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::tables::{Common, ProgressRow};
use ingero_server::rank::detector::DetectorConfig;
use ingero_sim::loadgen::synth_tables;
use ingero_store::{Store, StoreUrl, flush};

/// An hour boundary (2025-11-24T16:00:00Z).
const T0: i64 = 1_764_000_000_000_000;
const SECS: i64 = 60;
const HANG_AT: i64 = 20;
const NODES: usize = 6;
const CULPRIT: usize = 3;

/// Node `n`'s one training process at the end of window `w`: in a short
/// sync until the hang; then waiting in it for good, but for the culprit,
/// which sits in host code with no call in flight.
fn progress(n: usize, w: i64, hang: bool) -> RecordBatch {
    let common = Common {
        node: format!("node-{n}"),
        namespace: Some("ml".into()),
        pod: Some("trainer-0".into()),
        container: Some("pytorch".into()),
        job: Some("llama-ft".into()),
        rank: Some(0),
        world_size: Some(1),
        pid: 1000,
        comm: "python3".into(),
        cgroup_id: 5000,
        window_start_us: TimestampUs(T0 + w * 1_000_000),
        window_us: 1_000_000,
    };
    let hung_for = (hang && w >= HANG_AT).then(|| (w - HANG_AT + 1) as u64 * 1_000_000_000);
    let waiting = ProgressRow {
        threads_in_call: 1,
        oldest_library: Some("cudart"),
        oldest_op: Some("cudaStreamSynchronize"),
        oldest_tid: Some(1000),
        oldest_age_ns: Some(hung_for.unwrap_or(4_000_000)),
        last_call_age_ns: Some(0),
        proc_state: Some("S"),
    };
    let row = match hung_for {
        Some(age) if n == CULPRIT => ProgressRow {
            threads_in_call: 0,
            oldest_library: None,
            oldest_op: None,
            oldest_tid: None,
            oldest_age_ns: None,
            last_call_age_ns: Some(age),
            ..waiting
        },
        _ => waiting,
    };
    let mut b = BatchBuilder::new(Table::ProgressWindows);
    b.append(&common, &row).unwrap();
    b.finish().unwrap()
}

/// A store of one `NODES`-node job over `SECS` windows, every node alike
/// (one segment per window, as the aggregator writes them).
async fn store(dir: &std::path::Path, hang: bool) -> Store {
    let url = StoreUrl::parse(&format!("file://{}", dir.display())).unwrap();
    let store = Store::open(&url, &Default::default()).unwrap();
    for w in 0..SECS {
        let mut tables: BTreeMap<Table, Vec<RecordBatch>> = BTreeMap::new();
        for n in 0..NODES {
            for (t, b) in synth_tables(&format!("node-{n}"), T0 + w * 1_000_000, 8, 7) {
                tables.entry(t).or_default().push(b);
            }
            tables.entry(Table::ProgressWindows).or_default().push(progress(n, w, hang));
        }
        flush::write_segment(&store, "hung-test", w as u64 + 1, tables).await.unwrap();
    }
    store
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
