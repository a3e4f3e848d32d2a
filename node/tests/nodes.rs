// SPDX-License-Identifier: Apache-2.0
//! The agent on the shapes real GPU nodes have: several containers started
//! from one image (overlayfs), a pid namespace (a kind node), a node with
//! hundreds of CPUs (kernel map memory), processes and threads that come and
//! go. Real kernel, real mounts, real namespaces; needs root (CI is root).

mod fixtures;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use fixtures::*;
use ingero_model::Table;

/// An overlayfs mount, unmounted on drop.
struct Overlay(PathBuf);

impl Overlay {
    fn mount(lower: &Path, base: &Path) -> Overlay {
        let (upper, work, merged) = (base.join("upper"), base.join("work"), base.join("merged"));
        for d in [&upper, &work, &merged] {
            std::fs::create_dir_all(d).unwrap();
        }
        let opts = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
        let st = Command::new("mount").args(["-t", "overlay", "overlay", "-o", &opts]).arg(&merged).status().unwrap();
        assert!(st.success(), "mount -t overlay (root, overlayfs) failed");
        Overlay(merged)
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The string in `col` of the first row of `pid`.
fn text_of(batches: &[RecordBatch], pid: u32, col: &str) -> Option<String> {
    batches.iter().find_map(|b| {
        let p = b.column_by_name("pid")?.as_primitive::<UInt32Type>();
        let c = b.column_by_name(col)?.as_string::<i32>();
        (0..b.num_rows()).find(|&i| p.value(i) == pid && !c.is_null(i)).map(|i| c.value(i).to_string())
    })
}

/// (kind, value) of every host event of `pid`.
fn host_events_of(batches: &[RecordBatch], pid: u32) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for b in batches {
        let p = b.column_by_name("pid").unwrap().as_primitive::<UInt32Type>();
        let k = b.column_by_name("kind").unwrap().as_string::<i32>();
        let v = b.column_by_name("value").unwrap().as_primitive::<Int64Type>();
        out.extend((0..b.num_rows()).filter(|&i| p.value(i) == pid).map(|i| (k.value(i).to_string(), v.value(i))));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_of_one_image_count_every_call_once() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("overlay");
    let (lib, wl) = build(&dir.path().join("bin"));
    // One image layer holding the library, three containers (overlay mounts)
    // over it: on Linux >= 6.8 /proc/PID/maps shows each mount's own inode.
    let lower = dir.path().join("layer/usr/lib");
    std::fs::create_dir_all(&lower).unwrap();
    std::fs::copy(&lib, lower.join("libcudart.so.12")).unwrap();
    let mounts: Vec<Overlay> =
        (0..3).map(|i| Overlay::mount(&dir.path().join("layer"), &dir.path().join(format!("c{i}")))).collect();
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let counts = [1111u64, 2222, 3333];
    let workloads: Vec<(Workload, u64)> = mounts
        .iter()
        .zip(counts)
        .map(|(m, n)| {
            let step = format!("call:cudaLaunchKernel:{n}:0");
            let w = Workload::start(
                &wl,
                &m.0.join("usr/lib/libcudart.so.12"),
                &["open", "sleep:600", &step, "call:cudaStreamSynchronize:5:0", "sleep:300"],
                &cg,
            );
            (w, n)
        })
        .collect();
    let pids: Vec<(u32, u64)> = workloads.iter().map(|(w, n)| (w.pid(), *n)).collect();
    for (w, _) in workloads {
        w.wait();
    }
    let log = agent.stop();
    let calls = rows(dir.path(), Table::CallWindows).await;
    for (pid, n) in pids {
        let c = calls_of(&calls, pid);
        assert_eq!(c.get("cudaLaunchKernel").map(|x| x.0), Some(n), "pid {pid}: {c:?}\n{log}");
        assert_eq!(c["cudaStreamSynchronize"].0, 5, "pid {pid}");
    }
    let attached = log.lines().filter(|l| l.contains("attached") && l.contains("libcudart.so.12")).count();
    assert_eq!(attached, 1, "one file beneath three mounts is probed once:\n{log}");
}

/// Builds the shell script that runs inside the new pid namespace: two
/// workloads in a pod's cgroup (`pod_cg`, below the agent's `cg`), the agent
/// with `--pid` of the first, pods from the API server behind `kubeconfig`.
fn pidns_script(d: &Path, cg: &Path, pod_cg: &Path, kubeconfig: &Path, lib: &Path, wl: &Path) -> String {
    let agent = env!("CARGO_BIN_EXE_ingero-agent");
    let (d, cg, pod_cg, kc) = (d.display(), cg.display(), pod_cg.display(), kubeconfig.display());
    let (lib, wl) = (lib.display(), wl.display());
    format!(
        r#"set -e
mkfifo {d}/go1 {d}/go2
start() {{ exec sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' {pod_cg} {wl} {lib} wait open sleep:300 "$1" sleep:300; }}
start call:cudaLaunchKernel:4321:0 < {d}/go1 > {d}/w1.out &
W1=$!
start call:cudaLaunchKernel:999:0 < {d}/go2 > {d}/w2.out &
W2=$!
exec 3>{d}/go1 4>{d}/go2
INGERO_LOG=info {agent} run --store=file://{d}/data --spool-dir={d}/spool --cgroup-root={cg} \
  --rescan=100ms --window=1s --pid=$W1 --kubeconfig={kc} --node=node-a 2>{d}/agent.log &
A=$!
for i in $(seq 300); do grep -q "probe loop ready" {d}/agent.log && break; sleep 0.1; done
echo "$W1 $W2 $A" > {d}/pids
printf g >&3; printf g >&4
wait $W1; wait $W2
kill -TERM $A; wait $A
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_pid_namespace_rows_carry_its_pids_names_and_cgroups() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("pidns");
    let (lib, wl) = build(&dir.path().join("bin"));
    // A pod of the kind node: kubelet-shaped cgroup, known to the API server.
    const UID: &str = "3f2e1d0c-5b4a-4c3d-9e8f-7a6b5c4d3e2f";
    let cid = "d4".repeat(32);
    let pod_rel = format!(
        "{}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{cid}.scope",
        cg.0.file_name().unwrap().to_string_lossy(),
        UID.replace('-', "_")
    );
    let pod_cg = Cgroup::new(&pod_rel);
    let kube = fixtures::fake_kube::FakeKube::start();
    kube.apply(fixtures::fake_kube::pod(
        "ml",
        "llama-worker-0",
        UID,
        "node-a",
        ("trainer", &format!("containerd://{cid}")),
        serde_json::json!({}),
        Some(("Job", "llama")),
    ));
    let script = dir.path().join("node.sh");
    let kc = kube.kubeconfig(dir.path());
    std::fs::write(&script, pidns_script(dir.path(), &cg.0, &pod_cg.0, &kc, &lib, &wl)).unwrap();
    // A kind node's view: its own pid namespace and /proc.
    let out = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "sh"]).arg(&script).output().unwrap();
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    assert!(out.status.success(), "{}\n{log}", String::from_utf8_lossy(&out.stderr));
    let ids: Vec<u32> = std::fs::read_to_string(dir.path().join("pids"))
        .unwrap()
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    let (w1, w2) = (ids[0], ids[1]);
    // A fresh namespace numbers from 1: these are not the host's pids.
    assert!(w1 < 100 && w2 < 100, "pids {ids:?}");
    let calls = rows(dir.path(), Table::CallWindows).await;
    let c = calls_of(&calls, w1);
    assert_eq!(c.get("cudaLaunchKernel").map(|x| x.0), Some(4321), "{c:?}\n{log}");
    assert!(calls_of(&calls, w2).is_empty(), "--pid={w1} is filtered in the kernel");
    let rows_pids: Vec<u32> = calls
        .iter()
        .flat_map(|b| b.column_by_name("pid").unwrap().as_primitive::<UInt32Type>().values().to_vec())
        .collect();
    assert!(rows_pids.iter().all(|&p| p == w1), "only the namespace's pid {w1}: {rows_pids:?}");
    assert_eq!(text_of(&calls, w1, "comm").as_deref(), Some("workload"), "{log}");
    assert_eq!(text_of(&calls, w1, "pod").as_deref(), Some("llama-worker-0"), "pod resolved in the namespace\n{log}");
    assert_eq!(text_of(&calls, w1, "namespace").as_deref(), Some("ml"));
    assert_eq!(text_of(&calls, w1, "container").as_deref(), Some("trainer"));
    use std::os::unix::fs::MetadataExt;
    let cg_ino = std::fs::metadata(&pod_cg.0).unwrap().ino();
    let cgid = calls
        .iter()
        .find_map(|b| {
            let c = b.column_by_name("cgroup_id")?.as_primitive::<UInt64Type>();
            (b.num_rows() > 0 && !c.is_null(0)).then(|| c.value(0))
        })
        .unwrap();
    assert_eq!(cgid, cg_ino, "cgroup resolved through the namespace's /proc");
    drop(pod_cg);
}

/// Bytes of the BPF maps of `pid` (fdinfo memlock) if the node had `cpus`
/// possible CPUs: per-CPU maps scale, and a preallocated shared hash keeps
/// one spare element per CPU.
fn kernel_map_bytes_at(pid: u32, cpus: u64) -> (u64, u64) {
    let possible = ingero_agent::probes::memory::possible_cpus();
    let (mut now, mut at) = (0u64, 0u64);
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if !std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf-map") {
            continue;
        }
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy())).unwrap();
        let field = |k: &str| {
            info.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok()).unwrap_or_else(|| panic!("{k}"))
        };
        let (ty, mem, max) = (field("map_type:"), field("memlock:"), field("max_entries:"));
        now += mem;
        at += match ty {
            5 | 6 | 10 => mem * cpus / possible,
            1 => mem + mem * cpus.saturating_sub(possible) / max,
            _ => mem,
        };
    }
    (now, at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_map_memory_fits_a_256_cpu_node() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("mem");
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let (now, at_256) = kernel_map_bytes_at(agent.child.id(), 256);
    agent.stop();
    assert!(now > 1 << 20, "the maps are found ({now} bytes)");
    assert!(at_256 <= 64 << 20, "BPF maps need {} MiB at 256 CPUs (budget 64)", at_256 >> 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_and_exits_keep_their_meaning() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("life");
    let (lib, wl) = build(&dir.path().join("bin"));
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    // 200 short-lived threads, each one launch; then the process is killed.
    let mut w = Workload::start(
        &wl,
        &lib,
        &["open", "sleep:500", "threads:200:cudaLaunchKernel", "sleep:300", "sleep:1200", "kill:9"],
        &cg,
    );
    let pid = w.pid();
    let st = w.child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(9));
    std::thread::sleep(Duration::from_millis(300));
    let log = agent.stop();
    assert_eq!(calls_of(&rows(dir.path(), Table::CallWindows).await, pid)["cudaLaunchKernel"].0, 200, "{log}");
    let ev = host_events_of(&rows(dir.path(), Table::HostEvents).await, pid);
    assert!(!ev.iter().any(|(k, _)| k == "fork"), "new threads are not forks: {ev:?}");
    assert!(ev.contains(&("exit".into(), 137)), "SIGKILL reported as 137: {ev:?}");
    // Sleeping 1.5 s after the threads ended: off-CPU is the main thread's
    // own, not 200 dead threads' worth.
    let off_ms = sum_for(&rows(dir.path(), Table::SchedWindows).await, pid, "off_cpu_ns") as f64 / 1e6;
    assert!(off_ms < 3000.0, "off-CPU {off_ms} ms");
}

/// A process that calls until the moment it exits: its last calls can land
/// in the window after the one its exit event is handled in, and they still
/// carry its cgroup and name (the e2e once stored such calls under no pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_until_the_exit_keep_their_process() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("lastcalls");
    let (lib, wl) = build(&dir.path().join("bin"));
    let mut args = store_args(dir.path(), &cg);
    // Short windows: many window ends fall between a process's last call and its exit.
    args.retain(|a| !a.starts_with("--window="));
    args.push("--window=100ms".into());
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    const N: u64 = 20_000;
    let mut pids = Vec::new();
    for _ in 0..30 {
        let w = Workload::start(&wl, &lib, &["open", &format!("call:cudaLaunchKernel:{N}:0")], &cg);
        pids.push(w.pid());
        w.wait();
    }
    std::thread::sleep(Duration::from_millis(500));
    let log = agent.stop();
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(&cg.0).unwrap().ino();
    let calls = rows(dir.path(), Table::CallWindows).await;
    let mut wrong = Vec::new();
    for b in &calls {
        let p = b.column_by_name("pid").unwrap().as_primitive::<UInt32Type>();
        let comm = b.column_by_name("comm").unwrap().as_string::<i32>();
        let id = b.column_by_name("cgroup_id").unwrap().as_primitive::<UInt64Type>();
        let n = b.column_by_name("count").unwrap().as_primitive::<UInt64Type>();
        for i in (0..b.num_rows()).filter(|&i| id.value(i) != want || comm.value(i) != "workload") {
            wrong.push((p.value(i), comm.value(i).to_string(), id.value(i), n.value(i)));
        }
    }
    assert!(wrong.is_empty(), "calls stored without their process (pid, comm, cgroup_id, count): {wrong:?}\n{log}");
    for pid in pids {
        assert_eq!(calls_of(&calls, pid).get("cudaLaunchKernel").map(|c| c.0), Some(N), "pid {pid}\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_a_private_cgroup_namespace_other_cgroups_resolve() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("cgns");
    let (lib, wl) = build(&dir.path().join("bin"));
    let (home, work) =
        (Cgroup::new(&format!("{}/agent", cg.0.file_name().unwrap().to_string_lossy())), cg.0.join("work"));
    std::fs::create_dir_all(&work).unwrap();
    let (d, agent) = (dir.path().display(), env!("CARGO_BIN_EXE_ingero-agent"));
    let script = format!(
        r#"set -e
mkfifo {d}/go
sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' {work} {wl} {lib} wait open sleep:300 call:cudaLaunchKernel:777:0 sleep:300 < {d}/go > {d}/w.out &
W=$!
exec 3>{d}/go
INGERO_LOG=info {agent} run --store=file://{d}/data --spool-dir={d}/spool --cgroup-root={cg} --rescan=100ms --window=1s 2>{d}/agent.log &
A=$!
for i in $(seq 300); do grep -q "probe loop ready" {d}/agent.log && break; sleep 0.1; done
cat /proc/$W/cgroup > {d}/seen
echo $W > {d}/pids
printf g >&3
wait $W
kill -TERM $A; wait $A
"#,
        work = work.display(),
        wl = wl.display(),
        lib = lib.display(),
        cg = cg.0.display(),
    );
    std::fs::write(dir.path().join("ns.sh"), script).unwrap();
    // The agent's pod: its own cgroup (`agent`) becomes its namespace root.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs"; exec unshare --cgroup sh "$1""#)
        .arg(&home.0)
        .arg(dir.path().join("ns.sh"))
        .output()
        .unwrap();
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    assert!(out.status.success(), "{}\n{log}", String::from_utf8_lossy(&out.stderr));
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert!(seen.contains("/../work"), "the workload's cgroup as the namespace shows it: {seen}");
    let w: u32 = std::fs::read_to_string(dir.path().join("pids")).unwrap().trim().parse().unwrap();
    let calls = rows(dir.path(), Table::CallWindows).await;
    assert_eq!(calls_of(&calls, w).get("cudaLaunchKernel").map(|x| x.0), Some(777), "{log}");
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(&work).unwrap().ino();
    let got = calls.iter().find_map(|b| {
        let p = b.column_by_name("pid")?.as_primitive::<UInt32Type>();
        let c = b.column_by_name("cgroup_id")?.as_primitive::<UInt64Type>();
        (0..b.num_rows()).find(|&i| p.value(i) == w).map(|i| c.value(i))
    });
    assert_eq!(got, Some(want), "cgroup of the workload resolved from `/../work`\n{log}");
    drop(home);
}

#[test]
fn check_names_the_namespace_and_the_kernel_memory_and_mounts_nothing() {
    if !can_trace() {
        return;
    }
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().count();
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_ingero-agent"))
        .arg("check")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let line =
        |name: &str| text.lines().find(|l| l.contains(name)).unwrap_or_else(|| panic!("{name}:\n{text}")).to_string();
    assert!(line("pid namespace").contains("pid:["), "{text}");
    assert!(line("kernel memory").starts_with("ok") && line("kernel memory").contains("at 256"), "{text}");
    assert!(line("eBPF programs").starts_with("ok"), "{text}");
    let trap: u64 = line("trap cost").split_whitespace().find_map(|w| w.parse().ok()).unwrap_or(0);
    assert!((50..100_000).contains(&trap), "a trap's cost measured: {text}");
    assert!(text.lines().all(|l| l.chars().count() <= 100), "lines fit a terminal:\n{text}");
    let mounts_after = std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().count();
    assert_eq!(mounts_before, mounts_after, "check mounts nothing");
}

/// The agent's /metrics (with the HTTP head).
fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// A Prometheus gauge from the agent's /metrics.
fn metric(addr: &str, name: &str) -> u64 {
    let body = metrics(addr);
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in:\n{body}"))
}

/// Also: the dashboard's agent panels query only metrics the agent exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_churn_leaves_the_agent_state_flat() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("churn");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = store_args(dir.path(), &cg);
    args.push(format!("--metrics-addr={addr}"));
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    // 2,000 short-lived processes in scope, each exec'd (and seen by the agent).
    let st = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs"; i=0; while [ $i -lt 2000 ]; do /bin/true; i=$((i+1)); done"#)
        .arg(&cg.0)
        .status()
        .unwrap();
    assert!(st.success());
    std::thread::sleep(Duration::from_millis(2500));
    let cached = metric(&addr, "ingero_agent_cached_processes");
    let exported = metrics(&addr);
    let log = agent.stop();
    assert!(cached < 50, "{cached} processes still cached after 2,000 exited\n{log}");
    dashboard_queries_only(&exported);
}

/// Every agent metric the Grafana dashboard (deploy/grafana/ingero.json)
/// queries, and every one the chart's alert rules use, is in the agent's real
/// /metrics (the aggregator's are checked by cli/tests/it/dashboard.rs and
/// cli/tests/it/remediate.rs).
fn dashboard_queries_only(exported: &str) {
    alerted_metrics_are_exported(exported);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/ingero.json");
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queried = std::collections::BTreeSet::new();
    for t in d["panels"].as_array().unwrap().iter().flat_map(|p| p["targets"].as_array().into_iter().flatten()) {
        let mut rest = t["expr"].as_str().unwrap();
        while let Some(i) = rest.find("ingero_agent_") {
            let name: String =
                rest[i..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
            rest = &rest[i + name.len()..];
            queried.insert(name);
        }
    }
    assert!(queried.len() >= 8, "the dashboard shows agent health: {queried:?}");
    let samples: std::collections::BTreeSet<&str> = exported
        .lines()
        .filter(|l| l.starts_with("ingero_agent_"))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = queried.iter().filter(|n| !samples.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "the dashboard queries {missing:?}, not in the agent's /metrics:\n{exported}");
}

fn alerted_metrics_are_exported(exported: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/helm/ingero/alerts/ingero.rules.yaml");
    let rules = std::fs::read_to_string(path).unwrap();
    let mut used = std::collections::BTreeSet::new();
    let mut rest = rules.as_str();
    while let Some(i) = rest.find("ingero_agent_") {
        let name: String =
            rest[i..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        rest = &rest[i + name.len()..];
        // Exported with Kubernetes on only: tests/pods.rs reads it there.
        if !name.starts_with("ingero_agent_kube_") {
            used.insert(name);
        }
    }
    assert!(used.len() >= 2, "the rules alert on agent health: {used:?}");
    let missing: Vec<&String> = used.iter().filter(|n| !exported.lines().any(|l| l.starts_with(n.as_str()))).collect();
    assert!(missing.is_empty(), "the alert rules use {missing:?}, not in the agent's /metrics:\n{exported}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_process_that_exits_at_once_leaves_the_library_probed_for_the_next() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("quick");
    let (lib, wl) = build(&dir.path().join("bin"));
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    // Maps the library and exits within a millisecond, a few times over.
    for _ in 0..5 {
        Workload::start(&wl, &lib, &["open"], &cg).wait();
    }
    let w = Workload::start(&wl, &lib, &["open", "sleep:600", "call:cudaLaunchKernel:4242:0", "sleep:300"], &cg);
    let pid = w.pid();
    w.wait();
    let log = agent.stop();
    let c = calls_of(&rows(dir.path(), Table::CallWindows).await, pid);
    assert_eq!(c.get("cudaLaunchKernel").map(|x| x.0), Some(4242), "{c:?}\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_kill_is_recorded_for_its_victim() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("oom");
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    // A 32 MiB memory cgroup: cgroup v2's memory controller, or v1's on a
    // hybrid host (this VM), alongside the v2 scope the agent traces.
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
    let limit_dir = if cgroup_mount().join("cgroup.controllers").exists()
        && std::fs::read_to_string(cgroup_mount().join("cgroup.controllers")).unwrap_or_default().contains("memory")
    {
        std::fs::write(cg.0.join("cgroup.subtree_control"), "+memory").unwrap();
        let b = cg.0.join("box");
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("memory.max"), "32M").unwrap();
        std::fs::write(b.join("memory.swap.max"), "0").ok();
        b
    } else {
        assert!(v1.join("memory.limit_in_bytes").exists(), "no memory controller in cgroup v2 nor v1");
        let b = v1.join(format!("ingero-test-oom-{}", std::process::id()));
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("memory.limit_in_bytes"), "33554432").unwrap();
        std::fs::write(b.join("memory.memsw.limit_in_bytes"), "33554432").ok();
        b
    };
    // Touches 256 MiB: the kernel's OOM killer picks it.
    let child = ingero_sim::child::dies_with_test(&mut Command::new("sh"))
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs"; echo $$ > "$1/cgroup.procs"; exec python3 -c 'b = bytearray(256 << 20); print(len(b))'"#)
        .arg(&cg.0)
        .arg(&limit_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(9), "killed by the OOM killer");
    std::thread::sleep(Duration::from_millis(300));
    let log = agent.stop();
    let ev = host_events_of(&rows(dir.path(), Table::HostEvents).await, pid);
    assert!(ev.iter().any(|(k, _)| k == "oom_kill"), "oom_kill of pid {pid}: {ev:?}\n{log}");
    assert!(ev.contains(&("exit".into(), 137)), "{ev:?}");
    let _ = std::fs::remove_dir(&limit_dir);
}

/// The agent's cost to a process: its probed calls' traps (launches once,
/// timed calls twice, nested driver calls too) times the trap cost it
/// measured at start, in /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_trap_cost_to_a_process_is_counted() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("cost");
    let (lib, wl) = build(&dir.path().join("bin"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = store_args(dir.path(), &cg);
    args.push(format!("--metrics-addr={addr}"));
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    let trap_ns = metric(&addr, "ingero_agent_trap_ns");
    assert!((50..100_000).contains(&trap_ns), "a trap costs {trap_ns} ns here");
    let w = Workload::start(
        &wl,
        &lib,
        &["open", "call:cudaLaunchKernel:20000:0", "call:cudaStreamSynchronize:100:0", "sleep:1500"],
        &cg,
    );
    w.wait();
    let spent = metric(&addr, "ingero_agent_trap_time_ns_total") as f64;
    let log = agent.stop();
    // Each runtime call makes its driver call (probed too, nested: not a
    // call of the program's, but a trap): 20,000 launches trap twice, 100
    // syncs four times (entry and return, runtime and driver).
    let want = (2.0 * 20_000.0 + 4.0 * 100.0) * trap_ns as f64;
    assert!((spent / want - 1.0).abs() < 0.01, "trap time {spent} ns, expected {want}\n{log}");
}
