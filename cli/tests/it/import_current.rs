// SPDX-License-Identifier: Apache-2.0
//! `ingero import` on traces as the reference product's current release
//! leaves them: schema 0.10 (events.comm, an `annotations` table) and
//! rolled over (`<stem>.<UTC stamp>.db` beside the live `<stem>.db`). Built
//! from the real RTX 4090 recording by cutting it at its minute boundary,
//! as a rollover would: the set imports to the same totals as the whole
//! file, once, and the annotations reach the store and the Perfetto export.
//! Nodes of one job recorded at different times are reported unranked.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fixtures::*;
use arrow::array::{Array, AsArray, RecordBatch};
use ingero_analysis::query::QueryEngine;
use ingero_store::{Store, StoreUrl};
use serde_json::Value;

const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/pytorch-173382-empty-cache.db");
const READER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/perfetto_read.py");
/// The recording's two minutes (ns since epoch / 60 s): 29572668 and 29572669.
const CUT_NS: i64 = 29_572_669 * 60_000_000_000;
const TRAINER: i64 = 30581;
const SINCE: &str = "2026-03-01T00:00:00Z";

fn ingero(args: &[&str]) -> (bool, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
}

/// A copy of the recording as 0.10 writes it (node column, empty comm as
/// for rows of a 0.9 run continued by 0.10), keeping only `keep` events.
fn part(dir: &Path, name: &str, keep: &str, extra: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::copy(REAL, &p).unwrap();
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch(&format!(
        "ALTER TABLE events ADD COLUMN node TEXT NOT NULL DEFAULT '';
         ALTER TABLE events ADD COLUMN comm TEXT NOT NULL DEFAULT '';
         ALTER TABLE sessions ADD COLUMN node TEXT NOT NULL DEFAULT '';
         ALTER TABLE causal_chains ADD COLUMN node TEXT NOT NULL DEFAULT '';
         UPDATE events SET node = 'gpu-1'; UPDATE sessions SET node = 'gpu-1';
         CREATE TABLE annotations (id INTEGER PRIMARY KEY AUTOINCREMENT, timestamp INTEGER NOT NULL,
           labels TEXT NOT NULL, pid INTEGER NOT NULL DEFAULT 0, start_time INTEGER NOT NULL DEFAULT 0,
           span_start INTEGER NOT NULL DEFAULT 0, span_end INTEGER NOT NULL DEFAULT 0,
           peer_uid INTEGER NOT NULL DEFAULT 0, peer_gid INTEGER NOT NULL DEFAULT 0, peer_pid INTEGER NOT NULL DEFAULT 0);
         DELETE FROM events WHERE NOT ({keep});
         UPDATE schema_info SET value = '0.10' WHERE key = 'version';
         {extra}"
    ))
    .unwrap();
    c.execute_batch("VACUUM").unwrap();
    p
}

/// Steps `from..to` of the trainer, one instant each, 2 s apart from `t0`.
fn steps(t0: i64, from: i64, to: i64) -> String {
    (from..to)
        .map(|s| {
            format!(
                "INSERT INTO annotations (timestamp, labels, pid) VALUES ({}, '{{\"step\":\"{s}\",\"epoch\":\"0\"}}', {TRAINER});",
                t0 + (s - from) * 2_000_000_000
            )
        })
        .collect()
}

/// The set: the first minute (rolled first, the older stamp form, with the
/// session and process names), the second (rolled later: the source's
/// fresh file has no session row and no names for running processes), the
/// live file (no events yet; the epoch span and three malformed rows).
fn rolled_set(dir: &Path) -> PathBuf {
    part(dir, "trace.20260324T134800Z.db", &format!("timestamp < {CUT_NS}"), &steps(1_774_360_125_000_000_000, 1, 6));
    part(
        dir,
        "trace.20260324T134900.000000000Z-0a1b2c3d.db",
        &format!("timestamp >= {CUT_NS}"),
        &format!(
            "DELETE FROM sessions; DELETE FROM process_names; DELETE FROM causal_chains;
             DELETE FROM event_aggregates WHERE bucket < {CUT_NS}; {}",
            steps(CUT_NS + 1_000_000_000, 6, 8)
        ),
    );
    part(
        dir,
        "trace.db",
        "0",
        &format!(
            "DELETE FROM sessions; DELETE FROM process_names; DELETE FROM causal_chains; DELETE FROM event_aggregates;
         INSERT INTO annotations (timestamp, labels, span_start, span_end)
           VALUES (1774360124000000000, '{{\"epoch\":\"0\"}}', 1774360124000000000, 1774360154000000000),
                  (1774360130000000000, '[1, 2]', 0, 0), (1774360130000000000, '{{\"step\": 3}}', 0, 0),
                  (1774360130000000000, '{{\"k\":\"{}\"}}', 0, 0);",
            "x".repeat(5000)
        ),
    );
    // Beside them, not of the set: the recording whole (it would double every count).
    std::fs::copy(REAL, dir.join("trace.notes.db")).unwrap();
    // The first file also keeps the second minute's aggregates out.
    let c = rusqlite::Connection::open(dir.join("trace.20260324T134800Z.db")).unwrap();
    c.execute(&format!("DELETE FROM event_aggregates WHERE bucket >= {CUT_NS}"), []).unwrap();
    dir.join("trace.db")
}

async fn sql(store: &Path, q: &str) -> Vec<RecordBatch> {
    let st = Store::open(&StoreUrl::parse(store.to_str().unwrap()).unwrap(), &Default::default()).unwrap();
    QueryEngine::open(&st, Default::default()).await.unwrap().sql(q).await.unwrap()
}

/// Every row of a query as text, for comparing two stores.
async fn text(store: &Path, q: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in sql(store, q).await {
        let cols: Vec<_> =
            b.columns().iter().map(|c| arrow::compute::cast(c, &arrow::datatypes::DataType::Utf8).unwrap()).collect();
        for i in 0..b.num_rows() {
            let row: Vec<&str> =
                cols.iter().map(|c| if c.is_null(i) { "∅" } else { c.as_string::<i32>().value(i) }).collect();
            out.push(row.join("|"));
        }
    }
    out
}

const TOTALS: [&str; 3] = [
    "SELECT op, pid, comm, sum(count), sum(total_ns), max(max_ns) FROM call_windows GROUP BY 1, 2, 3 ORDER BY 1, 2",
    "SELECT pid, comm, sum(on_cpu_ns), sum(off_cpu_ns), sum(voluntary_switches), sum(involuntary_switches) FROM sched_windows GROUP BY 1, 2 ORDER BY 1",
    "SELECT kind, count(*) FROM host_events WHERE kind <> 'annotation' GROUP BY 1 ORDER BY 1",
];

#[tokio::test]
async fn a_rolled_over_set_imports_as_one_trace_once_with_its_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let live = rolled_set(dir.path());
    let (whole, set) = (dir.path().join("whole"), dir.path().join("set"));
    let (ok, out) = ingero(&["import", REAL, "--node", "gpu-1", "--store", whole.to_str().unwrap()]);
    assert!(ok, "{out}");
    let (ok, out) = ingero(&["import", live.to_str().unwrap(), "--store", set.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("one trace in 3 files (rolled over)"), "{out}");
    assert!(out.contains("3 annotation row(s) left out"), "{out}");
    assert!(!out.contains("trace.notes.db"), "not of the set: {out}");
    for q in TOTALS {
        assert_eq!(text(&set, q).await, text(&whole, q).await, "{q}");
    }
    // Host facts from the first file's session, on every window.
    let nodes = "SELECT count(*) FROM node_windows WHERE kernel IS NULL";
    assert_eq!(text(&set, nodes).await, vec!["0"]);

    // The annotations: the trainer's steps under its name (given only in the first file), the epoch trace-wide.
    let q = "SELECT pid, comm, value, detail FROM host_events WHERE kind = 'annotation' ORDER BY event_time, pid";
    let rows = text(&set, q).await;
    assert_eq!(rows.len(), 8, "{rows:#?}");
    assert_eq!(rows[0], "0|annotation|30000000000|{\"epoch\":\"0\"}");
    assert_eq!(rows[1], "30581|python3|0|{\"epoch\":\"0\",\"step\":\"1\"}");
    assert!(rows[1..].iter().all(|r| r.starts_with("30581|python3|0|")), "{rows:#?}");

    // The report reads step times from them: 5 → 6 spans the rollover and is the slow one.
    let (ok, text) = ingero(&["report", "--pid", "gpu-1:30581", "--store", set.to_str().unwrap(), "--since", SINCE]);
    assert!(ok, "{text}");
    assert!(text.contains("6 steps in epoch 0; median 2.00s."), "{text}");
    assert!(text.contains("step 5 (epoch 0): 8.00s, 4.0× the median"), "{text}");
    assert!(!text.contains("annotation"), "annotations are not host events to list: {text}");
    let html = dir.path().join("r.html");
    let args =
        ["report", "--pid", "gpu-1:30581", "--store", set.to_str().unwrap(), "--since", SINCE, "--format", "html"];
    let (ok, out) = ingero(&[&args[..], &["--out", html.to_str().unwrap()]].concat());
    assert!(ok, "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    // The slow step shaded on each of the three charts.
    assert_eq!(page.matches(r#"class="mk">step 5<"#).count(), 3, "{page}");

    // Again, and after the live file rolls over too (renamed after a
    // checkpoint that changes its size; a new empty live file): nothing twice.
    let before: Vec<Vec<String>> = stored_rows(&set).await;
    let (ok, out) = ingero(&["import", live.to_str().unwrap(), "--store", set.to_str().unwrap()]);
    assert!(ok, "{out}");
    let rolled = dir.path().join("trace.20260324T135000.000000000Z-deadbeef.db");
    std::fs::rename(&live, &rolled).unwrap();
    rusqlite::Connection::open(&rolled).unwrap().execute_batch("PRAGMA page_size = 8192; VACUUM").unwrap();
    let fresh =
        "DELETE FROM sessions; DELETE FROM process_names; DELETE FROM causal_chains; DELETE FROM event_aggregates;";
    part(dir.path(), "trace.db", "0", fresh);
    let (ok, out) = ingero(&["import", live.to_str().unwrap(), "--store", set.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("one trace in 4 files (rolled over)"), "{out}");
    assert_eq!(stored_rows(&set).await, before, "imported twice");

    // The Perfetto export shows them: steps as instants on the trainer, the epoch as a span.
    let pf = dir.path().join("t.pftrace");
    let args = ["export", "--format=perfetto", "--store", set.to_str().unwrap(), "--since", SINCE];
    let (ok, out) = ingero(&[&args[..], &[&format!("--out={}", pf.display())]].concat());
    assert!(ok, "{out}");
    assert!(out.contains("8 annotation(s)"), "{out}");
    let Some(tracks) = perfetto_tracks(&pf) else { return };
    let marks: Vec<&Value> = tracks.iter().filter(|t| t["name"] == "annotations").collect();
    let instants: Vec<&str> =
        marks.iter().flat_map(|t| t["instants"].as_array().unwrap()).map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(instants.len(), 7, "{marks:#?}");
    assert!(instants.contains(&"epoch=0 step=7"), "{instants:?}");
    let spans: Vec<&Value> = marks.iter().flat_map(|t| t["slices"].as_array().unwrap()).collect();
    assert_eq!(spans.len(), 1, "{marks:#?}");
    assert_eq!(spans[0]["name"], "epoch=0");
    assert_eq!(spans[0]["dur"], 30_000_000_000u64);
}

/// The totals and the annotations, to compare before and after.
async fn stored_rows(store: &Path) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for q in TOTALS.iter().chain(&["SELECT count(*) FROM host_events WHERE kind = 'annotation'"]) {
        out.push(text(store, q).await);
    }
    out
}

/// The export as Perfetto's own protos read it (None where they are missing, never under CI).
fn perfetto_tracks(file: &Path) -> Option<Vec<Value>> {
    let ok = Command::new("python3")
        .args(["-c", "from perfetto.protos.perfetto.trace import perfetto_trace_pb2"])
        .status()
        .is_ok_and(|s| s.success());
    if !require("python3 with Perfetto's protos (pip install perfetto protobuf)", ok) {
        return None;
    }
    let r = Command::new("python3").arg(READER).arg(file).output().unwrap();
    assert!(r.status.success(), "Perfetto's protos could not read the file: {}", String::from_utf8_lossy(&r.stderr));
    Some(serde_json::from_slice(&r.stdout).unwrap())
}

/// Nodes imported as one job from recordings an hour apart share no
/// window: the ranking says so instead of an empty list; recorded together,
/// they are ranked.
#[test]
fn nodes_recorded_at_different_times_are_reported_unranked() {
    let dir = tempfile::tempdir().unwrap();
    let later = dir.path().join("later.db");
    std::fs::copy(REAL, &later).unwrap();
    let hour = 3_600_000_000_000i64;
    rusqlite::Connection::open(&later)
        .unwrap()
        .execute_batch(&format!(
            "UPDATE events SET timestamp = timestamp + {hour}; UPDATE event_aggregates SET bucket = bucket + {hour};
             UPDATE sessions SET started_at = started_at + {hour}, stopped_at = stopped_at + {hour};
             UPDATE causal_chains SET detected_at = detected_at + {hour};"
        ))
        .unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    for (file, node) in [(REAL, "node-a"), (later.to_str().unwrap(), "node-b"), (REAL, "node-c")] {
        let (ok, out) = ingero(&["import", file, "--node", node, "--job", "ft", "--store", s]);
        assert!(ok, "{out}");
    }
    // node-a and node-c were recorded together: ranked; node-b an hour later: not.
    let (ok, out) = ingero(&["stragglers", "--store", s, "--since", SINCE, "--format", "json"]);
    assert!(ok, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["unranked"][0]["nodes"], serde_json::json!(["node-b"]), "{v:#}");
    assert!(v["unranked"][0]["reason"].as_str().unwrap().contains("with the job's other nodes"), "{v:#}");

    let other = dir.path().join("other");
    let o = other.to_str().unwrap();
    for (file, node) in [(REAL, "node-a"), (later.to_str().unwrap(), "node-b")] {
        let (ok, out) = ingero(&["import", file, "--node", node, "--job", "ft", "--store", o]);
        assert!(ok, "{out}");
    }
    let (ok, out) = ingero(&["stragglers", "--store", o, "--since", SINCE, "--format", "json"]);
    assert!(ok, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["unranked"][0]["job"], "ft", "{v:#}");
    assert_eq!(v["unranked"][0]["nodes"], serde_json::json!(["node-a", "node-b"]), "{v:#}");
    assert_eq!(v["stragglers"].as_array().map(Vec::len), Some(0), "{v:#}");
    let (ok, table) = ingero(&["stragglers", "--store", o, "--since", SINCE]);
    assert!(ok, "{table}");
    assert!(table.contains("job ft (node-a, node-b):") && table.contains("share no window"), "{table}");
    assert!(!table.contains("no node deviates"), "{table}");
    // The fleet page says the same, not "no node data".
    let page = dir.path().join("fleet.html");
    let out = format!("--out={}", page.display());
    let (ok, err) = ingero(&["stragglers", "--store", o, "--since", SINCE, "--format", "html", &out]);
    assert!(ok, "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("Not ranked") && html.contains("share no window"), "{html}");
    assert!(!html.contains("No node data") && !html.contains("bins of 1us"), "{html}");
    assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
}

/// Real recordings of jobs that are not input-starved (a memory-release
/// investigation, a vLLM server): no report on their node or on any of
/// their processes says the GPU starves for input.
#[tokio::test]
async fn real_recordings_of_other_kinds_are_never_called_input_bound() {
    let dir = tempfile::tempdir().unwrap();
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    for (file, node) in [("pytorch-173382-empty-cache.db", "gpu-p"), ("vllm-37343-logprobs-amplification.db", "gpu-v")]
    {
        let store = dir.path().join(node);
        let s = store.to_str().unwrap();
        let (ok, out) = ingero(&["import", &format!("{data}/{file}"), "--node", node, "--store", s]);
        assert!(ok, "{out}");
        let pids =
            text(&store, "SELECT DISTINCT pid FROM sched_windows UNION SELECT DISTINCT pid FROM call_windows").await;
        assert!(pids.len() >= 2, "{file}: {pids:?}");
        let targets = pids.iter().map(|p| ("--pid", format!("{node}:{p}"))).chain([("--node", node.to_string())]);
        for (kind, target) in targets {
            let (ok, out) = ingero(&["report", kind, &target, "--store", s, "--since", SINCE, "--format", "json"]);
            assert!(ok, "{file} {target}: {out}");
            let v: Value = serde_json::from_str(&out).unwrap();
            let causes: Vec<&str> =
                v["chains"].as_array().unwrap().iter().filter_map(|c| c["cause"].as_str()).collect();
            assert!(!causes.contains(&"input_bound"), "{file} {target}: {causes:?}");
        }
    }
}

/// A starved GPU as a real recording shows it (the held-back one, as the
/// issue describes it): the DataLoader workers were started before the
/// trace (no fork events) and are named as PyTorch names them, the trainer
/// launches a handful of kernels in the whole run, and its scheduler events
/// are a sample (little off-CPU seen) while its workers switch context
/// hundreds of thousands of times. Built from the real recording.
#[test]
fn a_starved_gpu_without_fork_events_is_found_by_container_and_names() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("starved.db");
    std::fs::copy(REAL, &file).unwrap();
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch(
            "DELETE FROM events WHERE source = 3 AND op = 7;
             DELETE FROM event_aggregates WHERE source = 3 AND op = 7;
             UPDATE process_names SET name = 'pt_data_worker' WHERE pid IN (30591, 30592, 30594, 30595, 30596);
             UPDATE process_names SET name = 'pt_data_pin' WHERE pid = 30597;
             DELETE FROM events WHERE pid = 30581 AND source IN (1, 4) AND id NOT IN
               (SELECT id FROM events WHERE pid = 30581 AND source = 1 AND op = 3 ORDER BY timestamp LIMIT 20);
             DELETE FROM event_aggregates WHERE pid = 30581 AND source IN (1, 4);
             UPDATE event_aggregates SET count = 240000, sum_dur = 240000000
               WHERE source = 3 AND op = 1 AND pid IN (30591, 30592, 30594, 30595, 30596, 30597);",
        )
        .unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let (ok, out) = ingero(&["import", file.to_str().unwrap(), "--node", "gpu-1", "--store", s]);
    assert!(ok, "{out}");
    // The trainer's report, and the node's (where every process is the target's).
    for (kind, target) in [("--pid", "gpu-1:30581"), ("--node", "gpu-1")] {
        let (ok, out) = ingero(&["report", kind, target, "--store", s, "--since", SINCE, "--format", "json"]);
        assert!(ok, "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let chains = v["chains"].as_array().unwrap();
        let c = chains.iter().find(|c| c["cause"] == "input_bound").unwrap_or_else(|| panic!("{target}: {v:#}"));
        let root = c["root_cause"].to_string();
        assert!(root.contains("python3 (pid 30581) launches only"), "{target}: {root}");
        assert!(root.contains("pt_data_worker (pid 3059") && root.contains("pt_data_pin (pid 30597)"), "{root}");
        assert_eq!(c["severity"], "HIGH", "{c:#}");
    }
}
