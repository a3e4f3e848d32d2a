// SPDX-License-Identifier: Apache-2.0
//! What the live detector is fed, with several replicas: a job's signals go
//! to its owner and are kept by its standby (the replica that owns it next);
//! a replica that starts ranking a job it was not ranking just now (the owner
//! died, came back, thawed, or the set rebalanced) holds the job's new
//! windows, asks the others for the job's recent windows, and rebuilds the
//! job's state from them before it judges anything: the hand-over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::detector::Detector;
use super::recent::Recent;
use super::{SignalRouter, Sigs};

/// Longest a job waits for the others' answer before it is rebuilt from
/// what this replica has (the asking itself times out sooner).
const HOLD_MAX: Duration = Duration::from_millis(1500);
/// How often jobs owned elsewhere now are dropped from this detector.
const RETAIN_EVERY: Duration = Duration::from_secs(1);

/// The ranking task's side of the hand-over (one per replica).
#[derive(Debug)]
pub(super) struct Intake {
    recent: Arc<Mutex<Recent>>,
    /// Jobs held for a hand-over, since when.
    holds: HashMap<String, Instant>,
    retained_at: Instant,
    handovers: Arc<AtomicU64>,
}

impl Intake {
    pub(super) fn new(recent: Arc<Mutex<Recent>>, handovers: Arc<AtomicU64>) -> Intake {
        Intake { recent, holds: HashMap::new(), retained_at: Instant::now(), handovers }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Signals this replica ranks. Without replicas they go straight to the
    /// detector; with them each piece is kept (and counted once), and a job
    /// new to this detector, or stale in it, is held for a hand-over.
    pub(super) fn rank(&mut self, det: &mut Detector, sigs: Sigs, router: Option<&Arc<dyn SignalRouter>>) {
        let Some(router) = router else {
            sigs.into_iter().for_each(|(k, s)| det.add(k, &s));
            return;
        };
        let mut take = Vec::with_capacity(sigs.len());
        {
            let mut recent = self.recent();
            for (k, s) in sigs {
                if recent.record(&k, &s, true) {
                    take.push((k, s));
                }
            }
        }
        for (k, s) in take {
            if self.holds.contains_key(&k.job) {
                continue; // kept: replayed when the hand-over ends
            }
            if !det.is_current(&k.job, k.window_start_us) {
                self.holds.insert(k.job.clone(), Instant::now());
                router.ask_handover(k.job.clone());
                continue;
            }
            det.add(k, &s);
        }
    }

    /// Signals of jobs this replica stands by for: kept, not ranked.
    pub(super) fn keep(&mut self, sigs: Sigs) {
        let mut recent = self.recent();
        for (k, s) in sigs {
            recent.record(&k, &s, false);
        }
    }

    /// The others' recent windows of a held job arrived: rebuild it.
    pub(super) fn handed_over(&mut self, det: &mut Detector, job: &str, sigs: Sigs) {
        self.keep(sigs);
        if self.holds.contains_key(job) {
            self.release(det, job);
        }
    }

    /// Rebuilds `job` from every kept window: the detector judges them in
    /// order (they are past their grace), reaching the state the previous
    /// owner had: warm-up done, streaks, flags.
    fn release(&mut self, det: &mut Detector, job: &str) {
        self.holds.remove(job);
        det.forget_job(job);
        let windows = self.recent().replay(job);
        tracing::debug!(job, windows = windows.len(), "job handed over to this replica");
        self.handovers.fetch_add(1, Ordering::Relaxed);
        for (k, s) in windows {
            det.add(k, &s);
        }
    }

    /// Every tick: holds nobody answered are released; jobs another replica
    /// owns now leave this detector (their flags are that replica's to show).
    pub(super) fn tick(&mut self, det: &mut Detector, router: Option<&Arc<dyn SignalRouter>>, now_us: i64) {
        let Some(router) = router else { return };
        let late: Vec<String> =
            self.holds.iter().filter(|(_, t)| t.elapsed() >= HOLD_MAX).map(|(j, _)| j.clone()).collect();
        for job in late {
            self.release(det, &job);
        }
        if self.retained_at.elapsed() >= RETAIN_EVERY {
            self.retained_at = Instant::now();
            det.retain_jobs(|job| router.owns(job));
            self.recent().sweep(now_us);
        }
    }
}
