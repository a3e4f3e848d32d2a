// SPDX-License-Identifier: Apache-2.0
//! Injectable faults and noise: `KIND@NODE:AT[+FOR]`.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// CPU contention: a noisy neighbour steals the training threads' CPU.
    Cpu,
    /// A slow GPU (thermal throttling, bad HBM): compute per step is longer.
    Gpu,
    /// A slow NIC/link. Real collectives run as a ring or tree paced by its
    /// slowest link: every rank's syncs wait longer alike, so host-side
    /// signals see a job-wide slowdown, not a straggler (naming the link
    /// needs NCCL's own view: NCCL_DEBUG, its profiler plugin).
    Net,
    /// Input pipeline stalled on block IO.
    Io,
    /// Memory pressure: reclaim, swap, page faults.
    Mem,
    /// Noise: the whole job slows down together (must not be flagged).
    JobSlow,
    /// Noise: a one-window spike on one node (must not be flagged).
    Blip,
    /// The job stops: the rank on the node blocks in host code and every
    /// other rank of its job waits in an all-reduce for it (`stuck`).
    Hang,
}

impl FaultKind {
    pub fn parse(s: &str) -> Option<FaultKind> {
        Some(match s {
            "cpu" => FaultKind::Cpu,
            "gpu" => FaultKind::Gpu,
            "net" | "network" => FaultKind::Net,
            "io" => FaultKind::Io,
            "mem" | "memory" => FaultKind::Mem,
            "jobslow" | "job-slow" => FaultKind::JobSlow,
            "blip" => FaultKind::Blip,
            "hang" => FaultKind::Hang,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Cpu => "cpu",
            FaultKind::Gpu => "gpu",
            FaultKind::Net => "net",
            FaultKind::Io => "io",
            FaultKind::Mem => "mem",
            FaultKind::JobSlow => "jobslow",
            FaultKind::Blip => "blip",
            FaultKind::Hang => "hang",
        }
    }

    /// Faults that make a straggler (the others are noise, for the hosts).
    pub fn is_straggler(self) -> bool {
        !matches!(self, FaultKind::JobSlow | FaultKind::Blip | FaultKind::Net)
    }
}

/// Which nodes a fault hits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    All,
    Node(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    pub kind: FaultKind,
    pub target: Target,
    pub at: Duration,
    /// None: until the end of the run.
    pub duration: Option<Duration>,
}

impl Injection {
    /// Parses `cpu@3:20s`, `gpu@node-7:10s+30s`, `jobslow@all:15s`.
    pub fn parse(s: &str, nodes: usize) -> Result<Injection, String> {
        let usage = || format!("`{s}`: expected KIND@NODE:AT[+FOR], e.g. cpu@3:20s or gpu@node-7:10s+30s");
        let (kind, rest) = s.split_once('@').ok_or_else(usage)?;
        let (node, when) = rest.split_once(':').ok_or_else(usage)?;
        let kind = FaultKind::parse(kind).ok_or_else(|| {
            format!("`{s}`: unknown fault kind `{kind}` (cpu, gpu, net, io, mem, jobslow, blip, hang)")
        })?;
        let target = if node == "all" {
            Target::All
        } else {
            let idx: usize = node
                .strip_prefix("node-")
                .unwrap_or(node)
                .parse()
                .map_err(|_| format!("`{s}`: node `{node}` is neither an index, node-<index> nor `all`"))?;
            if idx >= nodes {
                return Err(format!("`{s}`: node {idx} does not exist (--nodes {nodes})"));
            }
            Target::Node(idx)
        };
        if kind == FaultKind::JobSlow && target != Target::All {
            return Err(format!("`{s}`: jobslow applies to the whole job: use jobslow@all:AT"));
        }
        if kind != FaultKind::JobSlow && target == Target::All {
            return Err(format!("`{s}`: only jobslow takes `all`"));
        }
        let (at, dur) = match when.split_once('+') {
            Some((a, d)) => (a, Some(d)),
            None => (when, None),
        };
        let at = humantime::parse_duration(at).map_err(|e| format!("`{s}`: bad time `{at}`: {e}"))?;
        let duration = dur
            .map(|d| humantime::parse_duration(d).map_err(|e| format!("`{s}`: bad duration `{d}`: {e}")))
            .transpose()?;
        Ok(Injection { kind, target, at, duration })
    }

    pub fn active(&self, t: Duration) -> bool {
        t >= self.at && self.duration.is_none_or(|d| t < self.at + d)
    }

    pub fn hits(&self, node: usize) -> bool {
        match self.target {
            Target::All => true,
            Target::Node(n) => n == node,
        }
    }

    pub fn label(&self) -> String {
        match self.target {
            Target::All => format!("{}@all", self.kind.name()),
            Target::Node(n) => format!("{}@node-{n}", self.kind.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let i = Injection::parse("cpu@node-3:20s+5s", 8).unwrap();
        assert_eq!(
            (i.kind, i.target.clone(), i.at, i.duration),
            (FaultKind::Cpu, Target::Node(3), Duration::from_secs(20), Some(Duration::from_secs(5)))
        );
        assert!(i.active(Duration::from_secs(22)) && !i.active(Duration::from_secs(25)));
        assert_eq!(Injection::parse("jobslow@all:1m", 2).unwrap().at, Duration::from_secs(60));
        for (bad, why) in [
            ("cpu@9:1s", "does not exist"),
            ("disk@1:1s", "unknown fault kind"),
            ("cpu@x:1s", "neither"),
            ("cpu-1-1s", "expected"),
            ("cpu@all:1s", "only jobslow"),
            ("gpu@1:soon", "bad time"),
        ] {
            let e = Injection::parse(bad, 4).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
