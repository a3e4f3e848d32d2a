// SPDX-License-Identifier: Apache-2.0
//! The agent must not change what a traced program sees. A library that
//! loads plugins by bare name through its own RUNPATH (XLA's CUDA loader,
//! PyTorch's libtorch_cuda_linalg) must keep working with the agent at its
//! default flags, and a CUDA library loaded that way and called at once is
//! still counted from its first call (the hold at its first dlsym: once for
//! a new library file, once for a process the agent has not scanned).

mod fixtures;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fixtures::*;
use ingero_model::Table;

fn cc(args: &[&str], out: &Path, src: &str) {
    fixtures::cc(&[args, &["-o"]].concat(), out, src, &["-ldl"]);
}

/// loader/libloader.so (RUNPATH $ORIGIN/plugins), loader/plugins/{libplugin.so,
/// libcudart.so.12 (NVIDIA's)} and the main program; returns (main, loader).
fn build_runpath(dir: &Path, cudart: &Path) -> (PathBuf, PathBuf) {
    let plugins = dir.join("loader/plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let loader = dir.join("loader/libloader.so");
    cc(&["-shared", "-fPIC", "-O1", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/plugins"], &loader, "runpath_loader.c");
    cc(&["-shared", "-fPIC", "-O1"], &plugins.join("libplugin.so"), "runpath_plugin.c");
    // A copy: its own inode, so no other test has probed it already.
    std::fs::copy(cudart, plugins.join("libcudart.so.12")).unwrap();
    let main = dir.join("runpath_main");
    cc(&["-O1"], &main, "runpath_main.c");
    (main, loader)
}

fn run_in(cg: &Cgroup, main: &Path, args: &[&str]) -> (bool, String, u32) {
    let mut child = ingero_sim::child::dies_with_test(&mut Command::new(main))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    cg.add(pid);
    child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text, pid)
}

/// Runs `main` (loading libcudart.so.12 through the loader's RUNPATH, no
/// calls) and keeps it alive until the agent says it attached that file.
fn keep_mapped_until_probed(cg: &Cgroup, main: &Path, loader_and_plugin: &[&str], log: &Path) {
    let mut args = loader_and_plugin.to_vec();
    args.extend(["libcudart.so.12", "-", "0"]);
    let mut child = ingero_sim::child::dies_with_test(&mut Command::new(main))
        .args(&args)
        .env("RUNPATH_MAIN_LINGER", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    cg.add(child.id());
    child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    // The agent's rescan (100 ms here) finds it; emulation is 10-50x slower.
    wait_log(log, "plugins/libcudart.so.12 probes=", Duration::from_secs(60));
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "the process keeping libcudart.so.12 mapped failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_found_through_their_loaders_runpath_load_and_are_counted_from_the_first_call() {
    if !can_trace() {
        return;
    }
    let Some(cudart) = real_libcudart() else {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "pip install nvidia-cuda-runtime-cu12 (.ci/run does)"
        );
        eprintln!("SKIP: nvidia-cuda-runtime-cu12 not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cg = Cgroup::new(&format!("ingero-test-runpath-{}", std::process::id()));
    let (main, loader) = build_runpath(dir.path(), &cudart);
    let loader = loader.display().to_string();
    let args = [loader.as_str(), "libplugin.so", "plugin_hello", "3", "libcudart.so.12", "cudaLaunchKernel", "2500"];
    // Without the agent: the baseline the agent must not change.
    let (ok, text, _) = run_in(&cg, &main, &args);
    assert!(ok, "fails even without the agent: {text}");

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent_args = store_args(dir.path(), &cg);
    agent_args.push(format!("--metrics-addr={addr}"));
    let agent = Agent::start(&agent_args, &dir.path().join("agent.log"));
    let t = Instant::now();
    let (ok, text, pid) = run_in(&cg, &main, &args);
    let took = t.elapsed();
    // Counters are read once per window (1 s).
    std::thread::sleep(Duration::from_millis(2200));
    let holds = metric(&addr, "ingero_agent_library_holds_total");
    let timeouts = metric(&addr, "ingero_agent_library_hold_timeouts_total");
    let held_us = metric(&addr, "ingero_agent_library_hold_microseconds_total");
    eprintln!("holds {holds}, held {held_us} µs in all, timed out {timeouts}");
    let hold = kernel_has_library_hold();
    if !hold {
        // No hold: the first process may have ended before any scan saw
        // it map the library (its loss, stated). What such a kernel does
        // promise is a process that maps an already probed file, so one
        // that keeps it mapped makes sure the agent has probed it.
        keep_mapped_until_probed(&cg, &main, &args[..4], &dir.path().join("agent.log"));
    }
    // Again: the file is probed now.
    let (ok2, text2, pid2) = run_in(&cg, &main, &args);
    std::thread::sleep(Duration::from_millis(2200));
    let holds_after = metric(&addr, "ingero_agent_library_holds_total");
    let log = agent.stop();
    assert!(ok2, "second run: {text2}");
    assert!(ok, "a RUNPATH plugin load failed with the agent on: {text}\n{log}");
    assert!(text.contains("loaded libplugin.so") && text.contains("loaded libcudart.so.12"), "{text}");
    let c = calls_of(&rows(dir.path(), Table::CallWindows).await, pid);
    let c2 = calls_of(&rows(dir.path(), Table::CallWindows).await, pid2);
    if hold_turned_off(&log) {
        // A kernel where the held thread delays uprobe registration: the one
        // hold ran out, the agent said so and holds no more; the first
        // process may lose launches, never gains any; the second is exact.
        assert_eq!((holds, holds_after, timeouts), (1, 1, 1), "{log}");
        assert!(c.get("cudaLaunchKernel").is_none_or(|x| x.0 <= 2500), "{c:?}");
        assert_eq!(c2.get("cudaLaunchKernel").map(|x| x.0), Some(2500), "{c2:?}\n{log}");
        return;
    }
    if !hold {
        // No hold on this kernel (Linux < 5.19): nobody waits, the first
        // process may lose launches made before the agent attached (the
        // stated loss), and a process mapping the probed file is exact.
        assert_eq!((holds, holds_after, timeouts), (0, 0, 0), "{log}");
        assert!(c.get("cudaLaunchKernel").is_none_or(|x| x.0 <= 2500), "{c:?}");
        assert_eq!(c2.get("cudaLaunchKernel").map(|x| x.0), Some(2500), "{c2:?}\n{log}");
        return;
    }
    assert_eq!(
        c.get("cudaLaunchKernel").map(|x| x.0),
        Some(2500),
        "launches right after the load (holds {holds}, timed out {timeouts}): {c:?}\n{log}"
    );
    // One hold, for the one new library file, well inside its 1 s bound
    // (10 s under emulation: fixtures::store_args).
    assert!(emulated() || took < Duration::from_secs(5), "the program took {took:?}");
    assert_eq!((holds, timeouts), (1, 0), "one hold for one new library file, released by the agent\n{log}");
    // Released once probed, in a fraction of the bound: the held thread
    // yields its CPU, so the agent is not kept from running (BENCHMARKS.md).
    assert!(emulated() || held_us < 250_000, "held {held_us} µs\n{log}");
    // A new process waits at most once, for its first scan (its interpreter
    // found before its first calls), not for the file, which is probed now;
    // not at all when that scan came first (the exec event is handled while
    // the process starts).
    assert!(holds_after <= holds + 1, "once per new process, not per lookup: {holds} then {holds_after}\n{log}");
    assert_eq!(c2.get("cudaLaunchKernel").map(|x| x.0), Some(2500), "{c2:?}");
}

/// However slow the agent is to probe (here: it never releases anyone), a
/// process is held at most the hold's bound in all, not at each lookup: a
/// program that looks a CUDA library's symbols up one by one would
/// otherwise wait the whole bound at every one (seen: 6 s at a job's start
/// with three agents probing on two CPUs).
#[test]
fn a_process_is_held_at_most_the_bound_in_all_however_slow_the_agent() {
    use ingero_agent::probes::load::{Probes, Settings};
    use ingero_agent::probes::{libs, ops::Lib};
    if !can_trace() {
        return;
    }
    if !kernel_has_library_hold() {
        eprintln!(
            "SKIP: this kernel runs no library hold (its stated loss: first calls of a library loaded at run time)"
        );
        return;
    }
    const BOUND: Duration = Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let cg = Cgroup::new(&format!("ingero-test-hold-budget-{}", std::process::id()));
    let (lib, _) = build(&dir.path().join("bin"));
    let main = dir.path().join("dlsym_repeat");
    cc(&["-O1"], &main, "dlsym_repeat.c");

    let settings = Settings { cgroup_root: Some(cg.0.clone()), hold_max: BOUND, ..Settings::default() };
    let features = ingero_agent::probes::features::Features::probe().expect("loading the feature probes");
    let mut probes = Probes::load_with(features, &settings).expect("loading the probes");
    let libc = libs::well_known(&[]).into_iter().find(|f| f.lib == Lib::Libc).expect("glibc's libc.so.6");
    probes.attach_found(&libc).expect("probing libc's dlsym");

    const LOOKUPS: usize = 8;
    let (ok, text, _) = run_in(&cg, &main, &[lib.to_str().unwrap(), "cudaLaunchKernel", &LOOKUPS.to_string()]);
    assert!(ok, "dlsym_repeat failed: {text}");
    let took: Vec<Duration> = text.lines().map(|l| Duration::from_micros(l.trim().parse().unwrap())).collect();
    assert_eq!(took.len(), LOOKUPS, "{text}");
    let total: Duration = took.iter().sum();
    eprintln!("lookups took {took:?} (total {total:?}, bound {BOUND:?})");
    // Held: nobody released the first lookup, so it ran out its bound...
    assert!(took[0] >= BOUND.mul_f64(0.9), "the first lookup was not held: {took:?}");
    // ...and the process's later lookups had no bound left (without the
    // per-process budget: {LOOKUPS} x {BOUND}).
    assert!(total < BOUND * 2, "held {total:?} in all, bound {BOUND:?}: {took:?}");
}

/// The JIT's prologue that points r9 at a per-CPU private stack on x86-64
/// (`add r9, gs:[this_cpu_off]`, arch/x86/net/bpf_jit_comp.c).
const PRIVATE_STACK_PROLOGUE: [u8; 5] = [0x65, 0x4c, 0x03, 0x0c, 0x25];

/// The JIT'd image of a loaded program (BPF_OBJ_GET_INFO_BY_FD).
fn jited(id: u32) -> Vec<u8> {
    // SAFETY: the attr buffer outlives the call, and every pointer placed in
    // it points at a live buffer of the length stated beside it.
    let sys = |cmd: libc::c_long, attr: &mut [u64; 16]| unsafe {
        libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr))
    };
    let mut attr = [0u64; 16];
    attr[0] = u64::from(id);
    let fd = sys(13, &mut attr); // BPF_PROG_GET_FD_BY_ID
    assert!(fd >= 0, "program {id}: {}", std::io::Error::last_os_error());
    // struct bpf_prog_info: jited_prog_len at byte 16, jited_prog_insns at 24.
    let mut info = [0u64; 32];
    let get = |info: &mut [u64; 32]| {
        let mut a = [0u64; 16];
        a[0] = fd as u64 | (std::mem::size_of_val(info) as u64) << 32;
        a[1] = info.as_mut_ptr() as u64;
        assert_eq!(sys(15, &mut a), 0, "{}", std::io::Error::last_os_error()); // BPF_OBJ_GET_INFO_BY_FD
    };
    get(&mut info);
    let len = (info[2] & 0xffff_ffff) as usize;
    let mut image = vec![0u8; len];
    info = [0u64; 32];
    info[2] = len as u64;
    info[3] = image.as_mut_ptr() as u64;
    get(&mut info);
    // SAFETY: fd is the descriptor opened above, closed once.
    unsafe { libc::close(fd as i32) };
    image
}

#[cfg(target_arch = "x86_64")]
#[test]
fn no_program_a_workload_runs_uses_a_per_cpu_private_stack() {
    // Linux 6.13+ gives a program with a 64+ byte frame a per-CPU stack;
    // a uprobe program can be preempted (and the hold yields), and a second
    // run on that CPU would then overwrite the first one's frame.
    if !can_trace() {
        return;
    }
    let _probes = ingero_agent::probes::load::Probes::load().expect("loading the probes");
    let uses_private = |id: u32| jited(id).windows(5).any(|w| w == PRIVATE_STACK_PROLOGUE);
    let mut seen = std::collections::BTreeMap::new();
    for p in aya::programs::loaded_programs().flatten() {
        // The compat object (before 5.17) names its programs call_entry_<op>.
        let name = p.name_as_str().unwrap_or("").trim_end_matches(|c: char| c.is_ascii_digit() || c == '_');
        if ["call_entry", "call_return", "dlsym_entry", "dlsym_notify", "on_switch"].contains(&name) {
            seen.entry(name.to_string()).or_insert_with(Vec::new).push(uses_private(p.id()));
        }
    }
    eprintln!("programs on a private stack: {seen:?}");
    // The compat object loads its call programs at attach; it runs where
    // no kernel gives private stacks (before 5.17).
    use ingero_agent::probes::features::{Features, Object};
    let full = Features::probe().unwrap().object() == Object::Full;
    let calls = full.then_some(["call_entry", "call_return"]).into_iter().flatten();
    // The lookup notice is loaded on every kernel (the hold's stand-in).
    let lookups = kernel_has_library_hold().then_some("dlsym_entry").into_iter().chain(["dlsym_notify"]);
    for name in calls.chain(lookups) {
        let runs = seen.get(name).unwrap_or_else(|| panic!("{name} not loaded: {seen:?}"));
        assert!(runs.iter().all(|p| !p), "{name} runs on a private stack");
    }
    // The check sees one where the kernel gives them: the scheduler
    // tracepoint (160-byte frame, the kernel's own recursion guard).
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let v: Vec<u32> = release.split(|c: char| !c.is_ascii_digit()).take(2).map(|p| p.parse().unwrap_or(0)).collect();
    if (v[0], v[1]) >= (6, 13) {
        assert!(seen["on_switch"].iter().any(|p| *p), "on_switch shows no private stack on {release}");
    }
}
