// SPDX-License-Identifier: Apache-2.0
//! End-to-end ingest throughput (gRPC → WAL fsync → Parquet on local disk)
//! and bytes on the wire per row against JSON of the same rows.
//!
//! `cargo bench -p ingero --bench ingest` (env INGERO_BENCH_NODES,
//! INGERO_BENCH_BATCHES, INGERO_BENCH_ROWS override the shape;
//! INGERO_BENCH_FLUSH_ROWS the rows buffered before a flush).

/// glibc malloc returns large buffers to the kernel and faults them back in
/// zeroed on every batch; mimalloc keeps them (measured in BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Duration, Instant};

use ingero_model::Table;
use ingero_proto::ipc;
use ingero_server::{ServeConfig, Server};
use ingero_sim::loadgen::{self, LoadConfig, json_bytes, synth_tables};
use ingero_store::StoreUrl;
use ingero_store::commit::CommitConfig;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes with --list
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // Wire size: one realistic batch (1 s window, 5,000 call rows) both ways.
        let tables = synth_tables("node-0", chrono::Utc::now().timestamp_micros(), 5_000, 1);
        let rows: usize = tables.iter().map(|(_, b)| b.num_rows()).sum();
        let arrow: usize = tables
            .iter()
            .map(|(t, b)| ipc::encode(&t.schema(), std::slice::from_ref(b)).unwrap().len())
            .sum();
        let json = json_bytes(&tables);
        println!(
            "wire: {rows} rows, Arrow IPC+zstd {arrow} B ({:.1} B/row), NDJSON {json} B ({:.1} B/row): {:.1}x smaller",
            arrow as f64 / rows as f64,
            json as f64 / rows as f64,
            json as f64 / arrow as f64
        );

        encode_stages();

        let dir = tempfile::tempdir().unwrap();
        let store = StoreUrl::parse(&format!("file://{}", dir.path().join("data").display())).unwrap();
        let mut cfg = ServeConfig::ephemeral(store, Default::default(), dir.path().join("wal"));
        cfg.commit = CommitConfig { wal_dir: dir.path().join("wal"), flush_rows: env("INGERO_BENCH_FLUSH_ROWS", 500_000), flush_age: Duration::from_secs(30) };
        let server = Server::start(cfg).await.unwrap();
        let load = LoadConfig {
            server: server.grpc_url(),
            nodes: env("INGERO_BENCH_NODES", 16),
            batches_per_node: env("INGERO_BENCH_BATCHES", 25),
            rows_per_batch: env("INGERO_BENCH_ROWS", 5_000),
        };
        // loadgen::run encodes every request first and times only the sending.
        let report = loadgen::run(&load).await.unwrap();
        let acked = report.elapsed;
        let flush_started = Instant::now();
        server.committer.flush().await.unwrap();
        let total = acked + flush_started.elapsed();
        let files = ingero_store::read::list_files(&server.store, Table::CallWindows).await.unwrap();
        println!(
            "ingest: {} nodes x {} batches, {} rows: acked in {:.2?} ({:.0} rows/s), in Parquet after {:.2?} ({:.0} rows/s end to end), {} call_windows files",
            load.nodes,
            load.batches_per_node,
            report.rows,
            acked,
            report.rows as f64 / acked.as_secs_f64(),
            total,
            report.rows as f64 / total.as_secs_f64(),
            files.len()
        );
        let m = server.metrics.encode();
        for line in m.lines().filter(|l| l.contains("_sum") || l.contains("_count")) {
            println!("  {line}");
        }
        server.shutdown().await.unwrap();
    });
}

/// One flush file of `call_windows` (256 Ki rows from 16 nodes) through each
/// encoding stage on one thread, median of 5: where a flush's CPU goes.
fn encode_stages() {
    let now = chrono::Utc::now().timestamp_micros();
    let mut batches = Vec::new();
    for b in 0..ingero_store::parquet::FILE_ROWS.div_ceil(5_000) {
        let tables = synth_tables(&format!("node-{}", b % 16), now + b as i64 / 16 * 1_000_000, 5_000, b as u64);
        batches.extend(tables.into_iter().filter(|(t, _)| *t == Table::CallWindows).map(|(_, b)| b));
    }
    let median = |f: &mut dyn FnMut()| {
        let mut t: Vec<Duration> = (0..5)
            .map(|_| {
                let s = Instant::now();
                f();
                s.elapsed()
            })
            .collect();
        t.sort();
        t[2]
    };
    let parts = ingero_store::parquet::partition(Table::CallWindows, &batches).unwrap();
    let part = parts.values().next().unwrap().clone();
    let rows = part.num_rows() as f64;
    let storage = ingero_store::delta::schema::to_storage(&part).unwrap();
    let mut bytes = 0;
    let stages: [(&str, Duration); 4] = [
        (
            "partition (order, concat)",
            median(&mut || drop(ingero_store::parquet::partition(Table::CallWindows, &batches))),
        ),
        ("storage types", median(&mut || drop(ingero_store::delta::schema::to_storage(&part)))),
        (
            "Delta statistics read from the values (files take the writer's)",
            median(&mut || drop(ingero_store::delta::stats::of(&storage))),
        ),
        (
            "whole file (all of it, zstd Parquet)",
            median(&mut || bytes = ingero_store::parquet::encode(&part).unwrap().bytes.len()),
        ),
    ];
    for (stage, t) in stages {
        println!("encode: {stage}: {:.1} ms, {:.0} ns/row", t.as_secs_f64() * 1e3, t.as_secs_f64() * 1e9 / rows);
    }
    println!("encode: {rows} call_windows rows -> {bytes} B ({:.1} B/row)", bytes as f64 / rows);
}
