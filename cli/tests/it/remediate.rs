// SPDX-License-Identifier: Apache-2.0
//! `ingero serve --remediate on` end to end: a real server ranks a simulated
//! fleet with one straggler, marks that node through a Kubernetes API server
//! stand-in (real kube-rs from the binary, via --kubeconfig), clears it once
//! the fleet is healthy again, counts it on /metrics and journals it for
//! `ingero actions`. Dry-run on the same fleet writes nothing.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ingero_action::testing::ApiServer;

const NODES: usize = 6;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The server, stopped with the test; a failing test (or `INGERO_TEST_LOG`
/// set) prints its log: flags, clears and every judged window are in it.
struct Serve(Child, std::path::PathBuf);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if std::thread::panicking() || std::env::var_os("INGERO_TEST_LOG").is_some() {
            let log = std::fs::read_to_string(&self.1).unwrap_or_default();
            eprintln!("--- {} ---\n{log}", self.1.display());
        }
    }
}

fn serve(dir: &Path, grpc: u16, http: u16, mode: &str) -> Serve {
    let log = dir.join(format!("serve-{mode}.log"));
    let child = ingero_sim::child::dies_with_test(&mut Command::new(env!("CARGO_BIN_EXE_ingero")))
        .arg("serve")
        .arg(format!("--store=file://{}", dir.join("data").display()))
        .arg(format!("--wal-dir={}", dir.join("wal").display()))
        .arg(format!("--listen=127.0.0.1:{grpc}"))
        .arg(format!("--http-listen=127.0.0.1:{http}"))
        .arg(format!("--kubeconfig={}", dir.join("kubeconfig").display()))
        .args(["--remediate", mode, "--remediate-taint", "--remediate-after=2s", "--remediate-clear-after=3s"])
        .args(["--remediate-every=500ms", "--remediate-max-job-share=50%", "--flush-age=1s"])
        .args(["--report-url", "https://ingero.example/r/{node}", "--gpu-price=default=3"])
        .stdout(Stdio::null())
        .env("INGERO_LOG", "info,ingero_server::rank=debug,ingero_server::rank::detector=trace")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", grpc)).is_err() {
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Serve(child, log)
}

fn simulate(grpc: u16, secs: u64, inject: Option<&str>) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ingero"));
    ingero_sim::child::dies_with_test(&mut c);
    c.args(["simulate", "--server", &format!("http://127.0.0.1:{grpc}"), "--nodes", &NODES.to_string()]).args([
        "--duration",
        &format!("{secs}s"),
        "--json",
    ]);
    if let Some(f) = inject {
        c.args(["--inject", f]);
    }
    c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

/// Waits (polling) until `ok` holds; panics with `what` after `secs`.
fn wait_for(secs: u64, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn actions(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ingero"))
        .args(["actions", "--store", &format!("file://{}", dir.join("data").display()), "--since", "1h"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ingero actions: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn metrics(http: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", http)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The API stand-in (its runtime kept alive), a kubeconfig for it, and
/// `ingero serve --remediate MODE` pointed at it.
struct Rig {
    _rt: tokio::runtime::Runtime,
    api: ApiServer,
    dir: tempfile::TempDir,
    grpc: u16,
    http: u16,
    _serve: Serve,
}

impl Rig {
    fn start(mode: &str) -> Rig {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let names: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let api = rt.block_on(ApiServer::start(&refs, Vec::new()));
        let dir = tempfile::tempdir().unwrap();
        api.kubeconfig(&dir.path().join("kubeconfig"));
        let (grpc, http) = (free_port(), free_port());
        let serve = serve(dir.path(), grpc, http, mode);
        Rig { _rt: rt, api, dir, grpc, http, _serve: serve }
    }
}

#[test]
fn a_straggler_is_marked_then_cleared_by_the_server() {
    let Rig { _rt, api, dir, grpc, http, _serve } = Rig::start("on");
    let names: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();

    // node-2's GPU slows from 2 s on, for the rest of the run.
    let mut sim = simulate(grpc, 40, Some("gpu@node-2:2s"));
    wait_for(60, "node-2 marked", || api.condition("node-2").is_some_and(|c| c.0 == "True"));
    let (_, reason, msg) = api.condition("node-2").unwrap();
    assert_eq!(reason, "PerformanceStraggler");
    assert!(msg.contains("Report: https://ingero.example/r/node-2"), "{msg}");
    // What acting is worth: the job's loss so far, priced at $3 a GPU-hour.
    assert!(msg.contains("The job has lost ") && msg.contains(" GPU-hours ($"), "{msg}");
    // The taint is its own PATCH, after the condition's.
    wait_for(10, "node-2 tainted", || api.taints("node-2").contains(&"ingero.io/straggler:NoSchedule".to_string()));
    let m = metrics(http);
    alerted_metrics_are_exported(&m);
    let cost = |name: &str| -> f64 {
        let line = m.lines().find(|l| l.starts_with(name) && l.contains(r#"node="node-2""#));
        line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or_else(|| panic!("no {name} for node-2:\n{m}"))
    };
    // Flagged: what its job has lost so far, in GPU-hours and at $3 each.
    let (hours, usd) = (cost("ingero_straggler_lost_gpu_hours{"), cost("ingero_straggler_cost_dollars{"));
    assert!(hours > 0.0 && (usd - 3.0 * hours).abs() <= 0.01, "{hours} GPU-hours, ${usd}");
    let others: Vec<&str> = refs.iter().copied().filter(|n| *n != "node-2").collect();
    assert!(others.iter().all(|n| api.condition(n).is_none()), "only the straggler is marked");
    let _ = sim.kill();
    let _ = sim.wait();

    // The same nodes, healthy: the mark and the taint go.
    let mut sim = simulate(grpc, 40, None);
    wait_for(60, "node-2 cleared", || api.condition("node-2").is_some_and(|c| c.0 == "False"));
    wait_for(10, "node-2 untainted", || api.taints("node-2") == ["nvidia.com/gpu:NoSchedule"]);
    let _ = sim.kill();
    let _ = sim.wait();

    // An action is counted once its API calls have returned, and the marked
    // gauge set after its journal entry: the cluster can show the untaint a
    // moment before /metrics does (CI saw it).
    let mut m = String::new();
    let clear = r#"ingero_remediation_actions_total{action="clear",mode="on"} 1"#;
    wait_for(10, "the clear counted and no node marked", || {
        m = metrics(http);
        m.contains(clear) && m.contains("ingero_remediation_marked_nodes 0")
    });
    assert!(m.contains(r#"ingero_remediation_actions_total{action="mark",mode="on"} 1"#), "{m}");
    for (method, path) in api.writes() {
        assert!(method == "PATCH" || path.contains("/events"), "{method} {path}");
    }
    // The journal reaches the store with the next flush (--flush-age 1s).
    let kinds = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("20") && l.contains("node-2"))
            .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
            .collect()
    };
    let mut t = String::new();
    wait_for(15, "the journal's four actions", || {
        t = actions(dir.path());
        kinds(&t).len() >= 4
    });
    println!("{t}");
    assert_eq!(kinds(&t), ["mark", "taint", "untaint", "clear"], "{t}");
    assert!(t.lines().all(|l| l.chars().count() <= 80), "{t}");
}

/// Every aggregator metric the chart's alert rules use is in this server's
/// real /metrics (taken while a straggler is flagged and remediation is on;
/// the agent's are checked by node/tests/nodes.rs).
fn alerted_metrics_are_exported(exported: &str) {
    let rules =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/helm/ingero/alerts/ingero.rules.yaml"))
            .unwrap();
    let base = |n: &str| n.strip_suffix("_total").unwrap_or(n).to_string();
    let mut used = std::collections::BTreeSet::new();
    let mut rest = rules.as_str();
    while let Some(i) = rest.find("ingero_") {
        let name: String =
            rest[i..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        rest = &rest[i + name.len()..];
        if !name.starts_with("ingero_agent_") && name.len() > "ingero_".len() {
            used.insert(base(&name));
        }
    }
    assert!(used.len() >= 8, "the rules alert on the aggregator: {used:?}");
    // Families are declared (# TYPE) even before their first sample.
    let names: std::collections::BTreeSet<String> = exported
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ").or((!l.starts_with('#')).then_some(l)))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(base)
        .collect();
    let missing: Vec<&String> = used.iter().filter(|n| !names.contains(*n)).collect();
    assert!(missing.is_empty(), "the alert rules use {missing:?}, not in /metrics:\n{exported}");
}

#[test]
fn dry_run_on_a_live_server_writes_nothing_to_the_cluster() {
    let Rig { _rt, api, dir, grpc, http, _serve } = Rig::start("dry-run");
    let mut sim = simulate(grpc, 40, Some("gpu@node-4:2s"));
    wait_for(60, "a dry-run mark in the journal", || actions(dir.path()).contains("mark (dry)"));
    let _ = sim.kill();
    let _ = sim.wait();
    assert!(api.writes().is_empty(), "{:?}", api.writes());
    assert!(actions(dir.path()).lines().any(|l| l.contains("node-4") && l.contains("mark (dry)")));
    assert!(metrics(http).contains(r#"ingero_remediation_actions_total{action="mark",mode="dry-run"} 1"#));
}

#[test]
fn a_bad_kubeconfig_stops_serve_before_it_listens() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kubeconfig"), "not: [yaml").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ingero"))
        .args(["serve", "--remediate", "on", "--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0"])
        .arg(format!("--store=file://{}", dir.path().join("data").display()))
        .arg(format!("--wal-dir={}", dir.path().join("wal").display()))
        .arg(format!("--kubeconfig={}", dir.path().join("kubeconfig").display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kubeconfig"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_ingero")).args(["serve", "--remediate", "sometimes"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected off, dry-run or on"));
}
