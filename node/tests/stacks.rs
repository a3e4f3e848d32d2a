// SPDX-License-Identifier: Apache-2.0
//! Call sites of outlier calls against real interpreters: CPython 3.9–3.13
//! (pyenv) calling the CUDA-named test library through ctypes, from known
//! functions and lines, nested and from several threads; a C program gets
//! native frames only; a process that exits at once keeps its call site.

mod fixtures;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use arrow::array::RecordBatch;
use fixtures::sites::{PyFrames, python, rows_of};
use fixtures::*;
use ingero_model::Table;

const VERSIONS: [&str; 5] = ["3.9", "3.10", "3.11", "3.12", "3.13"];

/// The training script: every call site's line is marked `# site:NAME`.
/// The library is loaded once the process is in the traced cgroup, as a
/// pod's process is from its start: the agent sees the dlopen.
const SCRIPT: &str = r#"import ctypes, sys, threading
sys.stdin.read(1)
lib = ctypes.CDLL(sys.argv[1])

def sync(us):
    lib.cudaStreamSynchronize(ctypes.c_long(us))  # site:sync

class Trainer:
    def step(self):
        sync(30000)  # site:step
        lib.cudaDeviceSynchronize(ctypes.c_long(25000))  # site:device
        lib.cudaDeviceSynchronize(ctypes.c_long(10))  # site:fast

def loader():
    for _ in range(2):
        lib.cudaMemcpy(ctypes.c_long(20000))  # site:loader

threads = [threading.Thread(target=loader) for _ in range(3)]
for t in threads:
    t.start()
for _ in range(2):
    Trainer().step()  # site:main
for t in threads:
    t.join()
"#;

fn site_line(name: &str) -> u32 {
    site(name)
}

fn site(name: &str) -> u32 {
    let tag = format!("# site:{name}");
    SCRIPT.lines().position(|l| l.ends_with(&tag)).unwrap() as u32 + 1
}

/// (op, python frames innermost first as (file, function, line), native frame count) per stall of `pid`.
type Site = (String, Vec<(String, String, Option<u32>)>, usize);

fn stalls_of(stalls: &[RecordBatch], stacks: &[RecordBatch], pid: u32) -> Vec<Site> {
    rows_of(stalls, stacks, pid, "threshold").into_iter().map(|(op, py, native, _)| (op, py, native)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_call_sites_in_every_version_and_native_frames_elsewhere() {
    if !can_trace() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cg = Cgroup::new(&format!("ingero-test-stacks-{}", std::process::id()));
    let (lib, wl) = build(&dir.path().join("bin"));
    let script = dir.path().join("train.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let mut args = store_args(dir.path(), &cg);
    args.push("--outlier-abs=8ms".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    args.push(format!("--metrics-addr={addr}"));
    // Probed before any workload starts (the hold at a process's first
    // lookup then only has the interpreter to find).
    args.push(format!("--lib={}", lib.display()));
    let agent = Agent::start(&args, &dir.path().join("agent.log"));
    agent.wait_log(&format!("library={}", lib.display()), std::time::Duration::from_secs(10));
    // One after another: a thread held at its first lookup spins in the kernel
    // until released; six held at once leave the agent little of two cores
    // and its releases lag (each process's first calls would run unwalked).
    let pythons: Vec<(&str, Workload)> = VERSIONS
        .iter()
        .map(|v| {
            let mut cmd = Command::new(python(v));
            cmd.arg(&script);
            let w = Workload::start_with(cmd, &lib, &[], &cg);
            agent.wait_log(&format!("Python frames on pid={}", w.pid()), std::time::Duration::from_secs(10));
            (*v, w)
        })
        .collect();
    // A C program: native frames only.
    let c = Workload::start(&wl, &lib, &["open", "call:cudaStreamSynchronize:2:15000", "sleep:300"], &cg);
    // Stalls in its last statement and exits within microseconds (its code
    // object and memory gone before any reader could get to them): its
    // window still ships, with the line of its call.
    // In every version: the line comes from the kernel's copy of the code object.
    let quick: Vec<Workload> = VERSIONS
        .iter()
        .map(|v| {
            let mut cmd = Command::new(python(v));
            cmd.arg("-c").arg(
                "import ctypes,os,sys; sys.stdin.read(1); l=ctypes.CDLL(sys.argv[1])\nl.cudaMemcpy(ctypes.c_long(15000)); os._exit(0)",
            );
            let w = Workload::start_with(cmd, &lib, &[], &cg);
            agent.wait_log(&format!("Python frames on pid={}", w.pid()), std::time::Duration::from_secs(10));
            w
        })
        .collect();
    let pids: Vec<(&str, u32)> = pythons.iter().map(|(v, w)| (*v, w.pid())).collect();
    let cpid = c.pid();
    let qpids: Vec<u32> = quick.iter().map(|w| w.pid()).collect();
    let py312 = pids.iter().find(|p| p.0 == "3.12").unwrap().1;
    for (_, w) in pythons {
        w.wait();
    }
    c.wait();
    for w in quick {
        w.wait();
    }
    // Walks a failed read cut short (a page not resident: the probe cannot
    // fault it in): each may take a stall's Python frames, and the agent
    // says so. Only that many stalls may ship short.
    let mut cut = metric_settled(&addr, "ingero_agent_python_stacks_cut_total");
    eprintln!("Python call sites cut short: {cut}");
    let mut short = |py: &PyFrames, want: usize| {
        let ok = py.len() < want && cut > 0;
        cut -= ok as u64;
        ok
    };
    let log = agent.stop();
    if std::env::var_os("INGERO_TEST_LOG").is_some() {
        eprintln!("{log}");
    }
    let stalls = rows(dir.path(), Table::StallEvents).await;
    let stacks = rows(dir.path(), Table::Stacks).await;
    let file = script.display().to_string();
    for (v, pid) in pids {
        let got = stalls_of(&stalls, &stacks, pid);
        let qual = |name: &str| {
            if v == "3.9" || v == "3.10" { name.rsplit('.').next().unwrap().to_string() } else { name.to_string() }
        };
        let at = |f: &str, s: &str| (file.clone(), qual(f), Some(site(s)));
        // Each stall names exactly the line of its call, the functions
        // around it and nothing else; every slow call is there. (The fast
        // call may cross the threshold on a loaded machine: then it too must
        // name its own line.)
        let mut at_site: BTreeMap<&str, usize> = BTreeMap::new();
        for (op, py, _) in &got {
            let main = (file.clone(), "<module>".to_string(), Some(site("main")));
            let (name, want): (&str, Vec<_>) = match op.as_str() {
                "cudaStreamSynchronize" => ("sync", vec![at("sync", "sync"), at("Trainer.step", "step"), main]),
                "cudaDeviceSynchronize" if py.first().map(|f| f.2) == Some(Some(site("fast"))) => {
                    ("fast", vec![at("Trainer.step", "fast"), main])
                }
                "cudaDeviceSynchronize" => ("device", vec![at("Trainer.step", "device"), main]),
                _ => ("loader", vec![at("loader", "loader")]),
            };
            *at_site.entry(name).or_default() += 1;
            assert_eq!(
                &py[..want.len().min(py.len())],
                &want[..py.len().min(want.len())],
                "python {v}, {op}: {py:?}\n{got:?}\n{log}"
            );
            if short(py, want.len()) {
                eprintln!("python {v}, {op}: cut short, counted: {py:?}");
            } else if op == "cudaMemcpy" {
                // A thread's stack goes on into threading.py (run, _bootstrap_inner, _bootstrap).
                assert!(py.len() > 1 && py[1..].iter().all(|f| f.0.ends_with("threading.py")), "python {v}: {py:?}");
            } else {
                assert_eq!(py.len(), want.len(), "python {v}, {op}: {py:?}");
            }
        }
        at_site.remove("fast");
        let want: BTreeMap<&str, usize> = [("device", 2), ("loader", 6), ("sync", 2)].into();
        assert_eq!(at_site, want, "python {v}: one stall per slow call\n{got:?}\n{log}");
    }
    let native = stalls_of(&stalls, &stacks, cpid);
    assert_eq!(native.len(), 2, "{native:?}\n{log}");
    assert!(native.iter().all(|(_, py, n)| py.is_empty() && *n > 0), "a C program has native frames only: {native:?}");
    for (v, qpid) in VERSIONS.iter().zip(qpids) {
        let q = stalls_of(&stalls, &stacks, qpid);
        assert_eq!(q.len(), 1, "python {v}: the stall of a process that exited at once still ships: {q:?}\n{log}");
        let last = vec![("<string>".to_string(), "<module>".to_string(), Some(2))];
        if !short(&q[0].1, 1) {
            assert_eq!(q[0].1, last, "python {v}: the call site of a process that exited at once: {q:?}\n{log}");
        }
    }
    let keep = dir.path().to_path_buf();
    if std::env::var_os("INGERO_KEEP_REPORT").is_some() {
        std::mem::forget(dir);
    }
    report_names_the_lines(&keep, py312, &file).await;
    export_draws_each_thread(&keep, py312);
}

/// `ingero export --format perfetto`, read with Perfetto's own protos: the
/// process's threads each get a track with their own outlier calls.
fn export_draws_each_thread(dir: &Path, pid: u32) {
    let ok = Command::new("python3")
        .args(["-c", "from perfetto.protos.perfetto.trace import perfetto_trace_pb2"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "CI needs PyPI perfetto (.ci/run installs it)");
        return eprintln!("SKIP: PyPI perfetto is not installed");
    }
    let (store, trace) = (format!("--store=file://{}", dir.join("data").display()), dir.join("t.pftrace"));
    ingero(&["export", "--format=perfetto", "--since=10m", &store, &format!("--out={}", trace.display())]);
    let reader = concat!(env!("CARGO_MANIFEST_DIR"), "/../cli/tests/perfetto_read.py");
    let o = Command::new("python3").arg(reader).arg(&trace).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tracks: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let in_process = |t: &&serde_json::Value| t["path"][1].as_str().is_some_and(|p| p.contains(&format!(" {pid}")));
    let threads: Vec<&serde_json::Value> = tracks
        .iter()
        .filter(in_process)
        .filter(|t| t["path"].as_array().unwrap().len() == 3 && t["path"][2].as_str().unwrap().starts_with("thread "))
        .collect();
    let runtime_calls = |t: &serde_json::Value| -> Vec<(String, u64)> {
        let s = t["slices"].as_array().unwrap().iter().filter(|s| s["depth"] == 0 && s["categories"][0] == "cudart");
        s.map(|s| (s["name"].as_str().unwrap().to_string(), s["dur"].as_u64().unwrap())).collect()
    };
    let main = threads.iter().find(|t| t["path"][2].as_str().unwrap().ends_with("(main)")).expect("no main thread");
    let main_calls = runtime_calls(main);
    let syncs = main_calls.iter().filter(|(op, d)| op == "cudaStreamSynchronize" && *d >= 30_000_000).count();
    assert_eq!(syncs, 2, "the main thread's two 30 ms syncs: {main_calls:?}");
    let loaders: Vec<Vec<(String, u64)>> = threads
        .iter()
        .filter(|t| !t["path"][2].as_str().unwrap().ends_with("(main)"))
        .map(|t| runtime_calls(t))
        .collect();
    assert_eq!(loaders.len(), 3, "one track per loader thread: {loaders:?}");
    for l in &loaders {
        assert_eq!(l.len(), 2, "each loader thread made two slow copies: {l:?}");
        assert!(l.iter().all(|(op, d)| op == "cudaMemcpy" && *d >= 20_000_000), "{l:?}");
    }
    let with_stack =
        threads.iter().flat_map(|t| t["slices"].as_array().unwrap()).filter(|s| s["args"]["stack_id"].is_string());
    assert!(with_stack.count() >= 10, "outlier calls carry their stack id");
    assert!(
        tracks
            .iter()
            .filter(in_process)
            .any(|t| t["counter_unit"] == "threads" && !t["counters"].as_array().unwrap().is_empty())
    );
}

/// The `ingero` CLI, built with the workspace next to the agent.
fn ingero(args: &[&str]) -> (String, String) {
    let bin = Path::new(env!("CARGO_BIN_EXE_ingero-agent")).with_file_name("ingero");
    let o = Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (cargo build --workspace)", bin.display()));
    let (out, err) = (String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string());
    assert!(o.status.success(), "ingero {args:?}: {err}");
    (out, err)
}

/// `ingero report --pid N --format json|text|html`: the call sites name the lines.
async fn report_names_the_lines(dir: &Path, pid: u32, file: &str) {
    let store = format!("--store=file://{}", dir.join("data").display());
    let pid = pid.to_string();
    let (json, _) = ingero(&["report", "--pid", &pid, &store, "--since=10m", "--format=json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let sites = v["call_sites"].as_array().unwrap();
    let site = |op: &str, line: u32| {
        sites
            .iter()
            .find(|s| s["op"] == op && s["frames"][0]["line"] == line)
            .unwrap_or_else(|| panic!("no {op} at line {line}: {v:#}"))
    };
    let sync = site("cudaStreamSynchronize", site_line("sync"));
    assert_eq!(sync["count"], 2);
    assert_eq!(sync["frames"][0]["file"], file);
    assert_eq!(sync["frames"][0]["function"], "sync");
    assert_eq!(sync["frames"][1]["function"], "Trainer.step");
    assert_eq!(sync["frames"][1]["line"], site_line("step"));
    assert!(sync["p99_ns"].as_u64().unwrap() >= 30_000_000, "{sync}");
    assert!(!sync["native"].as_array().unwrap().is_empty(), "native frames on demand: {sync}");
    assert_eq!(site("cudaMemcpy", site_line("loader"))["count"], 6);
    let (text, _) = ingero(&["report", "--pid", &pid, &store, "--since=10m"]);
    let want = format!("train.py:{} sync → cudaStreamSynchronize: 2 stalls", site_line("sync"));
    assert!(text.contains(&want), "{text}");
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
    let page = dir.join("report.html");
    let out = format!("--out={}", page.display());
    ingero(&["report", "--pid", &pid, &store, "--since=10m", "--format=html", &out]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("Where the stalls were made") && html.contains("Stall time by stack"), "{html}");
    if let Ok(keep) = std::env::var("INGERO_KEEP_REPORT") {
        std::fs::copy(&page, keep).unwrap();
    }
}
