// SPDX-License-Identifier: Apache-2.0
//! A store that has aged 30 days against a fresh one, side by side in one
//! run: `cargo bench -p ingero --bench aging`. Both hold the same last hour
//! of 1,000 simulated nodes (the in-process writer, tiers included); the
//! aged one also holds 30 days before it in every table, at the density a
//! compacted hour of that fleet has (files per hour from the fresh hour's
//! rows at 256 Ki rows per file, each with a real file's statistics), with a
//! checkpoint as the periodic one leaves it. The old hours' `add`s name no
//! file on disk: a 1-hour question never reads them, only the log that
//! lists them, which is what ageing costs. Timed, interleaved, each a fresh
//! `ingero` process as a user runs it: the CLI's start (`ingero sql` of one
//! row of the last hour: open the store, the table's snapshot) and a 1-hour history
//! ranking (`ingero stragglers --since`). INGERO_BENCH_NODES /
//! INGERO_BENCH_DAYS change the shape; INGERO_BENCH_KEEP=DIR keeps the
//! stores for the next run.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;

use std::time::{Duration, Instant};

use common::{Shape, env, generate};
use ingero_store::delta::{Snapshot, TableLog, checkpoint, table};
use ingero_store::{Store, StoreUrl};

/// Runs the `ingero` binary; returns its wall time and standard output.
fn cli(args: &[&str]) -> (Duration, Vec<u8>) {
    let t = Instant::now();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ingero")).args(args).output().unwrap();
    assert!(o.status.success(), "ingero {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    (t.elapsed(), o.stdout)
}

fn open(dir: &std::path::Path) -> Store {
    Store::open(&StoreUrl::parse(&format!("file://{}", dir.display())).unwrap(), &Default::default()).unwrap()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let nodes = env("INGERO_BENCH_NODES", 1000);
    let days = env("INGERO_BENCH_DAYS", 30);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // INGERO_BENCH_KEEP=DIR keeps the two stores there and reuses them
        // on the next run (profiling one side without rebuilding both).
        let tmp = tempfile::tempdir().unwrap();
        let root = std::env::var_os("INGERO_BENCH_KEEP").map_or_else(|| tmp.path().to_path_buf(), Into::into);
        let ready = root.join("ready");
        let shape = match std::fs::read_to_string(&ready).ok().and_then(|s| s.trim().parse::<i64>().ok()) {
            Some(end_us) => Shape { nodes, secs: 3600, start_us: end_us - 3_600_000_000, end_us },
            None => {
                let (fresh, aged) = (open(&root.join("fresh")), open(&root.join("aged")));
                let end_us = chrono::Utc::now().timestamp_micros() / 3_600_000_000 * 3_600_000_000;
                let shape = Shape { nodes, secs: 3600, start_us: end_us - 3_600_000_000, end_us };
                let rows = generate(&fresh, &shape).await;
                let added = age(&fresh, &aged, shape.start_us, days).await;
                generate(&aged, &shape).await;
                std::fs::write(&ready, end_us.to_string()).unwrap();
                println!(
                    "dataset: {nodes} nodes x 1 h to {} ({rows} rows); aged store: {days} days before it, {added} more files listed",
                    ingero_model::time::rfc3339(shape.end_us)
                );
                shape
            }
        };
        let since = ingero_model::time::rfc3339(shape.start_us);
        // A question about the last hour: the old hours' files are not on disk.
        let hour = chrono::DateTime::from_timestamp_micros(shape.start_us).unwrap();
        let hour_query = format!(
            "SELECT count(*) FROM signal_windows_60s WHERE date = '{}' AND hour = '{}'",
            hour.format("%Y-%m-%d"),
            hour.format("%H")
        );
        let (mut open_s, mut rank_s) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        for run in 0..5 {
            for (i, dir) in ["fresh", "aged"].into_iter().enumerate() {
                let store = format!("--store=file://{}", root.join(dir).display());
                let (t, _) = cli(&["sql", &store, &hour_query]);
                open_s[i].push(t);
                let (t, out) = cli(&["stragglers", &store, &format!("--since={since}"), "--format=json"]);
                rank_s[i].push(t);
                let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
                let top = &v["stragglers"][0];
                println!(
                    "run {run} {dir:5}: start {:.0?}, 1-h ranking {:.0?}, top {} flagged={}",
                    open_s[i][run], rank_s[i][run], top["node"], top["flagged"]
                );
            }
        }
        let med = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2].as_secs_f64()
        };
        let (of, oa) = (med(&mut open_s[0]), med(&mut open_s[1]));
        let (rf, ra) = (med(&mut rank_s[0]), med(&mut rank_s[1]));
        println!("median CLI start:   fresh {of:.3} s, aged {oa:.3} s, aged/fresh {:.2}", oa / of);
        println!("median 1-h ranking: fresh {rf:.3} s, aged {ra:.3} s, aged/fresh {:.2}", ra / rf);
    });
}

/// Writes `days` of history before `start_us` into `aged`'s logs, table by
/// table, as the fresh store's hour shows that table's density; then a
/// checkpoint of each. Returns the files listed.
async fn age(fresh: &Store, aged: &Store, start_us: i64, days: usize) -> usize {
    let mut added = 0;
    for (name, schema, _) in ingero_store::upkeep::tables() {
        let snap = Snapshot::load(fresh, name).await.unwrap();
        let Some(sample) = snap.files.values().next() else { continue };
        let rows = snap.rows().expect("a writer's snapshot has every file's numRecords") as usize;
        let per_hour = rows.div_ceil(256 * 1024).max(1);
        let size = (sample.size as usize).max(1) * rows.div_ceil(per_hour) / (rows / snap.files.len()).max(1);
        let stats = sample.stats.clone().unwrap_or_default();
        let mut log = TableLog::open(aged, name, &schema).await.unwrap();
        let first_hour = start_us / 3_600_000_000 - (days * 24) as i64;
        for day in 0..days {
            let mut adds = Vec::new();
            for h in 0..24 {
                let hour = first_hour + (day * 24 + h) as i64;
                let t = chrono::DateTime::from_timestamp(hour * 3600, 0).unwrap();
                for f in 0..per_hour {
                    let rel =
                        format!("date={}/hour={}/part-aged-{hour}-{f}.parquet", t.format("%Y-%m-%d"), t.format("%H"));
                    adds.push(table::add(&rel, size, stats.clone()));
                }
            }
            added += adds.len();
            log.commit(aged, adds, vec![], None, serde_json::json!({"aged": day})).await.unwrap();
        }
        checkpoint::write(aged, &log.snapshot).await.unwrap();
    }
    added
}
