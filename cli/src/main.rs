// SPDX-License-Identifier: Apache-2.0
//! `ingero`: the aggregator and the command-line tools.

mod cli;
mod commands;

/// glibc malloc returns large buffers to the kernel and faults them back in
/// zeroed on every batch; mimalloc keeps them (measured in BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cli::ServeArgs;
use commands::{CmdResult, Failure};
use ingero_server::Server;
use ingero_sim::loadgen;

/// Ingero: find where paid GPU time leaks, on which node, in which pod, and why.
///
/// Per-node agents trace CUDA/NCCL calls and the scheduler; `ingero serve`
/// stores their windows as Parquet, ranks straggler nodes live, and answers
/// the commands below. `ingero demo` shows it all without a GPU or a cluster.
#[derive(Debug, Parser)]
#[command(name = "ingero", version, about, long_about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the aggregator: gRPC ingest + query, Parquet persistence, live ranking, HTTP metrics.
    Serve(Box<ServeArgs>),
    /// Rank straggler nodes: live (--server) or over history (--store / --since).
    Stragglers(Box<commands::stragglers::StragglersArgs>),
    /// Explain a pod's, node's or process's stalls: cause → effect → fix (text, JSON, HTML).
    Report(Box<commands::report::ReportArgs>),
    /// Read-only SQL over the dataset.
    Sql(Box<commands::sql::SqlArgs>),
    /// Simulate a fleet of agents with injected faults against a server and time each flag.
    Simulate(Box<commands::simulate::SimulateArgs>),
    /// Measure the live detector on a simulated fleet day, faster than real
    /// time: false flags per 1,000 node-days, recall, fault→flag latency.
    Evaluate(Box<commands::evaluate::EvaluateArgs>),
    /// Everything in one minute: in-process server, simulated fleet, one straggler, its report.
    Demo(Box<commands::demo::DemoArgs>),
    /// Export a time range as a Perfetto trace: nodes side by side, processes,
    /// threads, outlier calls, scheduler counters, straggler spans.
    Export(Box<commands::export::ExportArgs>),
    /// Answer an AI assistant over MCP (stdio, or streamable HTTP with --http):
    /// stragglers, stall reports, SQL, names seen, table schemas.
    Mcp(Box<commands::mcp::McpArgs>),
    /// What remediation (`serve --remediate`) did and held back: marks, taints,
    /// clears, budgets reached, errors.
    Actions(Box<commands::actions::ActionsArgs>),
    /// Nodes flagged again and again over history (default the last 7 days),
    /// with their causes and the GPU-hours and dollars they cost.
    Offenders(Box<commands::offenders::OffendersArgs>),
    /// Import SQLite traces recorded by Ingero (Go) into a store, as one node.
    Import(Box<commands::import::ImportArgs>),
    /// Push synthetic windows from many nodes as fast as possible (load test).
    Load(LoadArgs),
}

#[derive(Debug, clap::Args)]
struct LoadArgs {
    /// Aggregator gRPC address; with replicas, every replica's, comma-separated.
    #[arg(long, env = "INGERO_SERVER", default_value = "http://127.0.0.1:7070")]
    server: String,
    /// Simulated nodes sending concurrently.
    #[arg(long, default_value_t = 16, env = "INGERO_LOAD_NODES")]
    nodes: usize,
    /// Batches each node sends.
    #[arg(long, default_value_t = 20, env = "INGERO_LOAD_BATCHES")]
    batches: usize,
    /// Call-window rows per batch.
    #[arg(long, default_value_t = 5_000, env = "INGERO_LOAD_ROWS")]
    rows: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("INGERO_LOG").unwrap_or_else(|_| {
            // Tools keep quiet; the server logs its lifecycle.
            if matches!(cli.command, Command::Serve(_)) { "info" } else { "warn" }.into()
        }))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            match &f {
                Failure::Usage(msg) => eprintln!("error: {msg}"),
                Failure::Run(e) => eprintln!("error: {e:#}"),
                Failure::Interrupted => eprintln!("interrupted"),
            }
            f.exit_code()
        }
    }
}

async fn run(cli: Cli) -> CmdResult {
    match cli.command {
        Command::Serve(args) => {
            let mut cfg = args.config().map_err(Failure::Usage)?;
            let remediation = commands::actions::prepare(&args.remediate).await?;
            if let Some(p) = &remediation {
                let m = p.metrics.clone();
                cfg.extra_metrics = Some(ingero_server::ExtraMetrics::new(move |r| m.register(r)));
            }
            let server = Server::start(cfg).await.map_err(Failure::lib)?;
            let remediation = remediation.map(|p| commands::actions::start(p, &server));
            if server.grpc_addr.ip().is_unspecified() && args.token_file.is_none() {
                tracing::warn!(
                    "listening on all interfaces without --token-file: anyone who can reach {} can write and read data",
                    server.grpc_addr
                );
            }
            let res = server.run_until(shutdown_signal()).await;
            if let Some(r) = remediation {
                r.abort();
            }
            Ok(res?)
        }
        Command::Stragglers(a) => commands::stragglers::run(*a).await,
        Command::Report(a) => commands::report::run(*a).await,
        Command::Sql(a) => commands::sql::run(*a).await,
        Command::Simulate(a) => commands::simulate::run(*a).await,
        Command::Demo(a) => commands::demo::run(*a).await,
        Command::Evaluate(a) => commands::evaluate::run(*a).await,
        Command::Import(a) => commands::import::run(*a).await,
        Command::Actions(a) => commands::actions::run(*a).await,
        Command::Offenders(a) => commands::offenders::run(*a).await,
        Command::Mcp(a) => commands::mcp::run(*a).await,
        Command::Export(a) => commands::export::run(*a).await,
        Command::Load(args) => {
            if args.nodes == 0 || args.batches == 0 || args.rows == 0 {
                return Err(Failure::Usage("--nodes, --batches and --rows must be > 0".into()));
            }
            let cfg = loadgen::LoadConfig {
                server: args.server,
                nodes: args.nodes,
                batches_per_node: args.batches,
                rows_per_batch: args.rows,
            };
            let r = loadgen::run(&cfg).await?;
            println!(
                "sent {} batches, {} rows ({} duplicates) in {:.2?}: {:.0} rows/s, {:.1} wire bytes/row",
                r.batches,
                r.rows,
                r.duplicates,
                r.elapsed,
                r.rows_per_sec(),
                r.wire_bytes as f64 / r.rows.max(1) as f64
            );
            Ok(())
        }
    }
}

pub(crate) async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}
