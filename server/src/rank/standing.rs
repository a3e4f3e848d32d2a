// SPDX-License-Identifier: Apache-2.0
//! What the detector says of a node: its standing and the deviating signals
//! that explain it (a leaf, so stuck.rs and detector.rs need not import each other).

use serde::Serialize;

/// One deviating signal, with the numbers that justify it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Deviation {
    pub signal: String,
    pub value: f64,
    pub job_median: f64,
    pub z: f64,
    pub text: String,
}

/// A node's current standing.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Standing {
    pub node: String,
    pub job: String,
    pub score: f64,
    pub flagged: bool,
    /// RFC 3339 start of the window where the current deviation began.
    pub since: Option<String>,
    pub since_us: Option<i64>,
    pub signals: Vec<Deviation>,
    pub windows: u64,
    /// Holds the rank a stuck job waits for (see `signals` for what it does).
    #[serde(default)]
    pub stuck: bool,
    /// Job time lost in the current episode, in seconds (see `episode`).
    #[serde(default)]
    pub lost_s: f64,
    /// What that cost, while flagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<super::cost::Cost>,
    /// Its step time against its job's, where the agents found steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<super::steps::StepTime>,
}
