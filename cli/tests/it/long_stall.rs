// SPDX-License-Identifier: Apache-2.0
//! One call longer than ~8.6 s lands in a histogram bucket ≥ 128: the report
//! on its node, SQL over the bucket column and outside engines must all read
//! the bucket as written (it once failed the whole report: the u8 column was
//! stored as a signed byte).

use std::process::Command;

use crate::fixtures::*;
use ingero_model::Table;
use ingero_model::hist::{Histogram, bucket};
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::tables::{CallRow, Common};
use ingero_proto::client::{IngestClient, RetryPolicy};

/// A process whose one `cudaDeviceSynchronize` took `ns`, beside ordinary syncs.
fn one_long_sync(node: &str, window_start_us: i64, ns: u64) -> arrow::array::RecordBatch {
    let common = Common {
        node: node.into(),
        namespace: Some("ml".into()),
        pod: Some("trainer-0".into()),
        container: Some("pytorch".into()),
        pid: 4242,
        comm: "python3".into(),
        window_start_us: TimestampUs(window_start_us),
        window_us: 1_000_000,
        ..Common::default()
    };
    let mut h = Histogram::default();
    h.record(ns);
    h.add(bucket(2_000_000), 99);
    let (b, c) = h.sparse();
    let mut calls = BatchBuilder::new(Table::CallWindows);
    let row = CallRow {
        library: "cudart",
        op: "cudaDeviceSynchronize",
        count: 100,
        errors: 0,
        total_ns: ns + 99 * 2_000_000,
        max_ns: ns,
        sampled: false,
        hist_bucket: &b,
        hist_count: &c,
        sample_ratio: None,
    };
    calls.append(&common, &row).unwrap();
    calls.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nine_second_call_reports_and_reads_back_in_every_engine() {
    let nine_s = 9_000_000_000u64;
    assert!(bucket(nine_s) >= 128, "the test must exercise a bucket past i8::MAX");
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let now = chrono::Utc::now().timestamp_micros();
    let t0 = now - now % 1_000_000 - 30_000_000;
    let mut c = IngestClient::new(&server.grpc_url(), "gpu-9", RetryPolicy::default()).unwrap();
    let req = c.request(&[(Table::CallWindows, one_long_sync("gpu-9", t0, nine_s))]).unwrap();
    c.push(&req).await.unwrap();
    server.committer.flush().await.unwrap();

    let store = format!("--store=file://{}", dir.path().join("data").display());
    let o = ingero(&["report", "--node=gpu-9", &store, "--since=10m", "--format=json"]);
    assert!(o.status.success(), "report failed: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v.to_string().contains("cudaDeviceSynchronize"), "{v}");

    let q = "SELECT max(b) AS top FROM (SELECT unnest(hist_bucket) AS b FROM call_windows WHERE node = 'gpu-9')";
    let o = ingero(&["sql", q, &store, "--format=json"]);
    assert!(o.status.success(), "sql failed: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["top"].as_u64(), Some(bucket(nine_s) as u64), "{v}");

    // delta-rs, Polars and DuckDB read the bucket as written, not as -128.
    let table = dir.path().join("data").join("call_windows");
    let script = r#"
import sys, deltalake, polars as pl, duckdb
path = sys.argv[1]
t = deltalake.DeltaTable(path)
files = t.file_uris()
a = t.to_pyarrow_table().column("hist_bucket").combine_chunks().flatten().to_pylist()
p = pl.read_delta(path).explode("hist_bucket")["hist_bucket"].to_list()
d = [r[0] for r in duckdb.sql("SELECT unnest(hist_bucket) FROM read_parquet(" + repr(files) + ")").fetchall()]
print(max(a), max(p), max(d), min(a), min(p), min(d))
"#;
    let o = Command::new("python3").arg("-c").arg(script).arg(&table).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "outside engines: {}", String::from_utf8_lossy(&o.stderr));
    let top = bucket(nine_s) as i64;
    let low = bucket(2_000_000) as i64;
    let got: Vec<i64> = out.split_whitespace().map(|s| s.parse().unwrap()).collect();
    assert_eq!(got, vec![top, top, top, low, low, low], "delta-rs, Polars, DuckDB: {out}");
}
