// SPDX-License-Identifier: Apache-2.0
//! A pod that maps copies of a CUDA library by the dozen (each a file with
//! its own inode, each probed costs the agent open files and kernel memory)
//! cannot take the node's agent from everyone else: it gets
//! `--max-libraries-per-process` of them, a program started after it with
//! a fresh copy is still traced exactly, and past `--max-libraries` new
//! files are refused, said in the log and the metrics, while every window
//! keeps shipping and `/healthz` stays ok.

mod fixtures;

use std::path::{Path, PathBuf};
use std::time::Duration;

use fixtures::*;
use ingero_model::Table;

/// `n` copies of the stand-in runtime, each its own file named like it.
fn copies(lib: &Path, dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let d = dir.join(format!("copy-{i}"));
            std::fs::create_dir_all(&d).unwrap();
            let p = d.join("libcudart.so.12");
            std::fs::copy(lib, &p).unwrap();
            p
        })
        .collect()
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).expect("the agent answers within 5 s");
    body
}

/// A gauge or counter's value in the agent's /metrics.
fn metric(addr: &str, name: &str) -> u64 {
    let body = http_get(addr, "/metrics");
    let line = body.lines().find(|l| l.split_whitespace().next() == Some(name));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or_else(|| panic!("{name}:\n{body}"))
        as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_mapping_library_copies_by_the_dozen_gets_its_share_and_no_more() {
    if !can_trace() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cg = Cgroup::new(&format!("ingero-test-libcap-{}", std::process::id()));
    let (lib, wl) = build(&dir.path().join("bin"));
    let many = copies(&lib, &dir.path().join("pod"), 30);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = store_args(dir.path(), &cg);
    args.extend([
        format!("--metrics-addr={addr}"),
        "--max-libraries=10".into(),
        "--max-libraries-per-process=4".into(),
    ]);
    let agent = Agent::start(&args, &dir.path().join("agent.log"));

    // One process maps the first 12 copies and holds them.
    let maps: Vec<String> = many[..12].iter().map(|p| format!("driver:{}", p.display())).collect();
    let mut steps: Vec<&str> = maps.iter().map(String::as_str).collect();
    steps.push("sleep:6000");
    let hoarder = Workload::start(&wl, &lib, &steps, &cg);
    agent.wait_log("than --max-libraries-per-process", Duration::from_secs(20));
    // A program started after it, with a copy of its own: traced exactly.
    let fresh = many[29].display().to_string();
    let launches = "call:cudaLaunchKernel:200:0";
    let user = Workload::start(&wl, Path::new(&fresh), &["open", "sleep:600", launches, "sleep:300"], &cg);
    let user_pid = user.pid();
    user.wait();
    // Three more processes of 4 copies each: the cap of 10 files is reached.
    let mut late = Vec::new();
    for k in 0..3 {
        let maps: Vec<String> =
            many[12 + 4 * k..16 + 4 * k].iter().map(|p| format!("driver:{}", p.display())).collect();
        let mut steps: Vec<&str> = maps.iter().map(String::as_str).collect();
        steps.push("sleep:2000");
        late.push(Workload::start(&wl, &lib, &steps, &cg));
    }
    agent.wait_log("the --max-libraries cap: new library files are not probed", Duration::from_secs(20));
    let (probed, refused) =
        (metric(&addr, "ingero_agent_libraries"), metric(&addr, "ingero_agent_libraries_refused_total"));
    let health = http_get(&addr, "/healthz");
    let windows0 = metric(&addr, "ingero_agent_windows_total");
    std::thread::sleep(Duration::from_millis(2500));
    let windows1 = metric(&addr, "ingero_agent_windows_total");
    late.into_iter().for_each(|w| drop(w.wait()));
    // Past the cap, a program on a file probed already costs nothing new:
    // traced, and no refusal at each of its rescans.
    let refused0 = metric(&addr, "ingero_agent_libraries_refused_total");
    // (The user's copy: its 200 launches say it was probed.)
    let again = Workload::start(&wl, Path::new(&fresh), &["open", "sleep:1000", launches, "sleep:300"], &cg);
    let again_pid = again.pid();
    again.wait();
    let refused1 = metric(&addr, "ingero_agent_libraries_refused_total");
    hoarder.wait();
    let log = agent.stop();
    assert_eq!(refused1, refused0, "a file probed already was refused\n{log}");
    let calls = calls_of(&rows(dir.path(), Table::CallWindows).await, again_pid);
    assert_eq!(calls.get("cudaLaunchKernel").map(|c| c.0), Some(200), "{calls:?}\n{log}");

    assert!(probed <= 10, "{probed} files probed past --max-libraries=10\n{log}");
    assert!(refused > 0, "nothing refused\n{log}");
    assert!(health.starts_with("HTTP/1.1 200") || health.starts_with("HTTP/1.0 200"), "{health}");
    assert!(windows1 >= windows0 + 2, "windows stopped: {windows0} → {windows1}");
    let calls = calls_of(&rows(dir.path(), Table::CallWindows).await, user_pid);
    assert_eq!(calls.get("cudaLaunchKernel").map(|c| c.0), Some(200), "{calls:?}\n{log}");
    // Said once, not at every rescan.
    assert_eq!(log.matches("than --max-libraries-per-process").count(), 1, "{log}");
    assert_eq!(log.matches("the --max-libraries cap").count(), 1, "{log}");
}

/// An agent with a hundred library files probed stops within seconds: its
/// probes are closed all at once (one after another, each close waits out
/// kernel grace periods: ~150 ms a file, 15 s for these, past a pod's 30-s
/// grace at the 256-file cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_a_hundred_libraries_probed_stops_in_seconds() {
    if !can_trace() {
        return;
    }
    const FILES: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let cg = Cgroup::new(&format!("ingero-test-libstop-{}", std::process::id()));
    let (lib, wl) = build(&dir.path().join("bin"));
    let many = copies(&lib, &dir.path().join("pod"), FILES);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = store_args(dir.path(), &cg);
    args.extend([format!("--metrics-addr={addr}"), format!("--max-libraries-per-process={FILES}")]);
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    let maps: Vec<String> = many.iter().map(|p| format!("driver:{}", p.display())).collect();
    let mut steps: Vec<&str> = maps.iter().map(String::as_str).collect();
    steps.push("sleep:120000");
    let _holder = Workload::start(&wl, &lib, &steps, &cg);
    let t = std::time::Instant::now();
    while metric(&addr, "ingero_agent_libraries") < FILES as u64 {
        assert!(
            t.elapsed() < slow(Duration::from_secs(60)),
            "{} files probed",
            metric(&addr, "ingero_agent_libraries")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let stopping = std::time::Instant::now();
    let log = agent.stop();
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(8), "stopping with {FILES} files probed took {took:?}\n{log}");
    assert!(log.contains("library probes closed"), "{log}");
}
