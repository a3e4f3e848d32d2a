// SPDX-License-Identifier: Apache-2.0
//! The probe loop's watchdog. Each step of the loop says what it is doing;
//! a step that runs past the limit turns `/healthz` unhealthy (503, naming
//! the step and how long it has run), is logged once with that reason and
//! counted (`ingero_agent_probe_loop_overruns_total`). A stuck loop ships no
//! window and releases no held thread, so Kubernetes must be told: its
//! liveness probe restarts the agent.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the probe loop is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    ProcessEvents,
    ScanNew,
    Rescan,
    Settle,
    CloseWindow,
    SendWindow,
}

impl Step {
    const ALL: [Step; 6] =
        [Step::ProcessEvents, Step::ScanNew, Step::Rescan, Step::Settle, Step::CloseWindow, Step::SendWindow];

    pub fn what(self) -> &'static str {
        match self {
            Step::ProcessEvents => "handling process events",
            Step::ScanNew => "scanning new processes",
            Step::Rescan => "rescanning processes",
            Step::Settle => "waiting for the probes to finish with the last window",
            Step::CloseWindow => "closing a window",
            Step::SendWindow => "handing a window to the shipper",
        }
    }
}

/// Default limit on one step of the probe loop (`--watchdog`).
/// Records how late a window closed (µs) in `latest`; only a new latest over
/// 50 ms is logged, so a loaded node does not fill the log.
pub(crate) fn note_late(latest: &AtomicU64, late_us: i64) {
    let late = late_us.max(0) as u64;
    if late > latest.fetch_max(late, Ordering::Relaxed) && late >= 50_000 {
        tracing::info!(late_ms = late / 1000, "window closed late; its calls counted in it until then");
    }
}

pub const DEFAULT_LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Watchdog {
    epoch: Instant,
    /// When the current step began, in µs since `epoch` plus one; 0: idle.
    busy_since: AtomicU64,
    step: AtomicUsize,
    limit_us: AtomicU64,
    /// The `busy_since` of the last step reported as overrun (once each).
    reported: AtomicU64,
    pub overruns: AtomicU64,
}

impl Default for Watchdog {
    fn default() -> Self {
        Watchdog {
            epoch: Instant::now(),
            busy_since: AtomicU64::new(0),
            step: AtomicUsize::new(0),
            limit_us: AtomicU64::new(DEFAULT_LIMIT.as_micros() as u64),
            reported: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
        }
    }
}

/// Marks a step as running until dropped.
#[derive(Debug)]
#[must_use = "the step ends when the guard is dropped"]
pub struct Busy<'a> {
    dog: &'a Watchdog,
    step: Step,
    began: Instant,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.dog.busy_since.store(0, Ordering::Release);
        let ms = self.began.elapsed().as_millis() as u64;
        // Long enough to delay a held thread's release (debug: routine on a busy node).
        if ms >= 100 {
            tracing::debug!(ms, "probe loop busy {}", self.step.what());
        }
    }
}

impl Watchdog {
    pub fn set_limit(&self, limit: Duration) {
        self.limit_us.store(limit.as_micros().max(1) as u64, Ordering::Relaxed);
    }

    pub fn enter(&self, step: Step) -> Busy<'_> {
        let i = Step::ALL.iter().position(|s| *s == step).unwrap_or(0);
        self.step.store(i, Ordering::Relaxed);
        self.busy_since.store(self.epoch.elapsed().as_micros() as u64 + 1, Ordering::Release);
        Busy { dog: self, step, began: Instant::now() }
    }

    /// The step running past the limit now, and for how long.
    pub fn overrun(&self) -> Option<(Step, Duration)> {
        let since = self.busy_since.load(Ordering::Acquire);
        if since == 0 {
            return None;
        }
        let ran = Duration::from_micros((self.epoch.elapsed().as_micros() as u64 + 1).saturating_sub(since));
        let limit = Duration::from_micros(self.limit_us.load(Ordering::Relaxed));
        (ran > limit).then(|| (Step::ALL[self.step.load(Ordering::Relaxed)], ran))
    }

    /// `/healthz`: Ok, or why not.
    pub fn health(&self) -> Result<(), String> {
        match self.overrun() {
            None => Ok(()),
            Some((step, ran)) => Err(format!(
                "probe loop stuck {} for {:.1} s (limit {:?})",
                step.what(),
                ran.as_secs_f64(),
                Duration::from_micros(self.limit_us.load(Ordering::Relaxed))
            )),
        }
    }

    /// Logs and counts an overrun once per stuck step; the agent calls it
    /// about four times per limit.
    pub fn check(&self) {
        let since = self.busy_since.load(Ordering::Acquire);
        if let Err(why) = self.health()
            && self.reported.swap(since, Ordering::Relaxed) != since
        {
            self.overruns.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("{why}: /healthz reports unhealthy until it finishes");
        }
    }

    /// How often `check` should run.
    pub fn period(&self) -> Duration {
        (Duration::from_micros(self.limit_us.load(Ordering::Relaxed)) / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_past_its_limit_is_unhealthy_until_it_ends_and_counted_once() {
        let dog = Watchdog::default();
        dog.set_limit(Duration::from_millis(30));
        assert_eq!(dog.health(), Ok(()));
        {
            let _busy = dog.enter(Step::Rescan);
            assert_eq!(dog.health(), Ok(()), "within the limit");
            std::thread::sleep(Duration::from_millis(60));
            let why = dog.health().unwrap_err();
            assert!(why.contains("rescanning processes") && why.contains("limit 30ms"), "{why}");
            dog.check();
            dog.check();
            assert_eq!(dog.overruns.load(Ordering::Relaxed), 1, "one stuck step, one overrun");
        }
        assert_eq!(dog.health(), Ok(()), "healthy again once the step ends");
        let _busy = dog.enter(Step::CloseWindow);
        std::thread::sleep(Duration::from_millis(60));
        dog.check();
        assert_eq!(dog.overruns.load(Ordering::Relaxed), 2, "a second stuck step counts again");
    }

    #[test]
    fn idle_waiting_is_never_an_overrun() {
        let dog = Watchdog::default();
        dog.set_limit(Duration::from_millis(1));
        drop(dog.enter(Step::ProcessEvents));
        std::thread::sleep(Duration::from_millis(20));
        dog.check();
        assert_eq!((dog.health(), dog.overruns.load(Ordering::Relaxed)), (Ok(()), 0));
    }
}
