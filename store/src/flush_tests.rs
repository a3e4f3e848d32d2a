// SPDX-License-Identifier: Apache-2.0
//! Two writers holding one node's batches, one of them caught between its
//! first table commit and its segment's completion.

use arrow::array::UInt64Array;
use ingero_sim::loadgen::synth_tables;

use super::*;
use crate::commit::Buffer;
use crate::fixtures::temp_store;
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
    intent::write(&store, "aaaa", 1, &a.nodes).await.unwrap();
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
    assert_eq!(s.txns.get("node:gpu-0"), Some(&6), "the completion holds the node's high-water");

    // Maintenance removes intents of segments completed over an hour ago,
    // and keeps one not completed however old.
    intent::write(&store, "aaaa", 2, &segment("gpu-0", 2, 7..=7).nodes).await.unwrap();
    let intents = dir.path().join("_ingero/intents");
    for w in ["aaaa", "bbbb"] {
        for e in std::fs::read_dir(intents.join(w)).unwrap().flatten() {
            let f = std::fs::File::options().write(true).open(e.path()).unwrap();
            f.set_modified(std::time::SystemTime::now() - 2 * intent::KEEP).unwrap();
        }
    }
    assert_eq!(intent::cleanup(&store).await.unwrap(), 2);
    let left: Vec<_> = std::fs::read_dir(intents.join("aaaa"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, [format!("{:020}.json", 2)], "the segment not completed keeps its intent");
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
    assert_eq!(s.txns.get("node:gpu-0"), Some(&3));
}
