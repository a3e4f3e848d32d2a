// SPDX-License-Identifier: Apache-2.0
//! `ingero import`: bring traces recorded by Ingero (Go) into a store.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{CmdResult, Failure};
use crate::cli::StoreArgs;
use ingero_analysis::import;
use ingero_store::Store;

#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// SQLite trace files recorded by `ingero trace` (Go, schema ≤ 0.10), or
    /// made by its `ingero merge` (one node per node the file names). A live
    /// file brings its rolled-over siblings (`<stem>.<UTC stamp>.db`), oldest
    /// first, as one trace.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Node name of traces that name none (schema before 0.9); files that
    /// name their nodes keep those names.
    #[arg(long, env = "INGERO_IMPORT_NODE")]
    pub node: Option<String>,
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
    if a.node.as_deref().is_some_and(|n| n.trim().is_empty()) {
        return Err(Failure::Usage("--node must not be empty".into()));
    }
    if a.window < Duration::from_millis(100) || a.window > Duration::from_secs(60) {
        return Err(Failure::Usage("--window must be between 100ms and 60s".into()));
    }
    let store = Store::open(&a.store.store, &a.store.options()).map_err(|e| Failure::Usage(e.to_string()))?;
    let window_ns = a.window.as_nanos() as i64;
    let sets = import::sets(&a.files).map_err(Failure::lib)?;
    let mut folded = Vec::new();
    for set in sets {
        if set.len() > 1 {
            eprintln!(
                "{}: one trace in {} files (rolled over), oldest first",
                set.last().map(|p| p.display().to_string()).unwrap_or_default(),
                set.len()
            );
        }
        let (node, job) = (a.node.clone(), a.job.clone());
        let parts = tokio::task::spawn_blocking(move || {
            import::fold_set(&set, node.as_deref(), job, window_ns, |p, n, total| {
                eprintln!("  {}: {n}/{total} events", p.display());
            })
        })
        .await?
        .map_err(Failure::lib)?;
        for f in parts {
            report_folded(&f);
            folded.push(f);
        }
    }
    let files = import::write(&store, &folded).await?;
    let mut nodes: Vec<&str> = folded.iter().map(|f| f.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let traces = folded.iter().map(|f| f.file.as_str()).collect::<std::collections::HashSet<_>>().len();
    if files == 0 && !folded.is_empty() {
        // Each set commits under its content's fingerprint: the same trace
        // imported again adds nothing (no double counts), which says so.
        println!(
            "already in {}: {traces} file(s) as node(s) {} were imported before; nothing added",
            store.url,
            nodes.join(", ")
        );
    } else {
        println!(
            "imported {traces} file(s) as node(s) {} into {} ({files} Parquet files)",
            nodes.join(", "),
            store.url
        );
    }
    Ok(())
}

/// One line per file and node: what was read and what it became.
fn report_folded(f: &import::Folded) {
    let calls: u64 = f.stats.calls.values().sum();
    eprintln!(
        "{} (node {}): {} events → {} windows, {} calls ({} counted but not stored by the source), {} reference diagnoses, {} annotations",
        f.file,
        f.node,
        f.stats.events,
        f.stats.windows,
        calls,
        f.stats.discarded_calls,
        f.reference_chains,
        f.stats.annotations
    );
    if f.stats.bad_annotations > 0 {
        eprintln!(
            "  {} annotation row(s) left out: labels not a JSON object of strings, or over 4 KiB",
            f.stats.bad_annotations
        );
    }
    if !f.stats.skipped.is_empty() {
        let s: Vec<String> = f.stats.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
        eprintln!("  not imported (no table for them yet): {}", s.join(", "));
    }
}
