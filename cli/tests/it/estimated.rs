// SPDX-License-Identifier: Apache-2.0
//! Under its trap budget the agent duty-cycles launch probes and ships each
//! window's count as an estimate (`sample_ratio`: the share of the window the
//! probe was attached). A report must say which counts are estimates and how
//! much was seen, not print them as exact.

use crate::fixtures::*;
use ingero_model::Table;
use ingero_model::hist::{Histogram, bucket};
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::tables::{CallRow, Common};
use ingero_proto::client::{IngestClient, RetryPolicy};

/// One window of a node's `cudaLaunchKernel` row: `seen` launches timed (1 in 50 at
/// 1 ms, the rest at 10 µs: a tail the report names), `count` shipped.
fn launches(
    node: &str,
    window_start_us: i64,
    count: u64,
    seen: u64,
    sample_ratio: Option<f64>,
) -> arrow::array::RecordBatch {
    let common = Common {
        node: node.into(),
        namespace: Some("ml".into()),
        pod: Some("trainer-0".into()),
        pid: 7,
        comm: "python3".into(),
        window_start_us: TimestampUs(window_start_us),
        window_us: 1_000_000,
        ..Common::default()
    };
    let mut h = Histogram::default();
    h.add(bucket(10_000), seen - seen / 50);
    h.add(bucket(1_000_000), seen / 50);
    let (b, c) = h.sparse();
    let mut calls = BatchBuilder::new(Table::CallWindows);
    let row = CallRow {
        library: "cudart",
        op: "cudaLaunchKernel",
        count,
        errors: 0,
        total_ns: seen * 30_000,
        max_ns: 1_000_000,
        sampled: false,
        hist_bucket: &b,
        hist_count: &c,
        sample_ratio,
    };
    calls.append(&common, &row).unwrap();
    calls.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duty_cycled_count_is_reported_as_an_estimate_with_its_seen_share() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let now = chrono::Utc::now().timestamp_micros();
    let t0 = now - now % 1_000_000 - 30_000_000;
    let mut c = IngestClient::new(&server.grpc_url(), "gpu-3", RetryPolicy::default()).unwrap();
    // A quarter of the first window seen (1,000 of an estimated 4,000); every
    // call of the second (no ratio: the budget allowed all).
    for b in [launches("gpu-3", t0, 4_000, 1_000, Some(0.25)), launches("gpu-3", t0 + 1_000_000, 1_000, 1_000, None)] {
        let req = c.request(&[(Table::CallWindows, b)]).unwrap();
        c.push(&req).await.unwrap();
    }
    server.committer.flush().await.unwrap();

    let store = format!("--store=file://{}", dir.path().join("data").display());
    let o = ingero(&["report", "--node=gpu-3", &store, "--since=10m", "--format=json"]);
    assert!(o.status.success(), "report failed: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let op = v["ops"].as_array().unwrap().iter().find(|o| o["op"] == "cudaLaunchKernel").expect("launch op");
    assert_eq!(op["count"].as_u64(), Some(5_000), "{op}");
    let share = op["seen_share"].as_f64().expect("an estimated count carries its seen share");
    assert!((share - 0.4).abs() < 1e-9, "2,000 of 5,000 seen: {share}");
    let text = v.to_string();
    assert!(text.contains("≈5000 calls (40% seen, the rest estimated)"), "{text}");
    // The terminal and HTML tables of calls say it too, whether or not a chain fired.
    let o = ingero(&["report", "--node=gpu-3", &store, "--since=10m"]);
    let table = String::from_utf8_lossy(&o.stdout);
    let row = table.lines().find(|l| l.starts_with("cudaLaunchKernel ")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("≈5,000"), "{row}");
    assert!(table.contains("calls seen: cudaLaunchKernel 40%."), "{table}");
    assert!(table.contains("By kind: ≈5,000 launches"), "{table}");
    assert_eq!(op["kind"], "launch", "{op}");
    assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
    let html = dir.path().join("r.html");
    let out = format!("--out={}", html.display());
    let o = ingero(&["report", "--node=gpu-3", &store, "--since=10m", "--format=html", &out]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<td class=\"num\">≈5,000</td><td class=\"num\">40%</td>"), "{page}");

    // Every call seen (another node, no ratios): the count is exact.
    let mut c = IngestClient::new(&server.grpc_url(), "gpu-4", RetryPolicy::default()).unwrap();
    let full = |t| launches("gpu-4", t, 2_500, 2_500, None);
    for t in [t0, t0 + 1_000_000] {
        let req = c.request(&[(Table::CallWindows, full(t))]).unwrap();
        c.push(&req).await.unwrap();
    }
    server.committer.flush().await.unwrap();
    let o = ingero(&["report", "--node=gpu-4", &store, "--since=10m", "--format=json"]);
    assert!(o.status.success(), "report failed: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let op = v["ops"].as_array().unwrap().iter().find(|o| o["op"] == "cudaLaunchKernel").expect("launch op");
    assert_eq!((op["count"].as_u64(), op.get("seen_share")), (Some(5_000), None), "{op}");
    let text = v.to_string();
    assert!(text.contains("cudaLaunchKernel: 5000 calls, p50"), "{text}");
    assert!(!text.contains('≈'), "{text}");
    let o = ingero(&["report", "--node=gpu-4", &store, "--since=10m"]);
    let table = String::from_utf8_lossy(&o.stdout);
    let row = table.lines().find(|l| l.starts_with("cudaLaunchKernel ")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(" 5,000 ") && !table.contains('≈'), "{table}");
}
