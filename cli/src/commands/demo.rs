// SPDX-License-Identifier: Apache-2.0
//! `ingero demo`: an in-process aggregator, a simulated fleet with one
//! straggler, the time to flag, the ranking and the affected pod's report.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{CmdResult, Failure};
use ingero_analysis::query::service::with_query;
use ingero_analysis::report::{self, Target};
use ingero_server::{ServeConfig, Server};
use ingero_sim::faults::Injection;
use ingero_sim::fleet::{self, SimConfig};
use ingero_store::StoreUrl;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 16, env = "INGERO_DEMO_NODES")]
    pub nodes: usize,
    /// Run time of the simulated job.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, env = "INGERO_DEMO_DURATION")]
    pub duration: Duration,
    /// The fault to inject (KIND@NODE:AT, see `ingero simulate --help`).
    #[arg(long, default_value = "cpu@5:10s", env = "INGERO_DEMO_INJECT")]
    pub inject: String,
    /// Where to write the HTML report.
    #[arg(long, default_value = "ingero-demo-report.html", env = "INGERO_DEMO_HTML")]
    pub html: PathBuf,
    /// Keep the demo's dataset here instead of a temporary directory.
    #[arg(long, env = "INGERO_DEMO_KEEP")]
    pub keep: Option<PathBuf>,
}

pub(crate) async fn run(a: DemoArgs) -> CmdResult {
    let inj = Injection::parse(&a.inject, a.nodes).map_err(Failure::Usage)?;
    if inj.at >= a.duration {
        return Err(Failure::Usage("the injection must happen before the end of --duration".into()));
    }
    // The dataset goes where --keep says (relative to here), else into a
    // directory removed however the demo ends.
    let (root, _tmp) = match &a.keep {
        Some(k) => (std::path::absolute(k).map_err(|e| Failure::Usage(format!("--keep {}: {e}", k.display())))?, None),
        None => {
            let t = TempDir::new()?;
            (t.0.clone(), Some(t))
        }
    };
    let store = StoreUrl::parse(&format!("file://{}", root.join("data").display()))
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let mut cfg =
        with_query(ServeConfig::ephemeral(store.clone(), Default::default(), root.join("wal")), Default::default());
    cfg.commit.flush_age = Duration::from_secs(5);
    let server = Server::start(cfg).await?;
    // Ctrl-C returns through here too: the aggregator stops writing into
    // the directory before it goes.
    let r = tokio::select! {
        r = demo(&a, inj, &server, &store) => r,
        _ = crate::shutdown_signal() => Err(Failure::Interrupted),
    };
    server.shutdown().await?;
    if r.is_ok() && a.keep.is_some() {
        println!("dataset kept in {}", root.display());
        eprintln!("try: ingero stragglers --store {store} --since 5m");
    }
    r
}

async fn demo(a: &DemoArgs, inj: Injection, server: &Server, store: &StoreUrl) -> CmdResult {
    // One fact per line: a temporary store's path alone is ~40 columns.
    eprintln!("ingero demo: aggregator on {}", server.grpc_url());
    eprintln!("  store {store}");
    eprintln!(
        "simulating {} nodes of one data-parallel job for {:?};\n  injecting {} at {:?}",
        a.nodes,
        a.duration,
        inj.label(),
        inj.at
    );

    let sim = SimConfig {
        server: server.grpc_url(),
        nodes: a.nodes,
        jobs: 1,
        duration: a.duration,
        injections: vec![inj.clone()],
        jitter: 0.05,
        seed: 7,
        job_prefix: "llama-pretrain".into(),
    };
    let result = fleet::run(&sim, |line| eprintln!("  {line}")).await.map_err(|e| Failure::Run(e.into()))?;
    println!();
    super::simulate::print_report(&result);
    println!();
    println!("Live ranking (ingero stragglers --server {}):", server.grpc_url());
    let ranking = serde_json::to_value(server.ranker.ranking(None))?;
    print!("{}", super::stragglers::table(&ranking, chrono::Utc::now()));

    server.committer.flush().await?;
    let engine = ingero_analysis::query::QueryEngine::open(&server.store, Default::default()).await?;
    let rank = match inj.target {
        ingero_sim::faults::Target::Node(n) => n,
        ingero_sim::faults::Target::All => 0,
    };
    let target = Target::Pod { namespace: "ml".into(), name: format!("llama-pretrain-worker-{rank}") };
    // The simulated windows' own range: pushing may lag the clock (a big
    // fleet on a slow build), and the report is about those windows.
    let (start, end) = (result.start_us, result.start_us + result.windows as i64 * 1_000_000);
    let rep = report::build(&engine, &target, start, end, Default::default()).await?;
    println!("\n{}", report::text::render(&rep));
    std::fs::write(&a.html, report::html::render(&rep))
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", a.html.display()))?;
    println!("HTML report: {}", a.html.display());
    Ok(())
}

/// The demo's own directory, removed however the demo returns (success,
/// error or Ctrl-C).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> CmdResult<TempDir> {
        let p = std::env::temp_dir().join(format!("ingero-demo-{}", std::process::id()));
        std::fs::create_dir_all(&p).map_err(|e| anyhow::anyhow!("creating {}: {e}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
