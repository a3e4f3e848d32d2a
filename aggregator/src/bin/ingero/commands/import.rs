//! `ingero import`: bring traces recorded by Ingero (Go) into a store.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{CmdResult, Failure};
use crate::cli::StoreArgs;
use ingero_aggregator::import;
use ingero_aggregator::store::Store;

#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// SQLite trace files recorded by `ingero trace` (Go, schema ≤ 0.8).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Node name the traces were recorded on (one node per import).
    #[arg(long, env = "INGERO_IMPORT_NODE")]
    pub node: String,
    /// Job these traces belong to: give several nodes the same job to rank them against each other.
    #[arg(long, env = "INGERO_IMPORT_JOB")]
    pub job: Option<String>,
    /// Window the events are folded into.
    #[arg(long, env = "INGERO_IMPORT_WINDOW", default_value = "1s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub(crate) async fn run(a: ImportArgs) -> CmdResult {
    if a.node.trim().is_empty() {
        return Err(Failure::Usage("--node must not be empty".into()));
    }
    if a.window < Duration::from_millis(100) || a.window > Duration::from_secs(60) {
        return Err(Failure::Usage("--window must be between 100ms and 60s".into()));
    }
    let store = Store::open(&a.store.store, &a.store.options()).map_err(|e| Failure::Usage(e.to_string()))?;
    let window_ns = a.window.as_nanos() as i64;
    let mut folded = Vec::new();
    for path in &a.files {
        let (node, job, p) = (a.node.clone(), a.job.clone(), path.clone());
        let f = tokio::task::spawn_blocking(move || {
            import::fold_file(&p, &node, job, window_ns, |n, total| {
                eprintln!("  {}: {n}/{total} events", p.display());
            })
        })
        .await?
        .map_err(Failure::lib)?;
        let calls: u64 = f.stats.calls.values().sum();
        eprintln!(
            "{}: {} events → {} windows, {} calls ({} counted but not stored by the source), {} reference diagnoses",
            f.file, f.stats.events, f.stats.windows, calls, f.stats.discarded_calls, f.reference_chains
        );
        if !f.stats.skipped.is_empty() {
            let s: Vec<String> = f.stats.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
            eprintln!("  not imported (no table for them yet): {}", s.join(", "));
        }
        folded.push(f);
    }
    let files = import::write(&store, &folded).await?;
    println!("imported {} trace(s) as node {} into {} ({files} Parquet files)", folded.len(), a.node, store.url);
    Ok(())
}
