// SPDX-License-Identifier: Apache-2.0
//! The agent against the real kernel: real uprobes on real processes, real
//! cgroups, real scheduler contention. Needs root (CI runs as root).

mod fixtures;

use fixtures::*;
use ingero_model::Table;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_counts_durations_and_errors_across_libraries_and_paths() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("counts");
    let (lib, wl) = build(&dir.path().join("bin"));
    let nccl = dir.path().join("bin/libnccl.so.2");
    // The same library at another path (another file): attached separately.
    let other = dir.path().join("rootfs/usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(&lib, other.join("libcudart.so.12")).unwrap();
    // Where the kernel has no library hold (5.10 to 5.16), each process's
    // library is probed when the agent sees it looked up, one after another
    // (~0.2 s each under qemu, three files here): the calls wait that out.
    let settle = if emulated() { "sleep:2000" } else { "sleep:600" };
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let a = Workload::start(
        &wl,
        &lib,
        &[
            "open",
            settle,
            "call:cudaLaunchKernel:1234:0",
            "call:cudaStreamSynchronize:15:4000",
            "call:cudaMemcpyAsync:7:2000",
            "call:cudaFree:3:0",
            "sleep:300",
        ],
        &cg,
    );
    // Collectives enqueue 10 ms of device work each and return at once; the
    // sync after them waits for all of it.
    let nccl_step = format!("nccl:{}", nccl.display());
    let b = Workload::start(
        &wl,
        &lib,
        &[
            "open",
            &nccl_step,
            settle,
            "call:ncclAllReduce:9:10000",
            "call:ncclGroupStart:4:0",
            "call:cudaStreamSynchronize:1:0",
            "sleep:300",
        ],
        &cg,
    );
    // Then the driver called by the program itself, from the same frame as
    // its runtime launches: the program's own launches, counted.
    let driver_step = format!("driver:{}", dir.path().join("bin/libcuda.so.1").display());
    let c = Workload::start(
        &wl,
        &other.join("libcudart.so.12"),
        &[
            "open",
            settle,
            "call:cudaLaunchKernel:77:0",
            "call:cudaDeviceSynchronize:2:1000",
            &driver_step,
            "call:cuLaunchKernel:33:0",
            "call:cudaLaunchKernel:5:0",
        ],
        &cg,
    );
    let (pa, pb, pc) = (a.pid(), b.pid(), c.pid());
    let wall_a = a.wait();
    let wall_b = b.wait();
    c.wait();
    let log = agent.stop();
    let calls = rows(dir.path(), Table::CallWindows).await;
    let ca = calls_of(&calls, pa);
    assert_eq!(ca["cudaLaunchKernel"].0, 1234, "{ca:?}\n{log}");
    assert_eq!(ca["cudaStreamSynchronize"].0, 15);
    assert_eq!(ca["cudaMemcpyAsync"].0, 7);
    assert_eq!(ca["cudaFree"].0, 3);
    // The runtime calls the driver (cuLaunchKernel, cuStreamSynchronize,
    // cuMemFree_v2): one layer per call, the one the program made.
    assert!(ca.keys().all(|op| !op.starts_with("cu") || op.starts_with("cuda")), "driver calls counted again: {ca:?}");
    // Durations match what the workload itself measured around its calls
    // (sleeps overshoot on a loaded machine, so compare with the truth).
    let within = |probe_ns: u64, wall_ns: f64, what: &str| {
        // Under emulation a trap costs ~100× more and lands outside the probes.
        let low = if emulated() { 0.75 } else { 0.9 };
        let r = probe_ns as f64 / wall_ns;
        assert!((low..=1.0).contains(&r), "{what}: probes measured {probe_ns} ns, workload {wall_ns} ns ({r:.3})");
    };
    within(ca["cudaStreamSynchronize"].2, wall_a["cudaStreamSynchronize"], "15 x 4 ms sync");
    assert!(ca["cudaStreamSynchronize"].2 >= 60_000_000);
    let cb = calls_of(&calls, pb);
    assert_eq!(cb["ncclAllReduce"].0, 9, "{cb:?}");
    assert_eq!(cb["ncclGroupStart"].0, 4);
    // Blocking collectives would take the 90 ms of device work they enqueue;
    // half of it leaves room for emulated traps (0.5-2 ms a collective under
    // qemu, each with its driver launch: 19 ms for the 9 seen on 6.12).
    assert!(cb["ncclAllReduce"].2 < 45_000_000, "collectives return at once: {cb:?}");
    within(cb["cudaStreamSynchronize"].2, wall_b["cudaStreamSynchronize"], "sync after 9 x 10 ms of collectives");
    assert!(cb["cudaStreamSynchronize"].2 >= 90_000_000, "{cb:?}");
    assert!(!cb.contains_key("cuLaunchKernel"), "NCCL's own kernel launches counted as the program's: {cb:?}");
    let cc = calls_of(&calls, pc);
    assert_eq!(cc["cudaLaunchKernel"].0, 82, "{cc:?}\n{log}");
    assert_eq!(cc["cuLaunchKernel"].0, 33, "the program's own driver launches: {cc:?}");
    assert_eq!(cc["cudaDeviceSynchronize"].0, 2);
    assert!(log.matches("attached").count() >= 3, "three distinct files attached:\n{log}");
    // Node rows say nothing was lost.
    let node = rows(dir.path(), Table::NodeWindows).await;
    assert_eq!(sum_for(&node, node_pid(&node), "ringbuf_drops"), 0);
}

fn node_pid(node: &[arrow::array::RecordBatch]) -> u32 {
    use arrow::array::AsArray;
    node[0].column_by_name("pid").unwrap().as_primitive::<arrow::datatypes::UInt32Type>().value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_cpu_time_of_a_sleeping_process_and_a_late_dlopen() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("offcpu");
    let (lib, wl) = build(&dir.path().join("bin"));
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    // Starts without the library, dlopens it 1.5 s later, then sleeps 2 s in total.
    let w = Workload::start(
        &wl,
        &lib,
        &[
            "sleep:1500",
            "open",
            "sleep:500",
            "call:cudaStreamSynchronize:1:0",
            "sleep:800",
            "sleep:1200",
            "call:cudaLaunchKernel:10:0",
            "call:cudaStreamSynchronize:1:700000",
        ],
        &cg,
    );
    let pid = w.pid();
    w.wait();
    agent.stop();
    let calls = calls_of(&rows(dir.path(), Table::CallWindows).await, pid);
    assert_eq!(calls["cudaLaunchKernel"].0, 10, "late-dlopen library traced: {calls:?}");
    let sched = rows(dir.path(), Table::SchedWindows).await;
    let off_ms = sum_for(&sched, pid, "off_cpu_ns") as f64 / 1e6;
    let in_call_ms = sum_for(&sched, pid, "off_cpu_in_call_ns") as f64 / 1e6;
    // Tracked from its first CUDA call: the 800 + 1200 ms of sleep follow it
    // (the host's own), then 700 ms asleep inside a device sync (waiting).
    assert!((650.0..900.0).contains(&in_call_ms), "off-CPU inside calls {in_call_ms} ms, expected ~700");
    let host_ms = off_ms - in_call_ms;
    assert!((1900.0..2600.0).contains(&host_ms), "off-CPU outside calls {host_ms} ms, expected ~2000 (+ overshoot)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_queue_latency_when_a_cpu_hog_shares_the_cpu() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("runq");
    let (lib, wl) = build(&dir.path().join("bin"));
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let mut hog = ingero_sim::child::dies_with_test(&mut std::process::Command::new("taskset"))
        .args(["-c", "0", "sh", "-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    let mut cmd = std::process::Command::new("taskset");
    cmd.args(["-c", "0"]).arg(&wl);
    let w = Workload::start_with(
        cmd,
        &lib,
        &["open", "sleep:500", "call:cudaLaunchKernel:1:0", "spin:2000", "call:cudaLaunchKernel:1:0"],
        &cg,
    );
    let pid = w.pid();
    w.wait();
    let _ = hog.kill();
    let _ = hog.wait();
    agent.stop();
    let sched = rows(dir.path(), Table::SchedWindows).await;
    let runq = sum_for(&sched, pid, "runq_wait_ns") as f64 / 1e6;
    let on = sum_for(&sched, pid, "on_cpu_ns") as f64 / 1e6;
    assert!(runq > 600.0, "run-queue wait {runq} ms (on-CPU {on} ms) with a hog on the same CPU");
    assert!(sum_for(&sched, pid, "involuntary_switches") > 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_ring_buffer_reports_every_lost_event() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("flood");
    let (lib, wl) = build(&dir.path().join("bin"));
    let mut args = store_args(dir.path(), &cg);
    args.push("--outlier-abs=1ns".into());
    // Probed before the workload starts: this test is about loss accounting,
    // so no call may fall before the attach.
    args.push(format!("--lib={}", lib.display()));
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    agent.wait_log(&format!("library={}", lib.display()), std::time::Duration::from_secs(10));
    let n = 30_000u64;
    let step = format!("call:cudaStreamSynchronize:{n}:0");
    // One call first (its lookup's hold served), then the flood while the
    // agent is stopped: nothing reads the ring, so it fills whatever the
    // machine's load (a loaded machine slowed the workload until a reader
    // kept up, and nothing was dropped). Every call is an outlier.
    let mut w = Workload::start(&wl, &lib, &["open", "call:cudaStreamSynchronize:1:0", "wait", &step], &cg);
    let pid = w.pid();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(w.child.stdout.as_mut().unwrap()), &mut first).unwrap();
    assert!(first.starts_with("step cudaStreamSynchronize 1 "), "{first}");
    let signal = |sig| {
        // SAFETY: kill takes any pid; the agent is our child, not yet reaped.
        assert_eq!(unsafe { libc::kill(agent.child.id() as i32, sig) }, 0);
    };
    signal(libc::SIGSTOP);
    std::io::Write::write_all(w.child.stdin.as_mut().unwrap(), b"g").unwrap();
    let steps = w.wait();
    signal(libc::SIGCONT);
    assert!(steps.contains_key("cudaStreamSynchronize"), "the flood ran: {steps:?}");
    let n = n + 1;
    let log = agent.stop();
    let stalls: usize = rows(dir.path(), Table::StallEvents)
        .await
        .iter()
        .map(|b| {
            use arrow::array::AsArray;
            let r = b.column_by_name("reason").unwrap().as_string::<i32>();
            (0..b.num_rows()).filter(|&i| r.value(i) == "threshold").count()
        })
        .sum();
    let node = rows(dir.path(), Table::NodeWindows).await;
    let drops = sum_for(&node, node_pid(&node), "ringbuf_drops");
    let calls = calls_of(&rows(dir.path(), Table::CallWindows).await, pid);
    eprintln!("flood: {stalls} delivered, {drops} dropped of {n}");
    assert!(drops > 0, "a 1 MiB ring buffer nobody reads cannot hold {n} events");
    assert_eq!(stalls as u64 + drops, n, "every outlier is either delivered or counted as dropped\n{calls:?}\n{log}");
    assert_eq!(calls_of(&rows(dir.path(), Table::CallWindows).await, pid)["cudaStreamSynchronize"].0, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidias_real_libcudart_exact_counts() {
    if !can_trace() {
        return;
    }
    let Some(real) = real_libcudart() else {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "pip install nvidia-cuda-runtime-cu12 (.ci/run does)"
        );
        eprintln!("SKIP: nvidia-cuda-runtime-cu12 not installed");
        return;
    };
    let (dir, cg) = tmp("real");
    let (_, wl) = build(&dir.path().join("bin"));
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let w = Workload::start(
        &wl,
        &real,
        &[
            "open",
            "sleep:600",
            "call:cudaLaunchKernel:5000:0",
            "call:cudaStreamSynchronize:321:0",
            "call:cudaDeviceSynchronize:17:0",
            "call:cudaMemcpy:9:0",
        ],
        &cg,
    );
    let pid = w.pid();
    w.wait();
    let log = agent.stop();
    let c = calls_of(&rows(dir.path(), Table::CallWindows).await, pid);
    assert_eq!(c.get("cudaLaunchKernel").map(|x| x.0), Some(5000), "{c:?}\n{log}");
    assert_eq!(
        c["cudaStreamSynchronize"],
        (321, 321, c["cudaStreamSynchronize"].2),
        "every call fails with no driver: counted as errors"
    );
    assert_eq!(c["cudaDeviceSynchronize"].0, 17);
    assert_eq!(c["cudaMemcpy"].0, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_spooled_while_the_aggregator_is_away_are_delivered_in_order() {
    use ingero_server::{ServeConfig, Server};
    use ingero_store::StoreUrl;
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("spool");
    let (lib, wl) = build(&dir.path().join("bin"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cfg = || {
        let url = StoreUrl::parse(&format!("file://{}", dir.path().join("data").display())).unwrap();
        let mut c = ServeConfig::ephemeral(url, Default::default(), dir.path().join("wal"));
        c.listen = format!("127.0.0.1:{port}").parse().unwrap();
        c
    };
    let server = Server::start(cfg()).await.unwrap();
    let args = vec![
        format!("--aggregator=http://127.0.0.1:{port}"),
        format!("--spool-dir={}", dir.path().join("spool").display()),
        format!("--cgroup-root={}", cg.0.display()),
        "--rescan=100ms".into(),
    ];
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    let a = Workload::start(&wl, &lib, &["open", "sleep:600", "call:cudaLaunchKernel:111:0", "sleep:1200"], &cg);
    let pa = a.pid();
    a.wait();
    server.shutdown().await.unwrap();
    // Aggregator down: these windows wait in the spool.
    let b = Workload::start(&wl, &lib, &["open", "sleep:600", "call:cudaLaunchKernel:222:0", "sleep:1500"], &cg);
    let pb = b.pid();
    b.wait();
    // Not yet sent (`.pb`); acknowledged ones wait for their commit as `.ack`.
    let unsent = || {
        std::fs::read_dir(dir.path().join("spool/batches"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "pb"))
            .count()
    };
    let spooled = unsent();
    assert!(spooled >= 2, "expected spooled batches while the aggregator was down, found {spooled}");
    let server = Server::start(cfg()).await.unwrap();
    // Drained in order once it is back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while unsent() > 1 {
        assert!(std::time::Instant::now() < deadline, "spool not drained");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    agent.stop();
    server.shutdown().await.unwrap();
    let calls = rows(dir.path(), Table::CallWindows).await;
    assert_eq!(calls_of(&calls, pa)["cudaLaunchKernel"].0, 111);
    assert_eq!(calls_of(&calls, pb)["cudaLaunchKernel"].0, 222, "windows from the outage were lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_named_with_lib_is_traced_from_the_first_call() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("prelib");
    let (lib, wl) = build(&dir.path().join("bin"));
    let mut args = store_args(dir.path(), &cg);
    args.push(format!("--lib={}", dir.path().join("bin").display()));
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    agent.wait_log("attached ahead of use", std::time::Duration::from_secs(10));
    // No pause between loading the library and calling it.
    let w = Workload::start(
        &wl,
        &lib,
        &["call:cudaLaunchKernel:4321:0", "call:cudaStreamSynchronize:8:1000", "sleep:300"],
        &cg,
    );
    let pid = w.pid();
    w.wait();
    agent.stop();
    let c = calls_of(&rows(dir.path(), Table::CallWindows).await, pid);
    assert_eq!(c["cudaLaunchKernel"].0, 4321, "{c:?}");
    assert_eq!(c["cudaStreamSynchronize"].0, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_real_stacks_make_are_all_counted() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("coverage");
    let (lib, wl) = build(&dir.path().join("bin"));
    // Probed as libcudart, libcuda (the stand-in driver) and libnccl.
    let cuda = dir.path().join("bin/libcuda.so.1");
    let nccl = dir.path().join("bin/libnccl.so.2");
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let runtime = [
        "cudaMallocAsync",
        "cudaFreeAsync",
        "cudaEventRecord",
        "cudaEventRecordWithFlags",
        "cudaEventQuery",
        "cudaStreamWaitEvent",
        "cudaMemsetAsync",
        "cudaLaunchCooperativeKernel",
        "cudaMemcpyPeer",
        "cudaMemcpyPeerAsync",
    ];
    let driver = [
        "cuStreamSynchronize_ptsz",
        "cuMemcpy_ptds",
        "cuMemcpyHtoD_v2_ptds",
        "cuMemcpyDtoH_v2_ptds",
        "cuEventSynchronize",
        "cuStreamWaitEvent",
        "cuMemFree_v2",
        "cuMemAllocAsync",
        "cuGraphLaunch",
        "cuLaunchCooperativeKernel",
        "cuEventRecord",
        "cuMemsetD8Async",
        "cuMemsetD32Async_ptsz",
    ];
    let collectives = ["ncclCommSplit", "ncclReduce", "ncclAlltoAll", "ncclCommAbort", "ncclCommDestroy"];
    let mut pids = Vec::new();
    for (path, syms) in [(&lib, &runtime[..]), (&cuda, &driver[..]), (&nccl, &collectives[..])] {
        let steps: Vec<String> = ["open".to_string(), "sleep:600".to_string()]
            .into_iter()
            .chain(syms.iter().enumerate().map(|(i, s)| format!("call:{s}:{}:0", i + 2)))
            .collect();
        let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
        let w = Workload::start(&wl, path, &steps, &cg);
        pids.push((w.pid(), syms));
        w.wait();
    }
    let log = agent.stop();
    let calls = rows(dir.path(), Table::CallWindows).await;
    for (n, (pid, syms)) in pids.into_iter().enumerate() {
        let c = calls_of(&calls, pid);
        for (i, s) in syms.iter().enumerate() {
            assert_eq!(c.get(*s).map(|x| x.0), Some(i as u64 + 2), "{s} in {c:?}\n{log}");
        }
        // The runtime's calls into the driver (cudaMemsetAsync's
        // cuMemsetD8Async, cudaEventRecord's cuEventRecord) are the runtime
        // calls' own: no driver op is counted for the runtime workload.
        if n == 0 {
            assert!(c.keys().all(|k| k.starts_with("cuda")), "driver calls counted twice: {c:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_linked_into_the_executable_is_found_by_its_symbols() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("static");
    build(&dir.path().join("bin"));
    let driver = dir.path().join("bin/libcuda.so.1");
    let exe = dir.path().join("bin/train_cuda");
    let inc = native_dir();
    let flags =
        ["-O1", "-fno-inline", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-fcf-protection=none"];
    cc(&[&flags[..], &["-I", inc.to_str().unwrap(), "-o"]].concat(), &exe, "static_cuda.c", &["-ldl"]);
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let w = Workload::start(&exe, &driver, &["600", "3000"], &cg);
    let pid = w.pid();
    let out = w.child.wait_with_output().unwrap();
    assert!(out.status.success());
    let log = agent.stop();
    let c = calls_of(&rows(dir.path(), Table::CallWindows).await, pid);
    assert_eq!(c.get("cudaLaunchKernel").map(|x| x.0), Some(3000), "{c:?}\n{log}");
    assert_eq!(c.get("cudaStreamSynchronize").map(|x| x.0), Some(300), "{c:?}");
    // The static runtime's own driver calls (through dlsym'd pointers, as
    // the real one makes them) are part of the runtime call.
    assert!(!c.contains_key("cuStreamSynchronize"), "{c:?}");
    // The program's own driver launches, from the executable's code as the
    // runtime's are: counted.
    assert_eq!(c.get("cuLaunchKernel").map(|x| x.0), Some(30), "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_renames_itself_is_stored_under_its_current_name() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("rename");
    let (lib, wl) = build(&dir.path().join("bin"));
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let launch = |n: u32| format!("call:cudaLaunchKernel:{n}:0");
    // Renamed at once; after seconds; in a forked child, seconds after the
    // fork. Each exits 300 ms after its last launch, inside that window.
    // The library is mapped 600 ms before the first call: the kernels
    // without the library hold (6.13+) would miss calls made at once.
    let (l1, l5, l2k, l3k) = (launch(1000), launch(5), launch(2000), launch(3000));
    let at_once = Workload::start(&wl, &lib, &["name:early-name", "open", "sleep:600", &l1, "sleep:300"], &cg);
    let later =
        Workload::start(&wl, &lib, &["open", "sleep:600", &l5, "sleep:2500", "name:late-name", &l2k, "sleep:300"], &cg);
    let forked = Workload::start(
        &wl,
        &lib,
        &["open", "sleep:600", &l5, "fork", "sleep:2000", "name:child-name", &l3k, "sleep:300"],
        &cg,
    );
    // A worker thread that names itself: its slow call carries its name.
    let tcall = "tcall:pt_worker_7:cudaStreamSynchronize:60000";
    let threaded = Workload::start(&wl, &lib, &["open", "sleep:600", tcall, "sleep:300"], &cg);
    let pids = [at_once.pid(), later.pid(), forked.pid(), threaded.pid()];
    at_once.wait();
    later.wait();
    threaded.wait();
    let child = forked.wait()["fork"] as u32;
    let log = agent.stop();
    let named = thread_names(&rows(dir.path(), Table::StallEvents).await, pids[3]);
    assert_eq!(named, [(false, Some("pt_worker_7".to_string()))], "(is the main thread, thread_name)\n{log}");
    let calls = rows(dir.path(), Table::CallWindows).await;
    let by = |pid| calls_by_name(&calls, pid, "cudaLaunchKernel");
    assert_eq!(by(pids[0]).get("early-name"), Some(&1000), "{:?}\n{log}", by(pids[0]));
    let later = by(pids[1]);
    assert_eq!(later.get("late-name"), Some(&2000), "{later:?}\n{log}");
    assert_eq!(later.values().sum::<u64>(), 2005, "{later:?}");
    assert_eq!(by(child).get("child-name"), Some(&3000), "{:?} {child}\n{log}", by(child));
    assert!(!by(pids[2]).contains_key("child-name"), "the parent kept its name: {:?}", by(pids[2]));
}

/// (made by the main thread, thread_name) of each outlier call of `pid`.
fn thread_names(stalls: &[arrow::array::RecordBatch], pid: u32) -> Vec<(bool, Option<String>)> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::UInt32Type;
    let mut out = Vec::new();
    for b in stalls {
        let p = b.column_by_name("pid").unwrap().as_primitive::<UInt32Type>();
        let t = b.column_by_name("tid").unwrap().as_primitive::<UInt32Type>();
        let n = b.column_by_name("thread_name").unwrap().as_string::<i32>();
        let r = b.column_by_name("reason").unwrap().as_string::<i32>();
        let name = |i: usize| (!n.is_null(i)).then(|| n.value(i).to_string());
        let calls = (0..b.num_rows()).filter(|&i| p.value(i) == pid && r.value(i) == "threshold");
        out.extend(calls.map(|i| (t.value(i) == pid, name(i))));
    }
    out
}

/// Durations (ns) of one op's stall events of one pid.
fn stall_durations(stalls: &[arrow::array::RecordBatch], pid: u32, op: &str) -> Vec<u64> {
    use arrow::array::AsArray;
    use arrow::datatypes::{UInt32Type, UInt64Type};
    let mut out = Vec::new();
    for b in stalls {
        let p = b.column_by_name("pid").unwrap().as_primitive::<UInt32Type>();
        let o = b.column_by_name("op").unwrap().as_string::<i32>();
        let d = b.column_by_name("duration_ns").unwrap().as_primitive::<UInt64Type>();
        out.extend((0..b.num_rows()).filter(|&i| p.value(i) == pid && o.value(i) == op).map(|i| d.value(i)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_slow_call_of_every_process_is_caught_whichever_started_first() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("outliers");
    let (lib, wl) = build(&dir.path().join("bin"));
    // Default outlier flags: 10 x the process's own median, at least 1 ms.
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    // Each: 200 fast syncs (200 us), 16 slow ones (60 ms), 100 fast again.
    // Under qemu's emulation (the VM matrix) a fast sync took up to 15 ms
    // and ~2 ms at the median: 60 ms stays above 10 x that median.
    let steps = ["open", "sleep:600", "call:cudaStreamSynchronize:200:200", "call:cudaStreamSynchronize:16:60000"];
    let steps = [&steps[..], &["call:cudaStreamSynchronize:100:200", "sleep:300"]].concat();
    let first = Workload::start(&wl, &lib, &steps, &cg);
    // A process whose few syncs take 700 ms: once it lifted a node-wide
    // median above everyone's slow calls for minutes.
    let noisy =
        Workload::start(&wl, &lib, &["open", "sleep:300", "call:cudaStreamSynchronize:3:700000", "sleep:300"], &cg);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (second, third) = (Workload::start(&wl, &lib, &steps, &cg), Workload::start(&wl, &lib, &steps, &cg));
    let pids = [first.pid(), second.pid(), third.pid()];
    let npid = noisy.pid();
    for w in [first, noisy, second, third] {
        w.wait();
    }
    let log = agent.stop();
    let stalls = rows(dir.path(), Table::StallEvents).await;
    for pid in pids {
        let d = stall_durations(&stalls, pid, "cudaStreamSynchronize");
        // A fast call may cross 1 ms on a loaded machine; none takes 50 ms.
        let slow = d.iter().filter(|&&ns| ns >= 50_000_000).count();
        assert_eq!(slow, 16, "pid {pid}: {d:?}\n{log}");
    }
    assert_eq!(stall_durations(&stalls, npid, "cudaStreamSynchronize").len(), 3, "{log}");
}
