// SPDX-License-Identifier: Apache-2.0
//! The remediation loop: every `every`, read the ranking, let the policy
//! decide, apply through the API server (or only say it, in dry-run), and
//! journal and count everything, done or held back.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingero_server::rank::standing::Standing;
use ingero_store::Store;

use crate::cluster::Cluster;
use crate::journal::{self, Record};
use crate::metrics::Metrics;
use crate::policy::{Decision, Policy};
use crate::{Config, Mode, Result};

/// Every ranked node of the jobs this replica ranks, flagged or not.
pub type Standings = Arc<dyn Fn() -> Vec<Standing> + Send + Sync>;

pub struct Controller {
    cfg: Config,
    policy: Policy,
    cluster: Cluster,
    store: Store,
    metrics: Metrics,
    source: Standings,
    /// With replicas, a node another replica marked is adopted only once this
    /// replica ranks it; alone, every marked node is ours to undo.
    shared: bool,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").field("cfg", &self.cfg).field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl Controller {
    pub fn new(cfg: Config, cluster: Cluster, store: Store, metrics: Metrics, source: Standings, shared: bool) -> Self {
        Controller { policy: Policy::new(cfg.clone()), cfg, cluster, store, metrics, source, shared }
    }

    /// Runs [`Controller::step`] every `every` until the task is dropped.
    pub fn spawn(mut self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.cfg.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = self.step(Instant::now()).await {
                    self.metrics.errors.inc();
                    tracing::warn!(error = %e, "remediation: cannot read the cluster; next look in {:?}", self.cfg.every);
                }
            }
        })
    }

    /// One look: decide, apply, journal. Returns what was recorded.
    pub async fn step(&mut self, now: Instant) -> Result<Vec<Record>> {
        let standings = (self.source)();
        let in_cluster = self.cluster.marked().await?;
        let ranked: HashSet<&str> = standings.iter().map(|s| s.node.as_str()).collect();
        for m in &in_cluster {
            let mine = self.policy.marked().any(|n| n == m.node);
            if !mine && (!self.shared || ranked.contains(m.node.as_str())) {
                self.policy.adopt(&m.node, &m.job);
            }
        }
        let mine: HashSet<String> = self.policy.marked().map(str::to_string).collect();
        let others = in_cluster.iter().filter(|m| !mine.contains(&m.node)).count();
        let mut out = Vec::new();
        for d in self.policy.step(now, &standings, others) {
            out.extend(self.apply(d).await);
        }
        for r in &out {
            tracing::info!(action = %r.action, node = %r.node, job = %r.job, mode = %r.mode, cause = %r.cause, detail = %r.detail, "remediation");
            if let Err(e) = journal::append(&self.store, r).await {
                tracing::warn!(error = %e, "remediation: could not journal a record (it is in this log)");
            }
        }
        self.metrics.marked.set(self.policy.marked().count() as i64);
        Ok(out)
    }

    async fn apply(&mut self, d: Decision) -> Vec<Record> {
        let mode = self.cfg.mode;
        match d {
            Decision::Held { node, job, cause, budget, detail } => {
                self.metrics.held.get_or_create(&crate::metrics::BudgetLabel { budget: budget.label().into() }).inc();
                self.metrics.action("held", mode);
                vec![Record::new("held", &node, &job, mode, &cause, format!("{} budget: {detail}", budget.label()))]
            }
            Decision::Mark { node, job, cause, flagged_for, cost } => {
                let link = self.cfg.report_link(&node, &job);
                let loss = cost.map_or(String::new(), |c| format!(" {}.", crate::policy::loss_text(&c)));
                let msg = format!("{cause}.{loss} Flagged for {}. Report: {link}", human(flagged_for));
                let (mut recs, undone) = if mode == Mode::On {
                    self.mark(&node, &job, &msg).await
                } else {
                    self.would_mark(&node, &job).await.map_or_else(|e| (Vec::new(), Some(e)), |r| (r, None))
                };
                recs.iter_mut().for_each(|r| r.cause.clone_from(&cause));
                self.count(&recs);
                if let Some(e) = undone {
                    // Not marked: the next look tries again.
                    self.policy.forget(&node);
                    recs.extend(self.failed(&node, &job, &cause, e));
                }
                recs
            }
            Decision::Clear { node, job, healthy_for } => {
                let (mut recs, undone) = if mode == Mode::On {
                    self.clear(&node, &job, healthy_for).await
                } else {
                    (
                        vec![Record::new(
                            "clear",
                            &node,
                            &job,
                            mode,
                            "",
                            format!("healthy for {}", human(healthy_for)),
                        )],
                        None,
                    )
                };
                self.count(&recs);
                if let Some(e) = undone {
                    // Still ours: the next clear tries again.
                    self.policy.adopt(&node, &job);
                    recs.extend(self.failed(&node, &job, "", e));
                }
                recs
            }
        }
    }

    /// Counts what landed; an `error` among them is a step that failed after
    /// the change itself was made.
    fn count(&self, recs: &[Record]) {
        for r in recs {
            if r.action == "error" {
                self.metrics.errors.inc();
            } else {
                self.metrics.action(&r.action, self.cfg.mode);
            }
        }
    }

    fn failed(&self, node: &str, job: &str, cause: &str, e: crate::Error) -> Vec<Record> {
        self.metrics.errors.inc();
        vec![Record::new("error", node, job, self.cfg.mode, cause, e.to_string())]
    }

    /// A step that failed after the change was made: journaled beside it.
    fn step_failed(node: &str, job: &str, done: &str, step: &str, e: &crate::Error) -> Record {
        Record::new("error", node, job, Mode::On, "", format!("{done}, but {step} failed: {e}"))
    }

    /// What landed, and the error that left the node as it was (the next
    /// look tries again).
    async fn mark(&self, node: &str, job: &str, msg: &str) -> (Vec<Record>, Option<crate::Error>) {
        let c = &self.cluster;
        if let Err(e) = c.set_condition(node, job, msg, true).await {
            return (Vec::new(), Some(e));
        }
        // The condition is the mark (a restarted or second replica reads it
        // back), so from here a failed step is journaled beside the mark and
        // the rest still run; undoing the mark to retry would spend the hour's
        // budget again and repeat the events that did land.
        let mut recs = vec![Record::new("mark", node, job, Mode::On, "", msg.to_string())];
        if let Err(e) = self.mark_events(node, job, msg).await {
            recs.push(Self::step_failed(node, job, "marked", "sending its events", &e));
        }
        if self.cfg.taint {
            match c.set_taint(node, true).await {
                Ok(true) => recs.push(Record::new(
                    "taint",
                    node,
                    job,
                    Mode::On,
                    "",
                    format!("{} NoSchedule", crate::cluster::TAINT_KEY),
                )),
                Ok(false) => {}
                Err(e) => recs.push(Self::step_failed(node, job, "marked", "tainting it", &e)),
            }
        }
        (recs, None)
    }

    async fn mark_events(&self, node: &str, job: &str, msg: &str) -> Result<()> {
        let c = &self.cluster;
        c.node_event(node, true, "IngeroStraggler", &format!("job {job}: {msg}")).await?;
        for pod in c.job_pods(node, job).await? {
            c.pod_event(&pod, true, "IngeroStragglerNode", &format!("node {node} is a straggler in job {job}: {msg}"))
                .await?;
        }
        Ok(())
    }

    /// Dry-run: reads what it would touch, changes nothing.
    async fn would_mark(&self, node: &str, job: &str) -> Result<Vec<Record>> {
        let pods = self.cluster.job_pods(node, job).await?;
        let taint = if self.cfg.taint { ", taint NoSchedule" } else { "" };
        let detail = format!(
            "would set {} and send events to the node and {} pod(s){taint}",
            crate::cluster::CONDITION,
            pods.len()
        );
        Ok(vec![Record::new("mark", node, job, self.cfg.mode, "", detail)])
    }

    /// The taint goes first: one left behind keeps work off a healthy node,
    /// so until it is gone the node stays ours and every clear retries it.
    async fn clear(&self, node: &str, job: &str, healthy_for: Duration) -> (Vec<Record>, Option<crate::Error>) {
        let c = &self.cluster;
        let msg = format!("healthy for {}", human(healthy_for));
        let mut recs = Vec::new();
        // Always: a taint from an earlier run with --remediate-taint goes too.
        match c.set_taint(node, false).await {
            Ok(true) => recs.push(Record::new("untaint", node, job, Mode::On, "", crate::cluster::TAINT_KEY.into())),
            Ok(false) => {}
            Err(e) => return (recs, Some(e)),
        }
        if let Err(e) = c.set_condition(node, job, &msg, false).await {
            return (recs, Some(e));
        }
        recs.push(Record::new("clear", node, job, Mode::On, "", msg.clone()));
        if let Err(e) = c.node_event(node, false, "IngeroRecovered", &format!("job {job}: {msg}")).await {
            recs.push(Self::step_failed(node, job, "cleared", "sending its event", &e));
        }
        (recs, None)
    }
}

/// `4m10s`, `2h03m`: seconds dropped past an hour.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}
