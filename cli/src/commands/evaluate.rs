// SPDX-License-Identifier: Apache-2.0
//! `ingero evaluate`: the live detector against a simulated fleet day,
//! faster than real time: false flags per 1,000 node-days, recall, and
//! fault→flag latency, for the detector settings given.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use clap::Args;

use super::{CmdResult, Failure};
use crate::cli::RankArgs;
use ingero_model::signals::NodeWindowKey;
use ingero_server::rank::detector::Detector;
use ingero_sim::fleetday::{DayConfig, FleetDay, node_index, node_name};
use ingero_sim::scoring::{Score, Scorer};

#[derive(Debug, Args)]
pub(crate) struct EvaluateArgs {
    /// Simulated nodes (pools of --pool-size, cut into jobs of 4-32 nodes).
    #[arg(long, env = "INGERO_EVAL_NODES", default_value_t = 1000)]
    nodes: usize,
    /// Simulated time (1-s windows), e.g. 24h, 90m.
    #[arg(long, env = "INGERO_EVAL_DURATION", default_value = "24h", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Straggler faults injected (CPU contention, slow GPU, IO, memory; 2-20 min each).
    #[arg(long, env = "INGERO_EVAL_FAULTS", default_value_t = 200)]
    faults: usize,
    /// Nodes that are genuinely slow all day (flagging them is right).
    #[arg(long, env = "INGERO_EVAL_SLOW_NODES", default_value_t = 3)]
    slow_nodes: usize,
    /// Every job checkpoints this often (all ranks write for 10-40 s).
    #[arg(long, env = "INGERO_EVAL_CHECKPOINT_EVERY", default_value = "30m", value_parser = humantime::parse_duration)]
    checkpoint_every: Duration,
    /// Data-loader hiccups (twice an hour per node, 20-60 ms host-blocked per
    /// step) last 1 s to this long.
    #[arg(long, env = "INGERO_EVAL_HICCUP_MAX", default_value = "3s", value_parser = humantime::parse_duration)]
    hiccup_max: Duration,
    /// Nodes per pool.
    #[arg(long, env = "INGERO_EVAL_POOL_SIZE", default_value_t = 64)]
    pool_size: usize,
    /// The simulated day's seed: the same seed and flags give the same day and result.
    #[arg(long, env = "INGERO_EVAL_SEED", default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    rank: RankArgs,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(a: EvaluateArgs) -> CmdResult {
    if a.nodes == 0 || a.pool_size == 0 || a.duration < Duration::from_secs(60) {
        return Err(Failure::Usage("--nodes and --pool-size must be > 0 and --duration at least 1m".into()));
    }
    if a.checkpoint_every < Duration::from_secs(60) {
        return Err(Failure::Usage("--checkpoint-every must be at least 1m".into()));
    }
    let cfg = DayConfig {
        nodes: a.nodes,
        duration: a.duration,
        seed: a.seed,
        faults: a.faults,
        slow_nodes: a.slow_nodes,
        checkpoint_every: a.checkpoint_every,
        pool_size: a.pool_size,
        hiccup_max_s: a.hiccup_max.as_secs().max(1),
    };
    let detector = a.rank.detector();
    let grace_us = a.rank.grace.as_micros() as i64;
    let (score, wall) = tokio::task::spawn_blocking(move || simulate(cfg, detector, grace_us, !a.json))
        .await
        .map_err(|e| Failure::Run(e.into()))?;
    if a.json {
        let mut v = serde_json::to_value(&score).map_err(anyhow::Error::from)?;
        v["wall_seconds"] = wall.as_secs_f64().into();
        println!("{v}");
    } else {
        print!("{}", summary(&score, a.duration, wall));
    }
    Ok(())
}

/// Runs the day window by window through the detector; progress on stderr.
fn simulate(
    cfg: DayConfig,
    det: ingero_server::rank::detector::DetectorConfig,
    grace_us: i64,
    progress: bool,
) -> (Score, Duration) {
    let started = Instant::now();
    let (nodes, secs) = (cfg.nodes, cfg.duration.as_secs());
    let mut day = FleetDay::new(cfg);
    // As live: a node that stopped reporting is forgotten.
    let forget_after = det.forget_after.or(Some(ingero_server::rank::FORGET_AFTER));
    let mut detector = Detector::new(ingero_server::rank::detector::DetectorConfig { forget_after, ..det });
    let mut scorer = Scorer::new(day.faults(), day.slow_nodes());
    let names: Vec<String> = (0..nodes).map(node_name).collect();
    // Window starts on a real clock (the detector keeps times as µs).
    let epoch_us = 1_767_225_600_000_000i64;
    let mut out = Vec::new();
    // Jobs that reported in the last 10 minutes: a preempted job is still
    // the node's job; an ended one (its name is never reused) is history.
    let mut running: std::collections::HashMap<String, u64> = Default::default();
    for t in 0..secs {
        day.window(t, &mut out);
        running.retain(|_, seen| t - *seen <= 600);
        let start_us = epoch_us + t as i64 * 1_000_000;
        for (job, node, s) in out.drain(..) {
            let key = NodeWindowKey { job: job.clone(), node: names[node].clone(), window_start_us: start_us };
            detector.add(key, &s);
            running.insert(job, t);
        }
        detector.evaluate(start_us + 1_000_000 + grace_us, grace_us);
        // A node counts as flagged in the job it runs (an ended job's last
        // standing is history).
        let flagged: HashSet<usize> =
            detector.flagged().filter(|(j, _)| running.contains_key(*j)).filter_map(|(_, n)| node_index(n)).collect();
        scorer.observe(t, flagged);
        if progress && t % 3600 == 3599 {
            eprintln!("simulated {}h of {:.1}h in {:.0?}", (t + 1) / 3600, secs as f64 / 3600.0, started.elapsed());
        }
    }
    (scorer.finish(nodes, secs, |i| day.fault_seen(i)), started.elapsed())
}

fn summary(s: &Score, simulated: Duration, wall: Duration) -> String {
    let opt = |v: Option<u64>| v.map_or("-".into(), |v| format!("{v} s"));
    let mut out = format!(
        "{} nodes × {} simulated in {:.1?} ({:.0}× real time)\n",
        s.nodes,
        humantime::format_duration(simulated),
        wall,
        simulated.as_secs_f64() / wall.as_secs_f64().max(1e-9)
    );
    out += &format!(
        "false flags        {} ({:.2} per 1,000 node-days over {:.0} node-days)\n",
        s.false_flags, s.false_flags_per_1000_node_days, s.node_days
    );
    out += &format!(
        "  of which ≥ 2 min  {} (what an alert's for: 2m or remediation would act on)\n",
        s.false_flags_over_2m
    );
    out += &format!("recall             {:.1}% ({} of {} faults flagged)\n", s.recall * 100.0, s.detected, s.faults);
    out += &format!(
        "fault → flag       p50 {}, p90 {}, max {}\n",
        opt(s.flag_latency_p50_s),
        opt(s.flag_latency_p90_s),
        opt(s.flag_latency_max_s)
    );
    out += &format!("slow nodes flagged {} of {}\n", s.slow_nodes_flagged, s.slow_nodes);
    for (node, kind, a, b) in s.missed.iter().take(10) {
        out += &format!("  missed {kind} on {} at {a} s for {} s\n", node_name(*node), b - a);
    }
    for (t, node) in s.false_flag_examples.iter().take(10) {
        out += &format!("  false flag on {} at {t} s\n", node_name(*node));
    }
    out
}
