// SPDX-License-Identifier: Apache-2.0
//! A fleet's day of realistic noise, with straggler faults at known times,
//! as the node-window signals the live detector sees (`ingero evaluate`).
//!
//! Noise, none of which is a straggler: per-node jitter (each node its own
//! level), synchronized checkpoints (every job, every `checkpoint_every`,
//! all ranks writing their shards for 10–40 s), data-loader hiccups (one
//! node, 1–3 windows), jobs that end and are followed by others of another
//! shape on the same nodes, preemptions (a job gone for minutes, then a
//! warm-up every rank pays alike), and mixed job sizes and shapes per pool.
//! Ground truth: a few genuinely slow nodes (a slower GPU, always), and the
//! injected faults (CPU contention, slow GPU, IO, memory pressure).

use std::time::Duration;

use crate::faults::{FaultKind, Injection, Target};
use crate::model::{RankWindow, Rng, rank_window, settle, signals};
use ingero_model::signals::Signals;

#[derive(Debug, Clone)]
pub struct DayConfig {
    pub nodes: usize,
    pub duration: Duration,
    pub seed: u64,
    /// Straggler faults injected at random nodes and times.
    pub faults: usize,
    /// Nodes that are genuinely slow all day.
    pub slow_nodes: usize,
    pub checkpoint_every: Duration,
    /// Nodes per pool; jobs of mixed sizes fill each pool.
    pub pool_size: usize,
    /// Data-loader hiccups last 1 to this many 1-s windows (longer input
    /// stalls are a straggler, the `io` fault).
    pub hiccup_max_s: u64,
}

impl Default for DayConfig {
    fn default() -> Self {
        DayConfig {
            nodes: 1000,
            duration: Duration::from_secs(24 * 3600),
            seed: 1,
            faults: 200,
            slow_nodes: 3,
            checkpoint_every: Duration::from_secs(1800),
            pool_size: 64,
            hiccup_max_s: 3,
        }
    }
}

/// One injected fault (ground truth).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub node: usize,
    pub kind: FaultKind,
    pub start_s: u64,
    pub end_s: u64,
}

#[derive(Debug)]
struct Job {
    name: String,
    ranks: Vec<usize>,
    /// Per-step host and compute relative to the model's defaults.
    host_scale: f64,
    compute_scale: f64,
    started: u64,
    ends: u64,
    /// Preempted: no windows until then, then a warm-up.
    down_until: u64,
    warm_until: u64,
    ckpt_phase: u64,
    ckpt_len: u64,
    generation: u32,
}

#[derive(Debug)]
pub struct FleetDay {
    cfg: DayConfig,
    jobs: Vec<Job>,
    node_jitter: Vec<f64>,
    slow: Vec<bool>,
    /// Injections by node (a node's list is short; the fleet's is not).
    node_faults: Vec<Vec<Injection>>,
    faults: Vec<Fault>,
    /// Index in `faults` of each of `node_faults`; and whether its node
    /// reported while it was active (a fault on an idle node is invisible).
    fault_ids: Vec<Vec<usize>>,
    seen: Vec<bool>,
    /// Data-loader hiccup: extra host-blocked ms until a second.
    hiccup: Vec<(u64, f64)>,
    rng: Rng,
}

/// Job sizes a pool is cut into.
const SIZES: [usize; 4] = [4, 8, 16, 32];

pub fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// The node index of [`node_name`].
pub fn node_index(name: &str) -> Option<usize> {
    name.strip_prefix("node-")?.parse().ok()
}

impl FleetDay {
    pub fn new(cfg: DayConfig) -> FleetDay {
        let mut rng = Rng::new(cfg.seed);
        let n = cfg.nodes;
        let node_jitter = (0..n).map(|_| 0.02 + 0.06 * rng.uniform()).collect();
        let mut slow = vec![false; n];
        for _ in 0..cfg.slow_nodes.min(n) {
            slow[pick(&mut rng, n)] = true;
        }
        let horizon = cfg.duration.as_secs();
        let mut node_faults = vec![Vec::new(); n];
        let mut fault_ids = vec![Vec::new(); n];
        let mut faults = Vec::new();
        let kinds = [FaultKind::Cpu, FaultKind::Gpu, FaultKind::Io, FaultKind::Mem];
        let room = horizon.saturating_sub(1800).max(1);
        for _ in 0..cfg.faults {
            let node = pick(&mut rng, n);
            let kind = kinds[pick(&mut rng, kinds.len())];
            let start_s = 600 + (rng.uniform() * room as f64) as u64;
            let end_s = (start_s + 120 + (rng.uniform() * 1080.0) as u64).min(horizon);
            let inj = Injection {
                kind,
                target: Target::Node(node),
                at: Duration::from_secs(start_s),
                duration: Some(Duration::from_secs(end_s - start_s)),
            };
            node_faults[node].push(inj);
            fault_ids[node].push(faults.len());
            faults.push(Fault { node, kind, start_s, end_s });
        }
        let seen = vec![false; faults.len()];
        let hiccup = vec![(0, 0.0); n];
        let mut day =
            FleetDay { jobs: Vec::new(), node_jitter, slow, node_faults, faults, fault_ids, seen, hiccup, rng, cfg };
        day.place_jobs();
        day
    }

    pub fn faults(&self) -> &[Fault] {
        &self.faults
    }

    pub fn is_slow(&self, node: usize) -> bool {
        self.slow[node]
    }

    pub fn slow_nodes(&self) -> Vec<bool> {
        self.slow.clone()
    }

    /// Whether fault `i`'s node ran a job while it was active.
    pub fn fault_seen(&self, i: usize) -> bool {
        self.seen[i]
    }

    /// Cuts every pool into jobs of mixed sizes.
    fn place_jobs(&mut self) {
        let mut start = 0;
        while start < self.cfg.nodes {
            let pool_end = (start + self.cfg.pool_size).min(self.cfg.nodes);
            let mut at = start;
            while at < pool_end {
                let size = SIZES[pick(&mut self.rng, SIZES.len())].min(pool_end - at).max(1);
                let ranks: Vec<usize> = (at..at + size).collect();
                let job = self.new_job(ranks, 0, 0);
                self.jobs.push(job);
                at += size;
            }
            start = pool_end;
        }
    }

    fn new_job(&mut self, ranks: Vec<usize>, started: u64, generation: u32) -> Job {
        let r = &mut self.rng;
        let life = 2 * 3600 + (r.uniform() * 6.0 * 3600.0) as u64;
        let first = ranks[0];
        Job {
            name: format!("job-{first:04}-{generation}"),
            ranks,
            host_scale: 0.5 + 1.5 * r.uniform(),
            compute_scale: 0.5 + 1.5 * r.uniform(),
            started,
            ends: started + life,
            down_until: started,
            warm_until: started + 60,
            ckpt_phase: (r.uniform() * self.cfg.checkpoint_every.as_secs() as f64) as u64,
            ckpt_len: 10 + (r.uniform() * 30.0) as u64,
            generation,
        }
    }

    /// Every running node's signals for second `t`: (job, node, signals).
    pub fn window(&mut self, t: u64, out: &mut Vec<(String, usize, Signals)>) {
        out.clear();
        for j in 0..self.jobs.len() {
            self.lifecycle(j, t);
            let job = &self.jobs[j];
            if t < job.down_until {
                continue;
            }
            let ranks = self.ranks_window(j, t);
            let name = &self.jobs[j].name;
            for (node, r) in self.jobs[j].ranks.iter().zip(&ranks) {
                out.push((name.clone(), *node, signals(r)));
            }
        }
    }

    /// Ends, replaces and preempts jobs.
    fn lifecycle(&mut self, j: usize, t: u64) {
        if t >= self.jobs[j].ends {
            // The next job on these nodes starts after a gap, with another shape.
            let gap = 60 + (self.rng.uniform() * 540.0) as u64;
            let ranks = self.jobs[j].ranks.clone();
            let generation = self.jobs[j].generation + 1;
            let mut next = self.new_job(ranks, t + gap, generation);
            next.down_until = t + gap;
            next.warm_until = t + gap + 60;
            self.jobs[j] = next;
        } else if t >= self.jobs[j].down_until && self.rng.uniform() < 0.1 / 3600.0 {
            // Preempted (about once in ten job-hours): back in 2-5 minutes.
            let back = t + 120 + (self.rng.uniform() * 180.0) as u64;
            self.jobs[j].down_until = back;
            self.jobs[j].warm_until = back + 60;
        }
    }

    fn ranks_window(&mut self, j: usize, t: u64) -> Vec<RankWindow> {
        let job = &self.jobs[j];
        let every = self.cfg.checkpoint_every.as_secs().max(1);
        let in_ckpt = t > job.started + 300 && (t + job.ckpt_phase) % every < job.ckpt_len;
        let warm = t < job.warm_until;
        let (hs, cs) = (job.host_scale, job.compute_scale);
        let mut out = Vec::with_capacity(job.ranks.len());
        let mut net = Vec::with_capacity(job.ranks.len());
        let at = Duration::from_secs(t);
        for &node in &job.ranks {
            for &fi in &self.fault_ids[node] {
                let f = &self.faults[fi];
                self.seen[fi] |= f.start_s <= t && t < f.end_s;
            }
            let (mut r, n) = rank_window(node, at, &self.node_faults[node], self.node_jitter[node], &mut self.rng);
            r.host_ms *= hs;
            r.compute_ms *= cs;
            if self.slow[node] {
                r.compute_ms *= 1.12;
            }
            if warm {
                r.compute_ms *= 1.5;
            }
            if in_ckpt {
                // Every rank writes its shard: IO-bound alike, each disk a little different.
                r.blocked_ms += 150.0 * self.rng.jitter(0.2);
                r.io_ms = 5.0 * self.rng.jitter(0.2);
                r.io_count = 100.0;
            }
            let (until, extra) = self.hiccup[node];
            if t < until {
                r.blocked_ms += extra;
            } else if self.rng.uniform() < 1.0 / 1800.0 {
                // A data-loader hiccup (about twice an hour per node): 1 to hiccup_max_s windows.
                let len = 1 + (self.rng.uniform() * self.cfg.hiccup_max_s as f64) as u64;
                self.hiccup[node] = (t + len, 20.0 + 40.0 * self.rng.uniform());
                r.blocked_ms += self.hiccup[node].1;
            }
            out.push(r);
            net.push(n);
        }
        settle(&mut out, &net);
        out
    }
}

fn pick(rng: &mut Rng, n: usize) -> usize {
    ((rng.uniform() * n as f64) as usize).min(n.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_reports_while_its_job_runs_and_faults_are_where_they_were_put() {
        let cfg = DayConfig { nodes: 100, duration: Duration::from_secs(4 * 3600), faults: 20, ..Default::default() };
        let mut day = FleetDay::new(cfg);
        let mut out = Vec::new();
        day.window(0, &mut out);
        assert_eq!(out.len(), 100, "every node is in a job at the start");
        let mut nodes: Vec<usize> = out.iter().map(|o| o.1).collect();
        nodes.dedup();
        assert_eq!(nodes.len(), 100);
        assert_eq!(day.faults().len(), 20);
        assert!(day.faults().iter().all(|f| f.start_s >= 600 && f.end_s > f.start_s && f.end_s <= 4 * 3600));
        // A faulted node's window differs from its own healthy ones the way its kind says.
        let f = day.faults()[0].clone();
        day.window(f.start_s + 1, &mut out);
        let during = out.iter().find(|o| o.1 == f.node).map(|o| o.2.clone());
        if let Some(s) = during {
            let runq = s.runq_ns / (s.runq_ns + s.offcpu_ns + s.oncpu_ns);
            match f.kind {
                FaultKind::Cpu => assert!(runq > 0.2, "{s:?}"),
                FaultKind::Mem => assert!(s.mem_events > 0.0),
                FaultKind::Io => assert!(s.io_ns > 1e8, "{s:?}"),
                _ => {}
            }
        }
    }
}
