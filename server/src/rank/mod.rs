// SPDX-License-Identifier: Apache-2.0
//! Live straggler ranking: signals from every accepted batch feed a
//! detector; the current standings are served over gRPC, HTTP and metrics.

pub mod cost;
pub mod detector;
pub(crate) mod deviation;
pub mod episode;
pub mod exposition;
mod intake;
pub mod recent;
pub(crate) mod spec;
pub use spec::short_label;
pub mod standing;
pub mod steps;
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
    /// Nodes ranked (the listed stragglers and those within their job's
    /// range): says "all calm" apart from "no data".
    #[serde(default)]
    pub nodes: usize,
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
            jobs: d.jobs(job),
            nodes: d.nodes(job),
            stragglers: d.standings(job, 1.0),
            timeline: None,
            replicas: Vec::new(),
            unranked: d.solo(job).into_iter().map(|(job, node)| Unranked::solo(job, node)).collect(),
            episodes: Vec::new(),
        }
    }
}

impl Unranked {
    /// A job of one node: compared with nothing, so neither flagged nor
    /// "within range".
    pub fn solo(job: String, node: String) -> Unranked {
        Unranked { job, nodes: vec![node], reason: "the job's only node: nothing to rank it against".into() }
    }
}

/// Node-window signals as they travel between the ingest path, replicas and the detector.
pub type Sigs = Vec<(NodeWindowKey, Signals)>;

/// Decides which window signals this replica ranks itself (the jobs it
/// owns), which it keeps as a job's standby, and sends the rest to their
/// owners and standbys.
pub trait SignalRouter: Send + Sync + std::fmt::Debug {
    /// Takes the signals of accepted batches; returns those this replica
    /// ranks and those it keeps as standby.
    fn route(&self, sigs: Sigs) -> Routed;
    /// Whether this replica ranks `job` now.
    fn owns(&self, job: &str) -> bool;
    /// Asks the other replicas for `job`'s recent windows; the answer comes
    /// back through [`LiveRanker::handed_over`].
    fn ask_handover(&self, job: String);
    /// A message came from `replica`: it is up.
    fn heard_from(&self, replica: &str);
}

/// Signals as routed: ranked here, kept here for a hand-over.
#[derive(Debug, Default)]
pub struct Routed {
    pub rank: Sigs,
    pub keep: Sigs,
}

enum Feed {
    /// An accepted batch's signals, to route (this replica ranks the jobs it owns).
    Local(Sigs),
    /// Already routed here (forwarded by another replica, or re-routed).
    Signals(Sigs),
    /// Jobs this replica is the standby of (kept for a hand-over).
    Keep(Sigs),
    /// The other replicas' recent windows of a job this replica took over.
    HandedOver(String, Sigs),
}

/// How long the live ranking remembers a node that sent nothing.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone)]
pub struct LiveRanker {
    tx: mpsc::Sender<Feed>,
    pub detector: Arc<Mutex<Detector>>,
    pub dropped: Arc<std::sync::atomic::AtomicU64>,
    /// Jobs this replica took over from another (or started) and rebuilt.
    pub handovers: Arc<std::sync::atomic::AtomicU64>,
    /// Recent windows of the jobs ranked or kept here (what hand-overs send).
    pub recent: Arc<Mutex<recent::Recent>>,
    router: Arc<std::sync::OnceLock<Arc<dyn SignalRouter>>>,
}

impl LiveRanker {
    /// Starts the ranking task; windows are judged when complete or after `grace`.
    pub fn start(cfg: DetectorConfig, grace: Duration) -> LiveRanker {
        // Live, nodes that stopped reporting are forgotten (see the field).
        let cfg = DetectorConfig { forget_after: cfg.forget_after.or(Some(FORGET_AFTER)), ..cfg };
        let (tx, rx) = mpsc::channel::<Feed>(8192);
        let ranker = LiveRanker {
            tx,
            detector: Arc::new(Mutex::new(Detector::new(cfg))),
            dropped: Default::default(),
            handovers: Default::default(),
            recent: Default::default(),
            router: Default::default(),
        };
        let intake = intake::Intake::new(ranker.recent.clone(), ranker.handovers.clone());
        tokio::spawn(run(rx, ranker.detector.clone(), ranker.router.clone(), intake, grace));
        ranker
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
    pub fn feed_signals(&self, sigs: Sigs) {
        self.send(Feed::Signals(sigs));
    }

    /// Keeps signals of a job this replica is the standby of.
    pub fn feed_kept(&self, sigs: Sigs) {
        self.send(Feed::Keep(sigs));
    }

    /// The others' recent windows of `job` (answer to `ask_handover`).
    pub fn handed_over(&self, job: String, sigs: Sigs) {
        self.send(Feed::HandedOver(job, sigs));
    }

    fn send(&self, feed: Feed) {
        if self.tx.try_send(feed).is_err() {
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The recent windows of `job` kept here, oldest first (for its new owner).
    pub fn recent_of(&self, job: &str) -> Sigs {
        self.recent.lock().unwrap_or_else(|p| p.into_inner()).windows(job)
    }

    /// Another replica was heard from: it is up (a restart, a thaw).
    pub fn heard_from(&self, replica: &str) {
        if let Some(r) = self.router.get() {
            r.heard_from(replica);
        }
    }

    pub fn ranking(&self, job: Option<&str>) -> Ranking {
        let d = self.detector.lock().unwrap_or_else(|p| p.into_inner());
        Ranking::from_detector(&d, job, "live")
    }
}

/// The ranking task: feeds the detector and judges complete windows.
async fn run(
    mut rx: mpsc::Receiver<Feed>,
    d: Arc<Mutex<Detector>>,
    r: Arc<std::sync::OnceLock<Arc<dyn SignalRouter>>>,
    mut intake: intake::Intake,
    grace: Duration,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let grace_us = grace.as_micros() as i64;
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some(msg) = msg else { break };
                let mut det = d.lock().unwrap_or_else(|p| p.into_inner());
                match msg {
                    Feed::Signals(s) => intake.rank(&mut det, s, r.get()),
                    Feed::Keep(s) => intake.keep(s),
                    Feed::HandedOver(job, s) => intake.handed_over(&mut det, &job, s),
                    Feed::Local(sigs) => match r.get() {
                        Some(router) => {
                            let routed = router.route(sigs);
                            intake.keep(routed.keep);
                            intake.rank(&mut det, routed.rank, Some(router));
                        }
                        None => intake.rank(&mut det, sigs, None),
                    },
                }
                det.evaluate(chrono::Utc::now().timestamp_micros(), grace_us);
            }
            _ = tick.tick() => {
                let now = chrono::Utc::now().timestamp_micros();
                let mut det = d.lock().unwrap_or_else(|p| p.into_inner());
                intake.tick(&mut det, r.get(), now);
                det.evaluate(now, grace_us);
            }
        }
    }
}
