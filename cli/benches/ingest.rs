// SPDX-License-Identifier: Apache-2.0
//! End-to-end ingest throughput (gRPC → WAL fsync → Parquet on local disk)
//! and bytes on the wire per row against JSON of the same rows.
//!
//! `cargo bench -p ingero --bench ingest` (env INGERO_BENCH_NODES,
//! INGERO_BENCH_BATCHES, INGERO_BENCH_ROWS override the shape).

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

        let dir = tempfile::tempdir().unwrap();
        let store = StoreUrl::parse(&format!("file://{}", dir.path().join("data").display())).unwrap();
        let mut cfg = ServeConfig::ephemeral(store, Default::default(), dir.path().join("wal"));
        cfg.commit = CommitConfig { wal_dir: dir.path().join("wal"), flush_rows: 500_000, flush_age: Duration::from_secs(30) };
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
