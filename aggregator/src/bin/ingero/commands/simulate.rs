//! `ingero simulate`: a fleet of virtual agents with injected faults.

use std::time::Duration;

use clap::Args;

use super::{CmdResult, Failure};
use ingero_sim::faults::Injection;
use ingero_sim::fleet::{self, SimConfig, SimReport};

#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Aggregator gRPC address.
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
    /// jobslow (whole job, NODE=all) or blip (one window); repeatable.
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
    println!("{:<22} {:>6} {:>14}  SIGNALS", "INJECTION", "AT", "FLAGGED AFTER");
    for i in &r.injections {
        let after = i.flagged_after_secs.map_or("NOT FLAGGED".to_string(), |s| format!("{s:.1}s"));
        let sig = i.signals.first().cloned().unwrap_or_default();
        let sig: String = sig.chars().take(80 - 47).collect();
        println!("{:<22} {:>5.0}s {:>14}  {}", i.injection, i.at_secs, after, sig);
    }
    if r.injections.is_empty() {
        println!("(no straggler injected)");
    }
    if r.false_flags.is_empty() {
        println!("false flags: none");
    } else {
        println!("false flags: {}", r.false_flags.join(", "));
    }
}

pub(crate) async fn run(a: SimulateArgs) -> CmdResult {
    let cfg = a.config()?;
    let report = fleet::run(&cfg, |line| eprintln!("{line}")).await.map_err(|e| Failure::Run(e.into()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}
