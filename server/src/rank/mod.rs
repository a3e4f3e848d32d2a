// SPDX-License-Identifier: Apache-2.0
//! Live straggler ranking: signals from every accepted batch feed a
//! detector; the current standings are served over gRPC, HTTP and metrics.

pub mod cost;
pub mod detector;
pub(crate) mod deviation;
pub mod episode;
pub mod exposition;
pub(crate) mod spec;
pub mod standing;
pub mod stuck;

// The detector's inputs are part of the data model (ingero-model).
pub use ingero_model::{progress, signals};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use detector::{Detector, DetectorConfig, Standing};
use signals::{NodeWindowKey, Signals};

/// The JSON document of `/api/v1/stragglers` and `ingero stragglers --format json`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Ranking {
    pub generated_at: String,
    pub source: String,
    pub jobs: usize,
    pub stragglers: Vec<Standing>,
    /// Every node's score per bin (history with the detector's `timeline` on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
    /// With several replicas: each one and whether it answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaAnswer>,
    /// Jobs whose nodes could not be ranked against each other (history:
    /// imported nodes recorded at different times share no window).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unranked: Vec<Unranked>,
    /// History: every straggler episode of the range, priced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub episodes: Vec<episode::Episode>,
}

/// A job left out of the ranking, and why.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Unranked {
    pub job: String,
    pub nodes: Vec<String>,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct ReplicaAnswer {
    pub replica: String,
    pub answered: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Nodes × time: the fleet view's heatmap.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Timeline {
    pub start_us: i64,
    pub bin_us: i64,
    pub bins: usize,
    pub nodes: Vec<NodeTimeline>,
}

/// One node's row: its score per bin (−1: no data that bin) and the bin
/// ranges `[first, last]` where it was flagged.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct NodeTimeline {
    pub job: String,
    pub node: String,
    pub score: Vec<f32>,
    pub flagged: Vec<[usize; 2]>,
}

impl Timeline {
    /// `None` unless the detector kept timelines.
    pub fn from_detector(d: &Detector, job: Option<&str>, start_us: i64, bin_us: i64) -> Option<Timeline> {
        let rows = d.timelines(job);
        let last = rows.iter().flat_map(|(_, _, t)| t.last()).map(|p| p.0).max()?;
        let bins = ((last - start_us).div_euclid(bin_us) + 1).max(0) as usize;
        let nodes = rows
            .into_iter()
            .map(|(job, node, trace)| {
                let mut score = vec![-1.0f32; bins];
                let mut flagged: Vec<[usize; 2]> = Vec::new();
                for &(w, s, f) in trace {
                    let Some(i) = usize::try_from((w - start_us).div_euclid(bin_us)).ok().filter(|&i| i < bins) else {
                        continue;
                    };
                    score[i] = (s * 10.0).round() / 10.0;
                    match flagged.last_mut() {
                        Some(span) if f && span[1] + 1 == i => span[1] = i,
                        _ if f => flagged.push([i, i]),
                        _ => {}
                    }
                }
                NodeTimeline { job: job.to_string(), node: node.to_string(), score, flagged }
            })
            .collect();
        Some(Timeline { start_us, bin_us, bins, nodes })
    }
}

impl Ranking {
    pub fn from_detector(d: &Detector, job: Option<&str>, source: &'static str) -> Ranking {
        Ranking {
            generated_at: chrono::Utc::now().to_rfc3339(),
            source: source.to_string(),
            jobs: d.jobs(),
            stragglers: d.standings(job, 1.0),
            timeline: None,
            replicas: Vec::new(),
            unranked: Vec::new(),
            episodes: Vec::new(),
        }
    }
}

/// Handle shared by the ingest path (feeds) and the API (reads).
/// Decides which window signals this replica ranks itself (the jobs it
/// owns) and sends the rest to their owners.
pub trait SignalRouter: Send + Sync + std::fmt::Debug {
    /// Takes the signals of accepted batches; returns those ranked here.
    fn route(&self, sigs: Vec<(NodeWindowKey, Signals)>) -> Vec<(NodeWindowKey, Signals)>;
}

enum Feed {
    /// An accepted batch's signals, to route (this replica ranks the jobs it owns).
    Local(Vec<(NodeWindowKey, Signals)>),
    /// Already routed here (forwarded by another replica, or re-routed).
    Signals(Vec<(NodeWindowKey, Signals)>),
}

/// How long the live ranking remembers a node that sent nothing.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone)]
pub struct LiveRanker {
    tx: mpsc::Sender<Feed>,
    pub detector: Arc<Mutex<Detector>>,
    pub dropped: Arc<std::sync::atomic::AtomicU64>,
    router: Arc<std::sync::OnceLock<Arc<dyn SignalRouter>>>,
}

impl LiveRanker {
    /// Starts the ranking task; windows are judged when complete or after `grace`.
    pub fn start(cfg: DetectorConfig, grace: Duration) -> LiveRanker {
        // Live, nodes that stopped reporting are forgotten (see the field).
        let cfg = DetectorConfig { forget_after: cfg.forget_after.or(Some(FORGET_AFTER)), ..cfg };
        let (tx, mut rx) = mpsc::channel::<Feed>(8192);
        let detector = Arc::new(Mutex::new(Detector::new(cfg)));
        let router: Arc<std::sync::OnceLock<Arc<dyn SignalRouter>>> = Default::default();
        let (d, r) = (detector.clone(), router.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    msg = rx.recv() => {
                        let sigs = match msg {
                            None => break,
                            Some(Feed::Signals(s)) => s,
                            Some(Feed::Local(sigs)) => match r.get() {
                                Some(router) => router.route(sigs),
                                None => sigs,
                            },
                        };
                        let mut det = d.lock().unwrap_or_else(|p| p.into_inner());
                        for (k, s) in sigs {
                            det.add(k, &s);
                        }
                        det.evaluate(chrono::Utc::now().timestamp_micros(), grace.as_micros() as i64);
                    }
                    _ = tick.tick() => {
                        let mut det = d.lock().unwrap_or_else(|p| p.into_inner());
                        det.evaluate(chrono::Utc::now().timestamp_micros(), grace.as_micros() as i64);
                    }
                }
            }
        });
        LiveRanker { tx, detector, dropped: Default::default(), router }
    }

    /// Sends the signals of jobs other replicas own to them (set once, at start).
    pub fn set_router(&self, router: Arc<dyn SignalRouter>) {
        let _ = self.router.set(router);
    }

    /// Feeds an accepted batch's signals; never blocks ingest (a full queue
    /// drops and counts).
    pub fn feed(&self, sigs: Vec<(NodeWindowKey, Signals)>) {
        if self.tx.try_send(Feed::Local(sigs)).is_err() {
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Feeds signals routed to this replica.
    pub fn feed_signals(&self, sigs: Vec<(NodeWindowKey, Signals)>) {
        if self.tx.try_send(Feed::Signals(sigs)).is_err() {
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn ranking(&self, job: Option<&str>) -> Ranking {
        let d = self.detector.lock().unwrap_or_else(|p| p.into_inner());
        Ranking::from_detector(&d, job, "live")
    }
}
