// SPDX-License-Identifier: Apache-2.0
//! `ingero serve --remediate …` (the flags and starting the loop) and
//! `ingero actions` (what remediation did and held back, from the store).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{CmdResult, Failure, Since};
use crate::cli::StoreArgs;
use ingero_action::cluster::Cluster;
use ingero_action::journal::{self, Record};
use ingero_action::{Config, Controller, Mode};
use ingero_server::Server;
use ingero_store::Store;

/// Remediation: off unless asked. Marks confirmed stragglers in Kubernetes
/// (node condition IngeroStraggler with cause and report, Events on the node
/// and the job's pods; a NoSchedule taint only with --remediate-taint), within
/// budgets, and undoes it when the node is healthy again. Never evicts.
#[derive(Debug, Clone, Args)]
pub(crate) struct RemediateArgs {
    /// off, dry-run (decide, journal and log what it would do; change nothing) or on.
    #[arg(long, env = "INGERO_REMEDIATE", default_value = "off")]
    pub remediate: Mode,
    /// Also taint a marked node NoSchedule (new pods go elsewhere; running ones stay).
    #[arg(long, env = "INGERO_REMEDIATE_TAINT")]
    pub remediate_taint: bool,
    /// At most this many nodes marked at once, fleet-wide (read from the API
    /// server, so replicas share it).
    #[arg(long, env = "INGERO_REMEDIATE_MAX_NODES", default_value_t = 2)]
    pub remediate_max_nodes: usize,
    /// At most this share of a job's nodes marked at once (`25%` or `0.25`),
    /// rounded down: a job too small for one node is reported, never acted on.
    #[arg(long, env = "INGERO_REMEDIATE_MAX_JOB_SHARE", default_value = "50%", value_parser = parse_share)]
    pub remediate_max_job_share: f64,
    /// At most this many new marks per rolling hour (per replica).
    #[arg(long, env = "INGERO_REMEDIATE_MAX_PER_HOUR", default_value_t = 6)]
    pub remediate_max_per_hour: usize,
    /// A node must stay flagged this long, continuously, before it is marked.
    #[arg(long, env = "INGERO_REMEDIATE_AFTER", default_value = "5m", value_parser = humantime::parse_duration)]
    pub remediate_after: Duration,
    /// A marked node is cleared (condition False, taint removed) once healthy this long.
    #[arg(long, env = "INGERO_REMEDIATE_CLEAR_AFTER", default_value = "15m", value_parser = humantime::parse_duration)]
    pub remediate_clear_after: Duration,
    /// How often remediation looks at the live ranking.
    #[arg(long, env = "INGERO_REMEDIATE_EVERY", default_value = "10s", value_parser = humantime::parse_duration)]
    pub remediate_every: Duration,
    /// Where the condition sends a reader, `{node}` and `{job}` replaced
    /// (e.g. https://grafana.example/d/ingero?var-node={node}). Default: the
    /// `ingero report --node` command.
    #[arg(long, env = "INGERO_REPORT_URL")]
    pub report_url: Option<String>,
    /// Kubeconfig for remediation; default: the pod's service account, then KUBECONFIG.
    #[arg(long, env = "INGERO_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

fn parse_share(s: &str) -> Result<f64, String> {
    let (num, scale) = match s.strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (s, 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a share (25% or 0.25)"))?;
    let v = v / scale;
    if (0.0..=1.0).contains(&v) { Ok(v) } else { Err(format!("`{s}` is not between 0% and 100%")) }
}

impl RemediateArgs {
    pub(crate) fn config(&self) -> Result<Config, String> {
        let cfg = Config {
            mode: self.remediate,
            taint: self.remediate_taint,
            max_nodes: self.remediate_max_nodes,
            max_job_share: self.remediate_max_job_share,
            max_per_hour: self.remediate_max_per_hour,
            min_evidence: self.remediate_after,
            clear_after: self.remediate_clear_after,
            report_url: self.report_url.clone(),
            every: self.remediate_every,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Remediation ready to start once the server runs: connected to the API
/// server first, so a bad kubeconfig stops `serve` before it listens.
pub(crate) struct Pending {
    cfg: Config,
    cluster: Cluster,
    pub(crate) metrics: ingero_action::metrics::Metrics,
}

pub(crate) async fn prepare(args: &RemediateArgs) -> CmdResult<Option<Pending>> {
    let cfg = args.config().map_err(Failure::Usage)?;
    if cfg.mode == Mode::Off {
        return Ok(None);
    }
    let instance = std::env::var("HOSTNAME").unwrap_or_else(|_| "ingero-serve".into());
    let cluster = Cluster::connect(args.kubeconfig.as_deref(), &instance).await.map_err(|e| match e {
        ingero_action::Error::Config(m) => Failure::Usage(m),
        other => Failure::Run(other.into()),
    })?;
    Ok(Some(Pending { cfg, cluster, metrics: Default::default() }))
}

/// Starts the loop on the live ranking of the jobs this replica ranks.
pub(crate) fn start(p: Pending, server: &Server) -> tokio::task::JoinHandle<()> {
    let det = server.ranker.detector.clone();
    // Every ranked node, flagged or not: a job's size is its node count.
    let source = Arc::new(move || det.lock().unwrap_or_else(|e| e.into_inner()).standings(None, f64::NEG_INFINITY));
    tracing::info!(mode = %p.cfg.mode, taint = p.cfg.taint, max_nodes = p.cfg.max_nodes, "remediation on");
    let shared = server.replicas.is_some();
    Controller::new(p.cfg, p.cluster, server.store.clone(), p.metrics, source, shared).spawn()
}

#[derive(Debug, Args)]
pub(crate) struct ActionsArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// From this long ago (7d, 12h) or this RFC 3339 time.
    #[arg(long, env = "INGERO_SINCE", default_value = "7d", value_parser = Since::parse)]
    pub since: Since,
    /// Only this node's records.
    #[arg(long, env = "INGERO_NODE")]
    pub node: Option<String>,
    /// One JSON object per line instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) async fn run(a: ActionsArgs) -> CmdResult {
    let store = Store::open(&a.store.store, &a.store.options()).map_err(|e| Failure::Usage(e.to_string()))?;
    let mut recs = journal::read(&store, a.since.start_us()).await?;
    recs.retain(|r| a.node.as_deref().is_none_or(|n| n == r.node));
    if a.json {
        for r in &recs {
            println!("{}", serde_json::to_string(r).map_err(anyhow::Error::from)?);
        }
        return Ok(());
    }
    if recs.is_empty() {
        println!(
            "no remediation records in {} since {} (remediation runs with `ingero serve --remediate dry-run|on`)",
            store.url,
            chrono::DateTime::from_timestamp_micros(a.since.start_us()).unwrap_or_default().to_rfc3339()
        );
        return Ok(());
    }
    print!("{}", table(&recs));
    Ok(())
}

/// Two lines per record, each within 80 columns: what and where, then why.
fn table(recs: &[Record]) -> String {
    let mut out = format!("{:<20} {:<12} {:<16} {}\n", "TIME (UTC)", "ACTION", "NODE", "JOB");
    for r in recs {
        let action = if r.mode == "dry-run" { format!("{} (dry)", r.action) } else { r.action.clone() };
        let line = format!("{:<20} {:<12} {:<16} {}", r.at, action, fit(&r.node, 16), r.job);
        out.push_str(&fit(&line, 80));
        out.push('\n');
        let why = match (r.cause.is_empty(), r.detail.is_empty()) {
            (false, false) if r.detail.contains(&r.cause) => r.detail.clone(),
            (false, false) => format!("{} — {}", r.cause, r.detail),
            (false, true) => r.cause.clone(),
            _ => r.detail.clone(),
        };
        for l in wrap(&why, 78) {
            out.push_str(&format!("  {l}\n"));
        }
    }
    out
}

/// Words into lines of at most `w` characters (a longer word, a URL, is cut).
fn wrap(s: &str, w: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in s.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > w {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines.into_iter().map(|l| fit(&l, w)).collect()
}

/// At most `w` characters, an ellipsis marking a cut.
fn fit(s: &str, w: usize) -> String {
    if s.chars().count() <= w { s.to_string() } else { s.chars().take(w - 1).chain(['…']).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares() {
        assert_eq!(parse_share("25%"), Ok(0.25));
        assert_eq!(parse_share("0.5"), Ok(0.5));
        assert!(parse_share("150%").is_err());
        assert!(parse_share("half").is_err());
    }

    #[test]
    fn the_table_fits_80_columns() {
        let mut r = Record::new(
            "held",
            "gpu-node-0123456789abc",
            "pytorchjob:ml/llama-70b-pretrain-v2",
            Mode::On,
            "",
            String::new(),
        );
        r.cause = "GPU waits on the host 42% of the window (job median 5%); NCCL all-reduce 3.1x".into();
        r.detail = "fleet budget: 2 nodes marked (max 2)".into();
        let mut d = r.clone();
        d.mode = "dry-run".into();
        d.action = "mark".into();
        let t = table(&[r, d]);
        assert!(t.lines().all(|l| l.chars().count() <= 80), "{t}");
        assert!(t.contains("mark (dry)"), "{t}");
        assert!(t.contains("gpu-node-012345…"), "{t}");
        assert!(t.lines().nth(2).unwrap().starts_with("  GPU waits on the host 42%"), "{t}");
    }
}
