// SPDX-License-Identifier: Apache-2.0
//! The `ingero` binary as a user runs it: demo, history, SQL, reports (the
//! HTML one opened in headless Chromium), and refusals with exit code 2.

use std::path::Path;
use std::process::Command;

use crate::fixtures::*;

#[test]
fn demo_then_history_sql_and_reports_on_its_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("demo.html");
    let keep = dir.path().join("ds");
    // --keep relative to where the demo runs.
    let o = Command::new(env!("CARGO_BIN_EXE_ingero"))
        .args(["demo", "--nodes=6", "--duration=12s", "--inject=cpu@2:4s", "--keep=ds"])
        .arg(format!("--html={}", html.display()))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "demo failed: {err}");
    assert!(out.contains(&format!("dataset kept in {}", keep.display())), "{out}");
    assert!(out.contains("cpu@node-2") && !out.contains("NOT FLAGGED"), "{out}");
    assert!(out.contains("CPU scheduling contention"), "{out}");
    assert!(
        out.lines().filter(|l| !l.starts_with("dataset kept in")).all(|l| l.chars().count() <= 80),
        "demo output wider than 80 columns:\n{out}"
    );
    assert!(err.contains("window   1/12"), "no progress shown: {err}");
    assert!(html.exists());

    let store = format!("--store=file://{}", keep.join("data").display());
    let o = ingero(&["stragglers", &store, "--since=5m", "--format=json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stragglers"][0]["node"], "node-2", "{v}");
    assert_eq!(v["stragglers"][0]["flagged"], true);
    // In lockstep the straggler steps as its job does: the cost is the job's
    // pace before the contention began against since (the model: ~1.5x).
    let shift = &v["stragglers"][0]["step"]["job_shift"];
    let slower = shift["since_seconds"].as_f64().unwrap() / shift["before_seconds"].as_f64().unwrap();
    assert!((1.3..1.7).contains(&slower), "{v}");
    let o = ingero(&["stragglers", &store, "--since=5m"]);
    let (out, _) = text(&o);
    assert!(out.starts_with("NODE") && out.contains("node-2") && out.lines().all(|l| l.chars().count() <= 80), "{out}");
    assert!(out.contains("× the job's"), "no step time: {out}");
    assert!(out.ends_with("6 node(s) in 1 job(s) judged; 5 within their job's range\n"), "{out}");
    let o = ingero(&["stragglers", &store, "--since=5m", "--job=nobody"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    let named = "no node of job \"nobody\" reported in the range (jobs with data then: llama-pretrain)";
    assert!(out.is_empty() && err.contains(named), "{out}{err}");

    let o = ingero(&["sql", "SELECT count(*) AS n FROM call_windows WHERE node = 'node-2'", &store, "--format=json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v[0]["n"].as_u64().unwrap() >= 40, "{v}");
    // DataFusion 55.2 alone limits the DISTINCT below the window to 2 nodes
    // (query/repair.rs): the count said 2.
    let q =
        "SELECT node, COUNT(*) OVER () AS nodes FROM (SELECT DISTINCT node FROM call_windows) ORDER BY node LIMIT 2";
    let o = ingero(&["sql", q, &store, "--format=json"]);
    let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert_eq!(
        (v[0]["nodes"].as_u64(), v[1]["nodes"].as_u64(), v[1]["node"].as_str()),
        (Some(6), Some(6), Some("node-1")),
        "{v}"
    );
    // JSON for scripts: every column in every row, and an array when empty.
    let q = "SELECT node, CASE WHEN node = 'node-0' THEN NULL ELSE 1 END AS x FROM call_windows \
             GROUP BY node ORDER BY node LIMIT 2";
    let o = ingero(&["sql", q, &store, "--format=json"]);
    let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert_eq!(v, serde_json::json!([{"node": "node-0", "x": null}, {"node": "node-1", "x": 1}]));
    let o = ingero(&["sql", "SELECT node FROM call_windows WHERE node = 'nobody'", &store, "--format=json"]);
    assert_eq!((o.status.code(), text(&o).0.trim()), (Some(0), "[]"));
    // CSV of list columns: each list one quoted cell, as the table shows it.
    let q = "SELECT op, hist_bucket FROM call_windows WHERE cardinality(hist_bucket) > 1 LIMIT 3";
    let o = ingero(&["sql", q, &store, "--format=csv"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 4, "{out}");
    assert!(rows[0] == "op,hist_bucket" && rows[1..].iter().all(|r| r.contains(",\"[") && r.ends_with("]\"")), "{out}");
    for refused in [
        "DROP TABLE call_windows",
        "INSERT INTO call_windows VALUES (1)",
        "COPY call_windows TO '/tmp/x.parquet'",
        "CREATE TABLE t AS SELECT 1",
        "DELETE FROM call_windows",
    ] {
        let o = ingero(&["sql", refused, &store]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{refused}: {err}");
        assert!(err.contains("read-only"), "{refused}: {err}");
    }
    // A query smuggling a write after a SELECT is refused by the planner too.
    let o = ingero(&["sql", "SELECT 1; DROP TABLE call_windows", &store]);
    assert_ne!(o.status.code(), Some(0), "multi-statement accepted");

    let report = dir.path().join("r.html");
    let o = ingero(&[
        "report",
        "--pod=ml/llama-pretrain-worker-2",
        &store,
        "--since=5m",
        "--format=html",
        &format!("--out={}", report.display()),
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    let o = ingero(&["report", "--pod=ml/llama-pretrain-worker-2", &store, "--since=5m", "--format=json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["chains"][0]["cause"], "cpu_contention", "{v}");
    // The simulated steps slow by the contention: the chain says by how much.
    let effects = v["chains"][0]["effect"].to_string();
    assert!(effects.contains("each training step took"), "{effects}");
    assert!(v["steps"]["count"].as_u64().unwrap() > 0, "{v}");
    check_in_chromium(&report, dir.path());
    // A rank on a calm node: no stall of its own, held back by node-2.
    let o = ingero(&["report", "--pod=ml/llama-pretrain-worker-0", &store, "--since=5m", "--format=json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let chains = v["chains"].as_array().unwrap();
    assert_eq!((chains.len(), &chains[0]["cause"]), (1, &serde_json::json!("held_back")), "{v:#}");
    assert_eq!(chains[0]["title"], "Straggler node-2 → this rank waits for it", "{v:#}");
    assert!(chains[0]["fixes"][0].as_str().unwrap().ends_with("this rank has no stall of its own to fix"), "{v:#}");

    let o = ingero(&["report", "--pod=ml/nobody", &store, "--since=5m"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    let err = text(&o).1;
    assert!(err.contains("no data for pod ml/nobody"), "{err}");
    // The pods that have data, for a name mistyped.
    assert!(err.contains("pods with data then: ml/llama-pretrain-worker-0, ml/llama-pretrain-worker-1,"), "{err}");
    assert!(err.contains(", … 6 in all)"), "{err}");
    let o = ingero(&["report", "--pid=node-9:1", &store, "--since=5m"]);
    assert!(text(&o).1.contains("processes with data then: node-0:"), "{}", text(&o).1);
    // Every simulated node runs pid 4242: a bare pid names 6 processes, not one.
    let o = ingero(&["report", "--pid=4242", &store, "--since=5m"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    assert!(text(&o).1.contains("pid 4242 ran on 6 nodes in that range (node-0, node-1, node-2,"), "{}", text(&o).1);
}

/// Renders the page as a person would see it and checks what is on screen.
fn check_in_chromium(page: &Path, tmp: &Path) {
    let chromium = which("chromium").or_else(|| which("chromium-browser"));
    if !require("Debian chromium (apt-get install chromium)", chromium.is_some()) {
        return;
    }
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ];
    let profile = format!("--user-data-dir={}", tmp.join("chromium").display());
    let url = format!("file://{}", page.display());
    let dom = Command::new(chromium.as_ref().unwrap())
        .args(common)
        .arg(&profile)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("CPU scheduling contention"), "chain not in the rendered DOM");
    assert_eq!(dom.matches("<svg").count(), 4, "expected four plots");
    assert!(dom.contains("Step time (median per window"), "no step-time plot");
    assert!(dom.contains("job's other nodes"), "plots lack the peer comparison");
    assert!(dom.contains("CUDA/NCCL calls") && dom.contains("cudaStreamSynchronize"), "no table of calls");
    let shot = tmp.join("report.png");
    let o = Command::new(chromium.unwrap())
        .args(common)
        .arg(&profile)
        .arg("--window-size=900,2000")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 20_000, "screenshot missing or blank ({size} bytes): {}", String::from_utf8_lossy(&o.stderr));
}

/// Every `--help` page wraps to an 80-column terminal (clap reads
/// `COLUMNS` as it reads the terminal's width).
#[test]
fn every_help_fits_80_columns() {
    let help = |args: &[&str]| {
        let o = Command::new(BIN).args(args).env("COLUMNS", "80").env("LINES", "24").output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o).1);
        text(&o).0
    };
    let top = help(&["--help"]);
    let commands: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.strip_prefix("  ").filter(|c| !c.starts_with(' ')))
        .filter_map(|c| c.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.contains(&"serve") && commands.contains(&"report") && commands.len() >= 10, "{top}");
    for args in
        std::iter::once(vec!["--help"]).chain(commands.iter().flat_map(|c| [vec![*c, "--help"], vec![*c, "-h"]]))
    {
        let page = help(&args);
        let wide: Vec<&str> = page.lines().filter(|l| l.chars().count() > 80).collect();
        assert!(wide.is_empty(), "`ingero {}` wider than 80 columns: {wide:#?}", args.join(" "));
    }
}

/// A store remediation never wrote to: said so, with how to turn it on.
#[test]
fn actions_on_a_store_without_records_says_how_to_get_them() {
    let dir = tempfile::tempdir().unwrap();
    let o = ingero(&["actions", &format!("--store=file://{}", dir.path().display()), "--since=2h"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("no remediation records since 20") && out.contains("--remediate dry-run|on"), "{out}");
    // The store's URL is never cut; the rest fits 80 columns.
    let rest = out.replace(&format!("file://{}", dir.path().display()), "URL");
    assert!(rest.lines().all(|l| l.chars().count() <= 80), "wider than 80 columns:\n{out}");
}

#[test]
fn bad_arguments_exit_2_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty = format!("--store=file://{}", dir.path().display());
    for (args, needle) in [
        (vec!["serve", "--store=ftp://host/x"], "unsupported scheme"),
        (vec!["serve", "--flush-rows=0"], "--flush-rows"),
        (vec!["serve", "--vacuum-retention=5m"], "below the floor of 1h"),
        (vec!["serve", "--retention-raw=30m"], "at least 2h"),
        (vec!["serve", "--max-message-size=12parsecs"], "unknown size unit"),
        (vec!["simulate", "--nodes=1"], "at least 2"),
        (vec!["simulate", "--inject=cpu@99:1s"], "does not exist"),
        (vec!["report", "--pod=noslash", &empty], "NAMESPACE/NAME"),
        (vec!["stragglers", &empty], "holds no Ingero data"),
        (vec!["stragglers", "--since=yesterday-ish", &empty], "neither a duration"),
        (vec!["stragglers", "--since=2999-01-01T00:00:00Z", &empty], "is in the future"),
        (vec!["stragglers", "--flag-after=0", &empty], "--flag-after"),
        (vec!["stragglers", "--resolution=10s", "--server=http://127.0.0.1:1"], "give --store, not --server"),
        (vec!["stragglers", "--resolution=500ms", &empty], "at least 1s"),
    ] {
        let o = ingero(&args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: `{err}` lacks `{needle}`");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
    // A read of a store that is not there leaves nothing behind.
    let missing = dir.path().join("not-here");
    let o = ingero(&["stragglers", &format!("--store=file://{}", missing.display())]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    assert!(!missing.exists(), "a failed read created {}", missing.display());
}

/// Ctrl-C during the demo: exit 130 with one line, and its temporary
/// directory gone (it was left in /tmp on every interrupted demo).
#[test]
fn an_interrupted_demo_removes_its_directory() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ingero"))
        .args(["demo", "--nodes=2", "--duration=120s", "--inject=cpu@1:60s"])
        .arg(format!("--html={}", tmp.path().join("demo.html").display()))
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    // The first simulated window: the aggregator is up and writing its files.
    while !seen.contains("window   1/") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "the demo ended early: {seen}");
        seen.push_str(&line);
    }
    let dirs =
        || std::fs::read_dir(tmp.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect::<Vec<_>>();
    assert!(dirs().iter().any(|n| n.to_string_lossy().starts_with("ingero-demo-")), "{:?}", dirs());
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{seen}{rest}");
    assert!(rest.contains("interrupted") && !rest.contains("panicked"), "{rest}");
    assert!(dirs().iter().all(|n| !n.to_string_lossy().starts_with("ingero-demo-")), "left behind: {:?}", dirs());
}
