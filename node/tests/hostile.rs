// SPDX-License-Identifier: Apache-2.0
//! A pod is hostile input. Its executable's headers claim 200 MiB of
//! symbols (sparse, so the claim is in bounds). Its process maps the CUDA
//! libraries, then changes its root: every path in its /proc/PID/maps now
//! names what the pod chose: a FIFO where libcudart and the executable
//! were, a symlink pointing out of its root where the driver was,
//! truncated ELF headers for libc and a directory for the loader. The
//! agent must keep tracing it exactly (probes go in, and symbols are read,
//! through /proc/PID/map_files: the mapped file itself, never what the
//! path names now), catch every slow call, stay healthy, and neither block,
//! leak fds nor grow its memory.

mod fixtures;

use std::path::Path;
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray};
use arrow::datatypes::UInt32Type;
use fixtures::*;
use ingero_model::Table;

/// Outlier syncs the workload makes after it changed its root.
const ROUNDS: u64 = 40;
const LAUNCHES_PER_ROUND: u64 = 50;

fn agent_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The agent's peak RSS: a table read whole and freed at once shows here.
fn agent_peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `path` (absolute, as the host sees it) under the pod's new `root`.
fn in_root(root: &Path, path: &Path) -> std::path::PathBuf {
    let p = root.join(path.strip_prefix("/").unwrap());
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    p
}

/// A copy of an ELF file whose symbol table header claims 200 MiB, made
/// sparse to that size so the claim is in bounds.
fn claims_huge_symbols(from: &Path, to: &Path) {
    let mut b = std::fs::read(from).unwrap();
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as usize;
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap()) as usize;
    let (shoff, size, n) = (u64_at(&b, 0x28), u16_at(&b, 0x3a), u16_at(&b, 0x3c));
    let tables: Vec<usize> = (0..n)
        .map(|i| shoff + i * size)
        .filter(|&h| matches!(u32::from_le_bytes(b[h + 4..h + 8].try_into().unwrap()), 2 | 11))
        .collect();
    assert!(!tables.is_empty(), "{} has no symbol table", from.display());
    for h in tables {
        b[h + 32..h + 40].copy_from_slice(&(200u64 << 20).to_le_bytes());
    }
    std::fs::write(to, &b).unwrap();
    std::fs::OpenOptions::new().write(true).open(to).unwrap().set_len(1 << 30).unwrap();
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// The pod's new root: each path its process mapped is something hostile.
fn hostile_root(root: &Path, lib: &Path, exe: &Path) {
    mkfifo(&in_root(root, lib));
    mkfifo(&in_root(root, exe));
    let driver = lib.with_file_name("libcuda.so.1");
    std::os::unix::fs::symlink("/../../../../../../../etc/passwd", in_root(root, &driver)).unwrap();
    // The system libraries it maps (libc, the loader: this test maps the
    // same): truncated ELF headers, or a directory where the loader was.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libs =
        maps.lines().filter_map(|l| l.split_whitespace().nth(5)).filter(|p| p.starts_with('/') && p.contains(".so"));
    for path in libs {
        let p = in_root(root, Path::new(path));
        // Not `exists()`: it follows the symlink above, and writing through
        // it would write the host's /etc/passwd.
        if p.symlink_metadata().is_ok() {
            continue;
        }
        if path.contains("ld-linux") {
            std::fs::create_dir_all(&p).unwrap();
        } else {
            let mut head = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(path).unwrap(), 100), &mut head)
                .unwrap();
            std::fs::write(&p, head).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_pod_cannot_block_blind_or_bloat_the_agent() {
    if !can_trace() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cg = Cgroup::new(&format!("ingero-test-hostile-{}", std::process::id()));
    let (lib, wl) = build(&dir.path().join("bin"));
    let exe = dir.path().join("bin").join("wl-claims");
    claims_huge_symbols(&wl, &exe);
    let root = dir.path().join("pod-root");
    hostile_root(&root, &lib, &exe);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = store_args(dir.path(), &cg);
    args.extend([format!("--metrics-addr={addr}"), "--outlier-abs=30ms".into(), "--watchdog=2s".into()]);
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    let apid = agent.child.id();

    let chroot = format!("chroot:{}", root.display());
    let (repeat, launches) = (format!("repeat:{ROUNDS}"), format!("call:cudaLaunchKernel:{LAUNCHES_PER_ROUND}:0"));
    // The first launch loads the libraries (held until probed); the root
    // changes once the agent has shipped a few windows (its store's writer,
    // embedded here, grows ~10 MB over its first windows: not the pod's doing).
    let steps = [
        "call:cudaLaunchKernel:1:0",
        "sleep:3500",
        &chroot,
        &repeat,
        &launches,
        "call:cudaStreamSynchronize:9:1000",
        "call:cudaStreamSynchronize:1:60000",
        "sleep:50",
    ];
    let w = Workload::start(&exe, &lib, &steps, &cg);
    let pid = w.pid();
    // Its libraries are in (the first launch made them load) before the baseline.
    agent.wait_log("libcudart.so.12 probes=", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(3000));
    let (fds0, rss0) = (agent_fds(apid), agent_peak_rss_kb(apid));
    let started = Instant::now();
    let mut health = Vec::new();
    let wait = std::thread::spawn(move || w.wait());
    while !wait.is_finished() {
        health.push(healthz(&addr));
        assert!(started.elapsed() < Duration::from_secs(60), "the workload did not finish");
        std::thread::sleep(Duration::from_millis(500));
    }
    wait.join().unwrap();
    // Two more windows, so every call made is drained and shipped.
    std::thread::sleep(Duration::from_millis(2500));
    let (fds1, rss1) = (agent_fds(apid), agent_peak_rss_kb(apid));
    health.push(healthz(&addr));
    let log = agent.stop();
    eprintln!("agent fds {fds0} → {fds1}, peak RSS {rss0} → {rss1} kB");

    assert!(!log.contains("panicked"), "{log}");
    assert!(health.iter().all(|h| h.starts_with("HTTP/1.1 200") || h.starts_with("HTTP/1.0 200")), "{health:?}");
    assert!(fds1 <= fds0 + 4, "agent fds {fds0} → {fds1}");
    // A sparse claim read as stated would cost 200 MiB at once. The same run
    // without the hostile root raises the peak ~18 MB (the embedded store's
    // writer, stacks of the slow calls): the bound leaves room for that only.
    assert!(rss1 <= rss0 + 64 * 1024, "agent peak RSS {rss0} → {rss1} kB");

    let calls = calls_of(&rows(dir.path(), Table::CallWindows).await, pid);
    let count = |op: &str| calls.get(op).map_or(0, |c| c.0);
    assert_eq!(count("cudaLaunchKernel"), 1 + ROUNDS * LAUNCHES_PER_ROUND, "{calls:?}");
    assert_eq!(count("cudaStreamSynchronize"), ROUNDS * 10, "{calls:?}");
    let stalls: usize = rows(dir.path(), Table::StallEvents)
        .await
        .iter()
        .map(|b| {
            let p = b.column_by_name("pid").unwrap().as_primitive::<UInt32Type>();
            let r = b.column_by_name("reason").unwrap().as_string::<i32>();
            // Outlier calls (its sleeps between rounds ship as off-CPU episodes).
            (0..b.num_rows()).filter(|&i| !p.is_null(i) && p.value(i) == pid && r.value(i) == "threshold").count()
        })
        .sum();
    assert_eq!(stalls as u64, ROUNDS, "every 60 ms sync is a stall event, its frames resolved or not");

    // Their native frames in the executable were looked up in the file it
    // runs (it claims 200 MiB of symbols): file and offset, no name.
    let exe_path = exe.display().to_string();
    let mut in_exe = Vec::new();
    for b in rows(dir.path(), Table::Stacks).await {
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        let (kind, file, function, offset) = (col("kind"), col("file"), col("function"), col("offset"));
        for i in 0..b.num_rows() {
            if kind.as_string::<i32>().value(i) == "native" && file.as_string::<i32>().value(i) == exe_path {
                in_exe.push((function.as_string::<i32>().value(i).to_string(), !offset.is_null(i)));
            }
        }
    }
    assert!(!in_exe.is_empty(), "no native frame in {exe_path}");
    assert!(in_exe.iter().all(|(f, off)| f.is_empty() && *off), "names from a file claiming 200 MiB: {in_exe:?}");
}
