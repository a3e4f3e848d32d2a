// SPDX-License-Identifier: Apache-2.0
//! A scoped agent (`--cgroup-root`) acts on its subtree alone, from the
//! first program it attaches. Outside it, while the agent starts, a shell
//! execs a process ~100 times a second and another process calls into the
//! CUDA-named library: no event of theirs reaches the agent, none of their
//! files is probed for them, none of their calls is counted (the library
//! is probed for the process inside), and the process inside is counted
//! exactly. (The tracepoints fire as soon as they are attached; an
//! agent that wrote its scope afterwards acted on, and could hold, every
//! process on the node meanwhile.)

mod fixtures;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use fixtures::*;
use ingero_model::Table;

const LAUNCHES: u64 = 300;

/// Kills what is left in `cg` (the shell's sleeps), so that it can be removed.
fn kill_all(cg: &Cgroup) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let procs = std::fs::read_to_string(cg.0.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "processes left in {}: {pids:?}", cg.0.display());
        for pid in pids {
            // SAFETY: kill takes any pid; these are the test's own.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_agent_acts_on_its_scope_alone_from_its_first_event() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("scope");
    let outside = Cgroup::new(&format!("ingero-test-outside-{}", std::process::id()));
    let (lib, wl) = build(&dir.path().join("bin"));

    let mut cmd = Command::new("sh");
    // Each exec'd process lives 2 s: the agent finds it still there.
    cmd.args(["-c", "read x; while :; do sleep 2 & sleep 0.01; done"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut execs = ingero_sim::child::dies_with_test(&mut cmd).spawn().unwrap();
    outside.add(execs.id());
    execs.stdin.as_mut().unwrap().write_all(b"g\n").unwrap();
    let stranger = Workload::start(&wl, &lib, &["repeat:1000000", "call:cudaLaunchKernel:1:0", "sleep:2"], &outside);
    // Both running before the agent loads.
    std::thread::sleep(Duration::from_millis(300));

    // The library probed at start: the count inside is exact on kernels
    // without the library hold too (5.10-5.16), and the stranger's calls
    // run through a probed file, kept out by the kernel's scope check.
    let mut args = store_args(dir.path(), &cg);
    args.push(format!("--lib={}", lib.parent().unwrap().display()));
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    agent.wait_log(&format!("library={}", lib.display()), Duration::from_secs(60));
    let inside =
        Workload::start(&wl, &lib, &["open", &format!("call:cudaLaunchKernel:{LAUNCHES}:0"), "sleep:200"], &cg);
    let ipid = inside.pid();
    inside.wait();
    // Two more windows: everything made is drained and shipped.
    std::thread::sleep(Duration::from_millis(2500));
    let log = agent.stop();
    let spid = stranger.pid();
    for mut child in [execs, stranger.child] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    kill_all(&outside);

    let leaked: Vec<&str> = log.lines().filter(|l| l.contains("outside --cgroup-root")).collect();
    assert!(leaked.is_empty(), "events of processes outside the scope reached the agent:\n{}", leaked.join("\n"));
    assert!(!log.contains(&format!("pid={spid} ")), "the process outside was scanned or probed:\n{log}");
    let calls = rows(dir.path(), Table::CallWindows).await;
    assert!(calls_of(&calls, spid).is_empty(), "calls outside the scope counted: {:?}", calls_of(&calls, spid));
    let count = calls_of(&calls, ipid).get("cudaLaunchKernel").map_or(0, |c| c.0);
    assert_eq!(count, LAUNCHES, "the process inside, counted exactly\n{log}");
}
