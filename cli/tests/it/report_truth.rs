// SPDX-License-Identifier: Apache-2.0
//! What a report says about one process, as its rows hold it: the name it
//! goes by now (it renamed itself), its calls that failed, and its node's
//! other CPU users over the span the process ran (a 10-minute range around
//! a 20-s process once divided 10 minutes of a neighbour's CPU by 20 s:
//! 30 cores on a 2-CPU node), and the named threads its stalls were
//! made on (a worker's waits are not the main loop's).

use crate::fixtures::*;
use arrow::array::RecordBatch;
use ingero_model::Table;
use ingero_model::hist::{Histogram, bucket};
use ingero_model::rows::{BatchBuilder, TimestampUs};
use ingero_model::tables::{CallRow, CgroupRow, Common, SchedRow, StallRow};
use ingero_proto::client::{IngestClient, RetryPolicy};

const NODE: &str = "gpu-4";
const PID: u32 = 4242;
/// Windows the process ran: the first 8 under its executable's name.
const RAN: i64 = 20;
const RENAMED_AT: i64 = 8;
/// The neighbour's CPU per 1-s window, through the whole 10 minutes.
const NEIGHBOUR_NS: u64 = 1_500_000_000;

fn common(pid: u32, comm: &str, start_us: i64) -> Common {
    Common {
        node: NODE.into(),
        pid,
        comm: comm.into(),
        cgroup_id: u64::from(pid),
        window_start_us: TimestampUs(start_us),
        window_us: 1_000_000,
        ..Common::default()
    }
}

/// The process's windows from `t0`: 100 syncs each, every one failing.
fn process(t0: i64) -> (RecordBatch, RecordBatch) {
    let (mut sched, mut calls) = (BatchBuilder::new(Table::SchedWindows), BatchBuilder::new(Table::CallWindows));
    let mut h = Histogram::default();
    h.add(bucket(20_000), 100);
    let (b, c) = h.sparse();
    for w in 0..RAN {
        let comm = if w < RENAMED_AT { "python3" } else { "trainer" };
        let c0 = common(PID, comm, t0 + w * 1_000_000);
        let s = SchedRow {
            threads: 4,
            // Runnable but waiting for a CPU a third of the time: contention.
            on_cpu_ns: 600_000_000,
            off_cpu_ns: 100_000_000,
            runq_wait_ns: 300_000_000,
            runq_max_ns: 20_000_000,
            voluntary_switches: 100,
            involuntary_switches: 5,
            wakeups: 100,
            off_cpu_in_call_ns: Some(50_000_000),
            runq_wait_in_call_ns: Some(0),
        };
        sched.append(&c0, &s).unwrap();
        let row = CallRow {
            library: "cudart",
            op: "cudaStreamSynchronize",
            count: 100,
            errors: 100,
            total_ns: 2_000_000,
            max_ns: 25_000,
            sampled: false,
            hist_bucket: &b,
            hist_count: &c,
            sample_ratio: None,
        };
        calls.append(&c0, &row).unwrap();
    }
    (sched.finish().unwrap(), calls.finish().unwrap())
}

/// Its outlier syncs and off-CPU episodes in its last window: two syncs on
/// its worker `pt_worker_7`, one on the main thread (named as the process:
/// no thread to name), and a producer thread `loader_0` waiting on a read.
fn stalls(t0: i64) -> RecordBatch {
    let mut b = BatchBuilder::new(Table::StallEvents);
    let at = t0 + (RAN - 1) * 1_000_000;
    let c0 = common(PID, "trainer", at);
    let rows = [
        ("cudart", "cudaStreamSynchronize", "threshold", 4243, Some("pt_worker_7"), None),
        ("cudart", "cudaStreamSynchronize", "threshold", 4243, Some("pt_worker_7"), None),
        ("cudart", "cudaStreamSynchronize", "threshold", PID, Some("trainer"), None),
        ("kernel", "read", "off_cpu", 4250, Some("loader_0"), Some(false)),
    ];
    for (library, op, reason, tid, thread_name, feeds_gpu) in rows {
        // The syncs as long as the window's longest (25 µs), the read 30 ms.
        let (duration_ns, threshold_ns) = if reason == "off_cpu" { (30_000_000, 1_000_000) } else { (25_000, 10_000) };
        let row = StallRow {
            event_time: TimestampUs(at + 1_000),
            tid,
            library,
            op,
            duration_ns,
            threshold_ns,
            reason,
            stack_id: None,
            feeds_gpu,
            thread_name,
        };
        b.append(&c0, &row).unwrap();
    }
    b.finish().unwrap()
}

/// A CPU hog's cgroup for 600 windows from `t0`.
fn neighbour(t0: i64) -> RecordBatch {
    let mut cg = BatchBuilder::new(Table::CgroupWindows);
    for w in 0..600 {
        let row = CgroupRow {
            cgroup_path: "/system.slice/hog.service",
            on_cpu_ns: NEIGHBOUR_NS,
            runq_wait_ns: 0,
            switches: 10,
        };
        cg.append(&common(0, "stress", t0 + w * 1_000_000), &row).unwrap();
    }
    cg.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_names_a_renamed_process_counts_its_failures_and_its_neighbours_cores() {
    let dir = tempfile::tempdir().unwrap();
    let server = local_server(dir.path()).await;
    let now = chrono::Utc::now().timestamp_micros();
    let t0 = now - now % 1_000_000 - 620_000_000;
    let (sched, calls) = process(t0 + 300_000_000);
    let mut c = IngestClient::new(&server.grpc_url(), NODE, RetryPolicy::default()).unwrap();
    let tables = [
        (Table::SchedWindows, sched),
        (Table::CallWindows, calls),
        (Table::StallEvents, stalls(t0 + 300_000_000)),
        (Table::CgroupWindows, neighbour(t0)),
    ];
    let req = c.request(&tables).unwrap();
    c.push(&req).await.unwrap();
    server.committer.flush().await.unwrap();

    let store = format!("--store=file://{}", dir.path().join("data").display());
    let pid = PID.to_string();
    let o = ingero(&["report", "--pid", &pid, &store, "--since=15m", "--format=json"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&v["processes"], &v["renamed_from"]),
        (&serde_json::json!(["trainer"]), &serde_json::json!(["python3"]))
    );
    let cores = v["neighbours"][0]["cores"].as_f64().unwrap();
    assert!((cores - 1.5).abs() < 0.01, "{} cores: {}", cores, v["neighbours"]);
    let failing = v["chains"].as_array().unwrap().iter().find(|c| c["cause"] == "failing_calls").cloned();
    let root = failing.map(|c| c["root_cause"][0].clone()).unwrap_or_default();
    assert_eq!(root, "2,000 of 2,000 cudaStreamSynchronize calls returned an error (100%)", "{v:#}");
    // The worker's two stalls, and none for the main thread (it has no name of its own).
    let threads = &v["call_sites"][0]["threads"];
    assert_eq!(threads, &serde_json::json!([{"name": "pt_worker_7", "count": 2}]), "{v:#}");

    let o = ingero(&["report", "--pid", &pid, &store, "--since=15m"]);
    let out = text(&o).0;
    assert!(out.contains("Processes: trainer (pid 4242), earlier named python3\n"), "{out}");
    assert!(out.contains("training process trainer (pid 4242)"), "not named by its name now:\n{out}");
    let flowing = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flowing.contains("(stress) used 1.5 cores on the same node"), "{out}");
    assert!(flowing.contains("3 stalls, p99 25µs, total 75µs, on thread pt_worker_7"), "{out}");
    assert!(flowing.contains("1 episode in read, longest 30.0ms, total 30.0ms, on thread loader_0"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() <= 80), "{out}");
}
