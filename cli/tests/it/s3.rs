// SPDX-License-Identifier: Apache-2.0
//! The whole ingest → Parquet path against a real S3 server (SeaweedFS).

use crate::fixtures::*;
use ingero_model::Table;
use ingero_proto::auth::ClientAuth;
use ingero_proto::client::{IngestClient, RetryPolicy};
use ingero_server::Server;
use ingero_server::replicas::ReplicaConfig;
use ingero_sim::loadgen::synth_tables;
use ingero_store::StoreOptions;
use ingero_store::read::{list_files, read_table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_to_parquet_on_s3_survives_restart() {
    let Some(s3) = Seaweed::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("s3://ingero/test-{}", std::process::id());
    let now = chrono::Utc::now().timestamp_micros();
    let t0 = now - now % 1_000_000 - 30_000_000;

    let server = Server::start(serve_config(
        &prefix,
        &dir.path().join("wal"),
        StoreOptions { s3_endpoint: Some(s3.with_credentials()) },
    ))
    .await
    .unwrap();
    let mut client = IngestClient::new(&server.grpc_url(), "s3-node", RetryPolicy::default()).unwrap();
    let mut reqs = Vec::new();
    for w in 0..6 {
        let req = client.request(&synth_tables("s3-node", t0 + w * 1_000_000, 32, w as u64)).unwrap();
        assert!(!client.push(&req).await.unwrap().duplicate);
        reqs.push(req);
    }
    server.committer.flush().await.unwrap();
    let files = list_files(&server.store, Table::CallWindows).await.unwrap();
    assert!(!files.is_empty());
    assert!(
        files.iter().all(|(k, _)| k.starts_with(&format!("test-{}/call_windows/date=", std::process::id()))),
        "{files:?}"
    );
    assert_eq!(total_rows(&read_table(&server.store, Table::CallWindows).await.unwrap()), 6 * 32);
    server.shutdown().await.unwrap();

    // A new server on the same bucket (fresh WAL dir, as on another pod) still
    // knows what is stored: the dedup state lives in the object store.
    let dir2 = tempfile::tempdir().unwrap();
    let server = Server::start(serve_config(
        &prefix,
        &dir2.path().join("wal"),
        StoreOptions { s3_endpoint: Some(s3.with_credentials()) },
    ))
    .await
    .unwrap();
    let mut client = IngestClient::new(&server.grpc_url(), "s3-node", RetryPolicy::default()).unwrap();
    for req in &reqs {
        assert!(client.push(req).await.unwrap().duplicate);
    }
    server.shutdown().await.unwrap();

    // pyarrow reads the S3 dataset as-is.
    let script = r#"
import sys, pyarrow.dataset as ds, pyarrow.fs as fs
s3 = fs.S3FileSystem(endpoint_override=sys.argv[1], scheme="http", access_key="ingero", secret_key="ingero-secret", region="us-east-1")
d = ds.dataset(sys.argv[2] + "/call_windows", filesystem=s3, format="parquet", partitioning="hive")
print(d.to_table().num_rows)
"#;
    let bucket_path = prefix.trim_start_matches("s3://").to_string();
    if let Some(out) = python(script, &[s3.endpoint.trim_start_matches("http://"), &bucket_path]) {
        assert_eq!(out.trim(), (6 * 32).to_string());
    }
}

/// Replicas race for Delta versions, so at start a replica checks that the
/// bucket refuses a second create of one object; SeaweedFS honours
/// `If-None-Match: *`, so the replica starts and leaves no probe object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_on_s3_verifies_put_if_absent_before_it_serves() {
    let Some(s3) = Seaweed::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("s3://ingero/probe-{}", std::process::id());
    let opts = StoreOptions { s3_endpoint: Some(s3.with_credentials()) };
    let mut cfg = serve_config(&prefix, &dir.path().join("wal"), opts.clone());
    let urls = vec!["http://127.0.0.1:1".to_string(), "http://127.0.0.1:2".to_string()];
    cfg.replicas = Some(ReplicaConfig::new(urls, "http://127.0.0.1:1", ClientAuth::default()).unwrap());
    let server = Server::start(cfg).await.unwrap();
    let store = ingero_store::Store::open(&ingero_store::StoreUrl::parse(&prefix).unwrap(), &opts).unwrap();
    let left: Vec<_> =
        futures::TryStreamExt::try_collect::<Vec<_>>(store.object_store.list(Some(&store.key("_ingero"))))
            .await
            .unwrap();
    assert!(left.is_empty(), "probe objects left behind: {left:?}");
    server.shutdown().await.unwrap();
}

/// The same bucket behind a gateway that drops `If-None-Match` (as
/// S3-compatible servers without conditional writes behave): a replica
/// refuses to start, naming the store and the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_a_store_that_ignores_conditional_writes() {
    let Some(s3) = Seaweed::start() else { return };
    let gateway = strip_if_none_match(s3.endpoint.trim_start_matches("http://")).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("s3://ingero/no-cas-{}", std::process::id());
    let endpoint = s3.with_credentials().replace(s3.endpoint.trim_start_matches("http://"), &gateway);
    let opts = StoreOptions { s3_endpoint: Some(endpoint) };

    // One writer never races: it starts on this store.
    let server = Server::start(serve_config(&prefix, &dir.path().join("wal"), opts.clone())).await.unwrap();
    server.shutdown().await.unwrap();

    let mut cfg = serve_config(&prefix, &dir.path().join("wal"), opts);
    let urls = vec!["http://127.0.0.1:1".to_string(), "http://127.0.0.1:2".to_string()];
    cfg.replicas = Some(ReplicaConfig::new(urls, "http://127.0.0.1:1", ClientAuth::default()).unwrap());
    let err = Server::start(cfg).await.expect_err("a replica started on a store without put-if-absent");
    let msg = err.to_string();
    eprintln!("refused: {msg}");
    assert!(msg.contains(&prefix) && msg.contains("put-if-absent") && msg.contains("no --replicas"), "{msg}");
    assert!(err.is_input_error(), "a store that cannot do it is a configuration problem: {msg}");
}

/// An HTTP/1.1 forwarder to `upstream` that removes the `if-none-match`
/// header from every request; returns its `host:port`.
async fn strip_if_none_match(upstream: &str) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let upstream = upstream.to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let (client_r, mut client_w) = client.into_split();
            let (mut server_r, mut server_w) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut server_r, &mut client_w).await });
            tokio::spawn(async move {
                let mut reader = BufReader::new(client_r);
                loop {
                    // One request: header lines up to the blank line, then the body.
                    let (mut head, mut body_len) = (Vec::new(), 0usize);
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            body_len = v.trim().parse().unwrap_or(0);
                        }
                        if !lower.starts_with("if-none-match:") {
                            head.extend_from_slice(line.as_bytes());
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; body_len];
                    if reader.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    head.extend_from_slice(&body);
                    if server_w.write_all(&head).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}
