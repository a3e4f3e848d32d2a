//! Live straggler ranking: signals from every accepted batch feed a
//! detector; the current standings are served over gRPC, HTTP and metrics.

pub mod detector;
#[cfg(feature = "query")]
pub mod history;
pub(crate) mod signals;
pub mod stuck;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::RecordBatch;
use ingero_proto::Table;
use serde::Serialize;
use tokio::sync::mpsc;

use detector::{Detector, DetectorConfig, Standing};

/// The JSON document of `/api/v1/stragglers` and `ingero stragglers --format json`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Ranking {
    pub generated_at: String,
    pub source: &'static str,
    pub jobs: usize,
    pub stragglers: Vec<Standing>,
}

impl Ranking {
    pub fn from_detector(d: &Detector, job: Option<&str>, source: &'static str) -> Ranking {
        Ranking {
            generated_at: chrono::Utc::now().to_rfc3339(),
            source,
            jobs: d.jobs(),
            stragglers: d.standings(job, 1.0),
        }
    }
}

/// Handle shared by the ingest path (feeds) and the API (reads).
#[derive(Debug, Clone)]
pub struct LiveRanker {
    tx: mpsc::Sender<Vec<(Table, Vec<RecordBatch>)>>,
    pub detector: Arc<Mutex<Detector>>,
    pub dropped: Arc<std::sync::atomic::AtomicU64>,
}

impl LiveRanker {
    /// Starts the ranking task; windows are judged when complete or after `grace`.
    pub fn start(cfg: DetectorConfig, grace: Duration) -> LiveRanker {
        let (tx, mut rx) = mpsc::channel::<Vec<(Table, Vec<RecordBatch>)>>(8192);
        let detector = Arc::new(Mutex::new(Detector::new(cfg)));
        let d = detector.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    msg = rx.recv() => {
                        let Some(tables) = msg else { break };
                        let sigs = signals::from_tables(&tables);
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
        LiveRanker { tx, detector, dropped: Default::default() }
    }

    /// Feeds an accepted batch; never blocks ingest (a full queue drops and counts).
    pub fn feed(&self, tables: Vec<(Table, Vec<RecordBatch>)>) {
        if self.tx.try_send(tables).is_err() {
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn ranking(&self, job: Option<&str>) -> Ranking {
        let d = self.detector.lock().unwrap_or_else(|p| p.into_inner());
        Ranking::from_detector(&d, job, "live")
    }
}
