// SPDX-License-Identifier: Apache-2.0
//! Robust straggler detection: each node against its job's other nodes,
//! window by window, with K-consecutive flagging and hysteresis.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::signals::{NodeWindowKey, Signal, Signals};
use super::spec::{DEVICE_WAIT_HIGH, SPECS, SignalSpec, fmt_value};
pub use super::standing::{Deviation, Standing};
use super::stuck::culprits;
use ingero_model::time::{median, rfc3339};

#[derive(Debug, Clone)]
pub struct DetectorConfig {
    /// Robust z-score (MAD units) above which a signal deviates.
    pub z_threshold: f64,
    /// Consecutive deviant windows before a node is flagged.
    pub flag_after: u32,
    /// Consecutive normal windows before a flag clears.
    pub clear_after: u32,
    /// Jobs smaller than this compare each node with the *other* nodes
    /// (leave-one-out), so two nodes are enough.
    pub loo_below: usize,
    /// A job whose ranks have waited this long in one call has stopped
    /// progressing: the node holding the rank they wait for is flagged
    /// `stuck` at once.
    pub stuck_after: Duration,
    /// Keep every node's per-window score (history views; off live).
    pub timeline: bool,
    /// Live: a node that has sent no window for this long (it left its job,
    /// or its job ended) is forgotten, with its standing: an ended job's last
    /// flag must not stay on `/metrics` or keep a node marked. Measured in
    /// window time (the newest window judged), so replays behave alike.
    /// None (history): every node stays, for the range's ranking.
    pub forget_after: Option<Duration>,
    /// Per-job `z_threshold`s: (pattern, z), the first match wins; a pattern
    /// is a job name, or a prefix ending in `*` (`pytorchjob:research/*`).
    pub job_z: Vec<(String, f64)>,
}

impl DetectorConfig {
    /// The z threshold for `job`: its first matching override, else the fleet's.
    pub fn z_for(&self, job: &str) -> f64 {
        self.job_z
            .iter()
            .find(|(p, _)| match p.strip_suffix('*') {
                Some(prefix) => job.starts_with(prefix),
                None => p == job,
            })
            .map_or(self.z_threshold, |(_, z)| *z)
    }

    /// Parses `PATTERN=Z` (`--job-z-threshold`).
    pub fn parse_job_z(s: &str) -> Result<(String, f64), String> {
        let (p, z) = s.rsplit_once('=').ok_or_else(|| format!("`{s}`: expected JOB=Z, e.g. pytorchjob:ml/*=6"))?;
        let z: f64 = z.trim().parse().map_err(|_| format!("`{s}`: `{z}` is not a number"))?;
        if p.is_empty() || !(z > 0.0 && z.is_finite()) {
            return Err(format!("`{s}`: needs a job pattern and a z threshold > 0"));
        }
        Ok((p.to_string(), z))
    }
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            z_threshold: 4.0,
            flag_after: 4,
            clear_after: 5,
            loo_below: 8,
            stuck_after: Duration::from_secs(30),
            timeline: false,
            forget_after: None,
            job_z: Vec::new(),
        }
    }
}

#[derive(Debug, Default)]
struct NodeState {
    streak: u32,
    calm: u32,
    flagged: bool,
    streak_start: Option<i64>,
    since: Option<i64>,
    score: f64,
    devs: Vec<Deviation>,
    windows: u64,
    /// Windows with calls or scheduler rows (see [`WARMUP_WINDOWS`]).
    measured_windows: u64,
    last_window: i64,
    stuck: bool,
    /// (window, score this window, flagged after it), with `timeline` on.
    trace: Vec<TracePoint>,
}

/// (window start, score that window, flagged after it).
pub type TracePoint = (i64, f32, bool);

/// A node's first windows with data are start-up, not judged.
const WARMUP_WINDOWS: u64 = 2;

#[derive(Debug, Default)]
struct JobState {
    pending: BTreeMap<i64, HashMap<String, Signals>>,
    nodes: HashMap<String, NodeState>,
    evaluated_up_to: Option<i64>,
}

#[derive(Debug, Default)]
pub struct Detector {
    cfg: DetectorConfig,
    jobs: HashMap<String, JobState>,
    /// Newest window when departed nodes were last looked for.
    forgot_at: i64,
}

impl Detector {
    pub fn new(cfg: DetectorConfig) -> Self {
        Detector { cfg, jobs: HashMap::new(), forgot_at: i64::MIN }
    }

    /// Adds node-window signals (may arrive in several pieces).
    pub fn add(&mut self, key: NodeWindowKey, s: &Signals) {
        let job = self.jobs.entry(key.job).or_default();
        if job.evaluated_up_to.is_some_and(|e| key.window_start_us <= e) {
            return; // too late: that window was already judged
        }
        job.pending.entry(key.window_start_us).or_default().entry(key.node).or_default().merge(s);
    }

    /// Judges every pending window that is complete: all recently active
    /// nodes reported it, or `now_us` is past its end plus `grace_us`.
    /// Returns the number of windows judged.
    pub fn evaluate(&mut self, now_us: i64, grace_us: i64) -> usize {
        let cfg = self.cfg.clone();
        let mut judged = 0;
        for (name, job) in self.jobs.iter_mut() {
            // A job with its own sensitivity is judged with its own threshold.
            let z = cfg.z_for(name);
            let job_cfg = (z != cfg.z_threshold).then(|| DetectorConfig { z_threshold: z, ..cfg.clone() });
            let cfg = job_cfg.as_ref().unwrap_or(&cfg);
            while let Some((&w, nodes)) = job.pending.iter().next() {
                let active = job.nodes.values().filter(|n| n.last_window >= w - 10_000_000).count();
                let win_len = nodes.values().map(|s| s.window_ns).fold(0.0, f64::max) as i64 / 1000;
                let complete = nodes.len() >= active.max(1) && active > 0;
                let expired = now_us >= w + win_len + grace_us;
                let later = job.pending.len() > 2; // two newer windows exist: don't wait longer
                if !(complete || expired || later) {
                    break;
                }
                let nodes = job.pending.remove(&w).unwrap_or_default();
                judge(cfg, job, w, &nodes);
                job.evaluated_up_to = Some(w);
                judged += 1;
            }
        }
        if judged > 0 {
            self.forget_departed();
        }
        judged
    }

    /// With `forget_after`: drops nodes (and then jobs) whose newest window
    /// is that much older than the newest window judged anywhere.
    fn forget_departed(&mut self) {
        let Some(after) = self.cfg.forget_after else { return };
        let Some(newest) = self.jobs.values().filter_map(|j| j.evaluated_up_to).max() else { return };
        // Every node is visited: at most once per 10 s of windows, not per batch.
        if newest < self.forgot_at.saturating_add(10_000_000) {
            return;
        }
        self.forgot_at = newest;
        let horizon = newest - after.as_micros() as i64;
        for job in self.jobs.values_mut() {
            job.nodes.retain(|_, n| n.last_window >= horizon);
        }
        self.jobs.retain(|_, j| !j.nodes.is_empty() || !j.pending.is_empty());
    }

    /// Judges everything pending (history replay, end of stream).
    pub fn drain(&mut self) -> usize {
        self.evaluate(i64::MAX / 2, 0)
    }

    /// Standings, most deviant first; `min_score` hides quiet nodes.
    pub fn standings(&self, job: Option<&str>, min_score: f64) -> Vec<Standing> {
        let mut out: Vec<Standing> = self
            .jobs
            .iter()
            .filter(|(j, _)| job.is_none_or(|want| want == j.as_str()))
            .flat_map(|(j, st)| {
                st.nodes.iter().filter(move |(_, n)| n.flagged || n.score >= min_score).map(move |(node, n)| Standing {
                    node: node.clone(),
                    job: j.clone(),
                    score: (n.score * 100.0).round() / 100.0,
                    flagged: n.flagged,
                    since: n.since.or(n.streak_start).map(rfc3339),
                    since_us: n.since.or(n.streak_start),
                    signals: n.devs.clone(),
                    windows: n.windows,
                    stuck: n.stuck,
                })
            })
            .collect();
        out.sort_by(|a, b| b.flagged.cmp(&a.flagged).then(b.score.total_cmp(&a.score)).then(a.node.cmp(&b.node)));
        out
    }

    /// (job, node) of every node flagged now (cheap: no standings built).
    pub fn flagged(&self) -> impl Iterator<Item = (&str, &str)> {
        self.jobs.iter().flat_map(|(j, st)| {
            st.nodes.iter().filter(|(_, n)| n.flagged).map(move |(node, _)| (j.as_str(), node.as_str()))
        })
    }

    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// Every judged window of every node (`timeline` on), sorted by job, node.
    pub fn timelines(&self, job: Option<&str>) -> Vec<(&str, &str, &[TracePoint])> {
        let mut out: Vec<_> = self
            .jobs
            .iter()
            .filter(|(j, _)| job.is_none_or(|want| want == j.as_str()))
            .flat_map(|(j, st)| st.nodes.iter().map(move |(n, s)| (j.as_str(), n.as_str(), s.trace.as_slice())))
            .collect();
        out.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        out
    }
}

/// Median and scaled MAD of a set of values.
fn robust(values: &[f64]) -> (f64, f64) {
    let mut v = values.to_vec();
    let m = median(&mut v);
    let mut dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    (m, 1.4826 * median(&mut dev))
}

/// The nodes a signal is compared against, with their median and MAD
/// computed once when every node shares them (no leave-one-out): per node
/// it was O(n² log n) per window, most of a 1,000-node history ranking.
struct Reference<'a> {
    nodes: &'a [usize],
    shared: Option<(f64, f64)>,
}

impl<'a> Reference<'a> {
    fn new(cfg: &DetectorConfig, values: &[f64], nodes: &'a [usize]) -> Reference<'a> {
        let shared =
            (nodes.len() >= cfg.loo_below).then(|| robust(&nodes.iter().map(|&j| values[j]).collect::<Vec<_>>()));
        Reference { nodes, shared }
    }
}

/// How far `values[i]` deviates in the spec's bad direction from the nodes in
/// `reference` (itself excluded when the set is small: leave-one-out).
fn deviation(
    cfg: &DetectorConfig,
    spec: &SignalSpec,
    values: &[f64],
    i: usize,
    reference: &Reference,
) -> Option<Deviation> {
    let (med, mad) = match reference.shared {
        Some(m) => m,
        None => {
            let others: Vec<f64> = reference.nodes.iter().filter(|&&j| j != i).map(|&j| values[j]).collect();
            if others.is_empty() {
                return None;
            }
            robust(&others)
        }
    };
    let effect = spec.direction * (values[i] - med);
    // Scale never below the signal's minimum effect / z, nor 10% of the median:
    // identical peers (MAD 0) must not turn noise into infinite z.
    let scale = mad.max(spec.min_effect / cfg.z_threshold).max(0.1 * med.abs());
    let z = effect / scale;
    (z >= cfg.z_threshold && effect >= spec.min_effect).then(|| Deviation {
        signal: spec.name.to_string(),
        value: values[i],
        job_median: med,
        z: (z * 10.0).round() / 10.0,
        text: format!("{} {} vs job median {}", spec.label, fmt_value(spec, values[i]), fmt_value(spec, med)),
    })
}

/// Standing score of a node holding a stuck job's rank: above any z-score
/// the signals reach, so it ranks first.
const STUCK_SCORE: f64 = 1000.0;

fn add(d: &mut (f64, Vec<Deviation>, bool), dev: Deviation, cause: bool) {
    d.0 = d.0.max(dev.z);
    d.2 |= cause;
    d.1.push(dev);
}

fn judge(cfg: &DetectorConfig, job: &mut JobState, w: i64, nodes: &HashMap<String, Signals>) {
    let names: Vec<&String> = nodes.keys().collect();
    let n = names.len();
    for name in &names {
        let st = job.nodes.entry((*name).clone()).or_default();
        st.last_window = st.last_window.max(w);
        st.windows += 1;
        st.measured_windows += nodes[*name].measured as u64;
    }
    if n < 2 {
        return; // nothing to compare with
    }
    // devs[node] = (score, deviations, has_cause)
    let mut devs: Vec<(f64, Vec<Deviation>, bool)> = vec![(0.0, Vec::new(), false); n];
    // A node that sent only progress rows this window (its first call has
    // not returned yet) has no signals to compare, and a node's first
    // windows are its start-up (library loading, NCCL init, the first
    // barrier: ranks start seconds apart): neither is judged nor part of the
    // reference.
    let all: Vec<usize> =
        (0..n).filter(|&i| nodes[names[i]].measured && job.nodes[names[i]].measured_windows > WARMUP_WINDOWS).collect();
    let mut waits_less = vec![false; n];
    for spec in SPECS.iter() {
        let values: Vec<f64> = names.iter().map(|k| nodes[*k].get(spec.signal)).collect();
        let r = Reference::new(cfg, &values, &all);
        for &i in &all {
            if let Some(d) = deviation(cfg, spec, &values, i, &r) {
                waits_less[i] |= spec.signal == Signal::DeviceWaitShare;
                add(&mut devs[i], d, spec.cause);
            }
        }
    }
    // A slow link shows as *more* waiting on the device and peers than the
    // peers. The peers of a straggler wait more too, so compare only against
    // nodes that neither wait less nor have a cause of their own (stragglers
    // leave the reference).
    let values: Vec<f64> = names.iter().map(|k| nodes[*k].get(Signal::DeviceWaitShare)).collect();
    let reference: Vec<usize> = all.iter().copied().filter(|&i| !waits_less[i] && !devs[i].2).collect();
    let r = Reference::new(cfg, &values, &reference);
    for &i in &reference {
        if let Some(d) = deviation(cfg, &DEVICE_WAIT_HIGH, &values, i, &r) {
            add(&mut devs[i], d, true);
        }
    }
    let pairs: Vec<(&String, &Signals)> = names.iter().map(|k| (*k, &nodes[*k])).collect();
    let stuck: HashMap<usize, Deviation> =
        culprits(cfg.stuck_after.as_nanos() as f64, &pairs).into_iter().map(|c| (c.node, c.dev)).collect();
    // Waiting less in its syncs than the peers is the straggler's signature;
    // but when a node has a cause of its own, only it is the straggler.
    let any_cause = devs.iter().any(|d| d.2);
    for (i, name) in names.iter().enumerate() {
        let (score, list, cause) = &devs[i];
        let deviant = *score > 0.0 && (*cause || !any_cause);
        let st = job.nodes.get_mut(*name).expect("inserted above");
        update(cfg, st, w, stuck.get(&i), deviant.then_some((*score, list)));
    }
}

/// One node's standing after a judged window: stuck (flagged at once),
/// deviant (flagged after K windows) or calm (cleared after `clear_after`).
fn update(
    cfg: &DetectorConfig,
    st: &mut NodeState,
    w: i64,
    stuck: Option<&Deviation>,
    deviant: Option<(f64, &Vec<Deviation>)>,
) {
    update_state(cfg, st, w, stuck, deviant);
    if cfg.timeline {
        let score = if stuck.is_some() { st.score } else { deviant.map_or(0.0, |d| d.0) };
        st.trace.push((w, score as f32, st.flagged));
    }
}

fn update_state(
    cfg: &DetectorConfig,
    st: &mut NodeState,
    w: i64,
    stuck: Option<&Deviation>,
    deviant: Option<(f64, &Vec<Deviation>)>,
) {
    if let Some(dev) = stuck {
        // No K-window streak: the job has already waited `stuck_after`.
        st.stuck = true;
        st.flagged = true;
        st.since.get_or_insert(w);
        st.streak_start.get_or_insert(w);
        st.calm = 0;
        st.score = STUCK_SCORE;
        st.devs = vec![dev.clone()];
        return;
    }
    if std::mem::take(&mut st.stuck) {
        // Progress resumed: the hang is over, whatever else follows.
        st.flagged = false;
        st.since = None;
    }
    if let Some((score, list)) = deviant {
        st.calm = 0;
        st.streak += 1;
        st.streak_start.get_or_insert(w);
        st.score = score;
        st.devs = list.clone();
        if !st.flagged && st.streak >= cfg.flag_after {
            st.flagged = true;
            st.since = st.streak_start;
        }
    } else {
        st.streak = 0;
        st.streak_start = None;
        st.calm += 1;
        if st.flagged && st.calm >= cfg.clear_after {
            st.flagged = false;
            st.since = None;
        }
        if !st.flagged {
            st.score = 0.0;
            st.devs.clear();
        }
    }
}

#[cfg(test)]
mod tests {
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
                    let key =
                        NodeWindowKey { job: job.into(), node: format!("node-{i}"), window_start_us: w * 1_000_000 };
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
        assert_eq!(d.jobs(), 1);
        assert_eq!(
            d.standings(None, f64::NEG_INFINITY).len(),
            2,
            "node-1 of the running job is still within the minute"
        );
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
        assert_eq!(h.jobs(), 2);
    }
}
