// SPDX-License-Identifier: Apache-2.0
//! What `/healthz` says. Unhealthy (503, the kubelet restarts the agent)
//! while a restart may help: the probe loop is stuck in one step, or windows
//! are being lost because the spool cannot be written (a full or read-only
//! disk, no file descriptors left). An aggregator that does not answer is
//! no fault of this agent, which spools meanwhile: healthy, and said.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::loop_config::LoopStats;
use crate::ship::ShipStats;

/// An outage shorter than this is a retry, not worth a word.
const SAY_UNREACHABLE_AFTER: Duration = Duration::from_secs(10);

/// (healthy, the body: `ok` or `unhealthy: why`, then what is degraded).
pub(crate) fn report(l: &LoopStats, s: &ShipStats, now_ms: u64) -> (bool, String) {
    let lost = s.lost_in_a_row.load(Ordering::Relaxed);
    let why = match l.watchdog.health() {
        Err(why) => Some(why),
        Ok(()) if lost > 0 => {
            let e = s.lost_why.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            Some(format!("the last {lost} window(s) were lost, not spooled ({e})"))
        }
        Ok(()) => None,
    };
    let mut body = match &why {
        Some(w) => format!("unhealthy: {w}\n"),
        None => "ok\n".to_string(),
    };
    let since = s.unreachable_since_ms.load(Ordering::Relaxed);
    let away = Duration::from_millis(now_ms.saturating_sub(since));
    if since > 0 && away >= SAY_UNREACHABLE_AFTER {
        let to = s.target.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let spooled = s.spooled.load(Ordering::Relaxed);
        body += &format!(
            "degraded: aggregator {to} unreachable for {}; {spooled} batch(es) in the spool\n",
            humantime::format_duration(Duration::from_secs(away.as_secs()))
        );
    }
    (why.is_none(), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_windows_are_unhealthy_and_an_away_aggregator_is_said() {
        let (l, s) = (LoopStats::default(), ShipStats::default());
        assert_eq!(report(&l, &s, 1_000_000), (true, "ok\n".into()));
        s.lost_in_a_row.store(3, Ordering::Relaxed);
        *s.lost_why.lock().unwrap() = "cannot spool: No space left on device".into();
        let (ok, body) = report(&l, &s, 1_000_000);
        assert!(
            !ok && body.starts_with("unhealthy: the last 3 window(s) were lost") && body.contains("No space"),
            "{body}"
        );
        s.lost_in_a_row.store(0, Ordering::Relaxed);
        s.unreachable_since_ms.store(1_000_000 - 5_000, Ordering::Relaxed);
        *s.target.lock().unwrap() = "http://agg:7070".into();
        assert_eq!(report(&l, &s, 1_000_000), (true, "ok\n".into()), "a 5-s outage is a retry");
        s.unreachable_since_ms.store(1_000_000 - 125_000, Ordering::Relaxed);
        s.spooled.store(120, Ordering::Relaxed);
        let (ok, body) = report(&l, &s, 1_000_000);
        assert!(ok, "{body}");
        assert_eq!(
            body,
            "ok\ndegraded: aggregator http://agg:7070 unreachable for 2m 5s; 120 batch(es) in the spool\n"
        );
    }
}
