// SPDX-License-Identifier: Apache-2.0
//! When to act and when to undo: minimum evidence, the budgets, recovery.
//! Pure (time is passed in), so every rule is tested without a cluster.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use ingero_server::rank::cost::Cost;
use ingero_server::rank::standing::Standing;

use crate::config::Config;

/// Which budget kept a node from being marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Budget {
    /// `max_nodes` nodes are marked fleet-wide.
    Fleet,
    /// The job already has its share of nodes marked (or is too small for one).
    Job,
    /// `max_per_hour` marks in the last hour.
    Hour,
}

impl Budget {
    pub fn label(self) -> &'static str {
        match self {
            Budget::Fleet => "fleet",
            Budget::Job => "job",
            Budget::Hour => "hour",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Flagged for at least the minimum evidence, within every budget.
    Mark { node: String, job: String, cause: String, flagged_for: Duration, cost: Option<Cost> },
    /// Marked, and healthy for `clear_after`.
    Clear { node: String, job: String, healthy_for: Duration },
    /// Would be marked, but a budget is spent (said once per flagged episode:
    /// the first budget that held it).
    Held { node: String, job: String, cause: String, budget: Budget, detail: String },
}

#[derive(Debug)]
struct Episode {
    since: Instant,
    held: Option<Budget>,
}

#[derive(Debug)]
struct Marked {
    job: String,
    healthy_since: Option<Instant>,
}

#[derive(Debug)]
pub struct Policy {
    cfg: Config,
    /// Nodes flagged now, since when (continuously).
    episodes: HashMap<String, Episode>,
    /// Nodes this policy marked (or adopted at start), by node.
    marked: BTreeMap<String, Marked>,
    /// When each mark of the last hour was made.
    hour: VecDeque<Instant>,
}

impl Policy {
    pub fn new(cfg: Config) -> Policy {
        Policy { cfg, episodes: HashMap::new(), marked: BTreeMap::new(), hour: VecDeque::new() }
    }

    /// A node found marked at start (a restart must still undo its marks).
    pub fn adopt(&mut self, node: &str, job: &str) {
        self.marked.insert(node.to_string(), Marked { job: job.to_string(), healthy_since: None });
    }

    /// A mark that could not be applied: the next look tries again.
    pub fn forget(&mut self, node: &str) {
        self.marked.remove(node);
        if let Some(ep) = self.episodes.get_mut(node) {
            ep.held = None;
        }
        self.hour.pop_back();
    }

    pub fn marked(&self) -> impl Iterator<Item = &str> {
        self.marked.keys().map(String::as_str)
    }

    /// One look at the ranking. `standings` holds every ranked node (flagged
    /// or not: a job's size is its node count); `others` counts nodes marked
    /// by other replicas, which spend the same fleet budget.
    pub fn step(&mut self, now: Instant, standings: &[Standing], others: usize) -> Vec<Decision> {
        let mut out = Vec::new();
        let job_size = job_sizes(standings);
        let worst = worst_by_node(standings);
        self.episodes.retain(|n, _| worst.get(n.as_str()).is_some_and(|s| s.flagged));
        self.clear_recovered(now, &worst, &mut out);
        while self.hour.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(3600)) {
            self.hour.pop_front();
        }
        let mut ready: Vec<&Standing> = Vec::new();
        for s in worst.values().filter(|s| s.flagged) {
            let ep = self.episodes.entry(s.node.clone()).or_insert(Episode { since: now, held: None });
            if !self.marked.contains_key(&s.node) && now.duration_since(ep.since) >= self.cfg.min_evidence {
                ready.push(s);
            }
        }
        ready.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.node.cmp(&b.node)));
        for s in ready {
            let since = self.episodes[&s.node].since;
            match self.budget_left(s, &job_size, others) {
                Ok(()) => {
                    self.hour.push_back(now);
                    self.marked.insert(s.node.clone(), Marked { job: s.job.clone(), healthy_since: None });
                    out.push(Decision::Mark {
                        node: s.node.clone(),
                        job: s.job.clone(),
                        cause: cause_of(s),
                        flagged_for: now.duration_since(since),
                        cost: s.cost,
                    });
                }
                Err((budget, detail)) => {
                    let ep = self.episodes.get_mut(&s.node).expect("inserted above");
                    if ep.held.is_none() {
                        ep.held = Some(budget);
                        out.push(Decision::Held {
                            node: s.node.clone(),
                            job: s.job.clone(),
                            cause: cause_of(s),
                            budget,
                            detail,
                        });
                    }
                }
            }
        }
        out
    }

    /// Marked nodes healthy (or no longer ranked) for `clear_after` are cleared.
    fn clear_recovered(&mut self, now: Instant, worst: &BTreeMap<&str, &Standing>, out: &mut Vec<Decision>) {
        let clear_after = self.cfg.clear_after;
        self.marked.retain(|node, m| {
            if worst.get(node.as_str()).is_some_and(|s| s.flagged) {
                m.healthy_since = None;
                return true;
            }
            let since = *m.healthy_since.get_or_insert(now);
            let healthy_for = now.duration_since(since);
            if healthy_for < clear_after {
                return true;
            }
            out.push(Decision::Clear { node: node.clone(), job: m.job.clone(), healthy_for });
            false
        });
    }

    fn budget_left(
        &self,
        s: &Standing,
        job_size: &HashMap<&str, usize>,
        others: usize,
    ) -> Result<(), (Budget, String)> {
        let cfg = &self.cfg;
        if self.hour.len() >= cfg.max_per_hour {
            return Err((
                Budget::Hour,
                format!("{} marks in the last hour (max {})", self.hour.len(), cfg.max_per_hour),
            ));
        }
        let fleet = self.marked.len() + others;
        if fleet >= cfg.max_nodes {
            return Err((Budget::Fleet, format!("{fleet} nodes marked (max {})", cfg.max_nodes)));
        }
        let size = job_size.get(s.job.as_str()).copied().unwrap_or(1);
        let allowed = (cfg.max_job_share * size as f64 + 1e-9).floor() as usize;
        let in_job = self.marked.values().filter(|m| m.job == s.job).count();
        if in_job >= allowed {
            return Err((
                Budget::Job,
                format!(
                    "{in_job} of the job's {size} nodes marked (max {allowed}: {:.0}% of its nodes)",
                    cfg.max_job_share * 100.0
                ),
            ));
        }
        Ok(())
    }
}

/// Nodes per job, counted over every ranked node.
fn job_sizes(standings: &[Standing]) -> HashMap<&str, usize> {
    let mut out = HashMap::new();
    for s in standings {
        *out.entry(s.job.as_str()).or_default() += 1;
    }
    out
}

/// A node in several jobs is judged by its worst standing (flagged first).
fn worst_by_node(standings: &[Standing]) -> BTreeMap<&str, &Standing> {
    let mut out: BTreeMap<&str, &Standing> = BTreeMap::new();
    for s in standings {
        let e = out.entry(s.node.as_str()).or_insert(s);
        if (s.flagged, s.score) > (e.flagged, e.score) {
            *e = s;
        }
    }
    out
}

/// What the job has lost to the node so far, for the condition and the
/// events: the number that decides whether someone acts on them.
pub fn loss_text(c: &Cost) -> String {
    let usd = c.usd.map_or(String::new(), |d| format!(" (${d:.2})"));
    format!("The job has lost {:.2} GPU-hours{usd} to it so far", c.gpu_hours)
}

/// What the node condition and the events say the cause is.
pub fn cause_of(s: &Standing) -> String {
    let mut parts: Vec<&str> = s.signals.iter().map(|d| d.text.as_str()).take(3).collect();
    if s.stuck {
        parts.insert(0, "holds the rank its stuck job waits for");
    }
    if parts.is_empty() { format!("straggler in {} (score {:.1})", s.job, s.score) } else { parts.join("; ") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingero_server::rank::standing::Deviation;

    fn st(node: &str, job: &str, flagged: bool, score: f64) -> Standing {
        Standing {
            node: node.into(),
            job: job.into(),
            score,
            flagged,
            since: None,
            since_us: None,
            signals: vec![Deviation {
                signal: "device_wait".into(),
                value: 0.5,
                job_median: 0.1,
                z: score,
                text: format!("device wait 5x the job median on {node}"),
            }],
            windows: 10,
            stuck: false,
            lost_s: 0.0,
            cost: None,
            step: None,
        }
    }

    fn cfg() -> Config {
        Config {
            min_evidence: Duration::from_secs(60),
            clear_after: Duration::from_secs(120),
            max_nodes: 2,
            max_job_share: 0.5,
            max_per_hour: 3,
            ..Config::default()
        }
    }

    fn nodes(d: &[Decision]) -> Vec<(&'static str, &str)> {
        d.iter()
            .map(|d| match d {
                Decision::Mark { node, .. } => ("mark", node.as_str()),
                Decision::Clear { node, .. } => ("clear", node.as_str()),
                Decision::Held { node, .. } => ("held", node.as_str()),
            })
            .collect()
    }

    #[test]
    fn evidence_then_mark_then_clear_after_recovery() {
        let mut p = Policy::new(cfg());
        let t0 = Instant::now();
        let sick = [st("a", "j", true, 9.0), st("b", "j", false, 0.2)];
        let well = [st("a", "j", false, 0.1), st("b", "j", false, 0.2)];
        assert!(p.step(t0, &sick, 0).is_empty());
        assert!(p.step(t0 + Duration::from_secs(59), &sick, 0).is_empty(), "evidence not yet enough");
        assert_eq!(nodes(&p.step(t0 + Duration::from_secs(60), &sick, 0)), [("mark", "a")]);
        assert!(p.step(t0 + Duration::from_secs(70), &sick, 0).is_empty(), "marked once");
        assert!(p.step(t0 + Duration::from_secs(100), &well, 0).is_empty());
        // A relapse restarts the recovery clock.
        assert!(p.step(t0 + Duration::from_secs(200), &sick, 0).is_empty());
        assert!(p.step(t0 + Duration::from_secs(210), &well, 0).is_empty());
        assert!(p.step(t0 + Duration::from_secs(329), &well, 0).is_empty());
        assert_eq!(nodes(&p.step(t0 + Duration::from_secs(330), &well, 0)), [("clear", "a")]);
        assert_eq!(p.marked().count(), 0);
    }

    #[test]
    fn a_mark_says_what_the_job_has_lost_so_far() {
        let mut p = Policy::new(cfg());
        let t0 = Instant::now();
        let priced = Cost { gpus: 16, gpu_hours: 2.5, usd: Some(7.5) };
        let mut a = st("a", "j", true, 9.0);
        a.cost = Some(priced);
        let sick = [a, st("b", "j", false, 0.2)];
        p.step(t0, &sick, 0);
        let d = p.step(t0 + Duration::from_secs(60), &sick, 0);
        let [Decision::Mark { cost: Some(c), .. }] = d.as_slice() else { panic!("{d:?}") };
        assert_eq!(loss_text(c), "The job has lost 2.50 GPU-hours ($7.50) to it so far");
        // Unpriced nodes: GPU-hours alone, never a partial sum of dollars.
        let unpriced = Cost { usd: None, ..priced };
        assert_eq!(loss_text(&unpriced), "The job has lost 2.50 GPU-hours to it so far");
    }

    #[test]
    fn a_node_no_longer_ranked_is_cleared_too() {
        // Its job ended while it was flagged: the live ranking forgets it.
        let mut p = Policy::new(cfg());
        let t0 = Instant::now();
        let sick = [st("a", "j", true, 9.0), st("b", "j", false, 0.2)];
        p.step(t0, &sick, 0);
        assert_eq!(nodes(&p.step(t0 + Duration::from_secs(60), &sick, 0)), [("mark", "a")]);
        assert!(p.step(t0 + Duration::from_secs(100), &[], 0).is_empty());
        assert_eq!(nodes(&p.step(t0 + Duration::from_secs(220), &[], 0)), [("clear", "a")]);
    }

    #[test]
    fn a_flag_that_lapses_starts_its_evidence_again() {
        let mut p = Policy::new(cfg());
        let t0 = Instant::now();
        let sick = [st("a", "j", true, 9.0), st("b", "j", false, 0.2)];
        let well = [st("a", "j", false, 0.1), st("b", "j", false, 0.2)];
        p.step(t0, &sick, 0);
        p.step(t0 + Duration::from_secs(50), &well, 0);
        assert!(p.step(t0 + Duration::from_secs(55), &sick, 0).is_empty());
        assert!(p.step(t0 + Duration::from_secs(100), &sick, 0).is_empty());
        assert_eq!(nodes(&p.step(t0 + Duration::from_secs(115), &sick, 0)), [("mark", "a")]);
    }

    #[test]
    fn budgets_hold_under_a_burst_and_are_said_once() {
        let mut p = Policy::new(Config { max_nodes: 3, max_per_hour: 10, ..cfg() });
        let t0 = Instant::now();
        // Two jobs of 4 nodes, every node flagged at once.
        let all: Vec<Standing> =
            (0..8).map(|i| st(&format!("n{i}"), if i < 4 { "j1" } else { "j2" }, true, 10.0 - i as f64)).collect();
        p.step(t0, &all, 0);
        let d = p.step(t0 + Duration::from_secs(60), &all, 0);
        // Worst first: n0, n1 fill j1's share (2 of 4); n4 is j2's first; then the fleet budget (3).
        let marks: Vec<_> = nodes(&d).into_iter().filter(|(k, _)| *k == "mark").map(|(_, n)| n).collect();
        assert_eq!(marks, ["n0", "n1", "n4"]);
        let held: Vec<Budget> =
            d.iter().filter_map(|d| if let Decision::Held { budget, .. } = d { Some(*budget) } else { None }).collect();
        assert_eq!(held, [Budget::Job, Budget::Job, Budget::Fleet, Budget::Fleet, Budget::Fleet]);
        assert!(p.step(t0 + Duration::from_secs(70), &all, 0).is_empty(), "held is said once per episode");
        // Nodes other replicas marked spend the same fleet budget.
        let mut q = Policy::new(Config { max_nodes: 3, max_per_hour: 10, ..cfg() });
        q.step(t0, &all, 3);
        assert!(nodes(&q.step(t0 + Duration::from_secs(60), &all, 3)).iter().all(|(k, _)| *k == "held"));
    }

    #[test]
    fn hourly_budget_and_small_jobs() {
        let mut p = Policy::new(Config { max_nodes: 100, max_per_hour: 2, ..cfg() });
        let t0 = Instant::now();
        let mut standings: Vec<Standing> = Vec::new();
        for j in 0..4 {
            standings.push(st(&format!("bad{j}"), &format!("j{j}"), true, 9.0 - j as f64));
            standings.push(st(&format!("ok{j}"), &format!("j{j}"), false, 0.1));
        }
        // A job of one node: 50% of 1 rounds down to none.
        standings.push(st("alone", "solo", true, 1.0));
        p.step(t0, &standings, 0);
        let d = p.step(t0 + Duration::from_secs(60), &standings, 0);
        assert_eq!(
            nodes(&d),
            [("mark", "bad0"), ("mark", "bad1"), ("held", "bad2"), ("held", "bad3"), ("held", "alone")]
        );
        assert!(matches!(&d[4], Decision::Held { budget: Budget::Hour, .. }), "the hour is checked first");
        // An hour after the first marks, two more may go.
        let d = p.step(t0 + Duration::from_secs(3660), &standings, 0);
        assert_eq!(nodes(&d), [("mark", "bad2"), ("mark", "bad3")]);
        // Said once; still never marked (its job is too small for 50%).
        assert!(p.step(t0 + Duration::from_secs(7300), &standings, 0).is_empty());
        assert!(!p.marked().any(|n| n == "alone"));
        let mut q = Policy::new(Config { max_nodes: 100, max_per_hour: 100, ..cfg() });
        q.step(t0, &standings, 0);
        let d = q.step(t0 + Duration::from_secs(60), &standings, 0);
        assert!(matches!(d.last(), Some(Decision::Held { budget: Budget::Job, node, .. }) if node == "alone"), "{d:?}");
    }

    #[test]
    fn adopted_marks_are_cleared_and_count() {
        let mut p = Policy::new(Config { max_nodes: 1, ..cfg() });
        p.adopt("old", "j");
        let t0 = Instant::now();
        let s = [st("old", "j", false, 0.1), st("x", "k", true, 9.0), st("y", "k", false, 0.1)];
        p.step(t0, &s, 0);
        let d = p.step(t0 + Duration::from_secs(60), &s, 0);
        assert_eq!(nodes(&d), [("held", "x")], "the adopted mark fills the fleet budget");
        let d = p.step(t0 + Duration::from_secs(120), &s, 0);
        assert_eq!(nodes(&d), [("clear", "old"), ("mark", "x")]);
    }
}
