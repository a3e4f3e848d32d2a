// SPDX-License-Identifier: Apache-2.0
//! Ingest → WAL → Parquet on the local filesystem, over real gRPC on loopback.

use crate::fixtures::*;
use ingero_model::Table;
use ingero_proto::client::{IngestClient, RetryPolicy, SendError};
use ingero_proto::ipc;
use ingero_proto::pb::ingest_client::IngestClient as RawClient;
use ingero_proto::pb::{PushRequest, TableBatch};
use ingero_sim::loadgen::synth_tables;
use ingero_store::read::{list_files, read_table};
use tonic::Code;

fn now_window() -> i64 {
    let now = chrono::Utc::now().timestamp_micros();
    now - now % 1_000_000
}

#[tokio::test]
async fn stores_each_batch_once_and_reads_back_with_pyarrow() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let mut client = IngestClient::new(&server.grpc_url(), "gpu-a", RetryPolicy::default()).unwrap();
    let mut sent_rows = 0;
    let mut reqs = Vec::new();
    for w in 0..5 {
        let tables = synth_tables("gpu-a", now_window() - 10_000_000 + w * 1_000_000, 64, w as u64);
        let req = client.request(&tables).unwrap();
        let resp = client.push(&req).await.unwrap();
        assert!(!resp.duplicate);
        assert_eq!(resp.rows, 64 + 8);
        sent_rows += 64;
        reqs.push(req);
    }
    // A retried batch (same node + sequence) is acknowledged but not stored again,
    // before and after a flush.
    let again = client.push(&reqs[2]).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.rows, 0);
    server.committer.flush().await.unwrap();
    let again = client.push(&reqs[4]).await.unwrap();
    assert!(again.duplicate);

    let calls = read_table(&server.store, Table::CallWindows).await.unwrap();
    assert_eq!(total_rows(&calls), sent_rows);
    let mut keys = call_keys(&calls);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), sent_rows, "no row stored twice");
    let files = list_files(&server.store, Table::CallWindows).await.unwrap();
    assert_eq!(files.len(), 1, "5 batches from one node buffered into one file: {files:?}");
    assert!(files[0].0.contains("call_windows/date="), "{files:?}");

    let metrics = reqwest_metrics(&server).await;
    assert!(metrics.contains("ingero_ingest_batches_total{outcome=\"duplicate\"} 2"), "{metrics}");
    server.shutdown().await.unwrap();

    // pyarrow reads the directory as a hive-partitioned dataset, every row.
    let script = r#"
import sys, json, pyarrow.dataset as ds
out = {}
for t in ("call_windows", "sched_windows"):
    d = ds.dataset(sys.argv[1] + "/" + t, format="parquet", partitioning="hive")
    tab = d.to_table()
    out[t] = {"rows": tab.num_rows, "cols": tab.column_names, "hours": sorted(set(str(h) for h in tab.column("hour").to_pylist()))}
print(json.dumps(out))
"#;
    let data = dir.path().join("data");
    if let Some(out) = python(script, &[data.to_str().unwrap()]) {
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["call_windows"]["rows"], sent_rows as u64);
        assert_eq!(v["sched_windows"]["rows"], 40);
        let cols = v["call_windows"]["cols"].as_array().unwrap();
        for c in ["node", "window_start", "op", "hist_bucket", "date", "hour"] {
            assert!(cols.iter().any(|x| x == c), "pyarrow lacks column {c}: {cols:?}");
        }
    }
}

async fn reqwest_metrics(server: &ingero_server::Server) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(server.http_addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn bad_input_gets_a_precise_status_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let mut raw = RawClient::connect(server.grpc_url()).await.unwrap().max_encoding_message_size(64 << 20);
    let good_tables = synth_tables("n1", now_window(), 16, 1);
    let good_ipc = ipc::encode(&Table::CallWindows.schema(), &[good_tables[0].1.clone()]).unwrap();
    let req = |tables: Vec<TableBatch>, seq| PushRequest { node: "n1".into(), sequence: seq, tables };
    let tb = |table: &str, bytes: Vec<u8>| TableBatch { table: table.into(), arrow_ipc: bytes.into() };

    let cases: Vec<(PushRequest, Code, &str)> = vec![
        (
            req(vec![tb("call_windows", b"not arrow at all".to_vec())], 1),
            Code::InvalidArgument,
            "not an Arrow IPC stream",
        ),
        (
            req(vec![tb("sched_windows", good_ipc.clone())], 2),
            Code::InvalidArgument,
            "sched_windows: column 12 must be `threads`",
        ),
        (req(vec![tb("gpu_magic", good_ipc.clone())], 3), Code::InvalidArgument, "unknown table `gpu_magic`"),
        (req(vec![], 4), Code::InvalidArgument, "no tables"),
        (req(vec![tb("call_windows", good_ipc.clone())], 0), Code::InvalidArgument, "sequence"),
        (
            PushRequest { node: "other-node".into(), sequence: 5, tables: vec![tb("call_windows", good_ipc.clone())] },
            Code::InvalidArgument,
            "has node `n1` but the batch is from `other-node`",
        ),
        (req(vec![tb("call_windows", vec![7u8; 5 << 20])], 6), Code::ResourceExhausted, "max-message-size"),
        (req(vec![tb("call_windows", vec![7u8; 4 << 20])], 7), Code::ResourceExhausted, "max-message-size"),
    ];
    for (r, code, needle) in cases {
        let err = raw.push(r).await.unwrap_err();
        assert_eq!(err.code(), code, "{}", err.message());
        assert!(err.message().contains(needle), "`{}` lacks `{needle}`", err.message());
    }
    // Timestamps far in the future are refused.
    let future = synth_tables("n1", now_window() + 86_400_000_000, 8, 2);
    let bytes = ipc::encode(&Table::CallWindows.schema(), &[future[0].1.clone()]).unwrap();
    let err = raw.push(req(vec![tb("call_windows", bytes)], 8)).await.unwrap_err();
    assert!(err.message().contains("outside the accepted range"), "{}", err.message());

    // ... and so are windows from long ago, and values no agent can produce.
    let past = synth_tables("n1", now_window() - 30 * 86_400_000_000, 8, 2);
    let bytes = ipc::encode(&Table::CallWindows.schema(), &[past[0].1.clone()]).unwrap();
    let err = raw.push(req(vec![tb("call_windows", bytes)], 8)).await.unwrap_err();
    assert!(err.message().contains("outside the accepted range"), "{}", err.message());
    for (col, value, needle) in
        [("total_ns", u64::MAX, "total_ns = "), ("window_us", 0, "window_us 0"), ("errors", 1 << 40, "errors")]
    {
        let b = &good_tables[0].1;
        let i = b.schema().index_of(col).unwrap();
        let mut cols = b.columns().to_vec();
        let mut v: Vec<u64> = cols[i].as_any().downcast_ref::<arrow::array::UInt64Array>().unwrap().values().to_vec();
        v[3] = value;
        cols[i] = std::sync::Arc::new(arrow::array::UInt64Array::from(v));
        let bad = arrow::array::RecordBatch::try_new(b.schema(), cols).unwrap();
        let bytes = ipc::encode(&Table::CallWindows.schema(), &[bad]).unwrap();
        let err = raw.push(req(vec![tb("call_windows", bytes)], 8)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains(needle) && err.message().contains("row 3"), "{}", err.message());
    }

    // The client does not retry a refusal.
    let mut client = IngestClient::new(&server.grpc_url(), "n1", RetryPolicy::default()).unwrap();
    let bad = req(vec![tb("call_windows", b"junk".to_vec())], 9);
    assert!(matches!(client.push(&bad).await, Err(SendError::Rejected(s)) if s.code() == Code::InvalidArgument));

    // Still serving other senders.
    let ok = raw.push(req(vec![tb("call_windows", good_ipc)], 10)).await.unwrap().into_inner();
    assert_eq!(ok.rows, 16);
    server.committer.flush().await.unwrap();
    assert_eq!(total_rows(&read_table(&server.store, Table::CallWindows).await.unwrap()), 16);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_node_over_its_rate_is_told_to_retry_and_others_are_not_slowed() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("data").display());
    let mut cfg = serve_config(&store, &dir.path().join("wal"), Default::default());
    cfg.limits.node_rows_per_sec = 200;
    cfg.limits.node_burst_secs = 1;
    let server = ingero_server::Server::start(cfg).await.unwrap();
    let fast = RetryPolicy { give_up_after: std::time::Duration::from_millis(50), ..RetryPolicy::default() };
    let mut flood = IngestClient::new(&server.grpc_url(), "flood", fast.clone()).unwrap();
    let mut calm = IngestClient::new(&server.grpc_url(), "calm", fast).unwrap();
    let t = now_window();
    let first = flood.request(&synth_tables("flood", t, 100, 1)).unwrap();
    flood.push(&first).await.unwrap();
    let second = flood.request(&synth_tables("flood", t + 1_000_000, 100, 2)).unwrap();
    match flood.push(&second).await {
        Err(SendError::Unavailable { last, .. }) => {
            assert_eq!(last.code(), Code::Unavailable);
            assert!(last.message().contains("over its 200 rows/s"), "{}", last.message());
        }
        other => panic!("a flooding node was not limited: {other:?}"),
    }
    let calm_req = calm.request(&synth_tables("calm", t, 100, 3)).unwrap();
    calm.push(&calm_req).await.expect("another node is not limited by the flood");
    // Retried later (as the agent does from its spool), the same batch is stored once.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert!(!flood.push(&second).await.unwrap().duplicate);
    assert!(reqwest_metrics(&server).await.contains(r#"reason="rate_limited"} 1"#));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn client_retries_until_the_server_comes_up() {
    let dir = tempfile::tempdir().unwrap();
    // Reserve a port, release it, start the server there a little later.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut client = IngestClient::new(&format!("http://127.0.0.1:{port}"), "late", RetryPolicy::default()).unwrap();
    let req = client.request(&synth_tables("late", now_window(), 8, 3)).unwrap();
    let send = tokio::spawn(async move { client.push(&req).await });
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let mut cfg = serve_config(
        &format!("file://{}", dir.path().join("data").display()),
        &dir.path().join("wal"),
        Default::default(),
    );
    cfg.listen = format!("127.0.0.1:{port}").parse().unwrap();
    let server = ingero_server::Server::start(cfg).await.unwrap();
    let resp = send.await.unwrap().unwrap();
    assert_eq!(resp.rows, 9);
    server.shutdown().await.unwrap();
    // Shutdown flushed the buffered rows.
    let store = ingero_store::Store::open(
        &ingero_store::StoreUrl::parse(&format!("file://{}", dir.path().join("data").display())).unwrap(),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(total_rows(&read_table(&store, Table::SchedWindows).await.unwrap()), 1);
}

/// A push from a newer agent: today's fields plus one this server does not know.
#[derive(Clone, PartialEq, prost::Message)]
struct NewerPush {
    #[prost(string, tag = "1")]
    node: String,
    #[prost(uint64, tag = "2")]
    sequence: u64,
    #[prost(message, repeated, tag = "3")]
    tables: Vec<TableBatch>,
    #[prost(string, tag = "15")]
    added_later: String,
}

/// The WAL keeps the bytes the agent sent (the server does not encode the
/// request again), so a field added by a newer agent survives a replay.
#[tokio::test]
async fn the_wal_holds_the_request_as_sent_unknown_fields_included() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let mut client = IngestClient::new(&server.grpc_url(), "gpu-n", RetryPolicy::default()).unwrap();
    let req = client.request(&synth_tables("gpu-n", now_window() - 5_000_000, 16, 1)).unwrap();
    let sent = NewerPush { node: req.node, sequence: req.sequence, tables: req.tables, added_later: "v2".into() };

    let channel = tonic::transport::Endpoint::from_shared(server.grpc_url()).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/ingero.v1.Ingest/Push");
    let codec = tonic_prost::ProstCodec::<NewerPush, ingero_proto::pb::PushResponse>::default();
    let resp = grpc.unary(tonic::Request::new(sent.clone()), path, codec).await.unwrap().into_inner();
    assert_eq!(resp.rows, 16 + 2, "{resp:?}");

    // Segment frames are [len u32][crc32 u32][payload] (store/src/wal.rs).
    let mut records = Vec::new();
    for entry in std::fs::read_dir(dir.path().join("wal")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "wal") {
            continue;
        }
        let data = std::fs::read(path).unwrap();
        let mut off = 0;
        while off + 8 <= data.len() {
            let len = u32::from_le_bytes(data[off..off + 4].try_into().unwrap()) as usize;
            records.push(data[off + 8..off + 8 + len].to_vec());
            off += 8 + len;
        }
    }
    assert_eq!(records.len(), 1, "one push, one WAL record");
    assert_eq!(records[0], prost::Message::encode_to_vec(&sent), "the WAL record is not the request as sent");
    server.shutdown().await.unwrap();
}
