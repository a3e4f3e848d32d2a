// SPDX-License-Identifier: Apache-2.0
//! `ingero serve` SIGKILLed right after acknowledging batches: after restart
//! every acknowledged row is stored, none twice.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixtures::*;
use ingero_model::Table;
use ingero_proto::client::{IngestClient, RetryPolicy};
use ingero_sim::loadgen::synth_tables;
use ingero_store::read::read_table;
use ingero_store::{Store, StoreUrl};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn_serve(dir: &Path, port: u16, http: u16) -> Child {
    let child = ingero_sim::child::dies_with_test(&mut Command::new(env!("CARGO_BIN_EXE_ingero")))
        .arg("serve")
        .arg(format!("--store=file://{}", dir.join("data").display()))
        .arg(format!("--wal-dir={}", dir.join("wal").display()))
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg(format!("--http-listen=127.0.0.1:{http}"))
        .args(["--flush-rows=700", "--flush-age=1h"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "ingero serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_batches_survive_sigkill_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (port, http) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{port}");
    let now = chrono::Utc::now().timestamp_micros();
    let t0 = now - now % 1_000_000 - 60_000_000;

    let mut server = spawn_serve(dir.path(), port, http);
    let mut sent = Vec::new();
    let mut clients: Vec<IngestClient> =
        (0..3).map(|n| IngestClient::new(&url, &format!("node-{n}"), RetryPolicy::default()).unwrap()).collect();
    for w in 0..12 {
        for (n, c) in clients.iter_mut().enumerate() {
            let req = c.request(&synth_tables(&format!("node-{n}"), t0 + w * 1_000_000, 40, w as u64)).unwrap();
            let resp = c.push(&req).await.unwrap();
            assert!(!resp.duplicate);
            sent.push((n, req));
        }
    }
    // Acknowledged: now kill without any chance to flush.
    server.kill().unwrap();
    server.wait().unwrap();

    let mut server = spawn_serve(dir.path(), port, http);
    for (n, req) in &sent {
        let resp = clients[*n].push(req).await.unwrap();
        assert!(resp.duplicate, "a retry after restart must be recognised as stored");
    }
    let extra = clients[0].request(&synth_tables("node-0", t0 + 30_000_000, 40, 99)).unwrap();
    assert!(!clients[0].push(&extra).await.unwrap().duplicate);

    // SIGTERM flushes everything buffered before exit.
    Command::new("kill").arg("-TERM").arg(server.id().to_string()).status().unwrap();
    let status = server.wait().unwrap();
    assert!(status.success(), "ingero serve exited with {status}");

    let store = Store::open(
        &StoreUrl::parse(&format!("file://{}", dir.path().join("data").display())).unwrap(),
        &Default::default(),
    )
    .unwrap();
    let calls = read_table(&store, Table::CallWindows).await.unwrap();
    let expected = (sent.len() + 1) * 40;
    assert_eq!(total_rows(&calls), expected);
    let mut keys = call_keys(&calls);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), expected, "duplicated rows after crash recovery");
    assert_eq!(total_rows(&read_table(&store, Table::SchedWindows).await.unwrap()), (sent.len() + 1) * 5);
    let wal_left: Vec<_> = std::fs::read_dir(dir.path().join("wal"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != "writer-id")
        .collect();
    assert_eq!(wal_left.len(), 1, "only the fresh empty segment remains after a clean stop");
}
