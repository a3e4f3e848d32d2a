// SPDX-License-Identifier: Apache-2.0
//! `ingero-agent`: per-node eBPF tracing of CUDA, NCCL and the scheduler.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ingero_agent::agent::{self, Agent, AgentConfig, KubeConfig, Sink};
use ingero_agent::probe_loop::LoopConfig;
use ingero_agent::{check, error, probes};

use ingero_node::embedded::{self, Embedded};

/// Ingero agent: traces CUDA/NCCL calls and the scheduler with eBPF,
/// aggregates in the kernel, and ships per-window data to `ingero serve`
/// (or writes the Parquet dataset itself with --store).
#[derive(Debug, Parser)]
#[command(name = "ingero-agent", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Trace this node.
    Run(Box<RunArgs>),
    /// Check, read-only, that this host can run the agent: BTF, uprobes, capabilities, pid and cgroup
    /// namespaces, then load the programs (feature probe) and measure their kernel memory against the
    /// memory cgroup limit; lists the CUDA/NCCL libraries mapped now.
    Check,
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    ingero_model::units::parse_bytes(s)
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Aggregator gRPC address (e.g. http://ingero:7070). With several
    /// aggregator replicas: every replica's address, comma-separated, as their
    /// --replicas lists them; this node sends to the one its name hashes to and
    /// moves to the next if that one stops answering.
    #[arg(long, env = "INGERO_AGGREGATOR", conflicts_with = "store", required_unless_present = "store")]
    aggregator: Option<String>,
    /// Single-node use: write the Parquet dataset here, no server needed (file://, s3://, …).
    /// Only in an agent built with `--features store` (the DaemonSet build ships to --aggregator).
    #[arg(long, env = "INGERO_STORE")]
    store: Option<String>,
    /// S3-compatible endpoint for --store s3://…
    #[arg(long, env = "INGERO_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// Node name (default: $NODE_NAME, then the hostname).
    #[arg(long, env = "INGERO_NODE")]
    node: Option<String>,
    /// Aggregation window.
    #[arg(long, env = "INGERO_WINDOW", default_value = "1s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Batches wait here until acknowledged (survives restarts and outages).
    #[arg(long, env = "INGERO_SPOOL_DIR", default_value = "/var/lib/ingero-agent/spool")]
    spool_dir: PathBuf,
    /// Largest spool; when full the oldest batches are dropped (and counted).
    #[arg(long, env = "INGERO_SPOOL_MAX", default_value = "256MiB", value_parser = parse_bytes)]
    spool_max: usize,
    /// Prometheus metrics address (e.g. 0.0.0.0:9464).
    #[arg(long, env = "INGERO_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Trace only processes under this cgroup (v2 directory, e.g. /sys/fs/cgroup/kubepods.slice).
    #[arg(long, env = "INGERO_CGROUP_ROOT")]
    cgroup_root: Option<PathBuf>,
    /// Trace only these processes (repeatable).
    #[arg(long = "pid", env = "INGERO_PID", value_delimiter = ',')]
    pids: Vec<u32>,
    /// Measure the probes' own run time (BPF_STATS_RUN_TIME, shipped as
    /// `probe_run_ns` and `ingero_agent_probe_run_ns_total`) in one window of
    /// every N, scaled by N. While the kernel's accounting is on, every BPF
    /// program on the node pays ~50 ns a run for it. 1: every window; 0: never.
    #[arg(long, env = "INGERO_PROBE_TIME_EVERY", default_value_t = 30)]
    probe_time_every: u32,
    /// The share of one CPU the agent's probes may cost a traced process (each probed call traps into the
    /// kernel: ~0.5-0.8 µs, measured at start). Above it, the entry-only probes a program hits once per
    /// kernel (launches, event records, memsets) are attached for the middle part of each second only
    /// (1/2 down to 1/8 of it: the largest share that keeps the busiest process in budget, once one has
    /// been over it for 2 s), and their counts in `call_windows` are estimates: what was seen divided by
    /// `sample_ratio`, the share of the process's timed calls that fell where the probes were on (its
    /// pace with and without them). Syncs, copies, collectives and allocations stay probed (their
    /// durations, outliers and steps are exact). Needs uprobe_multi links (Linux 6.6+); `off`: every
    /// probe always on, counts exact.
    #[arg(long, env = "INGERO_TRAP_BUDGET", default_value = "1%", value_parser = trap_budget)]
    trap_budget: Budget,
    /// How often to rescan processes for newly loaded libraries.
    #[arg(long, env = "INGERO_RESCAN", default_value = "2s", value_parser = humantime::parse_duration)]
    rescan: Duration,
    /// A call is an outlier above this multiple of its own process's median for the op (a
    /// quantile of that process's recent calls; no other process moves it)…
    #[arg(long, env = "INGERO_OUTLIER_FACTOR", default_value_t = 10.0)]
    outlier_factor: f64,
    /// …and above this duration (alone, until the process has made 20 calls of the op).
    #[arg(long, env = "INGERO_OUTLIER_MIN", default_value = "1ms", value_parser = humantime::parse_duration)]
    outlier_min: Duration,
    /// Use a fixed outlier threshold instead.
    #[arg(long, env = "INGERO_OUTLIER_ABS", value_parser = humantime::parse_duration)]
    outlier_abs: Option<Duration>,
    /// A traced thread off CPU outside any CUDA/NCCL call at least this long (a lock, a queue, a
    /// sleep, a blocking read) ships the episode with its Python and native call site, taken when
    /// the syscall it slept in returns; reports rank these sites by their share of the time. Shorter
    /// episodes are still counted in the off-CPU time, without a site. While on, every syscall on
    /// the node takes the kernel's traced exit path and one array lookup (~30-60 ns more per
    /// syscall, BENCHMARKS.md). 0s: off.
    #[arg(long, env = "INGERO_OFFCPU_SITE_MIN", default_value = "10ms", value_parser = humantime::parse_duration)]
    offcpu_site_min: Duration,
    /// Do not find training steps. By default each return-probed call (syncs, copies, collectives,
    /// allocations: a few per step; never launches) is passed to the agent as it returns, and each
    /// process's step cycle is found in their order: `progress_windows` then carries the steps that
    /// ended in each window with their median and longest time, and reports and `ingero stragglers`
    /// show step time without any code change in the job.
    #[arg(long, env = "INGERO_NO_STEPS")]
    no_steps: bool,
    /// Place every call probe as a perf event of its own, even where the kernel has uprobe_multi
    /// links (Linux 6.6+; `ingero-agent check` says). An escape hatch: counts are the same, but
    /// the kernel closes each probe with an RCU wait under a global lock (~80 ms), so a stop or a
    /// library's detach takes seconds instead of well under one.
    #[arg(long, env = "INGERO_NO_UPROBE_MULTI")]
    no_uprobe_multi: bool,
    /// Library files or directories to probe at start, before any process maps
    /// them (repeatable; the usual CUDA install directories are always included).
    #[arg(long = "lib", env = "INGERO_LIB", value_delimiter = ',')]
    libs: Vec<PathBuf>,
    /// Do not hold a thread at its first symbol lookup (dlsym) in a CUDA/NCCL library not yet probed. By
    /// default that thread alone waits in the kernel for the agent, for as long as the probes take and at
    /// most 1 s, once per library file, so the first calls of a library loaded at run time (vLLM's NCCL) are
    /// traced. Only dlsym's entry is probed: nothing the loader sees changes (no return probes). Without
    /// the hold (this flag, a kernel before 5.19, or one where 3 holds in a row outlast their probing: the
    /// agent then turns it off) the lookup only wakes the agent: the library is probed within milliseconds,
    /// and the calls made before are missed.
    #[arg(long, env = "INGERO_NO_DLOPEN_HOLD")]
    no_dlopen_hold: bool,
    /// The most a process is held at such lookups, all of them together (at most 10s; exec starts it
    /// anew): a held thread polls on its CPU (yielding it to anything runnable), and goes on untraced
    /// when this runs out (counted in `ingero_agent_library_hold_timeouts_total`).
    #[arg(long, env = "INGERO_DLOPEN_HOLD_MAX", default_value = "1s", value_parser = hold_max)]
    dlopen_hold_max: Duration,
    /// A library file that no traced process has mapped for this long has its probes detached (its
    /// uprobes and their file descriptors freed), so nodes that run many short jobs, each with its own
    /// copy of the CUDA libraries, stay flat. Files given with `--lib` or found in the usual CUDA
    /// directories stay probed. A file mapped again later is probed again (held at its first lookup).
    /// Detaching is slow on the kernel's side (~120 ms a probe: two RCU grace periods each) and no
    /// lookup is held while probes close, so a new library's first calls may be missed meanwhile:
    /// keep this long where jobs restart from the same image.
    #[arg(long, env = "INGERO_DETACH_UNUSED_AFTER", default_value = "10m", value_parser = humantime::parse_duration)]
    detach_unused_after: Duration,
    /// Library files probed at most. A file's probes hold open files and kernel memory, and a pod can map
    /// thousands of copies of a library: past the cap (or once the agent's open files pass half their
    /// limit) new files are not probed, logged every 10 minutes and counted in
    /// `ingero_agent_libraries_refused_total`.
    #[arg(long, env = "INGERO_MAX_LIBRARIES", default_value_t = 256)]
    max_libraries: usize,
    /// CUDA/NCCL library files probed at most per process, the first it mapped (a real one maps a few:
    /// the runtime, the driver, NCCL, extensions built with a static runtime).
    #[arg(long, env = "INGERO_MAX_LIBRARIES_PER_PROCESS", default_value_t = 32)]
    max_libraries_per_process: usize,
    /// The probe loop's watchdog: one step of the loop (a process scan, a window) running longer than this
    /// makes `/healthz` answer 503 with the step and how long it has run (logged once, counted in
    /// `ingero_agent_probe_loop_overruns_total`), so the liveness probe restarts a stuck agent.
    #[arg(long, env = "INGERO_WATCHDOG", default_value = "10s", value_parser = humantime::parse_duration)]
    watchdog: Duration,
    /// Mount point of the cgroup v2 hierarchy.
    #[arg(long, env = "INGERO_CGROUP_MOUNT", default_value = "/sys/fs/cgroup")]
    cgroup_mount: PathBuf,
    /// Pod names, containers, labels and owners from the Kubernetes API: `auto` uses the
    /// in-cluster service account or a kubeconfig when there is one, `off` never asks.
    #[arg(long, env = "INGERO_KUBERNETES", default_value = "auto", value_parser = ["auto", "off"])]
    kubernetes: String,
    /// kubeconfig to use instead of the in-cluster account / $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "INGERO_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The kubelet PodResources socket (GPU → pod); absent is fine.
    #[arg(long, env = "INGERO_POD_RESOURCES_SOCKET", default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pod_resources_socket: PathBuf,
    /// Bearer token for the aggregator, read from this file (a mounted Secret).
    #[arg(long, env = "INGERO_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// CA bundle (PEM) that signed the aggregator's certificate; implies TLS.
    #[arg(long, env = "INGERO_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS, with --tls-key.
    #[arg(long, env = "INGERO_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Client private key (PEM) for mutual TLS, with --tls-cert.
    #[arg(long, env = "INGERO_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How often to ask the kubelet which GPUs each container holds.
    #[arg(long, env = "INGERO_POD_RESOURCES_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pod_resources_interval: Duration,
}

/// cgroup v2 mount: the given one, or the hybrid layout's `unified` subdirectory.
fn cgroup_mount(given: &std::path::Path) -> PathBuf {
    if !given.join("cgroup.controllers").exists() && given.join("unified/cgroup.controllers").exists() {
        return given.join("unified");
    }
    given.to_path_buf()
}

fn node_name(arg: Option<String>) -> String {
    arg.or_else(|| std::env::var("NODE_NAME").ok().filter(|s| !s.is_empty()))
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()))
        .unwrap_or_else(|| "unknown-node".into())
}

/// kube-client logs every failed request; the pod watcher says an outage once instead.
const LOG_DEFAULT: &str = "info,kube_client::client::builder=off";

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("INGERO_LOG").unwrap_or_else(|_| LOG_DEFAULT.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Check => {
            let mut ok = true;
            let mut checks = check::run_checks();
            if checks.iter().all(check::Check::ok) {
                checks.extend(check::load_checks());
            }
            for c in checks {
                ok &= c.ok();
                let tag = match c.level {
                    check::Level::Ok => "ok",
                    check::Level::Warn => "WARN",
                    check::Level::Fail => "FAIL",
                };
                println!("{tag:<4} {:<16} {}", c.name, c.detail);
                if c.level != check::Level::Ok && !c.fix.is_empty() {
                    println!("     {}: {}", c.hint, c.fix);
                }
            }
            let libs = check::libraries();
            if libs.is_empty() {
                println!("--   libraries        no libcudart/libcuda/libnccl mapped now (probed when mapped)");
            }
            for (lib, pids) in libs {
                println!("ok   library          {lib} in {} process(es): {:?}", pids.len(), &pids[..pids.len().min(8)]);
            }
            if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Command::Run(a) => match run(*a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code())
            }
        },
    }
}

/// Refuses flags that cannot work before anything is loaded.
fn validate(a: &RunArgs) -> Result<(), error::Error> {
    if a.store.is_some() && !embedded::AVAILABLE {
        return Err(embedded::unavailable());
    }
    if a.window < Duration::from_millis(100) {
        return Err(error::Error::Config("--window must be at least 100ms".into()));
    }
    if let Some(root) = &a.cgroup_root
        && !root.join("cgroup.procs").exists()
    {
        return Err(error::Error::Config(format!("--cgroup-root {} is not a cgroup v2 directory", root.display())));
    }
    let failed: Vec<_> = check::run_checks().into_iter().filter(|c| !c.ok()).collect();
    if !failed.is_empty() {
        let lines: Vec<String> = failed.iter().map(|c| format!("{}: {} — fix: {}", c.name, c.detail, c.fix)).collect();
        return Err(error::Error::Config(format!("this host cannot run the agent:\n  {}", lines.join("\n  "))));
    }
    Ok(())
}

/// What the programs must know before the first one is attached.
fn load_settings(a: &RunArgs) -> probes::load::Settings {
    probes::load::Settings {
        cgroup_root: a.cgroup_root.clone(),
        pids: a.pids.clone(),
        hold_dlopen: !a.no_dlopen_hold,
        hold_max: a.dlopen_hold_max,
    }
}

fn config(a: RunArgs, sink: Sink) -> AgentConfig {
    let probe = LoopConfig {
        node: node_name(a.node),
        window: a.window,
        rescan: a.rescan,
        cgroup_root: a.cgroup_root,
        cgroup_mount: cgroup_mount(&a.cgroup_mount),
        pids: a.pids,
        outlier_factor: a.outlier_factor,
        outlier_min: a.outlier_min,
        outlier_abs: a.outlier_abs,
        offcpu_site_min: a.offcpu_site_min,
        steps: !a.no_steps,
        libs: a.libs,
        hold_dlopen: !a.no_dlopen_hold,
        hold_max: a.dlopen_hold_max,
        detach_unused_after: a.detach_unused_after,
        max_libraries: a.max_libraries,
        max_libraries_per_process: a.max_libraries_per_process,
        watchdog: a.watchdog,
        probe_time_every: a.probe_time_every,
        trap_budget: a.trap_budget.0,
    };
    let kube = KubeConfig {
        enabled: a.kubernetes != "off",
        kubeconfig: a.kubeconfig,
        pod_resources_socket: a.pod_resources_socket,
        pod_resources_interval: a.pod_resources_interval,
    };
    AgentConfig {
        probe,
        sink,
        spool_dir: a.spool_dir,
        spool_max: a.spool_max as u64,
        metrics_addr: a.metrics_addr,
        kube,
    }
}

/// The aggregator to ship to: the given one, or with --store one embedded
/// on the agent's runtime (returned, to be flushed after the last window).
fn sink(a: &RunArgs, rt: &tokio::runtime::Runtime) -> Result<(Sink, Option<Embedded>), error::Error> {
    match (&a.aggregator, &a.store) {
        (Some(url), _) => {
            let auth = ingero_proto::auth::ClientAuth::from_files(
                a.token_file.as_deref(),
                a.tls_ca.as_deref(),
                a.tls_cert.as_deref(),
                a.tls_key.as_deref(),
            )
            .map_err(|e| error::Error::Config(e.to_string()))?;
            Ok((Sink { url: url.clone(), auth }, None))
        }
        (None, Some(store)) => {
            let wal = a.spool_dir.join("wal");
            let (s, url) = rt.block_on(Embedded::start(store, a.s3_endpoint.clone(), wal))?;
            // The embedded aggregator on loopback needs no credentials.
            Ok((Sink { url, auth: Default::default() }, Some(s)))
        }
        (None, None) => Err(error::Error::Config("one of --aggregator or --store is required".into())),
    }
}

fn run(a: RunArgs) -> Result<(), error::Error> {
    validate(&a)?;
    ingero_agent::heap::one_arena();
    // Before loading: every BPF map, program and uprobe link is a file.
    ingero_agent::fd_limit::raise_open_file_limit();
    // Load first, while little else is allocated: parsing the kernel's BTF
    // and relocating against it is the agent's largest transient (~25 MB),
    // then give the freed heap back to the kernel.
    let mut features = probes::features::Features::probe()?;
    if a.no_uprobe_multi {
        features.without(probes::features::UPROBE_MULTI);
    }
    let probes = probes::load::Probes::load_with(features, &load_settings(&a))?;
    ingero_agent::heap::release_free();
    let rt = agent::runtime()?;
    let (sink, embedded) = sink(&a, &rt)?;
    let agent = Agent::start_in(rt, config(a, sink), probes)?;
    match embedded {
        Some(store) => agent.wait_then(store.shutdown()),
        None => agent.wait(),
    }
}

/// `--trap-budget`: a share of one CPU, or none.
#[derive(Debug, Clone, Copy)]
struct Budget(Option<f64>);

/// `--trap-budget`: `off`, or a percentage of one CPU (`1%`, `0.5`) from
/// 0.01% to 100%.
fn trap_budget(s: &str) -> Result<Budget, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(Budget(None));
    }
    let pct: f64 = t
        .strip_suffix('%')
        .unwrap_or(t)
        .trim()
        .parse()
        .map_err(|_| format!("{s}: a percentage of one CPU (`1%`, `0.5%`) or `off`"))?;
    if !(0.01..=100.0).contains(&pct) {
        return Err(format!("{s}: between 0.01% and 100% of one CPU, or `off`"));
    }
    Ok(Budget(Some(pct / 100.0)))
}

/// `--dlopen-hold-max`: a duration from 1ms to 10s.
fn hold_max(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(1) || d > Duration::from_secs(10) {
        return Err(format!("{s}: between 1ms and 10s (a held thread polls on its CPU)"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trap_budget_is_a_share_of_one_cpu_or_off() {
        assert_eq!(trap_budget("1%").unwrap().0, Some(0.01));
        assert_eq!(trap_budget(" 0.5 ").unwrap().0, Some(0.005));
        assert_eq!(trap_budget("OFF").unwrap().0, None);
        for bad in ["0%", "150%", "-1", "one", "1%%", ""] {
            assert!(trap_budget(bad).is_err(), "{bad}");
        }
    }

    /// `--help` is read in an 80-column terminal: clap wraps to it
    /// (`wrap_help`), so no flag's text runs past the edge.
    #[test]
    fn every_help_fits_80_columns() {
        use clap::CommandFactory;
        let mut cmd = Cli::command().term_width(80);
        cmd.build();
        let mut pages = vec![cmd.render_long_help().to_string()];
        pages.extend(cmd.get_subcommands_mut().map(|c| c.render_long_help().to_string()));
        assert!(pages.len() >= 3 && pages.iter().any(|p| p.contains("--trap-budget")));
        for page in pages {
            let wide: Vec<&str> = page.lines().filter(|l| l.chars().count() > 80).collect();
            assert!(wide.is_empty(), "wider than 80 columns: {wide:#?}");
        }
    }
}
