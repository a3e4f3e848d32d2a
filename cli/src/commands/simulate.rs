// SPDX-License-Identifier: Apache-2.0
//! `ingero simulate`: a fleet of virtual agents with injected faults.

use std::time::Duration;

use clap::Args;

use super::{CmdResult, Failure, status_failure};
use ingero_proto::pb::query_client::QueryClient;
use std::io::IsTerminal;

use ingero_sim::backfill::{self, BackfillConfig};
use ingero_sim::faults::Injection;
use ingero_sim::fleet::{self, SimConfig, SimReport};

#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Aggregator gRPC URL; with replicas, every replica's URL comma-separated
    /// (each simulated node is routed as an agent would be).
    #[arg(long, env = "INGERO_SERVER", default_value = "http://127.0.0.1:7070")]
    pub server: String,
    /// Simulated nodes (named node-0 … node-N-1), one rank each.
    #[arg(long, default_value_t = 16, env = "INGERO_SIM_NODES")]
    pub nodes: usize,
    /// Split the nodes into this many data-parallel jobs.
    #[arg(long, default_value_t = 1, env = "INGERO_SIM_JOBS")]
    pub jobs: usize,
    /// How long to run (real time; 1-s windows).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, env = "INGERO_SIM_DURATION")]
    pub duration: Duration,
    /// Fault to inject, KIND@NODE:AT[+FOR]; KIND: cpu, gpu, net, io, mem (stragglers),
    /// hang (NODE's rank blocks, its job's other ranks wait in an all-reduce: flagged
    /// `stuck` once they have waited --stuck-after), jobslow (whole job, NODE=all) or
    /// blip (one window); repeatable.
    #[arg(long = "inject", env = "INGERO_SIM_INJECT")]
    pub inject: Vec<String>,
    /// Per-window jitter of every rank (0.05 = ±5 %).
    #[arg(long, default_value_t = 0.05, env = "INGERO_SIM_JITTER")]
    pub jitter: f64,
    #[arg(long, default_value_t = 1, env = "INGERO_SIM_SEED")]
    pub seed: u64,
    /// Print the result as JSON.
    #[arg(long, env = "INGERO_SIM_JSON")]
    pub json: bool,
    /// Simulate the past instead: --duration ending now, pushed through the
    /// real ingest path as fast as the server takes it (history benchmarks,
    /// demos of `stragglers --since`). Injections are relative to the start.
    #[arg(long, env = "INGERO_SIM_BACKFILL")]
    pub backfill: bool,
    /// With --backfill: windows each node ships per batch (as an agent
    /// draining its spool does).
    #[arg(long, default_value_t = 60, env = "INGERO_SIM_WINDOWS_PER_BATCH", value_parser = clap::value_parser!(u32).range(1..=600))]
    pub windows_per_batch: u32,
}

impl SimulateArgs {
    pub(crate) fn config(&self) -> CmdResult<SimConfig> {
        if self.nodes < 2 {
            return Err(Failure::Usage(
                "--nodes must be at least 2 (a straggler is slow relative to its peers)".into(),
            ));
        }
        if !(0.0..0.5).contains(&self.jitter) {
            return Err(Failure::Usage("--jitter must be in [0, 0.5)".into()));
        }
        let injections = self
            .inject
            .iter()
            .map(|s| Injection::parse(s, self.nodes))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Failure::Usage)?;
        for i in &injections {
            if i.at >= self.duration {
                return Err(Failure::Usage(format!(
                    "injection {} at {:?} is after the end (--duration {:?})",
                    i.label(),
                    i.at,
                    self.duration
                )));
            }
        }
        Ok(SimConfig {
            server: self.server.clone(),
            nodes: self.nodes,
            jobs: self.jobs,
            duration: self.duration,
            injections,
            jitter: self.jitter,
            seed: self.seed,
            job_prefix: "llama-pretrain".into(),
        })
    }
}

pub(crate) fn print_report(r: &SimReport) {
    if !r.injections.is_empty() {
        println!("{:<20} {:>6} {:>14}  SIGNALS", "INJECTION", "AT", "FLAGGED AFTER");
    }
    for i in &r.injections {
        let after = i.flagged_after_secs.map_or("NOT FLAGGED".to_string(), |s| format!("{s:.1}s"));
        // The top signal in full, wrapped under its column (80 columns).
        let sig = super::columns::wrap(i.signals.first().map_or("", String::as_str), 80 - 45);
        let first = sig.first().map_or("", String::as_str);
        println!("{:<20} {:>5.0}s {:>14}  {first}", super::columns::fit(&i.injection, 20), i.at_secs, after);
        sig.iter().skip(1).for_each(|l| println!("{:45}{l}", ""));
    }
    if !r.noise.is_empty() {
        // Said, so a fault that is not flagged does not read as a miss.
        println!("not stragglers (noise the detector must not flag): {}", r.noise.join(", "));
    } else if r.injections.is_empty() {
        println!("(no straggler injected)");
    }
    if r.false_flags.is_empty() {
        println!("false flags: none");
    } else {
        println!("false flags: {}", r.false_flags.join(", "));
    }
    println!("batches: {} sent, {} acknowledged ({} rows)", r.batches, r.acknowledged, r.acknowledged_rows);
    if !r.failovers.is_empty() {
        let mut secs: Vec<f64> = r.failovers.iter().map(|f| f.secs).collect();
        secs.sort_by(f64::total_cmp);
        let resent: usize = r.failovers.iter().map(|f| f.resent).sum();
        println!(
            "failovers: {} nodes moved to another replica in {:.1}s median, {:.1}s max; {resent} uncommitted batches sent again",
            secs.len(),
            secs[secs.len() / 2],
            secs[secs.len() - 1]
        );
    }
}

pub(crate) async fn run(a: SimulateArgs) -> CmdResult {
    let cfg = a.config()?;
    if a.backfill {
        return backfill(&a, cfg).await;
    }
    let report = fleet::run(&cfg, |line| eprintln!("{line}")).await.map_err(|e| Failure::Run(e.into()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

async fn backfill(a: &SimulateArgs, c: SimConfig) -> CmdResult {
    let cfg = BackfillConfig { sim: c, windows_per_batch: a.windows_per_batch as usize };
    let started = std::time::Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_decile = 0;
    let mut bar = |done: u64, total: u64, rows: u64| {
        let rate = rows as f64 / started.elapsed().as_secs_f64().max(1e-9);
        let pct = done * 100 / total.max(1);
        let line = format!(
            "[{:<30}] {pct:>3}% {done}/{total} s of {} nodes · {:.1} M rows · {:.2} M rows/s",
            "#".repeat((pct * 30 / 100) as usize),
            cfg.sim.nodes,
            rows as f64 / 1e6,
            rate / 1e6
        );
        if tty {
            eprint!("\r{line}");
        } else if pct / 10 > last_decile || done == total {
            last_decile = pct / 10;
            eprintln!("{line}");
        }
    };
    let r = backfill::run(&cfg, &mut bar).await.map_err(|e| Failure::Run(e.into()))?;
    if tty {
        eprintln!();
    }
    let (top, ranked_secs) = server_top(&a.server, r.start_us).await?;
    if a.json {
        let v = serde_json::json!({ "backfill": r, "server_ranking_secs": ranked_secs, "top": top });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let at = |us: i64| ingero_model::time::rfc3339(us);
    println!(
        "backfilled {} nodes × {} s ({} .. {}): {} rows in {} batches, {:.1} s, {:.2} M rows/s{}",
        r.nodes,
        r.windows,
        at(r.start_us),
        at(r.end_us),
        r.rows,
        r.batches,
        r.elapsed_secs,
        r.rows_per_sec / 1e6,
        if r.duplicates > 0 { format!(" ({} duplicates)", r.duplicates) } else { String::new() }
    );
    let names: Vec<String> = top
        .iter()
        .map(|s| {
            format!("{}{}", s["node"].as_str().unwrap_or("?"), if s["flagged"] == true { " (flagged)" } else { "" })
        })
        .collect();
    println!(
        "server flushed and ranked the range in {ranked_secs:.1} s; top: {}",
        if names.is_empty() { "no node deviates".to_string() } else { names.join(", ") }
    );
    println!("from the store: ingero stragglers --store <the server's store> --since {}", at(r.start_us));
    Ok(())
}

/// The server's history ranking of the backfilled range (top 3). Asking
/// makes the server flush what it buffered, so the store then holds it all.
async fn server_top(server: &str, start_us: i64) -> CmdResult<(Vec<serde_json::Value>, f64)> {
    let t = std::time::Instant::now();
    let ch = ingero_proto::client::channel(server).map_err(|e| Failure::Run(e.into()))?;
    let req = ingero_proto::pb::StragglersRequest { start_us, ..Default::default() };
    let json = QueryClient::new(ch).stragglers(req).await.map_err(status_failure)?.into_inner().json;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    let top = v["stragglers"].as_array().map(|a| a.iter().take(3).cloned().collect()).unwrap_or_default();
    Ok((top, t.elapsed().as_secs_f64()))
}
