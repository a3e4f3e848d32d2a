// SPDX-License-Identifier: Apache-2.0
//! `ingero export --format perfetto`, read back with Perfetto's own
//! published protos (tests/perfetto_read.py): the demo's six nodes with the
//! injected straggler's flagged span, and a real GPU trace (imported) with
//! its outlier calls as slices on the thread that made them.

use std::path::Path;
use std::process::Command;

use crate::fixtures::*;
use serde_json::Value;

const READER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/perfetto_read.py");
const REAL_TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/pytorch-173382-empty-cache.db");

fn reader_present() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "from perfetto.protos.perfetto.trace import perfetto_trace_pb2"])
        .status()
        .is_ok_and(|s| s.success());
    require("python3 with Perfetto's protos (pip install perfetto protobuf)", ok)
}

/// Exports, then reads the file with Perfetto's protos: the tracks.
fn export(store: &str, out: &Path, args: &[&str]) -> Vec<Value> {
    let o = Command::new(BIN)
        .args(["export", "--format=perfetto", &format!("--store={store}"), &format!("--out={}", out.display())])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "export failed: {err}");
    assert!(err.contains("ui.perfetto.dev"), "{err}");
    let r = Command::new("python3").arg(READER).arg(out).output().unwrap();
    assert!(r.status.success(), "Perfetto's protos could not read the file: {}", String::from_utf8_lossy(&r.stderr));
    serde_json::from_slice(&r.stdout).unwrap()
}

fn path(t: &Value) -> Vec<&str> {
    t["path"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect()
}

fn track<'a>(tracks: &'a [Value], want: &[&str]) -> &'a Value {
    tracks
        .iter()
        .find(|t| {
            let p = path(t);
            p.len() == want.len() && p.iter().zip(want).all(|(a, b)| a.starts_with(b))
        })
        .unwrap_or_else(|| panic!("no track {want:?} in {:?}", tracks.iter().map(path).collect::<Vec<_>>()))
}

#[test]
fn nodes_side_by_side_with_straggler_spans_counters_and_real_outlier_calls() {
    if !reader_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("ds");
    // The demo's page goes to the temp dir, not the working directory.
    let html = format!("--html={}", dir.path().join("demo.html").display());
    let o = ingero(&[
        "demo",
        "--nodes=6",
        "--duration=12s",
        "--inject=cpu@2:4s",
        &html,
        &format!("--keep={}", keep.display()),
    ]);
    assert!(o.status.success(), "demo: {}", String::from_utf8_lossy(&o.stderr));
    let store = format!("file://{}", keep.join("data").display());
    let o = ingero(&["import", REAL_TRACE, "--node=rtx4090", &format!("--store={store}")]);
    assert!(o.status.success(), "import: {}", String::from_utf8_lossy(&o.stderr));

    // The demo's range: six node groups, each with its process and counters; node-2 flagged.
    let tracks = export(&store, &dir.path().join("demo.pftrace"), &["--since=10m"]);
    let nodes: Vec<&Value> = tracks.iter().filter(|t| path(t).len() == 1).collect();
    assert_eq!(nodes.len(), 6, "one group per node: {nodes:?}");
    for n in &nodes {
        assert!(n["description"].as_str().unwrap().contains("wall clock"), "clock not noted: {n}");
    }
    assert!(
        nodes.iter().any(|n| n["description"].as_str().unwrap().contains("ms vs node-0")),
        "no node's offset relative to another: {nodes:?}"
    );
    let flagged = track(&tracks, &["node-2", "straggler · llama-pretrain"]);
    let span = &flagged["slices"][0];
    assert_eq!(span["name"], "flagged straggler");
    assert!(span["args"]["signal"].as_str().unwrap().contains("run-queue"), "{span}");
    assert!(span["dur"].as_u64().unwrap() >= 3_000_000_000, "a flag holds ≥ 3 windows: {span}");
    for n in ["node-0", "node-1", "node-3", "node-4", "node-5"] {
        assert!(!tracks.iter().any(|t| path(t) == [n, "straggler · llama-pretrain"]), "{n} flagged");
    }
    let runq = |node: &str| {
        let t = track(&tracks, &[node, "python3", "run-queue wait"]);
        assert_eq!(t["counter_unit"], "threads");
        t["counters"].as_array().unwrap().iter().map(|c| c[1].as_f64().unwrap()).fold(0.0, f64::max)
    };
    assert!(runq("node-2") > 3.0 * runq("node-0").max(0.01), "the contended node's run-queue counter stands out");
    let score = track(&tracks, &["node-2", "straggler score"]);
    assert!(score["counters"].as_array().unwrap().len() >= 6, "{score}");
    assert!(tracks.iter().all(|t| t["slices"].as_array().unwrap().iter().all(|s| s["depth"] == 0)));

    // The real trace's range: its outlier calls on the thread that made them.
    let tracks = export(
        &store,
        &dir.path().join("real.pftrace"),
        &["--since=2026-03-24T13:48:00Z", "--until=3m", "--node=rtx4090"],
    );
    assert_eq!(tracks.iter().filter(|t| path(t).len() == 1).count(), 1, "--node keeps one node");
    let thread = tracks.iter().find(|t| !t["slices"].as_array().unwrap().is_empty()).expect("no slices");
    let p = path(thread);
    assert!(p.len() == 3 && p[0] == "rtx4090" && p[1].starts_with("python3 ") && p[2].starts_with("thread "), "{p:?}");
    let slices = thread["slices"].as_array().unwrap();
    let sql = ingero(&[
        "sql",
        "SELECT count(*) AS n, max(duration_ns) AS longest FROM stall_events WHERE node = 'rtx4090'",
        "--format=json",
        &format!("--store={store}"),
    ]);
    let sql: Value = serde_json::from_slice(&sql.stdout).unwrap();
    assert_eq!(slices.len() as u64, sql[0]["n"].as_u64().unwrap(), "every outlier call is a slice");
    let longest = slices.iter().map(|s| s["dur"].as_u64().unwrap()).max().unwrap();
    assert_eq!(longest, sql[0]["longest"].as_u64().unwrap(), "durations kept to the ns");
    for s in slices {
        let (name, lib) = (s["name"].as_str().unwrap(), s["categories"][0].as_str().unwrap());
        assert!(s["args"]["threshold_ms"].as_f64().is_some() && s["args"]["library"] == lib, "{s}");
        assert!(matches!(lib, "cudart" | "cuda") && name.starts_with("cu"), "{s}");
    }
    // The driver's launch made inside the runtime's is drawn inside it.
    let nested = slices.iter().find(|s| s["depth"] == 1).expect("no nested call");
    assert_eq!((nested["name"].as_str(), nested["categories"][0].as_str()), (Some("cuLaunchKernel"), Some("cuda")));

    // --max-slices keeps the longest.
    let tracks = export(
        &store,
        &dir.path().join("cut.pftrace"),
        &["--since=2026-03-24T13:48:00Z", "--until=3m", "--node=rtx4090", "--max-slices=5"],
    );
    let kept: Vec<u64> = tracks
        .iter()
        .flat_map(|t| t["slices"].as_array().unwrap().iter().map(|s| s["dur"].as_u64().unwrap()))
        .collect();
    assert_eq!(kept.len(), 5);
    assert!(kept.contains(&longest));
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ds/_ingero")).unwrap();
    let store = format!("--store={}", dir.path().join("ds").display());
    let out = format!("--out={}", dir.path().join("t.pftrace").display());
    for (args, says) in [
        (vec!["--since=yesterday"], "RFC 3339"),
        (vec!["--since=10m", "--until=soon"], "--until"),
        (vec!["--since=10m", "--max-slices=0"], "--max-slices"),
        (vec!["--since=10m"], "no data"),
        (vec!["--since=10m", "--node=gpu-9"], "on gpu-9"),
    ] {
        let o = Command::new(BIN).args(["export", &store, &out]).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should say `{says}`: {err}");
    }
    let o = Command::new(BIN).args(["export", &store, &format!("--out={}", dir.path().display())]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("is a directory"));
}
