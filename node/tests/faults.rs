// SPDX-License-Identifier: Apache-2.0
//! Delivery under fault injection, with the real agent and the real server
//! processes: three agents ship 100-ms windows (1,000+ batches) while
//! `ingero serve` is SIGKILLed at random points and restarted; one agent is
//! SIGKILLed while the server is down and restarted on the same spool.
//! Asserted: every acknowledged batch is stored exactly once, every call the
//! workloads made is counted once, and the killed agent's spool is delivered.
//! `INGERO_FAULT_SEED` picks another kill schedule. Needs root.

mod fixtures;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::TimestampMicrosecondType;
use fixtures::*;
use ingero_model::Table;
use prost::Message;

const NODES: usize = 3;
const STEPS: u32 = 750;
const CALLS_PER_STEP: u64 = 10;

/// xorshift: a reproducible schedule from a printed seed.
struct Rng(u64);

impl Rng {
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + self.0 % (hi - lo)
    }
}

fn kill9(c: &mut Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// (node, window_start) of the node_windows row of every batch in a spool.
fn spooled_windows(spool: &Path) -> BTreeSet<(String, i64)> {
    let mut out = BTreeSet::new();
    // Committed batches only: a `.tmp` the agent was writing when killed
    // was never in the spool.
    for f in std::fs::read_dir(spool).unwrap().flatten().filter(|f| f.file_name().to_string_lossy().ends_with(".pb")) {
        let Ok(bytes) = std::fs::read(f.path()) else { continue };
        let Ok(req) = ingero_proto::pb::PushRequest::decode(bytes.as_slice()) else { continue };
        for t in req.tables.iter().filter(|t| t.table == "node_windows") {
            for b in ingero_proto::ipc::decode(Table::NodeWindows, &t.arrow_ipc, usize::MAX).unwrap() {
                let ts = b.column(10).as_primitive::<TimestampMicrosecondType>();
                out.extend((0..b.num_rows()).map(|i| (req.node.clone(), ts.value(i))));
            }
        }
    }
    out
}

fn windows(batches: &[RecordBatch]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for b in batches {
        let node = b.column(0).as_string::<i32>();
        let ts = b.column(10).as_primitive::<TimestampMicrosecondType>();
        out.extend((0..b.num_rows()).map(|i| (node.value(i).to_string(), ts.value(i))));
    }
    out
}

fn acked(log: &str) -> u64 {
    let line = log.lines().rev().find(|l| l.contains("ingero-agent stopped")).expect("no stop summary in the log");
    let v = line.split("acked=").nth(1).unwrap().split_whitespace().next().unwrap();
    v.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_batches_are_stored_exactly_once_across_aggregator_and_agent_kills() {
    if !can_trace() {
        return;
    }
    let seed = std::env::var("INGERO_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!("fault schedule seed {seed} (INGERO_FAULT_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let (lib, wl) = build(&dir.path().join("bin"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = serve(dir.path(), port);

    let root_rel = format!("ingero-test-faults-{}", std::process::id());
    let _root = Cgroup::new(&root_rel);
    let args = |n: usize| {
        vec![
            format!("--aggregator=http://127.0.0.1:{port}"),
            format!("--node=node-{n}"),
            format!("--spool-dir={}", dir.path().join(format!("spool-{n}")).display()),
            format!("--cgroup-root={}", cgroup_mount().join(&root_rel).join(format!("node-{n}")).display()),
            "--kubernetes=off".into(),
            "--rescan=100ms".into(),
            "--window=100ms".into(),
        ]
    };
    let log = |n: usize, run: u32| dir.path().join(format!("agent-{n}-{run}.log"));
    let mut cgroups = Vec::new();
    let mut agents = Vec::new();
    for n in 0..NODES {
        cgroups.push(Cgroup::new(&format!("{root_rel}/node-{n}/job")));
        agents.push(Agent::start(&args(n), &log(n, 0)));
    }
    let steps = [
        "open".to_string(),
        "sleep:800".into(),
        format!("repeat:{STEPS}"),
        format!("call:cudaLaunchKernel:{CALLS_PER_STEP}:0"),
        "sleep:50".into(),
    ];
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let workloads: Vec<Workload> = cgroups.iter().map(|cg| Workload::start(&wl, &lib, &steps, cg)).collect();
    let pids: Vec<u32> = workloads.iter().map(|w| w.pid()).collect();

    // Kill the aggregator at random points until the workloads are done; on
    // the second outage also kill agent 1 (its spool holds batches) and
    // restart it on the same spool.
    let started = Instant::now();
    let (mut kills, mut spool_at_kill) = (0, BTreeSet::new());
    while started.elapsed() < Duration::from_secs(36) {
        tokio::time::sleep(Duration::from_millis(rng.between(300, 2500))).await;
        kill9(&mut server.0);
        kills += 1;
        tokio::time::sleep(Duration::from_millis(rng.between(100, 1500))).await;
        if kills == 2 {
            tokio::time::sleep(Duration::from_millis(600)).await; // let windows pile up in the spool
            let mut a = agents.remove(1);
            let _ = a.child.kill();
            let _ = a.child.wait();
            spool_at_kill = spooled_windows(&dir.path().join("spool-1/batches"));
            assert!(!spool_at_kill.is_empty(), "agent 1 had nothing spooled when killed");
            agents.insert(1, Agent::start(&args(1), &log(1, 1)));
        }
        server = serve(dir.path(), port);
    }
    for w in workloads {
        w.wait();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let acks: Vec<u64> = agents.into_iter().map(|a| acked(&a.stop())).collect();
    // SAFETY: kill takes any pid; ours is a child we have not reaped.
    unsafe { libc::kill(server.0.id() as i32, libc::SIGTERM) };
    assert!(server.0.wait().unwrap().success());
    eprintln!("{kills} aggregator kills; acknowledged per agent (last run): {acks:?}");

    let nw = windows(&rows(dir.path(), Table::NodeWindows).await);
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for (n, _) in &nw {
        *per_node.entry(n.clone()).or_default() += 1;
    }
    let distinct: BTreeSet<_> = nw.iter().cloned().collect();
    eprintln!("stored batches per node: {per_node:?} ({} in all, {} distinct)", nw.len(), distinct.len());
    assert_eq!(distinct.len(), nw.len(), "a batch was stored twice");
    assert!(nw.len() >= 1000, "only {} batches stored; the test wants 1,000+", nw.len());
    // Agents 0 and 2 ran throughout: what they had acknowledged is exactly what is stored.
    for n in [0, 2] {
        assert_eq!(per_node[&format!("node-{n}")] as u64, acks[n], "node-{n}: stored ≠ acknowledged");
    }
    // Agent 1's spool at the moment it was killed was delivered by its successor.
    let missing: Vec<_> = spool_at_kill.difference(&distinct).collect();
    assert!(missing.is_empty(), "spooled batches of the killed agent never arrived: {missing:?}");
    assert!(log(1, 1).exists() && std::fs::read_to_string(log(1, 1)).unwrap().contains("ingero-agent tracing"));

    // Every call made under agents 0 and 2 is counted once.
    let calls = rows(dir.path(), Table::CallWindows).await;
    for n in [0, 2] {
        let got = calls_of(&calls, pids[n]).get("cudaLaunchKernel").map_or(0, |c| c.0);
        assert_eq!(got, STEPS as u64 * CALLS_PER_STEP, "node-{n}: calls lost or counted twice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_drops_the_oldest_batches_and_counts_them() {
    if !can_trace() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (lib, wl) = build(&dir.path().join("bin"));
    let root_rel = format!("ingero-test-spoolfull-{}", std::process::id());
    let cg = Cgroup::new(&root_rel);
    // Nothing listens there: every batch goes to the spool, capped at 48 KiB.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let spool = dir.path().join("spool");
    let args = vec![
        format!("--aggregator=http://127.0.0.1:{dead}"),
        format!("--spool-dir={}", spool.display()),
        "--spool-max=48KiB".into(),
        format!("--cgroup-root={}", cg.0.display()),
        "--kubernetes=off".into(),
        "--rescan=100ms".into(),
        "--window=100ms".into(),
    ];
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    let w =
        Workload::start(&wl, &lib, &["open", "sleep:500", "repeat:80", "call:cudaLaunchKernel:5:0", "sleep:50"], &cg);
    w.wait();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let bytes: u64 =
        std::fs::read_dir(spool.join("batches")).unwrap().flatten().map(|f| f.metadata().unwrap().len()).sum();
    let stopping = chrono::Utc::now().timestamp_micros();
    let t = Instant::now();
    let log = agent.stop();
    assert!(t.elapsed() < Duration::from_secs(15), "stopping took {:?} with the aggregator away", t.elapsed());
    let line = log.lines().rev().find(|l| l.contains("ingero-agent stopped")).unwrap();
    let dropped: u64 = line.split("dropped=").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    eprintln!("spool full: {line}; {bytes} bytes on disk");
    assert!(dropped > 0, "the spool never filled: {line}");
    assert_eq!(log.matches("spool full: dropped the oldest batch").count() as u64, dropped, "counted as logged");
    let dead_url = format!("127.0.0.1:{dead}");
    assert!(
        log.lines().any(|l| l.contains("aggregator unreachable") && l.contains(&dead_url)),
        "the outage's warning does not name {dead_url}"
    );
    assert!(bytes <= 48 * 1024, "spool holds {bytes} bytes, over its 48 KiB cap");
    // What is left is the newest stretch, with no gaps: the oldest went first.
    let left: Vec<i64> = spooled_windows(&spool.join("batches")).into_iter().map(|(_, t)| t).collect();
    assert!(left.len() >= 3, "{left:?}");
    assert!(left.windows(2).all(|p| p[1] - p[0] == 100_000), "spool kept a gappy set, not the newest: {left:?}");
    let newest = *left.last().unwrap();
    assert!(stopping - newest < 3_000_000, "the newest windows were dropped instead of the oldest: {left:?}");
}

/// `/healthz` tells the truth about shipping: unhealthy while windows are
/// lost because the spool cannot be written, healthy again once it can,
/// and healthy but saying so while the aggregator does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_unhealthy_while_windows_are_lost_and_says_when_the_aggregator_is_away() {
    if !can_trace() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cg = Cgroup::new(&format!("ingero-test-health-{}", std::process::id()));
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let spool = dir.path().join("spool");
    let args = vec![
        format!("--aggregator=http://127.0.0.1:{dead}"),
        format!("--spool-dir={}", spool.display()),
        format!("--cgroup-root={}", cg.0.display()),
        format!("--metrics-addr={addr}"),
        "--kubernetes=off".into(),
        "--window=100ms".into(),
    ];
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    let started = Instant::now();
    let wait_for = |want: &dyn Fn(&str) -> bool, what: &str| {
        let t = Instant::now();
        loop {
            let h = healthz(&addr);
            if want(&h) {
                return h;
            }
            assert!(t.elapsed() < slow(Duration::from_secs(20)), "{what}: /healthz still says\n{h}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let status = |h: &str| h.split_whitespace().nth(1).unwrap_or("").to_string();
    let ok = |h: &str| status(h) == "200" && h.contains("\r\n\r\nok\n");
    wait_for(&ok, "healthy at start");
    // The spool's directory becomes a file: no window can be written.
    let batches = spool.join("batches");
    std::fs::rename(&batches, spool.join("away")).unwrap();
    std::fs::write(&batches, b"").unwrap();
    let h = wait_for(&|h: &str| status(h) == "503", "windows lost");
    assert!(h.contains("unhealthy: the last") && h.contains("were lost, not spooled (cannot spool"), "{h}");
    std::fs::remove_file(&batches).unwrap();
    std::fs::rename(spool.join("away"), &batches).unwrap();
    wait_for(&ok, "healthy once the spool can be written again");
    // Ten seconds without an answer from the aggregator: said, still healthy.
    let h = wait_for(&|h: &str| h.contains("degraded: aggregator"), "the outage said");
    assert!(ok(&h) && h.contains(&format!("http://127.0.0.1:{dead} unreachable for")), "{h}");
    assert!(started.elapsed() >= Duration::from_secs(10), "said before 10 s");
    let log = agent.stop();
    assert!(log.contains("cannot spool a batch; it is lost"), "{log}");
}
