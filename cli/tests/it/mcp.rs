// SPDX-License-Identifier: Apache-2.0
//! `ingero mcp` driven by the official MCP Python SDK (PyPI `mcp`,
//! tests/mcp_client.py) as an assistant would: over stdio on a store, and
//! over streamable HTTP with a bearer token and TLS in front of a running
//! aggregator. The store is the demo's: one known straggler (node-2, CPU).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::fixtures::*;
use serde_json::{Value, json};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");

fn sdk_present() -> bool {
    let ok = Command::new("python3").args(["-c", "import mcp, httpx2"]).status().is_ok_and(|s| s.success());
    require("python3 with the MCP SDK (pip install mcp)", ok)
}

/// A store with a 6-node job and one injected CPU straggler (node-2).
fn demo_store(dir: &Path) -> String {
    let keep = dir.join("ds");
    let o = Command::new(BIN)
        .args(["demo", "--nodes=6", "--duration=12s", "--inject=cpu@2:4s"])
        .arg(format!("--keep={}", keep.display()))
        .arg(format!("--html={}", dir.join("demo.html").display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "demo: {}", String::from_utf8_lossy(&o.stderr));
    format!("file://{}", keep.join("data").display())
}

/// Runs the Python client; (exit ok, its JSON or None, stderr).
fn client(mode_args: &[&str], calls: &Value) -> (bool, Option<Value>, String) {
    let o = Command::new("python3")
        .arg(CLIENT)
        .arg(mode_args[0])
        .arg(calls.to_string())
        .args(&mode_args[1..])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    (o.status.success(), serde_json::from_slice(&o.stdout).ok(), err)
}

fn stdio(store: &str, calls: Value) -> Value {
    let (ok, out, err) = client(&["stdio", BIN, "mcp", &format!("--store={store}")], &calls);
    assert!(ok, "MCP client over stdio failed: {err}");
    out.unwrap()
}

/// The call results, each checked to be a tool answer rather than a protocol error.
fn calls(out: &Value) -> &Vec<Value> {
    let calls = out["calls"].as_array().unwrap();
    for c in calls {
        assert!(c.get("protocol_error").is_none(), "a call failed at the protocol level, not as a tool error: {c}");
    }
    calls
}

fn ok(c: &Value) -> &Value {
    assert_eq!(c["is_error"], false, "{} failed: {}", c["tool"], c["text"]);
    assert_eq!(serde_json::from_str::<Value>(c["text"].as_str().unwrap()).unwrap(), c["structured"]);
    &c["structured"]
}

fn tool_error(c: &Value, says: &str) {
    assert_eq!(c["is_error"], true, "{} should be a tool error: {c}", c["tool"]);
    assert!(c["text"].as_str().unwrap().contains(says), "{} error should say `{says}`: {}", c["tool"], c["text"]);
}

#[test]
fn an_assistant_finds_the_straggler_and_explains_it_over_stdio() {
    if !sdk_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let out = stdio(
        &store,
        json!([
            ["stragglers", {"since": "10m"}],
            ["list_targets", {"kind": "pods", "since": "1h"}],
            ["list_targets", {"kind": "jobs"}],
            ["stall_report", {"node": "node-2", "since": "10m"}],
            ["sql", {"query": "SELECT node, count(*) AS n FROM call_windows GROUP BY node ORDER BY node", "max_rows": 4}],
            ["table_schema", {"table": "call_windows"}],
            ["table_schema", {}],
            // Mistakes an assistant makes: each must come back as a tool error it can read.
            ["stragglers", {"since": "yesterday-ish"}],
            ["stall_report", {"pod": "nowhere/nobody", "since": "10m"}],
            ["stall_report", {"pod": "a/b", "node": "node-2"}],
            ["sql", {"query": "DROP TABLE call_windows"}],
            ["sql", {"query": "SELECT no_such_column FROM call_windows"}],
            ["list_targets", {"kind": "racks"}],
            ["table_schema", {"table": "nope"}],
        ]),
    );
    let names: Vec<&str> = out["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 5, "{names:?}");
    for want in ["stragglers", "stall_report", "sql", "list_targets", "table_schema"] {
        assert!(names.contains(&want), "{want} not listed: {names:?}");
    }
    for t in out["tools"].as_array().unwrap() {
        let d = t["description"].as_str().unwrap();
        assert!(
            d.len() > 80 && (d.contains("Use") || d.contains("Call")),
            "{}: says not when to use it: {d}",
            t["name"]
        );
        assert_eq!(t["input_schema"]["type"], "object", "{t}");
    }
    assert!(out["instructions"].as_str().unwrap().contains("stragglers"));
    let c = calls(&out);

    let ranking = ok(&c[0]);
    assert_eq!(ranking["stragglers"][0]["node"], "node-2", "{ranking}");
    assert_eq!(ranking["stragglers"][0]["flagged"], true);
    assert!(ranking["stragglers"][0]["cost"]["gpu_hours"].as_f64().is_some_and(|h| h > 0.0), "{ranking}");
    assert_eq!(ranking["episodes"][0]["node"], "node-2", "{ranking}");
    let pods = ok(&c[1]);
    assert_eq!(pods["row_count"], 6, "{pods}");
    let straggler_pod = pods["rows"].as_array().unwrap().iter().find(|r| r["node"] == "node-2").unwrap();
    assert_eq!(ok(&c[2])["rows"][0]["job"], "llama-pretrain");
    let report = ok(&c[3]);
    assert_eq!(report["chains"][0]["cause"], "cpu_contention", "{}", report["chains"]);
    assert!(report["straggler"][0]["flagged"] == true, "{}", report["straggler"]);
    let sql = ok(&c[4]);
    assert_eq!((sql["row_count"].clone(), sql["truncated"].clone()), (json!(6), json!(true)));
    assert_eq!(sql["rows"].as_array().unwrap().len(), 4);
    // The same count the CLI gives.
    let cli = Command::new(BIN)
        .args(["sql", "SELECT count(*) AS n FROM call_windows WHERE node = 'node-0'", "--format=json"])
        .arg(format!("--store={store}"))
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(sql["rows"][0]["n"], cli[0]["n"]);
    let cols = ok(&c[5])["columns"].as_array().unwrap().clone();
    assert!(cols.iter().any(|x| x["name"] == "window_start" && x["meaning"].as_str().is_some_and(|m| !m.is_empty())));
    assert!(ok(&c[6])["tables"].as_array().unwrap().len() >= 10);

    tool_error(&c[7], "RFC 3339");
    tool_error(&c[8], "no data for pod nowhere/nobody");
    tool_error(&c[9], "exactly one of");
    tool_error(&c[10], "read-only");
    tool_error(&c[11], "no_such_column");
    tool_error(&c[12], "racks");
    tool_error(&c[13], "call_windows");

    // The pod the ranking blames, reported by name in a second session.
    let pod = straggler_pod["pod"].as_str().unwrap();
    let out = stdio(&store, json!([["stall_report", {"pod": pod, "since": "2026-01-01T00:00:00Z"}]]));
    let report = ok(&calls(&out)[0]);
    assert!(report["target"].as_str().unwrap().contains(pod), "{}", report["target"]);
    assert_eq!(report["chains"][0]["cause"], "cpu_contention");
}

/// `ingero mcp --http …` as a child; waits for its "listening on" line.
fn mcp_http(args: &[String]) -> (Child, String) {
    let mut child =
        Command::new(BIN).arg("mcp").args(args).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("ingero mcp exited before listening").unwrap();
        if let Some(u) = line.split("listening on ").nth(1) {
            break u.trim().to_string();
        }
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_needs_the_token_and_speaks_tls_and_mutual_tls() {
    if !sdk_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = demo_store(dir.path());
    let server = ingero_server::Server::start(serve_config(
        &store,
        &dir.path().join("wal"),
        ingero_store::StoreOptions::default(),
    ))
    .await
    .unwrap();
    let authority = ca("ingero mcp test CA");
    let (cert, key) = leaf(&authority, &["localhost", "127.0.0.1"]);
    let w = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let (ca_pem, token) = (w("ca.pem", &authority.pem()), "mcp-test-token-8c1f");
    let args = vec![
        format!("--server=http://{}", server.grpc_addr),
        "--http=127.0.0.1:0".into(),
        format!("--http-token-file={}", w("token", token)),
        format!("--http-tls-cert={}", w("cert.pem", &cert)),
        format!("--http-tls-key={}", w("key.pem", &key)),
    ];
    let (mut child, url) = tokio::task::spawn_blocking(move || mcp_http(&args)).await.unwrap();
    assert!(url.starts_with("https://127.0.0.1:") && url.ends_with("/mcp"), "{url}");

    let run = |token: &'static str, calls: Value| {
        let url = url.clone();
        let ca_pem = ca_pem.clone();
        tokio::task::spawn_blocking(move || client(&["http", &url, token, &ca_pem], &calls))
    };
    let (ok_run, out, err) =
        run(token, json!([["stragglers", {"since": "10m"}], ["stall_report", {"node": "node-2", "since": "bad"}]]))
            .await
            .unwrap();
    assert!(ok_run, "MCP client over HTTPS failed: {err}");
    let out = out.unwrap();
    let c = calls(&out);
    assert_eq!(ok(&c[0])["stragglers"][0]["node"], "node-2", "through the server's gRPC query service");
    tool_error(&c[1], "RFC 3339");

    assert_ne!(out["http_status"], 401);
    for bad in ["wrong-token", "-"] {
        let (ok_run, out, err) = run(bad, json!([["stragglers", {}]])).await.unwrap();
        let out = out.unwrap_or_else(|| panic!("client failed: {err}"));
        assert!(ok_run && out["http_status"] == 401, "token {bad}: must be refused with 401: {out}");
        assert!(out["session_error"].is_string() && out.get("calls").is_none(), "token {bad}: a session opened: {out}");
    }

    child.kill().unwrap();
    child.wait().unwrap();

    // Mutual TLS, over the store: only a client certificate from the CA gets in.
    let (client_cert, client_key) = leaf(&authority, &["assistant"]);
    let (rogue_cert, rogue_key) = leaf(&ca("someone else's CA"), &["assistant"]);
    let files = [
        w("client.pem", &client_cert),
        w("client.key", &client_key),
        w("rogue.pem", &rogue_cert),
        w("rogue.key", &rogue_key),
    ];
    let args = vec![
        format!("--store={store}"),
        "--http=127.0.0.1:0".into(),
        format!("--http-tls-cert={}", dir.path().join("cert.pem").display()),
        format!("--http-tls-key={}", dir.path().join("key.pem").display()),
        format!("--http-tls-client-ca={ca_pem}"),
    ];
    let (mut child, url) = tokio::task::spawn_blocking(move || mcp_http(&args)).await.unwrap();
    let mtls = |cert: &str, key: &str| {
        let (url, ca_pem, cert, key) = (url.clone(), ca_pem.clone(), cert.to_string(), key.to_string());
        tokio::task::spawn_blocking(move || {
            let mut a = vec!["http", &url, "-", &ca_pem];
            if !cert.is_empty() {
                a.extend([cert.as_str(), key.as_str()]);
            }
            client(&a, &json!([["list_targets", {"kind": "nodes"}]]))
        })
    };
    let (ok_run, out, err) = mtls(&files[0], &files[1]).await.unwrap();
    let out = out.unwrap_or_else(|| panic!("client failed: {err}"));
    assert!(ok_run && out.get("connect_error").is_none(), "{out}");
    assert_eq!(ok(&calls(&out)[0])["row_count"], 6);
    for (cert, key, who) in [("", "", "no certificate"), (files[2].as_str(), files[3].as_str(), "a rogue CA's")] {
        let (_, out, err) = mtls(cert, key).await.unwrap();
        let out = out.unwrap_or_else(|| panic!("client failed: {err}"));
        assert!(out["connect_error"].is_string(), "{who}: let in: {out}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    server.shutdown().await.unwrap();
}

#[test]
fn bad_configuration_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| Command::new(BIN).arg("mcp").args(args).output().unwrap();
    let empty = format!("--store={}", dir.path().display());
    let o = run(&[&empty]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("holds no Ingero data"), "{o:?}");
    let missing = format!("--http-token-file={}", dir.path().join("absent").display());
    std::fs::create_dir_all(dir.path().join("ds/_ingero")).unwrap();
    let store = format!("--store={}", dir.path().join("ds").display());
    let o = run(&[&store, "--http=127.0.0.1:0", &missing]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--http-token-file"), "{o:?}");
    let o = run(&[&store, "--http-token-file=/etc/hostname"]);
    assert_eq!(o.status.code(), Some(2), "--http-token-file without --http: {o:?}");
    let o = run(&[&store, "--max-rows=0"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}
