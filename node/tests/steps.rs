// SPDX-License-Identifier: Apache-2.0
//! Training steps without code changes: a loop whose every step is a copy,
//! 20 launches and a sync, with one slow step, ships per window the steps
//! that ended in it and their times, exactly as the loop itself measured
//! them (its steps that also allocate among them); a loop of launches only
//! (no sync, no copy) ships none.

mod fixtures;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{TimestampMicrosecondType, UInt32Type, UInt64Type};
use fixtures::*;
use ingero_model::Table;

const STEPS: usize = 60;
const SLOW: usize = 34;
/// How far the loop's clock read after a sync may be from the probe's.
const SLACK_US: i64 = 1000;
/// How far a step's time as the loop measured it (two such reads) may be
/// from the shipped one: the loop preempted between a sync's return and
/// its clock read lengthens one step and shortens the next (1.4 ms seen
/// with three other live-kernel tests on the 2 CPUs; the slow step is
/// ~8x the others, so this still tells it apart).
const STEP_SLACK_US: i64 = 5000;

/// A `progress_windows` row's step columns.
#[derive(Debug)]
struct StepRow {
    start_us: i64,
    len_us: i64,
    steps: Option<u32>,
    p50_ns: Option<u64>,
    max_ns: Option<u64>,
    op: Option<String>,
}

fn step_rows(batches: &[RecordBatch], pid: u32) -> Vec<StepRow> {
    let mut out = Vec::new();
    for b in batches {
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        let (p, ws, wu) = (col("pid"), col("window_start"), col("window_us"));
        let (n, p50, max, op) = (col("steps"), col("step_p50_ns"), col("step_max_ns"), col("step_op"));
        let u64_at = |c: &arrow::array::ArrayRef, i| (!c.is_null(i)).then(|| c.as_primitive::<UInt64Type>().value(i));
        for i in (0..b.num_rows()).filter(|&i| p.as_primitive::<UInt32Type>().value(i) == pid) {
            out.push(StepRow {
                start_us: ws.as_primitive::<TimestampMicrosecondType>().value(i),
                len_us: wu.as_primitive::<UInt64Type>().value(i) as i64,
                steps: (!n.is_null(i)).then(|| n.as_primitive::<UInt32Type>().value(i)),
                p50_ns: u64_at(&p50, i),
                max_ns: u64_at(&max, i),
                op: (!op.is_null(i)).then(|| op.as_string::<i32>().value(i).to_string()),
            });
        }
    }
    out.sort_by_key(|r| r.start_us);
    out
}

/// When each sync returned (wall clock, µs), as the loop printed it.
fn sync_ends(out: &str) -> Vec<i64> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 5 && f[1] == "cudaStreamSynchronize").then(|| f[4].parse::<f64>().unwrap() as i64)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_and_the_slow_step_are_found_from_the_call_cycle() {
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("steps");
    let (lib, wl) = build(&dir.path().join("bin"));
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    // ~41-ms steps; step SLOW waits 300 ms more in its sync. Every 7th
    // step also allocates (a caching allocator growing): an extra call in
    // the cycle, before and after it is believed.
    let mut args: Vec<String> = vec!["open".into(), "sleep:600".into()];
    for s in 0..STEPS {
        args.push("call:cudaMemcpyAsync:1:200".into());
        if s % 7 == 3 {
            args.push("call:cudaMalloc:1:0".into());
        }
        args.push("call:cudaLaunchKernel:20:0".into());
        args.push(format!("call:cudaStreamSynchronize:1:{}", if s == SLOW { 340_000 } else { 40_000 }));
    }
    args.push("sleep:300".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let looped = Workload::start(&wl, &lib, &args, &cg);
    let launches_only =
        Workload::start(&wl, &lib, &["open", "sleep:600", "repeat:30", "call:cudaLaunchKernel:20:0", "sleep:40"], &cg);
    let (pid, other) = (looped.pid(), launches_only.pid());
    let out = looped.output();
    launches_only.wait();
    let log = agent.stop();
    let batches = rows(dir.path(), Table::ProgressWindows).await;
    let ends = sync_ends(&out);
    assert_eq!(ends.len(), STEPS, "{out}");
    let rows = step_rows(&batches, pid);
    eprintln!("steps per window: {rows:?}");
    let near_edge = |r: &StepRow| {
        ends.iter().any(|&e| (e - r.start_us).abs() < SLACK_US || (e - r.start_us - r.len_us).abs() < SLACK_US)
    };
    let within = |r: &StepRow, e: i64| e >= r.start_us && e < r.start_us + r.len_us;

    // Three cycles are enough: from the window of the third step's end on,
    // every window has its steps, each ended by the sync; the first such
    // window also counts the steps before it (the loop's first two).
    let first = rows.iter().position(|r| r.steps.is_some()).unwrap_or_else(|| panic!("{rows:?}\n{log}"));
    assert!(rows[first].start_us <= ends[2] + SLACK_US, "the cycle believed late: {rows:?}\n{log}");
    let last = rows.iter().position(|r| within(r, ends[STEPS - 1])).unwrap();
    for (i, r) in rows[first..=last].iter().enumerate() {
        let end = r.start_us + r.len_us;
        let made = ends.iter().filter(|&&e| e < end && (i == 0 || e >= r.start_us)).count() as u32;
        assert_eq!(r.op.as_deref(), Some("cudaStreamSynchronize"), "{r:?}");
        if !near_edge(r) {
            assert_eq!(r.steps, Some(made), "{r:?}\n{rows:?}\n{log}");
        }
    }
    let counted: u32 = rows[first..=last].iter().map(|r| r.steps.unwrap()).sum();
    assert_eq!(counted as usize, STEPS, "every step counted once: {rows:?}");

    // The slow step's time, in the window it ended in, as the loop measured it.
    let slow = rows.iter().find(|r| within(r, ends[SLOW])).unwrap();
    let took_us = ends[SLOW] - ends[SLOW - 1];
    let max_us = slow.max_ns.unwrap() as i64 / 1000;
    assert!((max_us - took_us).abs() < STEP_SLACK_US, "slow step {took_us} µs, shipped {max_us} µs: {slow:?}");
    let mut times: Vec<i64> = (1..STEPS).filter(|&i| within(slow, ends[i])).map(|i| ends[i] - ends[i - 1]).collect();
    times.sort_unstable();
    let median_us = times[(times.len() - 1) / 2];
    let p50_us = slow.p50_ns.unwrap() as i64 / 1000;
    assert!((p50_us - median_us).abs() < SLACK_US, "median {median_us} µs, shipped {p50_us} µs: {slow:?}");

    report_shows_the_steps(dir.path(), pid, counted, took_us);

    // No sync or copy: no cycle, no steps, never a guess.
    let other_rows = step_rows(&batches, other);
    assert!(!other_rows.is_empty(), "{log}");
    assert!(other_rows.iter().all(|r| r.steps.is_none() && r.op.is_none()), "{other_rows:?}");
}

/// `ingero report --pid N`: the steps found, their median, the slow one.
fn report_shows_the_steps(dir: &std::path::Path, pid: u32, counted: u32, slow_us: i64) {
    let run = |fmt: &str| report(dir, pid, fmt);
    let v: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
    let steps = &v["steps"];
    assert_eq!(steps["count"], counted, "{v:#}");
    assert_eq!(steps["ended_by"], "cudaStreamSynchronize", "{steps:#}");
    let median = steps["median_s"].as_f64().unwrap();
    assert!((0.040..0.050).contains(&median), "{steps:#}");
    let slowest = steps["slowest"][0]["seconds"].as_f64().unwrap();
    // A step time: two clock reads of the loop's (STEP_SLACK_US, not SLACK_US).
    assert!((slowest * 1e6 - slow_us as f64).abs() < STEP_SLACK_US as f64, "{slow_us} µs: {steps:#}");
    let text = run("text");
    assert!(text.contains("Steps (found from the cycle of its calls)"), "{text}");
    assert!(text.contains(&format!("{counted} steps, each ended by a cudaStreamSynchronize; median 4")), "{text}");
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
}

/// A loop that copies its batch in and reads its result back with the same
/// blocking `cudaMemcpy`, after a setup allocation: every step counted,
/// the first with the setup, each ended by the copy back (it waits for the
/// step's kernels); the slow step's time as the loop measured it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_back_ends_each_step_and_setup_costs_no_step() {
    const N: usize = 40;
    const SLOW_COPY: usize = 22;
    if !can_trace() {
        return;
    }
    let (dir, cg) = tmp("steps-copy");
    let (lib, wl) = build(&dir.path().join("bin"));
    let agent = Agent::start(&store_args(dir.path(), &cg), &dir.path().join("agent.log"));
    let mut args: Vec<String> = vec!["open".into(), "sleep:600".into(), "call:cudaMalloc:1:0".into()];
    for s in 0..N {
        args.push("call:cudaMemcpy:1:20".into());
        args.push("call:cudaLaunchKernel:20:0".into());
        args.push(format!("call:cudaMemcpy:1:{}", if s == SLOW_COPY { 340_000 } else { 40_000 }));
    }
    args.push("sleep:300".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let looped = Workload::start(&wl, &lib, &args, &cg);
    let pid = looped.pid();
    let out = looped.output();
    let log = agent.stop();
    // When each copy back returned: every second copy.
    let copies: Vec<i64> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 5 && f[1] == "cudaMemcpy").then(|| f[4].parse::<f64>().unwrap() as i64)
        })
        .collect();
    assert_eq!(copies.len(), 2 * N, "{out}");
    let ends: Vec<i64> = copies.iter().skip(1).step_by(2).copied().collect();
    let rows = step_rows(&rows(dir.path(), Table::ProgressWindows).await, pid);
    let counted: u32 = rows.iter().filter_map(|r| r.steps).sum();
    assert_eq!(counted as usize, N, "every step counted once: {rows:?}\n{log}");
    assert!(rows.iter().all(|r| r.op.as_deref().is_none_or(|o| o == "cudaMemcpy")), "{rows:?}");
    let slow = rows
        .iter()
        .find(|r| ends[SLOW_COPY] >= r.start_us && ends[SLOW_COPY] < r.start_us + r.len_us)
        .unwrap_or_else(|| panic!("{rows:?}"));
    let took_us = ends[SLOW_COPY] - ends[SLOW_COPY - 1];
    let max_us = slow.max_ns.unwrap_or(0) as i64 / 1000;
    assert!((max_us - took_us).abs() < STEP_SLACK_US, "slow step {took_us} µs, shipped {max_us} µs: {slow:?}");
}
