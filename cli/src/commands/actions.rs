// SPDX-License-Identifier: Apache-2.0
//! `ingero serve --remediate …` (the flags and starting the loop) and
//! `ingero actions` (what remediation did and held back, from the store).

use std::sync::Arc;

use clap::Args;

use super::columns::{fit, wrap};
use super::{CmdResult, Failure, Since};
use crate::cli::{RemediateArgs, StoreArgs};
use ingero_action::cluster::Cluster;
use ingero_action::journal::{self, Record};
use ingero_action::{Config, Controller, Mode};
use ingero_server::Server;
use ingero_store::Store;

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
            "no remediation records since {} in {}\n(remediation runs with `ingero serve --remediate dry-run|on`)",
            ingero_model::time::rfc3339(a.since.start_us()),
            store.url
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

#[cfg(test)]
mod tests {
    use super::*;

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
