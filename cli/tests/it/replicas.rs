// SPDX-License-Identifier: Apache-2.0
//! Three `ingero serve` processes as one aggregator over one store, a fleet
//! of simulated agents routed over them, one replica SIGKILLed mid-run:
//! the injected straggler is still flagged, its nodes move to the others
//! with what that replica had not committed, every acknowledged batch is in
//! the Delta tables exactly once, batch by batch and row by row (also after
//! the dead replica comes back and replays its WAL), and every replica answers for the whole fleet,
//! naming the one that is down.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixtures::ingero;

const REPLICAS: usize = 3;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn_replica(dir: &Path, i: usize, ports: &[u16]) -> Child {
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let child = ingero_sim::child::dies_with_test(&mut Command::new(env!("CARGO_BIN_EXE_ingero")))
        .arg("serve")
        .arg(format!("--store=file://{}", dir.join("data").display()))
        .arg(format!("--wal-dir={}", dir.join(format!("wal-{i}")).display()))
        .arg(format!("--listen=127.0.0.1:{}", ports[i]))
        .arg("--http-listen=127.0.0.1:0")
        .arg(format!("--replicas={}", urls.join(",")))
        .arg(format!("--replica-self={}", urls[i]))
        .args(["--flush-age=2s", "--flag-after=3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", ports[i])).is_err() {
        assert!(Instant::now() < deadline, "replica {i} did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn sql_number(dir: &Path, q: &str) -> u64 {
    let store = format!("file://{}", dir.join("data").display());
    let out = ingero(&["sql", "--store", &store, "--format", "json", q]);
    assert!(out.status.success(), "ingero sql: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &v.as_array().unwrap()[0];
    row.as_object().unwrap().values().next().unwrap().as_u64().unwrap_or(0)
}

/// Rows of every data table, from the `numRecords` of its live files.
fn stored_rows(dir: &Path) -> u64 {
    use ingero_store::{Store, StoreUrl, delta::Snapshot};
    let url = StoreUrl::parse(&format!("file://{}", dir.join("data").display())).unwrap();
    let store = Store::open(&url, &Default::default()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tables = ingero_model::Table::ALL.iter();
    tables
        .map(|t| rt.block_on(Snapshot::load(&store, t.name())).unwrap().rows().expect("numRecords of every file"))
        .sum()
}

#[test]
fn a_killed_replica_loses_no_batch_and_the_others_answer_for_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..REPLICAS).map(|_| free_port()).collect();
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut replicas: Vec<Child> = (0..REPLICAS).map(|i| spawn_replica(dir.path(), i, &ports)).collect();

    // 36 nodes in 2 jobs; node-7 (job 1) becomes a CPU straggler at 22 s,
    // after replica 1 is killed at ~10 s.
    let sim = ingero_sim::child::dies_with_test(&mut Command::new(env!("CARGO_BIN_EXE_ingero")))
        .args(["simulate", "--server", &urls.join(","), "--nodes", "36", "--jobs", "2", "--duration", "40s"])
        .args(["--inject", "cpu@node-7:22s", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(11));
    replicas[1].kill().unwrap();
    replicas[1].wait().unwrap();
    let out = sim.wait_with_output().unwrap();
    assert!(out.status.success(), "simulate failed");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let inj = &report["injections"][0];
    let after = inj["flagged_after_secs"].as_f64().unwrap_or_else(|| panic!("node-7 never flagged: {report}"));
    assert!(after <= 5.0, "flagged {after:.1}s after the injection: {report}");
    assert_eq!(report["false_flags"].as_array().unwrap().len(), 0, "{report}");
    let failovers = report["failovers"].as_array().unwrap();
    assert!(!failovers.is_empty(), "no node moved off the killed replica: {report}");
    for f in failovers {
        assert_ne!(f["to"], urls[1], "{f}");
        assert!(f["secs"].as_f64().unwrap() < 10.0, "slow failover: {f}");
    }

    // Every live replica answers for the whole fleet and names the dead one.
    for i in [0, 2] {
        let out = ingero(&["stragglers", "--server", &urls[i], "--format", "json"]);
        assert!(out.status.success(), "stragglers on replica {i}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let down: Vec<&str> = v["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["answered"] != true)
            .map(|r| r["replica"].as_str().unwrap())
            .collect();
        assert_eq!(down, vec![urls[1].as_str()], "replica {i}: {v}");
    }

    // The killed replica comes back and replays its WAL: still exactly once.
    replicas[1] = spawn_replica(dir.path(), 1, &ports);
    std::thread::sleep(Duration::from_secs(4));
    for mut r in replicas {
        Command::new("kill").arg("-TERM").arg(r.id().to_string()).status().unwrap();
        assert!(r.wait().unwrap().success());
    }
    let acked = report["acknowledged"].as_u64().unwrap();
    let stored = sql_number(dir.path(), "SELECT sum(batches) AS n FROM ingest_batches");
    eprintln!(
        "flagged after {after:.1}s; {} nodes failed over ({:?}), re-sending {} uncommitted batches; \
         acknowledged {acked}, stored {stored}",
        failovers.len(),
        failovers.iter().map(|f| (f["secs"].as_f64().unwrap() * 10.0).round() / 10.0).collect::<Vec<_>>(),
        failovers.iter().map(|f| f["resent"].as_u64().unwrap()).sum::<u64>()
    );
    assert_eq!(stored, acked, "acknowledged batches vs batches in the store: {report}");
    // And row by row: every table's live files hold each acknowledged row once.
    let acked_rows = report["acknowledged_rows"].as_u64().unwrap();
    assert_eq!(sql_number(dir.path(), "SELECT sum(rows) AS n FROM ingest_batches"), acked_rows, "{report}");
    assert_eq!(stored_rows(dir.path()), acked_rows, "rows in the data tables vs rows acknowledged: {report}");
    let ranges = sql_number(
        dir.path(),
        "SELECT count(*) AS n FROM ingest_batches a JOIN ingest_batches b ON a.node = b.node \
         AND (a.writer <> b.writer OR a.segment <> b.segment) \
         AND a.first_sequence <= b.last_sequence AND b.first_sequence <= a.last_sequence",
    );
    assert_eq!(ranges, 0, "a batch range was stored twice");
}

/// Every flagged node of `ingero stragglers --server URL`, checking that no
/// node is listed twice (a replica that no longer owns a job must not keep
/// showing its old standings beside the new owner's).
fn flagged_once(url: &str) -> Vec<String> {
    let out = ingero(&["stragglers", "--server", url, "--format", "json"]);
    assert!(out.status.success(), "stragglers on {url}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes: Vec<String> =
        v["stragglers"].as_array().unwrap().iter().map(|s| s["node"].as_str().unwrap().to_string()).collect();
    let mut unique = nodes.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), nodes.len(), "a node listed twice on {url}: {v}");
    // Nor counted twice: each job and node once, fleet-wide.
    assert_eq!((v["jobs"].as_u64(), v["nodes"].as_u64()), (Some(2), Some(36)), "on {url}: {v}");
    let flagged = v["stragglers"].as_array().unwrap().iter().filter(|s| s["flagged"] == true);
    flagged.map(|s| s["node"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_job_whose_owner_dies_and_comes_back_goes_on_from_its_recent_windows() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..REPLICAS).map(|_| free_port()).collect();
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut replicas: Vec<Child> = (0..REPLICAS).map(|i| spawn_replica(dir.path(), i, &ports)).collect();
    // The replica that ranks job 0 (nodes 0, 2, 4, …) dies at ~8 s and is
    // back at ~14 s. node-10 slows down while its job's standby ranks it,
    // node-4 once the owner is back: a new owner that started from nothing
    // would spend its first windows warming up and miss both deadlines.
    let owner = ingero_proto::route::rendezvous("llama-pretrain-0", &urls)[0];
    let sim = ingero_sim::child::dies_with_test(&mut Command::new(env!("CARGO_BIN_EXE_ingero")))
        .args(["simulate", "--server", &urls.join(","), "--nodes", "36", "--jobs", "2", "--duration", "32s"])
        .args(["--inject", "cpu@node-10:10s", "--inject", "io@node-4:15s", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    replicas[owner].kill().unwrap();
    replicas[owner].wait().unwrap();
    std::thread::sleep(Duration::from_secs(6));
    replicas[owner] = spawn_replica(dir.path(), owner, &ports);
    let out = sim.wait_with_output().unwrap();
    assert!(out.status.success(), "simulate failed");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for inj in report["injections"].as_array().unwrap() {
        let after = inj["flagged_after_secs"].as_f64().unwrap_or_else(|| panic!("never flagged: {inj} in {report}"));
        assert!(after <= 5.0, "{inj}: flagged {after:.1}s after the injection: {report}");
        eprintln!("{}: flagged after {after:.1}s", inj["injection"]);
    }
    assert_eq!(report["false_flags"].as_array().unwrap().len(), 0, "{report}");
    // Every replica answers with each node once, both stragglers flagged.
    for url in &urls {
        let mut flagged = flagged_once(url);
        flagged.sort();
        assert_eq!(flagged, ["node-10", "node-4"], "on {url}");
    }
    for mut r in replicas {
        Command::new("kill").arg("-TERM").arg(r.id().to_string()).status().unwrap();
        assert!(r.wait().unwrap().success());
    }
}
