// SPDX-License-Identifier: Apache-2.0
//! Robust straggler detection: each node against its job's other nodes,
//! window by window, with K-consecutive flagging and hysteresis.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::cost::Prices;
use super::deviation::{Reference, deviation};
use super::episode::{Episode, Ledger, Outcome, lost_in_window, medians};
use super::signals::{Host, NodeWindowKey, Signal, Signals};
use super::spec::{DEVICE_WAIT_HIGH, SPECS};
pub use super::standing::{Deviation, Standing};
use super::steps::StepTime;
use super::stuck::culprits;
use ingero_model::time::rfc3339;

/// Maps by job or node name: aHash, not SipHash (names come from our own
/// store and agents; a 10,000-node history hour is millions of lookups).
type ByName<V> = HashMap<String, V, ahash::RandomState>;

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
    /// GPU-hour prices: what a straggler episode costs (`--gpu-price`).
    pub prices: Prices,
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
            prices: Prices::default(),
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
    /// End of its last judged window: where an episode still open is known to.
    judged_until: i64,
    stuck: bool,
    /// (window, score this window, flagged after it), with `timeline` on.
    trace: Vec<TracePoint>,
    /// Job time lost in the current episode (and, with `timeline`, past ones).
    ledger: Ledger,
    /// Its recent step times, where the agents found steps.
    steps: super::steps::StepTrack,
}

/// (window start, score that window, flagged after it).
pub type TracePoint = (i64, f32, bool);

/// A window's pieces as they arrive, and when the detector first saw it.
#[derive(Debug, Default)]
struct Pending {
    nodes: ByName<Signals>,
    /// `now_us` of the first [`Detector::evaluate`] that found the window:
    /// its grace counts from here as well as from its end, so a window that
    /// reaches this replica late (a backlog, a lagging fleet, an agent clock
    /// behind ours) is still given the whole grace to gather its nodes
    /// instead of being judged on its first piece.
    first_seen_us: Option<i64>,
}

/// A node's first windows with data are start-up, not judged.
const WARMUP_WINDOWS: u64 = 2;
/// A job whose newest window here is this much older than a new one is
/// not being ranked here: it came (back) from another replica.
const CURRENT_US: i64 = 5_000_000;

#[derive(Debug, Default)]
struct JobState {
    pending: BTreeMap<i64, Pending>,
    nodes: ByName<NodeState>,
    evaluated_up_to: Option<i64>,
    steps: super::steps::JobSteps,
}

#[derive(Debug, Default)]
pub struct Detector {
    cfg: DetectorConfig,
    jobs: ByName<JobState>,
    /// Newest window when departed nodes were last looked for.
    forgot_at: i64,
    /// Each node's GPUs, as its agent last said (what costs are priced by).
    hosts: HashMap<String, Host>,
}

impl Detector {
    pub fn new(cfg: DetectorConfig) -> Self {
        Detector { cfg, jobs: ByName::default(), forgot_at: i64::MIN, hosts: HashMap::new() }
    }

    /// Adds node-window signals (may arrive in several pieces).
    pub fn add(&mut self, key: NodeWindowKey, s: &Signals) {
        self.add_signals(&key.job, key.node, key.window_start_us, s.clone());
    }

    /// [`Self::add`] from a caller that owns the signals and lends the job
    /// (history replay: millions of node-windows, no copies).
    pub fn add_signals(&mut self, job: &str, node: String, window_start_us: i64, s: Signals) {
        if let Some(h) = s.host.as_ref().filter(|h| self.hosts.get(&node) != Some(h)) {
            self.hosts.insert(node.clone(), h.clone());
        }
        if !self.jobs.contains_key(job) {
            self.jobs.insert(job.to_string(), JobState::default());
        }
        let job = self.jobs.get_mut(job).expect("inserted above");
        if job.evaluated_up_to.is_some_and(|e| window_start_us <= e) {
            return; // too late: that window was already judged
        }
        match job.pending.entry(window_start_us).or_default().nodes.entry(node) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().merge(&s),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(s);
            }
        }
    }

    /// Judges every pending window that is complete: all recently active
    /// nodes reported it, or `now_us` is `grace_us` past both its end and
    /// the first call that found it pending.
    /// Returns the number of windows judged.
    pub fn evaluate(&mut self, now_us: i64, grace_us: i64) -> usize {
        let cfg = self.cfg.clone();
        let mut judged = 0;
        for (name, job) in self.jobs.iter_mut() {
            // A job with its own sensitivity is judged with its own threshold.
            let z = cfg.z_for(name);
            let job_cfg = (z != cfg.z_threshold).then(|| DetectorConfig { z_threshold: z, ..cfg.clone() });
            let cfg = job_cfg.as_ref().unwrap_or(&cfg);
            while let Some((&w, p)) = job.pending.iter_mut().next() {
                let active = job.nodes.values().filter(|n| n.last_window >= w - 10_000_000).count();
                let win_len = p.nodes.values().map(|s| s.window_ns).fold(0.0, f64::max) as i64 / 1000;
                let complete = p.nodes.len() >= active.max(1) && active > 0;
                let seen = *p.first_seen_us.get_or_insert(now_us);
                let expired = now_us >= (w + win_len).max(seen) + grace_us;
                let later = job.pending.len() > 2; // two newer windows exist: don't wait longer
                if !(complete || expired || later) {
                    break;
                }
                let nodes = job.pending.remove(&w).map(|p| p.nodes).unwrap_or_default();
                tracing::trace!(job = %name, window = w, nodes = nodes.len(), active, complete, expired, later, "judged");
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

    /// Whether `job` is being judged here up to about `window_us`: if not, a
    /// replica that starts ranking it rebuilds it first (a hand-over).
    pub fn is_current(&self, job: &str, window_us: i64) -> bool {
        self.jobs.get(job).is_some_and(|j| {
            let newest = j.pending.keys().next_back().copied().max(j.evaluated_up_to);
            newest.is_some_and(|n| n >= window_us - CURRENT_US)
        })
    }

    /// Drops `job` and its standings (it is rebuilt, or ranked elsewhere).
    pub fn forget_job(&mut self, job: &str) {
        self.jobs.remove(job);
    }

    /// Keeps only the jobs `keep` says (those this replica owns now).
    pub fn retain_jobs(&mut self, keep: impl Fn(&str) -> bool) {
        self.jobs.retain(|j, _| keep(j));
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
                let job_step = super::steps::median(st.nodes.values().filter_map(|n| n.steps.ns()).collect());
                let step = move |n: &NodeState| {
                    let shift = n.since.or(n.streak_start).and_then(|t| st.steps.shift(n.steps.job_before, t));
                    Some(StepTime::new(n.steps.ns()? as f64, job_step? as f64)?.with_shift(shift))
                };
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
                    lost_s: round2(n.ledger.lost_s),
                    cost: n.flagged.then(|| self.cost(st, n.ledger.lost_s)),
                    step: step(n),
                })
            })
            .collect();
        out.sort_by(|a, b| b.flagged.cmp(&a.flagged).then(b.score.total_cmp(&a.score)).then(a.node.cmp(&b.node)));
        out
    }

    /// Nodes' GPUs known from elsewhere (history: the store's `node_windows`).
    pub fn set_hosts(&mut self, hosts: HashMap<String, Host>) {
        self.hosts.extend(hosts);
    }

    /// What `lost_s` seconds of `job`'s time cost, on every node it ran on.
    fn cost(&self, job: &JobState, lost_s: f64) -> super::cost::Cost {
        self.cfg.prices.cost(lost_s, job.nodes.keys().map(|n| (n.as_str(), self.hosts.get(n))))
    }

    /// Every episode (history: closed ones too), priced, oldest first.
    pub fn episodes(&self) -> Vec<Episode> {
        let mut out = Vec::new();
        for (j, st) in &self.jobs {
            for (node, n) in &st.nodes {
                let ep = |start_us, end_us: Option<i64>, cause: &str, text: &str, peak_score, lost_s| Episode {
                    job: j.clone(),
                    node: node.clone(),
                    start_us,
                    end_us,
                    seen_until_us: end_us.or(Some(n.judged_until).filter(|&t| t > start_us)),
                    cause: cause.to_string(),
                    text: text.to_string(),
                    peak_score,
                    lost_s: round2(lost_s),
                    cost: Some(self.cost(st, lost_s)),
                };
                for c in &n.ledger.closed {
                    out.push(ep(c.start_us, Some(c.end_us), &c.cause, &c.text, c.peak_score, c.lost_s));
                }
                if n.flagged {
                    let (score, cause, text) = &n.ledger.peak;
                    out.push(ep(n.since.unwrap_or(n.last_window), None, cause, text, *score, n.ledger.lost_s));
                }
            }
        }
        out.sort_by(|a, b| a.start_us.cmp(&b.start_us).then(a.node.cmp(&b.node)));
        out
    }

    /// (job, node) of every node flagged now (cheap: no standings built).
    pub fn flagged(&self) -> impl Iterator<Item = (&str, &str)> {
        self.jobs.iter().flat_map(|(j, st)| {
            st.nodes.iter().filter(|(_, n)| n.flagged).map(move |(node, _)| (j.as_str(), node.as_str()))
        })
    }

    /// Jobs ranked now (`job`: 1 if it is one of them).
    pub fn jobs(&self, job: Option<&str>) -> usize {
        job.map_or(self.jobs.len(), |j| usize::from(self.jobs.contains_key(j)))
    }

    /// Nodes ranked now (of `job`, or of every job): each judged against
    /// its job's other nodes, whether or not it deviates.
    pub fn nodes(&self, job: Option<&str>) -> usize {
        self.jobs.iter().filter(|(j, _)| job.is_none_or(|want| want == j.as_str())).map(|(_, st)| st.nodes.len()).sum()
    }

    /// (job, node) of each job with one node now: nothing to rank it against.
    pub fn solo(&self, job: Option<&str>) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .jobs
            .iter()
            .filter(|(j, st)| job.is_none_or(|want| want == j.as_str()) && st.nodes.len() == 1)
            .filter_map(|(j, st)| st.nodes.keys().next().map(|n| (j.clone(), n.clone())))
            .collect();
        out.sort();
        out
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

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Standing score of a node holding a stuck job's rank: above any z-score
/// the signals reach, so it ranks first.
const STUCK_SCORE: f64 = 1000.0;

fn add(d: &mut (f64, Vec<Deviation>, bool), dev: Deviation, cause: bool) {
    d.0 = d.0.max(dev.z);
    d.2 |= cause;
    d.1.push(dev);
}

/// Counts window `w` in each node's state (created on its first window);
/// returns each node's measured windows so far, in `names` order.
fn note_window(job: &mut JobState, w: i64, names: &[&String], sigs: &[&Signals]) -> Vec<u64> {
    let mut measured_windows = Vec::with_capacity(names.len());
    let mut steps = Vec::new();
    for (name, s) in names.iter().zip(sigs) {
        if !job.nodes.contains_key(name.as_str()) {
            job.nodes.insert((*name).clone(), NodeState::default());
        }
        let st = job.nodes.get_mut(name.as_str()).expect("inserted above");
        st.last_window = st.last_window.max(w);
        st.windows += 1;
        st.measured_windows += s.measured as u64;
        steps.extend(st.steps.add(s));
        measured_windows.push(st.measured_windows);
    }
    job.steps.add(w, steps);
    measured_windows
}

fn judge(cfg: &DetectorConfig, job: &mut JobState, w: i64, nodes: &ByName<Signals>) {
    // Looked up once: a 10,000-node job is judged 360 times per history hour.
    let (names, sigs): (Vec<&String>, Vec<&Signals>) = nodes.iter().unzip();
    let n = names.len();
    let measured_windows = note_window(job, w, &names, &sigs);
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
    let all: Vec<usize> = (0..n).filter(|&i| sigs[i].measured && measured_windows[i] > WARMUP_WINDOWS).collect();
    let mut waits_less = vec![false; n];
    for spec in SPECS.iter() {
        let values: Vec<f64> = sigs.iter().map(|s| s.get(spec.signal)).collect();
        let r = Reference::new(cfg.loo_below, &values, &all);
        for &i in &all {
            if let Some(d) = deviation(cfg.z_threshold, spec, &values, i, &r) {
                waits_less[i] |= spec.signal == Signal::DeviceWaitShare;
                add(&mut devs[i], d, spec.cause);
            }
        }
    }
    // A slow link shows as *more* waiting on the device and peers than the
    // peers. The peers of a straggler wait more too, so compare only against
    // nodes that neither wait less nor have a cause of their own (stragglers
    // leave the reference).
    let values: Vec<f64> = sigs.iter().map(|s| s.get(Signal::DeviceWaitShare)).collect();
    let reference: Vec<usize> = all.iter().copied().filter(|&i| !waits_less[i] && !devs[i].2).collect();
    let r = Reference::new(cfg.loo_below, &values, &reference);
    for &i in &reference {
        if let Some(d) = deviation(cfg.z_threshold, &DEVICE_WAIT_HIGH, &values, i, &r) {
            add(&mut devs[i], d, true);
        }
    }
    let pairs: Vec<(&String, &Signals)> = names.iter().copied().zip(sigs.iter().copied()).collect();
    let stuck: HashMap<usize, Deviation> =
        culprits(cfg.stuck_after.as_nanos() as f64, &pairs).into_iter().map(|c| (c.node, c.dev)).collect();
    // Waiting less in its syncs than the peers is the straggler's signature;
    // but when a node has a cause of its own, only it is the straggler.
    let any_cause = devs.iter().any(|d| d.2);
    // What the peers wait, for the job time a straggler costs: shared by
    // every node in a large job, leave-one-out in a small one (as above).
    // Calls in flight count: peers waiting in a collective for a hung rank
    // have returned nothing yet.
    let shares = |j: usize| (sigs[j].waiting_share(), sigs[j].get(Signal::CopyWaitShare));
    let shared = (all.len() >= cfg.loo_below).then(|| medians(&all.iter().map(|&j| shares(j)).collect::<Vec<_>>()));
    for (i, name) in names.iter().enumerate() {
        let (score, list, cause) = &devs[i];
        let deviant = *score > 0.0 && (*cause || !any_cause);
        let st = job.nodes.get_mut(*name).expect("inserted above");
        let window_s = sigs[i].window_ns / 1e9;
        let lost_s = match (stuck.contains_key(&i), deviant || st.flagged) {
            (true, _) => window_s,
            (false, true) => {
                let peers = shared.unwrap_or_else(|| {
                    medians(&all.iter().filter(|&&j| j != i).map(|&j| shares(j)).collect::<Vec<_>>())
                });
                lost_in_window(window_s, shares(i), peers)
            }
            (false, false) => 0.0,
        };
        let end = w + (window_s * 1e6) as i64;
        let was_flagged = st.flagged;
        tracing::trace!(node = %name, window = w, score, cause, any_cause, deviant, "node judged");
        update(cfg, st, (w, end, lost_s), stuck.get(&i), deviant.then_some((*score, list)));
        if st.streak_start == Some(w) {
            st.steps.job_before = job.steps.before(w);
        }
        if st.flagged != was_flagged {
            let what = if st.flagged { "flagged" } else { "cleared" };
            tracing::debug!(node = %name, window = w, score = st.score, stuck = st.stuck, "{what}");
        }
    }
}

/// One node's standing after a judged window: stuck (flagged at once),
/// deviant (flagged after K windows) or calm (cleared after `clear_after`).
/// `(w, end, lost_s)`: the window's start and end, and the job seconds it lost.
fn update(
    cfg: &DetectorConfig,
    st: &mut NodeState,
    (w, end, lost_s): (i64, i64, f64),
    stuck: Option<&Deviation>,
    deviant: Option<(f64, &Vec<Deviation>)>,
) {
    let (was_flagged, since) = (st.flagged, st.since);
    st.judged_until = st.judged_until.max(end);
    update_state(cfg, st, w, stuck, deviant);
    let top = st.devs.iter().max_by(|a, b| a.z.total_cmp(&b.z));
    let outcome = Outcome {
        window_end_us: end,
        lost_s,
        deviant: stuck.is_some() || deviant.is_some(),
        was_flagged,
        flagged: st.flagged,
        since: if st.flagged { st.since } else { since },
        score: st.score,
        top,
    };
    // History (nodes never forgotten) keeps every episode; live, only the current one.
    st.ledger.record(&outcome, cfg.forget_after.is_none());
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
        // A hang starts the node afresh: what deviated before it does not
        // count towards a flag after it (nor does the hang itself).
        st.stuck = true;
        st.flagged = true;
        st.since.get_or_insert(w);
        (st.streak, st.streak_start, st.calm) = (0, None, 0);
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
mod tests;
