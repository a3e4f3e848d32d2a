// SPDX-License-Identifier: Apache-2.0
//! Pod attribution end to end: workloads in kubelet-shaped cgroups (systemd and
//! cgroupfs drivers; containerd and CRI-O), a fake API server driving the real
//! kube-rs watcher (410 Gone, outage), a fake kubelet PodResources socket.
//! Needs root (CI runs as root).

mod fixtures;

use std::collections::BTreeMap;
use std::time::Duration;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use fixtures::fake_kube::{FakeKube, pod};
use fixtures::*;
use ingero_model::Table;
use serde_json::json;

/// (window_start, count, namespace, pod, container, job) per row of one pid, by window.
type Row = (i64, u64, Option<String>, Option<String>, Option<String>, Option<String>);

fn rows_of(batches: &[RecordBatch], pid: u32) -> Vec<Row> {
    let mut out = Vec::new();
    for b in batches {
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        let (p, w, n) = (col("pid"), col("window_start"), col("count"));
        let (p, n) = (p.as_primitive::<UInt32Type>(), n.as_primitive::<UInt64Type>());
        let w = arrow::compute::cast(&w, &arrow::datatypes::DataType::Int64).unwrap();
        let w = w.as_primitive::<Int64Type>();
        let s = |name: &str, i: usize| {
            let c = col(name);
            let c = c.as_string::<i32>();
            (!c.is_null(i)).then(|| c.value(i).to_string())
        };
        for i in 0..b.num_rows() {
            if p.value(i) == pid {
                out.push((w.value(i), n.value(i), s("namespace", i), s("pod", i), s("container", i), s("job", i)));
            }
        }
    }
    out.sort();
    out
}

fn meta_of(batches: &[RecordBatch], pid: u32, col: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for b in batches {
        let p = b.column_by_name("pid").unwrap().as_primitive::<UInt32Type>();
        let c = b.column_by_name(col).unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            if p.value(i) == pid {
                out.push((!c.is_null(i)).then(|| c.value(i).to_string()));
            }
        }
    }
    out
}

const UID_A: &str = "6a1e8c2b-0f3d-4a4e-9b1a-1c2d3e4f5a6b";
const UID_B: &str = "7b2f9d3c-1a4e-4b5f-8c2b-2d3e4f5a6b7c";
const UID_C: &str = "8c3a0e4d-2b5f-4c6a-9d3c-3e4f5a6b7c8d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_both_cgroup_drivers_are_attributed_through_410_and_an_outage() {
    if !can_trace() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root_rel = format!("ingero-test-pods-{}", std::process::id());
    let root = Cgroup::new(&root_rel);
    let (id_a, id_b, id_c) = ("a1".repeat(32), "b2".repeat(32), "c3".repeat(32));
    // systemd driver, burstable, containerd.
    let cg_a = Cgroup::new(&format!(
        "{root_rel}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id_a}.scope",
        UID_A.replace('-', "_")
    ));
    // cgroupfs driver, besteffort, containerd.
    let cg_b = Cgroup::new(&format!("{root_rel}/kubepods/besteffort/pod{UID_B}/{id_b}"));
    // systemd driver, guaranteed, CRI-O.
    let cg_c = Cgroup::new(&format!(
        "{root_rel}/kubepods.slice/kubepods-pod{}.slice/crio-{id_c}.scope",
        UID_C.replace('-', "_")
    ));

    let mut kube = FakeKube::start();
    let kf = json!({"training.kubeflow.org/job-name": "llama-ft"});
    let pod_a = pod(
        "ml",
        "llama-ft-worker-0",
        UID_A,
        "node-a",
        ("trainer", &format!("containerd://{id_a}")),
        kf,
        Some(("PyTorchJob", "llama-ft")),
    );
    let pod_b = pod(
        "ml",
        "bench-x7k2p",
        UID_B,
        "node-a",
        ("bench", &format!("containerd://{id_b}")),
        json!({}),
        Some(("Job", "bench")),
    );
    let mut pod_c = pod(
        "serve",
        "vllm-7d9f8-abcde",
        UID_C,
        "node-a",
        ("vllm", &format!("cri-o://{id_c}")),
        json!({"pod-template-hash": "7d9f8", "phase": "1"}),
        Some(("ReplicaSet", "vllm-7d9f8")),
    );
    // Another node's pod: must never reach this agent.
    let other = pod(
        "ml",
        "llama-ft-worker-1",
        "9d4b1f5e-3c6a-4d7b-8e4d-4f5a6b7c8d9e",
        "node-b",
        ("trainer", ""),
        json!({}),
        None,
    );
    kube.apply(pod_a);
    kube.apply(pod_c.clone());
    kube.apply(other);
    let socket = dir.path().join("kubelet.sock");
    let _kubelet = fake_kubelet::start(
        &socket,
        &[
            ("ml", "llama-ft-worker-0", "trainer", "nvidia.com/gpu", &["GPU-aaaa", "GPU-bbbb"]),
            ("ml", "llama-ft-worker-0", "trainer", "example.com/nic", &["nic0"]),
            ("serve", "vllm-7d9f8-abcde", "vllm", "nvidia.com/gpu", &["GPU-cccc"]),
        ],
    );

    let (lib, wl) = build(&dir.path().join("bin"));
    let mut args = store_args(dir.path(), &root);
    let metrics_addr =
        format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    args.extend([
        format!("--metrics-addr={metrics_addr}"),
        "--node=node-a".to_string(),
        format!("--kubeconfig={}", kube.kubeconfig(dir.path()).display()),
        format!("--pod-resources-socket={}", socket.display()),
        "--pod-resources-interval=500ms".to_string(),
        // Probed before the first call, as the usual CUDA directories are.
        format!("--lib={}", lib.display()),
    ]);
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    agent.wait_log("watching pods of this node", Duration::from_secs(20));

    // 125 × (5 calls, 200 ms): ~25 s of steady work in every window.
    let steps: Vec<&str> = (0..125).flat_map(|_| ["call:cudaLaunchKernel:5:0", "sleep:200"]).collect();
    let a = Workload::start(&wl, &lib, &steps, &cg_a);
    let b = Workload::start(&wl, &lib, &steps, &cg_b);
    let c = Workload::start(&wl, &lib, &steps, &cg_c);
    let (pa, pb, pc) = (a.pid(), b.pid(), c.pid());

    std::thread::sleep(Duration::from_secs(3));
    // Pod B's process has been calling for 3 s before its pod is known.
    kube.apply(pod_b);
    std::thread::sleep(Duration::from_secs(2));
    kube.expire_watches();
    std::thread::sleep(Duration::from_secs(1));
    kube.stop();
    // Changed while the API server is away: seen once it is back.
    pod_c["metadata"]["labels"]["phase"] = json!("2");
    kube.apply(pod_c);
    std::thread::sleep(Duration::from_secs(4));
    let resumed = || std::fs::read_to_string(&agent.log).unwrap().matches("Kubernetes API again").count();
    let before = resumed();
    kube.restart();
    // The watcher comes back on its own (backoff, then a fresh list).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while resumed() <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "the watch did not resume after the API server returned:\n{}",
            std::fs::read_to_string(&agent.log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // What the chart's IngeroAgentNoPodNames alert reads: connected again.
    assert_eq!(metric(&metrics_addr, "ingero_agent_kube_connected"), 1);
    std::thread::sleep(Duration::from_millis(1500));
    for w in [a, b, c] {
        w.wait();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let log = agent.stop();

    let calls = rows(dir.path(), Table::CallWindows).await;
    let ra = rows_of(&calls, pa);
    // Nothing lost to the 410 or the outage: every call counted, and each
    // in its own window (bursts are >= 200 ms apart: at most 5 of 5 calls
    // start in one second), so none was lost and none carried over. A
    // window the agent closed late (it says so) holds the bursts made until
    // then. A window may be empty: a loaded machine can pause the workload.
    assert_eq!(ra.iter().map(|r| r.1).sum::<u64>(), 625, "{ra:?}");
    let late_ms = latest_close_ms(&log);
    let most = 25 + 5 * late_ms.div_ceil(200);
    assert!(ra.iter().all(|r| r.1 <= most), "a window holds another's calls (closed <= {late_ms} ms late): {ra:?}");
    assert!(ra.len() >= 25, "the ~25 s of work fell into {} windows: {ra:?}", ra.len());
    for r in &ra {
        assert_eq!(
            (r.2.as_deref(), r.3.as_deref(), r.4.as_deref(), r.5.as_deref()),
            (Some("ml"), Some("llama-ft-worker-0"), Some("trainer"), Some("pytorchjob:ml/llama-ft")),
            "{r:?}"
        );
    }
    // Pod B appeared 3 s after its process: first by container id, then by name.
    let rb = rows_of(&calls, pb);
    assert_eq!(rb.iter().map(|r| r.1).sum::<u64>(), 625, "{:?} {rb:?}", calls_of(&calls, pb));
    assert_eq!(rb[0].3, None, "{rb:?}");
    assert_eq!(rb[0].4.as_deref(), Some(&id_b[..12]));
    let last = rb.last().unwrap();
    assert_eq!(
        (last.2.as_deref(), last.3.as_deref(), last.4.as_deref(), last.5.as_deref()),
        (Some("ml"), Some("bench-x7k2p"), Some("bench"), Some("job:ml/bench"))
    );
    let rc = rows_of(&calls, pc);
    assert!(rc.iter().all(|r| r.3.as_deref() == Some("vllm-7d9f8-abcde") && r.4.as_deref() == Some("vllm")));
    assert!(rc.iter().all(|r| r.5.as_deref() == Some("deployment:serve/vllm")));

    let meta = rows(dir.path(), Table::ProcessMeta).await;
    assert!(meta_of(&meta, pa, "gpus").contains(&Some("GPU-aaaa,GPU-bbbb".into())));
    assert_eq!(meta_of(&meta, pa, "pod_uid").last().unwrap().as_deref(), Some(UID_A));
    assert_eq!(meta_of(&meta, pa, "container_id").last().unwrap().as_deref(), Some(id_a.as_str()));
    assert!(meta_of(&meta, pc, "gpus").contains(&Some("GPU-cccc".into())));
    assert!(meta_of(&meta, pb, "gpus").iter().all(Option::is_none));
    // The label changed during the outage reached the store after it.
    let labels = meta_of(&meta, pc, "labels");
    assert!(labels.iter().any(|l| l.as_deref().is_some_and(|l| l.contains(r#""phase":"2""#))), "{labels:?}");

    // The cgroup table names the pods too.
    let cg = rows(dir.path(), Table::CgroupWindows).await;
    let pods: BTreeMap<String, ()> =
        cg.iter().flat_map(|b| meta_of(std::slice::from_ref(b), 0, "pod")).flatten().map(|p| (p, ())).collect();
    assert!(pods.contains_key("llama-ft-worker-0"), "{pods:?}");

    // Only this node's pods were asked for; the 410 made the watcher list again.
    let reqs = kube.requests();
    assert!(reqs.iter().all(|q| q.get("fieldSelector").map(String::as_str) == Some("spec.nodeName=node-a")));
    let lists = reqs.iter().filter(|q| q.get("watch").is_none()).count();
    assert!(lists >= 2, "{reqs:?}");
    assert!(!log.contains("llama-ft-worker-1"));
    // An outage costs a line when it starts and one when it ends, not one per retry.
    let failures = log.matches("Kubernetes API watch failed").count();
    assert!((1..=3).contains(&failures), "{failures} failure lines:\n{log}");
    assert!(log.contains("watching pods of this node on the Kubernetes API again"), "{log}");
}

/// The latest the agent says it closed a window after its end (0: never late).
fn latest_close_ms(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("window closed late"))
        .filter_map(|l| l.split("late_ms=").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_kubernetes_processes_are_named_by_container_id_with_one_log_line() {
    if !can_trace() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root_rel = format!("ingero-test-nokube-{}", std::process::id());
    let root = Cgroup::new(&root_rel);
    let id = "d4".repeat(32);
    let cg = Cgroup::new(&format!("{root_rel}/system.slice/docker-{id}.scope"));
    let (lib, wl) = build(&dir.path().join("bin"));
    let mut args = store_args(dir.path(), &root);
    args.push(format!("--pod-resources-socket={}", dir.path().join("absent.sock").display()));
    args.push(format!("--lib={}", lib.display()));
    let f = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let child = ingero_sim::child::dies_with_test(&mut std::process::Command::new(env!("CARGO_BIN_EXE_ingero-agent")))
        .arg("run")
        .args(&args)
        .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("INGERO_LOG", "info")
        .stderr(f)
        .spawn()
        .unwrap();
    let agent = Agent { child, log: dir.path().join("agent.log") };
    agent.wait_log("probe loop ready", Duration::from_secs(120));
    let w =
        Workload::start(&wl, &lib, &["call:cudaLaunchKernel:20:0", "sleep:1500", "call:cudaLaunchKernel:20:0"], &cg);
    let pid = w.pid();
    w.wait();
    std::thread::sleep(Duration::from_millis(1500));
    let log = agent.stop();
    assert_eq!(log.matches("no Kubernetes API").count(), 1, "{log}");
    assert_eq!(log.matches("no kubelet PodResources").count(), 1, "{log}");
    let r = rows_of(&rows(dir.path(), Table::CallWindows).await, pid);
    assert_eq!(r.iter().map(|r| r.1).sum::<u64>(), 40, "{r:?}\n{log}");
    assert!(r.iter().all(|r| r.3.is_none() && r.4.as_deref() == Some(&id[..12]) && r.5.is_none()), "{r:?}");
}
