// SPDX-License-Identifier: Apache-2.0
//! The detector on hand-made windows: flagging, clearing, references.

use super::*;

fn sig(runq: f64, wait: f64) -> Signals {
    Signals {
        runq_ns: runq * 1e9,
        oncpu_ns: (1.0 - runq) * 1e9,
        wait_ns: wait * 1e9,
        measured: true,
        window_ns: 1e9,
        threads: 1.0,
        ..Default::default()
    }
}

fn feed(d: &mut Detector, w: i64, vals: &[(f64, f64)]) {
    for (i, (r, n)) in vals.iter().enumerate() {
        let key = NodeWindowKey { job: "j".into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
        d.add(key, &sig(*r, *n));
    }
    d.drain();
}

#[test]
fn two_nodes_flag_the_contended_one_after_k_windows_and_clear_with_hysteresis() {
    let mut d = Detector::new(DetectorConfig::default());
    for w in -2..0 {
        feed(&mut d, w, &[(0.03, 0.30), (0.03, 0.30)]); // start-up windows, not judged
    }
    let k = DetectorConfig::default().flag_after as i64;
    for w in 0..k - 1 {
        feed(&mut d, w, &[(0.03, 0.30), (0.41, 0.05)]);
        assert!(d.standings(None, 0.0).iter().all(|s| !s.flagged), "flagged before K windows");
    }
    feed(&mut d, k - 1, &[(0.03, 0.30), (0.41, 0.05)]);
    let s = d.standings(None, 0.0);
    assert_eq!(s[0].node, "node-1");
    assert!(s[0].flagged);
    assert_eq!(s[0].since_us, Some(0));
    assert!(s[0].signals[0].text.contains("run-queue wait 41% vs job median 3%"), "{:?}", s[0].signals);
    assert!(!s.iter().any(|x| x.node == "node-0" && x.flagged), "the waiting peer is not a straggler");
    for w in k..k + 4 {
        feed(&mut d, w, &[(0.03, 0.30), (0.03, 0.30)]);
        assert!(d.standings(None, 0.0)[0].flagged, "cleared too early at {w}");
    }
    feed(&mut d, k + 4, &[(0.03, 0.30), (0.03, 0.30)]);
    assert!(d.standings(None, 0.0).iter().all(|s| !s.flagged));
}

#[test]
fn blips_and_whole_job_slowdowns_are_not_flagged() {
    let mut d = Detector::new(DetectorConfig::default());
    let mut vals: Vec<(f64, f64)> = (0..16).map(|i| (0.02 + 0.001 * i as f64, 0.3)).collect();
    for w in 0..20 {
        let mut v = vals.clone();
        if w % 4 == 0 {
            v[w as usize % 16] = (0.6, 0.02); // one-window blip
        }
        if w >= 10 {
            v.iter_mut().for_each(|x| x.0 += 0.3); // whole job slower
        }
        feed(&mut d, w, &v);
    }
    assert!(d.standings(None, 0.0).iter().all(|s| !s.flagged));
    vals[5] = (0.5, 0.01);
    for w in 20..20 + DetectorConfig::default().flag_after as i64 {
        feed(&mut d, w, &vals);
    }
    let s = d.standings(None, 0.0);
    assert_eq!((s[0].node.as_str(), s[0].flagged), ("node-5", true));
}

#[test]
fn start_up_windows_are_not_judged() {
    // Ranks start seconds apart: the late one waits least at first.
    let mut d = Detector::new(DetectorConfig::default());
    for w in 0..2 {
        feed(&mut d, w, &[(0.02, 0.9), (0.02, 0.0)]);
    }
    for w in 2..8 {
        feed(&mut d, w, &[(0.02, 0.9), (0.02, 0.9)]);
    }
    assert!(d.standings(None, 0.0).iter().all(|s| !s.flagged), "{:?}", d.standings(None, 0.0));
}

#[test]
fn a_node_with_only_progress_rows_is_not_judged() {
    // Its rank's first call has not returned: no calls, no scheduler
    // time yet, only what it is inside. Zero waiting is not "waits least".
    let mut d = Detector::new(DetectorConfig::default());
    for w in 0..5 {
        for (node, s) in [("node-0", sig(0.02, 0.9)), ("node-1", sig(0.02, 0.92)), ("node-x", Signals::default())] {
            let key = NodeWindowKey { job: "j".into(), node: node.into(), window_start_us: w * 1_000_000 };
            d.add(key, &Signals { window_ns: 1e9, ..s });
        }
        d.drain();
    }
    assert!(d.standings(None, 0.0).iter().all(|s| !s.flagged), "{:?}", d.standings(None, 0.0));
}

#[test]
fn a_job_can_be_made_stricter_or_laxer() {
    let cfg = DetectorConfig {
        job_z: vec![("lax:*".into(), 60.0), ("strict:ml/a".into(), 2.0)],
        ..DetectorConfig::default()
    };
    assert_eq!((cfg.z_for("lax:ml/x"), cfg.z_for("strict:ml/a"), cfg.z_for("strict:ml/b")), (60.0, 2.0, 4.0));
    let mut d = Detector::new(cfg);
    for w in 0..8 {
        for job in ["lax:ml/x", "plain"] {
            // Peers spread by 1 point: node-3's 27-point excess is z 27.
            for (i, r) in [0.02, 0.03, 0.04, 0.30].iter().enumerate() {
                let key = NodeWindowKey { job: job.into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
                d.add(key, &sig(*r, 0.3));
            }
        }
        d.drain();
    }
    let flagged: Vec<(&str, &str)> = d.flagged().collect();
    assert_eq!(flagged, [("plain", "node-3")], "the lax job's deviation is under its threshold");
    assert!(DetectorConfig::parse_job_z("pytorchjob:ml/*=6").is_ok());
    assert!(DetectorConfig::parse_job_z("x=0").is_err());
    assert!(DetectorConfig::parse_job_z("nothing").is_err());
}

#[test]
fn live_forgets_nodes_and_jobs_that_stopped_reporting() {
    let cfg = DetectorConfig { forget_after: Some(Duration::from_secs(60)), ..DetectorConfig::default() };
    let mut d = Detector::new(cfg);
    let win = |d: &mut Detector, job: &str, w: i64, vals: &[f64]| {
        for (i, r) in vals.iter().enumerate() {
            let key = NodeWindowKey { job: job.into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
            d.add(key, &sig(*r, 0.3));
        }
    };
    for w in 0..10 {
        win(&mut d, "ended", w, &[0.03, 0.03, 0.41]);
        win(&mut d, "running", w, &[0.03, 0.03]);
        d.drain();
    }
    assert!(d.flagged().any(|(j, n)| (j, n) == ("ended", "node-2")));
    // "ended" sends nothing more; "running" goes on, then loses a node.
    for w in 10..75 {
        win(&mut d, "running", w, if w < 40 { &[0.03, 0.03] } else { &[0.03] });
        d.drain();
    }
    assert_eq!(d.flagged().count(), 0, "an ended job's last flag is forgotten");
    assert_eq!((d.jobs(None), d.nodes(None)), (1, 2), "the ended job and its nodes are forgotten");
    assert_eq!(d.standings(None, f64::NEG_INFINITY).len(), 2, "node-1 of the running job is still within the minute");
    for w in 75..105 {
        win(&mut d, "running", w, &[0.03]);
        d.drain();
    }
    assert_eq!(d.standings(None, f64::NEG_INFINITY).len(), 1, "node-1 left its job");
    // History keeps everything.
    let mut h = Detector::new(DetectorConfig::default());
    for w in 0..10 {
        win(&mut h, "ended", w, &[0.03, 0.03, 0.41]);
    }
    for w in 10..200 {
        win(&mut h, "running", w, &[0.03, 0.03]);
    }
    h.drain();
    assert_eq!((h.jobs(None), h.nodes(None)), (2, 5));
    assert_eq!((h.jobs(Some("ended")), h.nodes(Some("ended"))), (1, 3));
    assert_eq!((h.jobs(Some("other")), h.nodes(Some("other"))), (0, 0));
}

/// The detector books a contended node's episode: 4 streak windows of
/// 0.25 s lost each (peers wait 30% of the window, it 5%), then 5 calm
/// windows to clear; priced on 2 nodes × 8 GPUs at $3.
#[test]
fn the_detector_prices_a_flagged_nodes_episode() {
    use crate::rank::cost::Cost;
    let prices = Prices { rules: vec![Prices::parse_rule("default=3").unwrap()], gpus_per_node: 8 };
    let mut d = Detector::new(DetectorConfig { prices, ..Default::default() });
    let (calm, contended) = ([(0.03, 0.30), (0.03, 0.30)], [(0.03, 0.30), (0.41, 0.05)]);
    for w in 0..3 {
        feed(&mut d, w, &calm); // start-up
    }
    for w in 3..7 {
        feed(&mut d, w, &contended);
    }
    let st = d.standings(None, 0.0).into_iter().find(|s| s.flagged).expect("flagged");
    assert_eq!((st.node.as_str(), st.lost_s), ("node-1", 1.0));
    assert_eq!(st.cost, Some(Cost { gpus: 16, gpu_hours: 0.004, usd: Some(0.01) }));
    // Open: known to the end of its last window, not to whenever one asks.
    let open = d.episodes();
    assert_eq!((open[0].end_us, open[0].seen_until_us), (None, Some(7_000_000)), "{open:?}");
    for w in 7..12 {
        feed(&mut d, w, &calm);
    }
    let eps = d.episodes();
    assert_eq!(eps.len(), 1, "{eps:?}");
    let e = &eps[0];
    assert_eq!(
        (e.node.as_str(), e.start_us, e.end_us, e.cause.as_str()),
        ("node-1", 3_000_000, Some(12_000_000), "runq_share")
    );
    assert_eq!(e.seen_until_us, e.end_us);
    assert!((e.lost_s - 1.0).abs() < 1e-9, "{e:?}");
}

/// A rank blocked on its host while its peers sit in a collective that has
/// not returned (a hang shorter than `--stuck-after`): their wait has no
/// duration yet, but each window of it is the whole job's time lost.
#[test]
fn peers_waiting_in_a_call_still_in_flight_price_the_blocked_rank() {
    use ingero_model::progress::ProcProgress;
    let mut d = Detector::new(DetectorConfig::default());
    let blocked = Signals { offcpu_ns: 0.98e9, oncpu_ns: 0.02e9, ..sig(0.0, 0.0) };
    for w in 0..9i64 {
        let calm = w < 3;
        for i in 0..4 {
            let key = NodeWindowKey { job: "j".into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
            let s = if calm {
                sig(0.03, 0.30)
            } else if i == 3 {
                blocked.clone()
            } else {
                // In ncclAllReduce since the hang began, returned nothing since.
                let age = ((w - 2) * 1_000_000_000) as u64;
                let p = ProcProgress { op: Some("ncclAllReduce".into()), age_ns: Some(age), ..Default::default() };
                Signals { in_call_ns: 1e9, procs: vec![p], ..sig(0.03, 0.0) }
            };
            d.add(key, &s);
        }
        d.drain();
    }
    let st = d.standings(None, 0.0).into_iter().find(|s| s.flagged).expect("flagged");
    assert_eq!(st.node, "node-3");
    assert!((st.lost_s - 6.0).abs() < 1e-9, "6 windows of the whole job: {}", st.lost_s);
}

/// A new owner that rebuilds a job from the kept windows (what a hand-over
/// does) stands where the old owner stood: the straggler flagged since the
/// same window; one that starts from nothing is still warming up.
#[test]
fn a_job_rebuilt_from_its_recent_windows_stands_where_its_old_owner_stood() {
    let mut old = Detector::new(DetectorConfig::default());
    let mut kept = super::super::recent::Recent::default();
    let mut fresh = Detector::new(DetectorConfig::default());
    let vals = |w: i64| [(0.03, 0.30), (0.04, 0.31), if w >= 5 { (0.41, 0.05) } else { (0.03, 0.30) }];
    for w in 0..12 {
        for (i, (r, n)) in vals(w).iter().enumerate() {
            let key = NodeWindowKey { job: "j".into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
            old.add(key.clone(), &sig(*r, *n));
            kept.record(&key, &sig(*r, *n), false);
            if w >= 10 {
                fresh.add(key, &sig(*r, *n));
            }
        }
        old.drain();
    }
    let mut new = Detector::new(DetectorConfig::default());
    assert!(!new.is_current("j", 12_000_000));
    for (k, s) in kept.replay("j") {
        new.add(k, &s);
    }
    new.drain();
    fresh.drain();
    let (a, b) = (old.standings(None, 0.0), new.standings(None, 0.0));
    assert!(a[0].flagged && a[0].node == "node-2", "{a:?}");
    assert_eq!((&b[0].node, b[0].flagged, &b[0].since), (&a[0].node, true, &a[0].since));
    assert!(new.is_current("j", 12_000_000) && !new.is_current("j", 17_000_001));
    assert!(fresh.standings(None, 0.0).iter().all(|s| !s.flagged), "{:?}", fresh.standings(None, 0.0));
}

#[test]
fn a_window_that_arrives_late_still_gets_its_grace_to_gather_its_nodes() {
    // The fleet's windows reach this replica 10 s after they end (a backlog,
    // or agents' clocks behind ours); each arrives in two halves, 0.5 s apart,
    // with the grace 1.5 s. Judged on its first half, node-5 (in the second)
    // would never be seen deviating.
    let mut d = Detector::new(DetectorConfig::default());
    let (grace, lag) = (1_500_000, 10_000_000);
    let key = |i: usize, w: i64| NodeWindowKey { job: "j".into(), node: format!("node-{i}"), window_start_us: w };
    for n in 0..12 {
        let w = n * 1_000_000;
        let arrived = w + 1_000_000 + lag;
        for half in [0..6, 6..12] {
            let now = arrived + if half.start == 0 { 0 } else { 500_000 };
            for i in half {
                let hot = n >= 2 && i == 8;
                d.add(key(i, w), &if hot { sig(0.41, 0.05) } else { sig(0.03 + 0.001 * i as f64, 0.30) });
            }
            d.evaluate(now, grace);
        }
    }
    d.drain();
    let s = d.standings(None, 0.0);
    let hot = s.iter().find(|x| x.node == "node-8").expect("node-8 ranked");
    assert!(hot.flagged, "the late node was judged out: {s:?}");
    assert!(s.iter().filter(|x| x.flagged).count() == 1, "{s:?}");
}

/// A hang flags the node holding the rank the others wait for at once, and
/// starts it afresh: the deviant windows before the hang do not count
/// towards a flag after progress resumes (the SQL ranking's rule too).
#[test]
fn a_hang_flags_at_once_and_what_deviated_before_it_does_not_count_after() {
    use crate::rank::progress::ProcProgress;
    let proc = |op: Option<&str>| ProcProgress {
        pid: 1,
        comm: "python3".into(),
        op: op.map(String::from),
        age_ns: op.map(|_| 40_000_000_000),
        ..Default::default()
    };
    let mut d = Detector::new(DetectorConfig::default());
    let mut window = |w: i64, deviant: bool, hung: bool| {
        for i in 0..3 {
            let mut s = if i == 1 && deviant { sig(0.41, 0.05) } else { sig(0.03, 0.30) };
            if hung {
                s.procs = vec![proc((i != 1).then_some("cudaStreamSynchronize"))];
            }
            let key = NodeWindowKey { job: "j".into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
            d.add(key, &s);
        }
        d.drain();
        d.standings(None, 0.0).into_iter().find(|s| s.node == "node-1").unwrap()
    };
    for w in -2..0 {
        window(w, false, false); // start-up
    }
    for w in 0..3 {
        assert!(!window(w, true, false).flagged, "flagged before K windows at {w}");
    }
    let s = window(3, true, true);
    assert!(s.flagged && s.stuck, "{s:?}");
    assert_eq!((s.since_us, s.score), (Some(3_000_000), 1000.0), "{s:?}");
    // Progress resumed: 3 deviant windows before and the hang are not a streak.
    for w in 4..7 {
        assert!(!window(w, true, false).flagged, "flagged at {w} from a streak across the hang");
    }
    let s = window(7, true, false);
    assert!(s.flagged && !s.stuck, "{s:?}");
    assert_eq!(s.since_us, Some(4_000_000), "{s:?}");
}

#[test]
fn live_standings_show_each_nodes_step_time_against_its_jobs() {
    use crate::rank::progress::ProcProgress;
    let mut d = Detector::new(DetectorConfig::default());
    let proc =
        |p50_ms: u64| ProcProgress { steps: Some(3), step_p50_ns: Some(p50_ms * 1_000_000), ..Default::default() };
    for w in 0..8 {
        for (i, (runq, p50)) in [(0.03, 310), (0.41, 480), (0.03, 300), (0.03, 320)].into_iter().enumerate() {
            let key = NodeWindowKey { job: "j".into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
            // Node 3's agent found no steps in its first windows.
            let procs = if i == 3 && w < 4 { vec![] } else { vec![proc(p50)] };
            d.add(key, &Signals { procs, ..sig(runq, 0.3) });
        }
        d.drain();
    }
    let s = d.standings(None, 0.0);
    let step = |node: &str| s.iter().find(|x| x.node == node).and_then(|x| x.step.clone()).unwrap();
    // The job's step time: the median of its nodes' (300, 310, 320, 480 → 310).
    assert_eq!((step("node-1").seconds, step("node-1").job_seconds, step("node-1").ratio), (0.48, 0.31, 1.55));
    assert_eq!(step("node-2").ratio, 0.97);
    assert_eq!(step("node-3").seconds, 0.32);
}

/// In lockstep every rank steps at the straggler's pace: the standing says
/// what the job's steps were before the node deviated and since, and keeps
/// the "before" once the job's kept windows no longer reach back to it.
#[test]
fn a_stragglers_standing_says_how_much_slower_its_job_steps() {
    use crate::rank::progress::ProcProgress;
    let mut d = Detector::new(DetectorConfig::default());
    let proc = |ms: u64| ProcProgress { steps: Some(3), step_p50_ns: Some(ms * 1_000_000), ..Default::default() };
    let mut window = |w: i64, slow: bool| {
        for i in 0..4 {
            let key = NodeWindowKey { job: "j".into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
            let runq = if slow && i == 1 { 0.41 } else { 0.03 };
            d.add(key, &Signals { procs: vec![proc(if slow { 150 } else { 100 })], ..sig(runq, 0.3) });
        }
        d.drain();
        d.standings(None, 1.0).into_iter().find(|s| s.node == "node-1")
    };
    for w in 0..20 {
        assert!(window(w, false).is_none(), "calm node-1 listed at {w}");
    }
    let mut s = None;
    for w in 20..30 {
        s = window(w, true);
    }
    let s = s.expect("node-1 listed");
    assert!(s.flagged && s.since_us == Some(20_000_000), "{s:?}");
    let step = s.step.expect("steps found");
    assert_eq!(step.ratio, 1.0, "lockstep: {step:?}");
    let shift = step.job_shift.expect("a shift");
    assert_eq!((shift.before_seconds, shift.since_seconds), (0.1, 0.15));
    // Eleven minutes on: the job's windows from before are gone, the pace
    // taken when the deviation began is not.
    let mut s = None;
    for w in 30..690 {
        s = window(w, true);
    }
    let shift = s.and_then(|s| s.step).and_then(|t| t.job_shift).expect("a shift after 11 minutes");
    assert_eq!((shift.before_seconds, shift.since_seconds), (0.1, 0.15));
}

#[test]
fn a_job_of_one_node_is_solo_not_calm() {
    let mut d = Detector::new(DetectorConfig::default());
    for w in 0..4 {
        feed(&mut d, w, &[(0.5, 0.0)]);
    }
    assert_eq!(d.solo(None), vec![("j".to_string(), "node-0".to_string())]);
    let r = crate::rank::Ranking::from_detector(&d, None, "live");
    assert_eq!(r.unranked.len(), 1, "{r:?}");
    assert!(r.unranked[0].reason.contains("the job's only node"), "{r:?}");
    // A second node joins: ranked against each other.
    feed(&mut d, 4, &[(0.5, 0.0), (0.02, 0.3)]);
    assert!(d.solo(None).is_empty());
    assert!(crate::rank::Ranking::from_detector(&d, None, "live").unranked.is_empty());
}
