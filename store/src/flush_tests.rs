// SPDX-License-Identifier: Apache-2.0
//! Two writers holding one node's batches, one of them caught between its
//! first table commit and its segment's completion.

use arrow::array::UInt64Array;
use ingero_sim::loadgen::synth_tables;

use super::*;
use crate::commit::Buffer;
use crate::delta::Snapshot;
use crate::fixtures::temp_store;
use crate::fold::{self, Completed};
use crate::read::{read_named, read_table};

const ROWS: usize = 8;
const T0: i64 = 1_764_000_000_000_000;

/// A segment of `node`'s batches `seqs` (each its own window).
fn segment(node: &str, segment: u64, seqs: std::ops::RangeInclusive<u64>) -> Arc<Sealed> {
    let mut buf = Buffer::default();
    for seq in seqs {
        let tables = synth_tables(node, T0 + seq as i64 * 1_000_000, ROWS, seq);
        let tables: Vec<_> = tables.into_iter().map(|(t, b)| (t, vec![b])).collect();
        let signals = ingero_model::signals::of_tables(&tables);
        buf.add(node, seq, tables, signals);
    }
    Arc::new(buf.seal(segment))
}

async fn rows(store: &Store, t: Table) -> usize {
    read_table(store, t).await.unwrap().iter().map(|b| b.num_rows()).sum()
}

/// Writer A commits `call_windows` of gpu-0's batches 1–4 and stops before
/// the rest; writer B (the node's new replica, every batch re-sent) commits
/// 1–6 in full; A resumes. B learnt from A's intent that `call_windows`
/// holds 1–4 although no table carries a node version: every table holds
/// each batch once, and `ingest_batches` lists each batch once.
#[tokio::test]
async fn a_writer_mid_segment_is_seen_through_its_intent() {
    let (dir, store) = temp_store();
    let (a, b) = (segment("gpu-0", 1, 1..=4), segment("gpu-0", 1, 1..=6));
    let (mut la, mut lb) = (Logs::new("aaaa".into()), Logs::new("bbbb".into()));
    // Both writers have had the node a while (no compatibility versions).
    for l in [&mut la, &mut lb] {
        l.arrived.insert("gpu-0".into(), ARRIVING);
    }
    let guard = Txn { app_id: writer_app("aaaa"), version: 1, last_updated: None };
    let info = serde_json::json!({});
    intent::write(&store, "aaaa", 1, &BTreeMap::from([("gpu-0", [1, 4])])).await.unwrap();
    let calls = encode("aaaa", &a).await.unwrap().into_iter().find(|e| e.name == "call_windows").unwrap();
    la.commit_table(&store, &a, calls, &guard, &info).await.unwrap();

    commit(&store, &mut lb, b).await.unwrap();
    commit(&store, &mut la, a).await.unwrap();

    assert_eq!(rows(&store, Table::CallWindows).await, 6 * ROWS, "call_windows: each batch once");
    assert_eq!(rows(&store, Table::SchedWindows).await, 6, "sched_windows: each batch once");
    let listed = read_named(&store, BATCHES_TABLE, &batches_schema()).await.unwrap();
    let batches: u64 = listed
        .iter()
        .map(|b| b.column_by_name("batches").unwrap().as_any().downcast_ref::<UInt64Array>().unwrap())
        .map(|c| c.iter().flatten().sum::<u64>())
        .sum();
    assert_eq!(batches, 6, "ingest_batches lists each batch once");

    for t in ["call_windows", "sched_windows", "signal_windows_60s"] {
        let s = Snapshot::load(&store, t).await.unwrap();
        assert!(!s.txns.keys().any(|a| a.starts_with("node:")), "{t} carries node versions: {:?}", s.txns);
        assert_eq!(s.txns.len(), 2, "{t}: one version per writer: {:?}", s.txns);
    }
    let s = Snapshot::load(&store, BATCHES_TABLE).await.unwrap();
    assert_eq!(s.txns.get("node:gpu-0"), None, "a completion names the segment only");
    let hw = Completed::default().high_waters(&store, &s).await.unwrap();
    assert_eq!(hw.get("gpu-0"), Some(&6), "the completed intents hold the node's high-water");
    let before_fold = s;

    // Maintenance folds it into a node version, then removes the intents
    // of segments folded over an hour ago, and keeps one not completed
    // however old.
    assert_eq!(fold::fold(&store).await.unwrap(), 1);
    let s = Snapshot::load(&store, BATCHES_TABLE).await.unwrap();
    assert_eq!(s.txns.get("node:gpu-0"), Some(&6), "the fold holds the node's high-water");
    assert_eq!(fold::folded(&s), [("aaaa".to_string(), 1), ("bbbb".to_string(), 1)].into());
    assert_eq!(fold::fold(&store).await.unwrap(), 0, "nothing left to fold");
    intent::write(&store, "aaaa", 2, &BTreeMap::from([("gpu-0", [7, 7])])).await.unwrap();
    let intents = dir.path().join("_ingero/intents");
    for w in ["aaaa", "bbbb"] {
        for e in std::fs::read_dir(intents.join(w)).unwrap().flatten() {
            let f = std::fs::File::options().write(true).open(e.path()).unwrap();
            f.set_modified(std::time::SystemTime::now() - 2 * intent::KEEP).unwrap();
        }
    }
    assert_eq!(fold::cleanup(&store).await.unwrap(), 2);
    let left: Vec<_> = std::fs::read_dir(intents.join("aaaa"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, [format!("{:020}.json", 2)], "the segment not completed keeps its intent");
    // A reader holding the log from before the fold finds the intents gone
    // and the fold's versions in their place.
    let hw = Completed::default().high_waters(&store, &before_fold).await.unwrap();
    assert_eq!(hw.get("gpu-0"), Some(&6), "read across a fold and a cleanup");
}

/// A node's first two segments at a writer carry its version in every table
/// it has rows in (for replicas of an ingero before intents); later ones only
/// the writer's segment.
#[tokio::test]
async fn only_a_nodes_first_segments_here_carry_its_version_in_data_tables() {
    let (dir, store) = temp_store();
    let mut logs = Logs::new("cccc".into());
    for seg in 1..=3u64 {
        commit(&store, &mut logs, segment("gpu-0", seg, seg..=seg)).await.unwrap();
    }
    let log = dir.path().join("call_windows/_delta_log");
    let mut per_commit = Vec::new();
    for v in 1..=3 {
        let body = std::fs::read_to_string(log.join(format!("{v:020}.json"))).unwrap();
        per_commit.push(body.lines().filter(|l| l.contains(r#""appId":"node:gpu-0""#)).count());
    }
    assert_eq!(per_commit, [1, 1, 0], "node versions per call_windows commit");
    let s = Snapshot::load(&store, BATCHES_TABLE).await.unwrap();
    assert_eq!(s.txns.get("node:gpu-0"), Some(&2), "arriving segments' completions carry it");
    let mut reader = Completed::default();
    assert_eq!(reader.high_waters(&store, &s).await.unwrap().get("gpu-0"), Some(&3));
    fold::fold(&store).await.unwrap();
    let s = Snapshot::load(&store, BATCHES_TABLE).await.unwrap();
    assert_eq!(s.txns.get("node:gpu-0"), Some(&3));
    assert_eq!(reader.high_waters(&store, &s).await.unwrap().get("gpu-0"), Some(&3), "a reader across a fold");
}

/// Completions of many nodes carry no node version once the nodes have
/// settled; one fold carries one per node. Without maintenance, a writer
/// whose unfolded segments pile up folds them itself.
#[tokio::test]
async fn node_versions_are_committed_once_per_fold_not_once_per_segment() {
    let (dir, store) = temp_store();
    let mut logs = Logs::new("dddd".into());
    let nodes: Vec<String> = (0..20).map(|i| format!("gpu-{i}")).collect();
    for n in &nodes {
        logs.arrived.insert(n.clone(), ARRIVING);
    }
    let many = |seg: u64| {
        let mut buf = Buffer::default();
        for n in &nodes {
            let tables = synth_tables(n, T0 + seg as i64 * 1_000_000, 2, seg);
            let tables: Vec<_> = tables.into_iter().map(|(t, b)| (t, vec![b])).collect();
            let signals = ingero_model::signals::of_tables(&tables);
            buf.add(n, seg, tables, signals);
        }
        Arc::new(buf.seal(seg))
    };
    for seg in 1..=5 {
        commit(&store, &mut logs, many(seg)).await.unwrap();
    }
    let node_txns = |v: u64| {
        let body = std::fs::read_to_string(dir.path().join(format!("ingest_batches/_delta_log/{v:020}.json"))).unwrap();
        body.lines().filter(|l| l.contains(r#""appId":"node:"#)).count()
    };
    assert_eq!((1..=5).map(node_txns).collect::<Vec<_>>(), [0; 5], "completions");
    assert_eq!(fold::fold(&store).await.unwrap(), 20);
    assert_eq!(node_txns(6), 20, "the fold: one per node");

    // Segment numbers jump (a long run without maintenance): the writer folds.
    commit(&store, &mut logs, many(5 + fold::SELF_FOLD)).await.unwrap();
    let s = Snapshot::load(&store, BATCHES_TABLE).await.unwrap();
    assert_eq!(fold::folded(&s).get("dddd"), Some(&(5 + fold::SELF_FOLD)));
    assert_eq!(s.txns.get("node:gpu-7"), Some(&(5 + fold::SELF_FOLD as i64)));
}

/// While a replica of an ingero before folds has completed a segment within
/// the hour (its completions carry node versions but no `ingero-folds-`),
/// completions carry every node's version again: that replica reads a
/// node's high-water nowhere else.
#[tokio::test]
async fn completions_carry_node_versions_while_an_older_replica_is_about() {
    let (dir, store) = temp_store();
    let mut logs = Logs::new("eeee".into());
    logs.arrived.insert("gpu-0".into(), ARRIVING);
    commit(&store, &mut logs, segment("gpu-0", 1, 1..=1)).await.unwrap();
    let log = dir.path().join("ingest_batches/_delta_log");
    let old_completion = |v: u64, ago_ms: i64| {
        let ms = chrono::Utc::now().timestamp_millis() - ago_ms;
        let body = format!(
            "{{\"commitInfo\":{{\"timestamp\":{ms}}}}}\n\
             {{\"txn\":{{\"appId\":\"ingero-writer-0ld\",\"version\":9,\"lastUpdated\":{ms}}}}}\n"
        );
        std::fs::write(log.join(format!("{v:020}.json")), body).unwrap();
    };
    let carries = |v: u64| {
        let body = std::fs::read_to_string(log.join(format!("{v:020}.json"))).unwrap();
        body.contains(r#""appId":"node:gpu-0""#)
    };
    old_completion(2, 2 * 3_600_000);
    commit(&store, &mut logs, segment("gpu-0", 2, 2..=2)).await.unwrap();
    assert!(!carries(3), "an older replica last seen two hours ago");
    old_completion(4, 60_000);
    commit(&store, &mut logs, segment("gpu-0", 3, 3..=3)).await.unwrap();
    assert!(carries(5), "an older replica seen a minute ago");
}
