// SPDX-License-Identifier: Apache-2.0
//! Probe overhead on this machine (root): ns per call with no probe, with a
//! bare empty uprobe, and with Ingero's probes; paced workload slowdown at
//! 10k and 100k launches/s; agent CPU and peak RSS.
//!
//! `sudo cargo bench -p ingero-node --bench overhead`

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeScope};
use ingero_agent::probes::libs::Found;
use ingero_agent::probes::load::Probes;
use ingero_agent::probes::ops::Lib;

fn native() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/native")
}

fn cc(args: &[&str]) {
    assert!(Command::new("cc").args(args).status().unwrap().success(), "cc {args:?}");
}

fn run(bin: &Path, lib: &Path, sym: &str, n: u64, work_us: Option<f64>) -> f64 {
    let mut c = Command::new(bin);
    c.arg(lib).arg(sym).arg(n.to_string());
    if let Some(w) = work_us {
        c.arg(w.to_string());
    }
    let out = c.output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("overhead bench needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (lib, bench) = build(dir.path());
    // NVIDIA's real libcudart when installed (pip nvidia-cuda-runtime-cu12):
    // the per-call figures are taken on it; the paced runs use the test library.
    let measured = real_cudart().unwrap_or_else(|| lib.clone());
    println!("per-call library: {}", measured.display());
    let probes = per_call(&bench, &measured);
    paced(probes, &bench, &lib);
    agent_process(&dir.path().join("agent"), &bench, &lib);
}

/// The test libcudart and the call benchmark, compiled into `dir`.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let lib = dir.join("libcudart.so.12");
    let bench = dir.join("callbench");
    let src = native();
    cc(&[
        "-shared",
        "-fPIC",
        // -O0: every function starts with `push %rbp` like NVIDIA's
        // libcudart, the kind of first instruction a uprobe emulates cheaply.
        "-O0",
        "-fcf-protection=none",
        "-o",
        lib.to_str().unwrap(),
        src.join("fakecuda.c").to_str().unwrap(),
    ]);
    cc(&["-O2", "-o", bench.to_str().unwrap(), src.join("callbench.c").to_str().unwrap(), "-ldl"]);
    (lib, bench)
}

fn real_cudart() -> Option<PathBuf> {
    Command::new("python3")
        .args(["-c", "import nvidia.cuda_runtime as m; print(list(m.__path__)[0])"])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("lib/libcudart.so.12"))
        .filter(|p| p.exists())
}

/// ns per call: no probe, a bare uprobe, Ingero's probes, and Ingero's with
/// every sync an outlier. Returns the loaded probes.
fn per_call(bench: &Path, measured: &Path) -> Probes {
    let n = 2_000_000;
    let per_call = |sym: &str| median((0..5).map(|_| run(bench, measured, sym, n, None)).collect());

    let none_launch = per_call("cudaLaunchKernel");
    let none_sync = per_call("cudaStreamSynchronize");

    let mut probes = Probes::load().expect("loading probes (root, BTF)");
    // A bare uprobe on the same function: the floor any uprobe pays here.
    let bare_launch = {
        let p: &mut UProbe = probes.ebpf.program_mut("bare_uprobe").unwrap().try_into().unwrap();
        p.load().unwrap();
        let link =
            p.attach(UProbeAttachLocation::Symbol("cudaLaunchKernel"), measured, UProbeScope::AllProcesses).unwrap();
        let v = per_call("cudaLaunchKernel");
        p.detach(link).unwrap();
        v
    };
    probes.attach_found(&Found::at_path(measured, Lib::Cudart)).unwrap();
    let ingero_launch = per_call("cudaLaunchKernel");
    let ingero_sync = per_call("cudaStreamSynchronize");
    // Every sync an outlier: the stack capture (native frames; Python
    // frames are walked only for registered interpreters) on every call.
    let set_thresholds = |probes: &mut Probes, ns: u64| {
        let mut t: aya::maps::Array<&mut aya::maps::MapData, u64> =
            ingero_agent::probes::load::map(&mut probes.ebpf, "thresholds").unwrap();
        for op in 0..256 {
            t.set(op, ns, 0).unwrap();
        }
    };
    set_thresholds(&mut probes, 1);
    let outlier_sync = per_call("cudaStreamSynchronize");
    set_thresholds(&mut probes, 0);
    println!("per call (median of 5 x {n} calls, same run):");
    println!(
        "  cudaLaunchKernel      no probe {none_launch:>7.1} ns | bare uprobe {bare_launch:>7.1} ns | ingero {ingero_launch:>7.1} ns | ingero/bare = {:.3}x",
        ingero_launch / bare_launch
    );
    println!("  cudaStreamSynchronize no probe {none_sync:>7.1} ns | ingero entry+return {ingero_sync:>7.1} ns");
    println!(
        "  cudaStreamSynchronize as an outlier (stack captured, event sent or counted dropped) {outlier_sync:>7.1} ns: +{:.1} ns per captured stack",
        outlier_sync - ingero_sync
    );
    probes
}

/// Paced workloads: each launch follows `work` µs of host work.
fn paced(mut probes: Probes, bench: &Path, lib: &Path) {
    for (rate, work, steps) in [(10_000u64, 100.0, 30_000u64), (100_000, 10.0, 200_000)] {
        drop(std::mem::replace(&mut probes, Probes::load().unwrap()));
        // Unprobed first (fresh Probes has no library attached), then probed.
        let off = median((0..3).map(|_| run(bench, lib, "cudaLaunchKernel", steps, Some(work))).collect());
        probes.attach_found(&Found::at_path(lib, Lib::Cudart)).unwrap();
        let on = median((0..3).map(|_| run(bench, lib, "cudaLaunchKernel", steps, Some(work))).collect());
        println!(
            "  paced ~{rate}/s: {steps} launches in {off:.3} s without, {on:.3} s with probes: {:+.2}% slowdown",
            (on / off - 1.0) * 100.0
        );
    }
}

/// The agent process itself under a 100k launches/s workload for ~5 s.
fn agent_process(agent_dir: &Path, bench: &Path, lib: &Path) {
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target");
    let agent_bin = ["release", "debug"].iter().map(|p| target.join(p).join("ingero-agent")).find(|p| p.exists());
    let Some(agent_bin) = agent_bin else {
        println!("  (build ingero-agent to measure the agent process)");
        return;
    };
    println!("  agent binary: {}", agent_bin.display());
    for (mode, target) in [
        ("--aggregator, aggregator unreachable (agent alone, spooling)", "--aggregator=http://127.0.0.1:9".to_string()),
        (
            "--store (embedded aggregator writing Parquet)",
            format!("--store=file://{}", agent_dir.join("data").display()),
        ),
    ] {
        let spool = agent_dir.join(format!("spool-{}", target.len()));
        let mut agent = Command::new(&agent_bin)
            .args(["run", &target, &format!("--spool-dir={}", spool.display()), "--rescan=200ms"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let t = Instant::now();
        run(bench, lib, "cudaLaunchKernel", 500_000, Some(10.0));
        let pid = agent.id();
        let (hwm, ticks) = (peak_rss(pid), cpu_ticks(pid));
        let total = t.elapsed().as_secs_f64() + 2.0;
        println!(
            "  agent {mode}: peak RSS {hwm}, CPU {:.2} s over {total:.1} s ({:.1}% of one core) at ~100k launches/s",
            ticks / 100.0,
            ticks / 100.0 / total * 100.0
        );
        // SAFETY: kill takes any pid; ours is a child we have not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let _ = agent.wait();
    }
}

/// VmHWM from /proc/PID/status, as written there ("123456 kB").
fn peak_rss(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("VmHWM: ?")
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>()
        .join(" ")
}

/// User + system CPU ticks from /proc/PID/stat.
fn cpu_ticks(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
}
