// SPDX-License-Identifier: Apache-2.0
//! `ingero import` on a real trace recorded by Ingero (Go) on an RTX 4090:
//! totals against what the SQLite file says, the report's diagnosis against
//! the causal chains stored in the file, ranking of imported nodes, and bad
//! files refused with nothing written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use arrow::array::AsArray;
use arrow::datatypes::{Float64Type, Int64Type};
use ingero_analysis::query::QueryEngine;
use ingero_analysis::report::{self, Target};
use ingero_server::rank::detector::DetectorConfig;
use ingero_store::{Store, StoreUrl};

fn trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/pytorch-173382-empty-cache.db")
}

fn ingero(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ingero")).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn import(file: &Path, node: &str, job: Option<&str>, store: &Path) -> String {
    let mut args = vec!["import", file.to_str().unwrap(), "--node", node, "--store", store.to_str().unwrap()];
    if let Some(j) = job {
        args.extend(["--job", j]);
    }
    let (rc, out) = ingero(&args);
    assert_eq!(rc, 0, "{out}");
    out
}

/// `ingero stragglers` over the whole of the bundled trace's time, as JSON.
fn stragglers(store: &Path) -> serde_json::Value {
    let args =
        ["stragglers", "--store", store.to_str().unwrap(), "--since", "2026-03-01T00:00:00Z", "--format", "json"];
    let (rc, out) = ingero(&args);
    assert_eq!(rc, 0, "{out}");
    serde_json::from_str(&out).unwrap()
}

async fn engine(dir: &Path) -> QueryEngine {
    let store = Store::open(&StoreUrl::parse(dir.to_str().unwrap()).unwrap(), &Default::default()).unwrap();
    QueryEngine::open(&store, Default::default()).await.unwrap()
}

/// (count, total ns) per op as the source defines them: stored raw events plus
/// what its minute aggregates counted but discarded (`count − stored`).
fn expected_calls() -> BTreeMap<String, (i64, f64)> {
    let c = rusqlite::Connection::open_with_flags(trace(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let sql = "WITH raw AS (SELECT source, op, pid, timestamp / 60000000000 * 60000000000 AS bucket, \
                 COUNT(*) AS n, SUM(duration) AS d FROM events WHERE source IN (1, 4) AND pid != 0 GROUP BY 1, 2, 3, 4), \
               agg AS (SELECT a.source, a.op, a.count - MIN(a.stored, COALESCE(r.n, 0)) AS n, \
                 MAX(a.sum_dur - CASE WHEN COALESCE(r.n, 0) = 0 THEN 0 \
                   ELSE r.d * MIN(a.stored, r.n) / r.n END, 0) AS d \
                 FROM event_aggregates a LEFT JOIN raw r USING (source, op, pid, bucket) \
                 WHERE a.source IN (1, 4) AND a.pid != 0) \
               SELECT o.name, SUM(n), SUM(d) FROM (SELECT source, op, n, d FROM raw UNION ALL SELECT * FROM agg) x \
               JOIN ops o ON o.source_id = x.source AND o.op_id = x.op GROUP BY o.name";
    let mut st = c.prepare(sql).unwrap();
    let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, (r.get::<_, i64>(1)?, r.get::<_, f64>(2)?)))).unwrap();
    rows.map(|r| r.unwrap())
        .map(|(name, v)| {
            let name = match name.as_str() {
                "cudaStreamSync" => "cudaStreamSynchronize".to_string(),
                "cudaDeviceSync" => "cudaDeviceSynchronize".to_string(),
                _ => name,
            };
            (name, v)
        })
        .filter(|(_, v)| v.0 > 0)
        .collect()
}

/// Per driver op: its stored calls, and those made inside a stored runtime
/// call on the same thread (a cuMemAlloc under cudaMalloc), which the
/// import leaves out as the agent does.
fn driver_nesting() -> BTreeMap<String, (i64, i64)> {
    let c = rusqlite::Connection::open_with_flags(trace(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let sql = "SELECT o.name, COUNT(*), SUM(EXISTS (SELECT 1 FROM events r WHERE r.source = 1 AND r.pid = d.pid \
                 AND r.tid = d.tid AND r.timestamp <= d.timestamp \
                 AND d.timestamp + d.duration <= r.timestamp + r.duration)) \
               FROM events d JOIN ops o ON o.source_id = 4 AND o.op_id = d.op \
               WHERE d.source = 4 AND d.pid != 0 GROUP BY o.name";
    let mut st = c.prepare(sql).unwrap();
    let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, (r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))).unwrap();
    rows.map(|r| r.unwrap()).collect()
}

#[tokio::test]
async fn imported_totals_match_the_trace_and_the_report_reaches_a_diagnosis() {
    let dir = tempfile::tempdir().unwrap();
    import(&trace(), "rtx4090", None, dir.path());
    let e = engine(dir.path()).await;

    let got = e
        .sql("SELECT op, CAST(SUM(count) AS BIGINT), CAST(SUM(total_ns) AS DOUBLE), BOOL_OR(sampled) FROM call_windows GROUP BY op")
        .await
        .unwrap();
    let mut ours = BTreeMap::new();
    for b in &got {
        let (op, n, d) = (
            b.column(0).as_string::<i32>(),
            b.column(1).as_primitive::<Int64Type>(),
            b.column(2).as_primitive::<Float64Type>(),
        );
        for i in 0..b.num_rows() {
            ours.insert(op.value(i).to_string(), (n.value(i), d.value(i)));
        }
    }
    let want = expected_calls();
    assert_eq!(ours.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    let nesting = driver_nesting();
    assert!(nesting["cuMemAlloc"].1 >= 40, "the trace's cuMemAllocs run inside cudaMalloc: {nesting:?}");
    for (op, (n, d)) in &want {
        let (gn, gd) = ours[op];
        if let Some(&(stored, nested)) = nesting.get(op) {
            // The nested stored calls left out, and the discarded ones in the
            // same share (rounded per minute row).
            let outer = |x: f64| x * (stored - nested) as f64 / stored as f64;
            let (want_n, want_d) = (outer((n - stored) as f64) + (stored - nested) as f64, outer(*d));
            assert!(
                (gn as f64 - want_n).abs() <= 3.0,
                "{op} count {gn} vs {want_n} ({stored} stored, {nested} nested)"
            );
            assert!(
                gd <= d * (1.0 + 1e-3) && (nested == 0 || gd < *d),
                "{op} total ns {gd} vs {d} ({want_d} expected)"
            );
            continue;
        }
        assert_eq!(gn, *n, "{op} count");
        // Integer division when spreading over windows: within 0.1 %.
        assert!((gd - d).abs() <= d * 1e-3 + 100.0, "{op} total ns {gd} vs {d}");
    }
    // cudaLaunchKernel: 906 + 9 stored, 31,065 more counted by the minute aggregates.
    assert_eq!(ours["cudaLaunchKernel"].0, 31_980);

    // Host facts from the session row.
    let nw = e.sql("SELECT DISTINCT gpu_model, cuda_version, cpu_cores FROM node_windows").await.unwrap();
    assert_eq!(nw[0].column(0).as_string::<i32>().value(0), "NVIDIA GeForce RTX 4090, 24564 MiB");
    assert_eq!(nw[0].column(1).as_string::<i32>().value(0), "13.0");

    // The diagnosis: the Go product blamed context switches for four op tails;
    // the allocator is what the trace shows (the issue is about empty_cache).
    let end = 1_774_360_300_000_000;
    let rep = report::build(&e, &Target::Node("rtx4090".into()), 1_774_360_000_000_000, end, DetectorConfig::default())
        .await
        .unwrap();
    let churn = rep.chains.iter().find(|c| c.cause == "allocator_churn").expect("allocator chain");
    assert!(churn.root_cause.iter().any(|r| r.starts_with("cudaFree: 54 calls")), "{churn:?}");
    assert!(churn.fixes.iter().any(|f| f.contains("empty_cache")));
    assert_eq!(rep.reference.len(), 4, "{:?}", rep.reference);
    let verdict = |id: &str| rep.reference.iter().find(|v| v.id == id).unwrap().clone();
    let free = verdict("tail-medium-cudaFree");
    assert_eq!((free.verdict.as_str(), free.our_cause.as_deref()), ("refine", Some("allocator_churn")), "{free:?}");
    assert_eq!(verdict("tail-medium-cudaMemcpyAsync").verdict, "refine");
    for v in &rep.reference {
        assert!(["confirm", "refine", "disagree"].contains(&v.verdict.as_str()));
        assert!(!v.why.is_empty());
    }
    // The same comparison is in the JSON report, and the text names the node.
    let (rc, json) = ingero(&[
        "report",
        "--node",
        "rtx4090",
        "--store",
        dir.path().to_str().unwrap(),
        "--since",
        "2026-03-24T13:00:00Z",
        "--format",
        "json",
    ]);
    assert_eq!(rc, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["reference"].as_array().unwrap().len(), 4);
    let (rc, pid) = ingero(&[
        "report",
        "--pid",
        "30581",
        "--store",
        dir.path().to_str().unwrap(),
        "--since",
        "2026-03-24T13:00:00Z",
    ]);
    assert_eq!(rc, 0, "{pid}");
    assert!(pid.contains("CUDA allocator churn"), "{pid}");

    // Importing again overwrites instead of duplicating, and says so.
    let again = import(&trace(), "rtx4090", None, dir.path());
    assert!(again.contains("were imported before; nothing added"), "{again}");
    let e = engine(dir.path()).await;
    let n = e.sql("SELECT CAST(SUM(count) AS BIGINT) FROM call_windows WHERE op = 'cudaLaunchKernel'").await.unwrap();
    assert_eq!(n[0].column(0).as_primitive::<Int64Type>().value(0), 31_980);
}

#[tokio::test]
async fn the_slow_node_of_an_imported_job_is_ranked_first() {
    let dir = tempfile::tempdir().unwrap();
    // Node c: the same run, with every off-CPU period five times longer.
    let slow = dir.path().join("slow.db");
    std::fs::copy(trace(), &slow).unwrap();
    let c = rusqlite::Connection::open(&slow).unwrap();
    c.execute_batch(
        "UPDATE events SET duration = duration * 5 WHERE source = 3 AND op = 1;
         UPDATE event_aggregates SET sum_dur = sum_dur * 5 WHERE source = 3 AND op = 1;",
    )
    .unwrap();
    drop(c);
    let store = dir.path().join("store");
    for n in ["node-a", "node-b"] {
        import(&trace(), n, Some("llm-ft"), &store);
    }
    import(&slow, "node-c", Some("llm-ft"), &store);
    let v = stragglers(&store);
    let out = v.to_string();
    let first = &v["stragglers"][0];
    assert_eq!(first["node"], "node-c", "{out}");
    assert_eq!(first["job"], "llm-ft");
    assert_eq!(first["signals"][0]["signal"], "offcpu_share", "{out}");
}

#[test]
fn bad_files_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a database at all, just some text\n".repeat(200)).unwrap();
    let truncated = dir.path().join("truncated.db");
    let bytes = std::fs::read(trace()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let newer = dir.path().join("newer.db");
    std::fs::copy(trace(), &newer).unwrap();
    rusqlite::Connection::open(&newer)
        .unwrap()
        .execute("UPDATE schema_info SET value = '0.11' WHERE key = 'version'", [])
        .unwrap();
    let other = dir.path().join("other.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
        .unwrap();
    let cases = [
        (&text, "not an SQLite file"),
        (&truncated, "corrupt or truncated"),
        (&newer, "schema version 0.11 is newer"),
        (&other, "not an Ingero trace: no table(s) events"),
        (&dir.path().join("missing.db"), "no such file"),
    ];
    for (file, why) in cases {
        // A good file first: the bad one must stop the whole import before any write.
        let (rc, out) = ingero(&[
            "import",
            trace().to_str().unwrap(),
            file.to_str().unwrap(),
            "--node",
            "n",
            "--store",
            store.to_str().unwrap(),
        ]);
        assert_eq!(rc, 2, "{}: {out}", file.display());
        assert!(out.contains(why), "{}: {out}", file.display());
        assert_eq!(out.lines().filter(|l| l.starts_with("error")).count(), 1, "{out}");
        assert!(
            !store.exists() || std::fs::read_dir(&store).unwrap().next().is_none(),
            "{} wrote files",
            file.display()
        );
    }
    let (rc, out) = ingero(&["import", trace().to_str().unwrap(), "--node", "", "--store", store.to_str().unwrap()]);
    assert_eq!(rc, 2, "{out}");
}

/// The trace as the reference product's current release writes it (schema
/// 0.9: node and rank columns, node-namespaced ids) and as its `ingero
/// merge` combines nodes: node-a is the recorded run, node-b the same run
/// with every stored off-CPU period a second longer; merge drops the minute
/// aggregates (so only the stored events remain) and keeps one
/// process_names row per pid.
fn merged(dir: &Path) -> PathBuf {
    let out = dir.join("cluster.db");
    std::fs::copy(trace(), &out).unwrap();
    let c = rusqlite::Connection::open(&out).unwrap();
    c.execute_batch(
        "ALTER TABLE events ADD COLUMN node TEXT NOT NULL DEFAULT '';
         ALTER TABLE events ADD COLUMN rank INTEGER;
         ALTER TABLE events ADD COLUMN local_rank INTEGER;
         ALTER TABLE events ADD COLUMN world_size INTEGER;
         ALTER TABLE causal_chains ADD COLUMN node TEXT NOT NULL DEFAULT '';
         ALTER TABLE sessions ADD COLUMN node TEXT NOT NULL DEFAULT '';
         UPDATE events SET node = 'node-a', rank = 0, world_size = 2;
         INSERT INTO events (timestamp, pid, tid, source, op, duration, gpu_id, arg0, arg1, ret_code, stack_hash, cgroup_id, node, rank, world_size)
           SELECT timestamp, pid, tid, source, op, CASE WHEN source = 3 AND op = 1 THEN duration + 1000000000 ELSE duration END,
                  gpu_id, arg0, arg1, ret_code, stack_hash, cgroup_id, 'node-b', 1, 2 FROM events WHERE node = 'node-a';
         UPDATE causal_chains SET node = 'node-a';
         INSERT INTO causal_chains (id, detected_at, severity, summary, root_cause, explanation, recommendations, cuda_op, cuda_p99_us, cuda_p50_us, tail_ratio, timeline, node)
           SELECT id || '-again', detected_at + 30000000000, severity, REPLACE(summary, 'p99=', 'p99=1'), root_cause, explanation, recommendations, cuda_op, cuda_p99_us, cuda_p50_us, tail_ratio, timeline, node FROM causal_chains;
         INSERT INTO causal_chains (id, detected_at, severity, summary, root_cause, explanation, recommendations, cuda_op, cuda_p99_us, cuda_p50_us, tail_ratio, timeline, node)
           SELECT 'node-b:' || id, detected_at, severity, summary, root_cause, explanation, recommendations, cuda_op, cuda_p99_us, cuda_p50_us, tail_ratio, timeline, 'node-b' FROM causal_chains;
         UPDATE sessions SET node = 'node-a';
         DELETE FROM event_aggregates;
         UPDATE schema_info SET value = '0.9' WHERE key = 'version';",
    )
    .unwrap();
    out
}

#[tokio::test]
async fn a_merged_multi_node_trace_is_imported_as_its_nodes_and_ranked() {
    let dir = tempfile::tempdir().unwrap();
    let file = merged(dir.path());
    let store = dir.path().join("store");
    // No --node: the file names its nodes. 5-s windows: only stored events remain.
    let args =
        ["import", file.to_str().unwrap(), "--job", "llm-ft", "--window", "5s", "--store", store.to_str().unwrap()];
    let (rc, out) = ingero(&args);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("as node(s) node-a, node-b"), "{out}");
    let e = engine(&store).await;
    let rows = e
        .sql("SELECT node, CAST(COUNT(DISTINCT pid) AS BIGINT), CAST(MAX(rank) AS BIGINT) FROM call_windows GROUP BY node ORDER BY node")
        .await
        .unwrap();
    let b = &rows[0];
    assert_eq!(b.num_rows(), 2, "one node per node the file names");
    assert_eq!(b.column(2).as_primitive::<Int64Type>().value(1), 1, "node-b's rank from the file");
    let v = stragglers(&store);
    let out = v.to_string();
    assert_eq!(v["stragglers"][0]["node"], "node-b", "the slow node first: {out}");
    // The source stored the same diagnosis at many detections: one line each, with count and span.
    let (rc, text) =
        ingero(&["report", "--node", "node-a", "--store", store.to_str().unwrap(), "--since", "2026-03-01T00:00:00Z"]);
    assert_eq!(rc, 0, "{text}");
    let section = text.split("Diagnoses stored in the imported trace").nth(1).unwrap_or_default();
    let lines: Vec<&str> = section.lines().filter(|l| l.starts_with(['C', 'R', 'D'])).collect();
    let mut uniq = lines.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), lines.len(), "a diagnosis printed more than once:\n{section}");
    assert!(!lines.is_empty() && section.matches("(×2,").count() == lines.len(), "each stored twice:\n{section}");
    // The HTML page says them too, and has no empty table of CPU neighbours.
    let page = dir.path().join("a.html");
    let store_s = store.to_str().unwrap();
    let args =
        ["report", "--node", "node-a", "--store", store_s, "--since", "2026-03-01T00:00:00Z", "--format", "html"];
    let (rc, out) = ingero(&[&args[..], &["--out", page.to_str().unwrap()]].concat());
    assert_eq!(rc, 0, "{out}");
    let page = std::fs::read_to_string(&page).unwrap();
    assert!(page.contains("Diagnoses stored in the imported trace") && page.contains("<b>CONFIRM</b>"), "{page}");
    assert!(!page.contains("Other CPU users on the node"), "no neighbour was recorded: {page}");
    // A file that names no node needs --node.
    let (rc, out) = ingero(&["import", trace().to_str().unwrap(), "--store", store.to_str().unwrap()]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("names no node"), "{out}");
}

#[tokio::test]
async fn a_starved_gpu_is_diagnosed_as_input_bound_and_its_workers_named() {
    let dir = tempfile::tempdir().unwrap();
    // The recorded run, with its six forked DataLoader workers context-
    // switching thousands of times a second and the training process
    // blocked outside CUDA more than half of its thread time, as in a run
    // whose input pipeline cannot keep up.
    let file = dir.path().join("starved.db");
    std::fs::copy(trace(), &file).unwrap();
    let c = rusqlite::Connection::open(&file).unwrap();
    c.execute_batch(
        "UPDATE event_aggregates SET count = 240000, sum_dur = 240000000
           WHERE source = 3 AND op = 1 AND pid IN (30591, 30592, 30594, 30595, 30596, 30597);
         INSERT OR REPLACE INTO event_aggregates (bucket, source, op, pid, count, stored, sum_dur, max_dur)
           VALUES (1774360080000000000, 3, 1, 30581, 3000, 1, 90000000000, 500000000),
                  (1774360140000000000, 3, 1, 30581, 12000, 38, 360000000000, 500000000);",
    )
    .unwrap();
    drop(c);
    let store = dir.path().join("store");
    import(&file, "gpu-1", None, &store);
    let args =
        ["report", "--pid", "gpu-1:30581", "--store", store.to_str().unwrap(), "--since", "2026-03-01T00:00:00Z"];
    let (rc, out) = ingero(&[&args[..], &["--format", "json"]].concat());
    assert_eq!(rc, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let chains = v["chains"].as_array().unwrap();
    let c =
        chains.iter().find(|c| c["cause"] == "input_bound").unwrap_or_else(|| panic!("no input_bound chain: {v:#}"));
    let root = c["root_cause"].to_string();
    assert!(root.contains("6 data worker(s)") && root.contains("python3 (pid 30592)"), "{root}");
    assert!(!chains.iter().any(|c| c["cause"] == "host_blocked"), "the same symptom twice: {v:#}");
    let explains = c["explains"].as_f64().unwrap_or_default();
    assert!((0.3..=1.0).contains(&explains), "the input wait is most of the time: {explains}");
    // The unmodified run is not input bound.
    let plain = dir.path().join("plain");
    import(&trace(), "gpu-1", None, &plain);
    let (rc, out) = ingero(&[
        "report",
        "--pid",
        "gpu-1:30581",
        "--store",
        plain.to_str().unwrap(),
        "--since",
        "2026-03-01T00:00:00Z",
        "--format",
        "json",
    ]);
    assert_eq!(rc, 0, "{out}");
    assert!(!out.contains("input_bound"), "{out}");
}
