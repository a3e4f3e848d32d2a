// SPDX-License-Identifier: Apache-2.0
//! A running agent: the probe thread (probe → window → attribute) and the
//! shipper on a small async runtime, started from one [`AgentConfig`] the
//! way `ingero serve` starts from a `ServeConfig`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ingero_proto::auth::ClientAuth;
use ingero_proto::routed::RoutedClient;

use crate::attribution::KubeSources;
use crate::error::{Error, Result};
use crate::probe_loop::{LoopConfig, LoopStats, ProbeLoop};
use crate::probes::load::Probes;
use crate::ship::spool::Spool;
use crate::ship::{ShipStats, Shipper};

/// Where windows go: `ingero serve`, one replica or several (comma-separated
/// URLs). Single-node use (`ingero-agent run --store`) points this at an
/// aggregator the binary embeds on loopback: the library never links storage.
#[derive(Debug, Clone)]
pub struct Sink {
    pub url: String,
    pub auth: ClientAuth,
}

/// Pod metadata sources (see `attribution::apiserver`, `podresources`).
#[derive(Debug, Clone)]
pub struct KubeConfig {
    pub enabled: bool,
    pub kubeconfig: Option<PathBuf>,
    pub pod_resources_socket: PathBuf,
    pub pod_resources_interval: Duration,
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub probe: LoopConfig,
    pub sink: Sink,
    pub spool_dir: PathBuf,
    pub spool_max: u64,
    pub metrics_addr: Option<SocketAddr>,
    pub kube: KubeConfig,
}

/// A started agent; [`Agent::wait`] returns after SIGTERM/SIGINT once the
/// last window is shipped (or spooled).
pub struct Agent {
    rt: tokio::runtime::Runtime,
    probe_thread: std::thread::JoinHandle<Result<()>>,
    shipper: tokio::task::JoinHandle<()>,
    ship_stats: Arc<ShipStats>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").finish_non_exhaustive()
    }
}

/// The agent's async runtime. Two workers whatever the node: shipping and
/// the pod watch are light, and one worker per CPU would be 224 threads (and
/// malloc arenas) on a GPU node.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|cause| Error::Runtime { what: "starting the async runtime", cause })
}

impl Agent {
    /// Starts shipping, metrics, the pod watch and the probe thread;
    /// `probes` loaded with the settings of `cfg.probe` (scope, pids, hold).
    pub fn start(cfg: AgentConfig, probes: Probes) -> Result<Agent> {
        Agent::start_in(runtime()?, cfg, probes)
    }

    /// [`Agent::start`] on a runtime the caller made with [`runtime`] (and
    /// may already have started its own tasks on, such as an embedded aggregator).
    pub fn start_in(rt: tokio::runtime::Runtime, cfg: AgentConfig, probes: Probes) -> Result<Agent> {
        let _guard = rt.enter();
        let Sink { url, auth } = cfg.sink.clone();
        let policy = crate::ship::policy();
        let urls: Vec<String> = url.split(',').map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).collect();
        let client =
            RoutedClient::new(&urls, &cfg.probe.node, policy, &auth).map_err(|e| Error::Config(e.to_string()))?;
        let spool = Spool::open(&cfg.spool_dir.join("batches"), cfg.spool_max)?;
        let ship_stats = Arc::new(ShipStats::default());
        let loop_stats = Arc::new(LoopStats::default());
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let shipper = rt.spawn(Shipper::new(rx, client, spool, ship_stats.clone(), Duration::from_secs(5)).run());
        let l = loop_stats.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(l.watchdog.period()).await;
                l.watchdog.check();
            }
        });
        if let Some(addr) = cfg.metrics_addr {
            let (l, s) = (loop_stats.clone(), ship_stats.clone());
            rt.spawn(async move {
                // Tried again while it fails: the port of an agent killed a
                // moment ago can stay held (a thread stuck closing probes),
                // and without /healthz the kubelet would restart a healthy agent.
                let mut said = false;
                while let Err(e) = crate::metrics::serve(addr, l.clone(), s.clone()).await {
                    if !std::mem::replace(&mut said, true) {
                        tracing::error!(error = %e, %addr, "metrics endpoint failed; trying again every 5 s");
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
            });
        }
        let kube = rt.block_on(kube_sources(&cfg.kube, &cfg.probe.node))?;
        if let Some(w) = &kube.watch {
            let _ = loop_stats.kube.set(w.stats.clone());
        }
        let stop = stop_on_signals(&rt)?;
        tracing::info!(node = %cfg.probe.node, aggregator = %url, window = ?cfg.probe.window, "ingero-agent tracing");
        let dropped = ship_stats.dropped.clone();
        let probe_thread =
            std::thread::spawn(move || ProbeLoop::start(probes, cfg.probe, loop_stats, dropped, kube)?.run(tx, &stop));
        Ok(Agent { rt, probe_thread, shipper, ship_stats })
    }

    /// Waits for the probe thread to stop and the shipper to drain.
    pub fn wait(self) -> Result<()> {
        self.wait_then(async { Ok(()) })
    }

    /// [`Agent::wait`], then runs `after` on the agent's runtime: what must
    /// follow the last shipped window (an embedded aggregator's last flush).
    pub fn wait_then(self, after: impl Future<Output = Result<()>>) -> Result<()> {
        let res = self.probe_thread.join().unwrap_or_else(|_| Err(Error::Config("probe thread panicked".into())));
        let ss = self.ship_stats;
        self.rt.block_on(async {
            let _ = self.shipper.await;
            tracing::info!(
                acked = ss.sent.load(Ordering::Relaxed),
                rejected = ss.rejected.load(Ordering::Relaxed),
                dropped = ss.dropped.load(Ordering::Relaxed),
                spooled = ss.spooled.load(Ordering::Relaxed),
                "ingero-agent stopped"
            );
            after.await
        })?;
        res
    }
}

/// A flag set by SIGTERM or SIGINT.
fn stop_on_signals(rt: &tokio::runtime::Runtime) -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let stop = stop.clone();
        let mut s = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(sig))
            .map_err(|cause| Error::Runtime { what: "installing signal handlers", cause })?;
        rt.spawn(async move {
            s.recv().await;
            stop.store(true, Ordering::Relaxed);
        });
    }
    Ok(stop)
}

/// The pod watcher and GPU poller, unless Kubernetes is off or absent.
async fn kube_sources(k: &KubeConfig, node: &str) -> Result<KubeSources> {
    use crate::attribution::apiserver::PodWatch;
    if !k.enabled {
        tracing::info!("Kubernetes off; attributing by container id, cgroup path and process name only");
        return Ok(Default::default());
    }
    let watch = match &k.kubeconfig {
        Some(path) => {
            let bad = |e: &dyn std::fmt::Display| Error::Config(format!("--kubeconfig {}: {e}", path.display()));
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.map_err(|e| bad(&e))?;
            let client = kube::Client::try_from(cfg).map_err(|e| Error::Config(format!("kube client: {e}")))?;
            Some(PodWatch::with_client(client, node))
        }
        None => PodWatch::start(node).await,
    };
    let gpus = crate::attribution::podresources::Gpus::start(k.pod_resources_socket.clone(), k.pod_resources_interval);
    Ok(KubeSources { watch, gpus: Some(gpus) })
}
