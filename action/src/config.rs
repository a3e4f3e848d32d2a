// SPDX-License-Identifier: Apache-2.0
//! What remediation may do, and how much of it.

use std::time::Duration;

/// `--remediate`: off (default), dry-run (decide and log, change nothing),
/// on (set the node condition and emit events; taint only with `taint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Off,
    DryRun,
    On,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Mode::Off),
            "dry-run" => Ok(Mode::DryRun),
            "on" => Ok(Mode::On),
            other => Err(format!("unknown remediation mode {other:?}: expected off, dry-run or on")),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::DryRun => "dry-run",
            Mode::On => "on",
        })
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    /// Also taint a marked node `NoSchedule` (never evicts what runs there).
    pub taint: bool,
    /// At most this many nodes marked at once, fleet-wide (counted from the
    /// API server, so replicas share it).
    pub max_nodes: usize,
    /// At most this share (0–1) of a job's nodes marked at once (rounded down:
    /// a job too small for one node is never acted on, only reported).
    pub max_job_share: f64,
    /// At most this many new marks per rolling hour.
    pub max_per_hour: usize,
    /// A node must stay flagged this long before it is marked.
    pub min_evidence: Duration,
    /// A marked node is cleared after it has been healthy this long.
    pub clear_after: Duration,
    /// Where a node's report is read: `{node}` and `{job}` are replaced
    /// (a Grafana link, a report host). None: the condition names the command.
    pub report_url: Option<String>,
    /// How often the loop looks at the ranking.
    pub every: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Off,
            taint: false,
            max_nodes: 2,
            max_job_share: 0.5,
            max_per_hour: 6,
            min_evidence: Duration::from_secs(5 * 60),
            clear_after: Duration::from_secs(15 * 60),
            report_url: None,
            every: Duration::from_secs(10),
        }
    }
}

impl Config {
    /// Refuses settings that would act on everything or never undo.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.max_job_share) {
            return Err(format!("--remediate-max-job-share {} is not a share between 0 and 1", self.max_job_share));
        }
        if self.mode != Mode::Off && (self.max_nodes == 0 || self.max_per_hour == 0) {
            return Err("--remediate-max-nodes and --remediate-max-per-hour must be > 0 when remediation is on".into());
        }
        if self.clear_after.is_zero() {
            return Err("--remediate-clear-after must be > 0 (a node would be cleared while still flagged)".into());
        }
        if self.every.is_zero() {
            return Err("--remediate-every must be > 0".into());
        }
        Ok(())
    }

    /// Where the condition sends a reader for the evidence.
    pub fn report_link(&self, node: &str, job: &str) -> String {
        match &self.report_url {
            Some(t) => t.replace("{node}", node).replace("{job}", job),
            None => format!("ingero report --node {node}"),
        }
    }
}
