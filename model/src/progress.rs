// SPDX-License-Identifier: Apache-2.0
//! One process's progress in one window (a row of `progress_windows`) and
//! how it reads in a hung-rank explanation.

use serde::{Deserialize, Serialize};

/// One process's progress in one window (a row of `progress_windows`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcProgress {
    pub pid: u32,
    pub rank: Option<i32>,
    pub comm: String,
    pub threads_in_call: u32,
    /// The call in flight longest and its age.
    pub op: Option<String>,
    pub age_ns: Option<u64>,
    pub last_call_age_ns: Option<u64>,
    pub state: Option<String>,
    /// Steps that ended in the window and their median time, where the
    /// agent found the process's step cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_p50_ns: Option<u64>,
}

impl ProcProgress {
    pub fn waits_in(&self, op: &str, after_ns: f64) -> bool {
        self.op.as_deref() == Some(op) && self.age_ns.is_some_and(|a| a as f64 >= after_ns)
    }

    pub fn who(&self) -> String {
        match self.rank {
            Some(r) => format!("rank {r} (pid {}, {})", self.pid, self.comm),
            None => format!("pid {} ({})", self.pid, self.comm),
        }
    }

    /// What the rank the others wait for is doing.
    pub fn doing(&self) -> String {
        let state = match self.state.as_deref() {
            Some("S") => " (sleeping)",
            Some("D") => " (in uninterruptible IO)",
            Some("R") => " (running on a CPU)",
            Some("T" | "t") => " (stopped)",
            Some("Z") => " (exited, not reaped)",
            _ => "",
        };
        match (&self.op, self.age_ns) {
            (Some(op), Some(age)) => format!("inside {op} for {}{state}", secs(age as f64)),
            _ => {
                let last = self
                    .last_call_age_ns
                    .map_or("no CUDA/NCCL call seen".to_string(), |a| format!("last call {} ago", secs(a as f64)));
                format!("in host code, no CUDA/NCCL call in flight, {last}{state}")
            }
        }
    }
}

pub fn secs(ns: f64) -> String {
    format!("{:.0}s", ns / 1e9)
}
