// SPDX-License-Identifier: Apache-2.0
//! The whole ingest → Parquet path against a real S3 server (SeaweedFS).

mod fixtures;

use fixtures::*;
use ingero_model::Table;
use ingero_proto::client::{IngestClient, RetryPolicy};
use ingero_server::Server;
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
