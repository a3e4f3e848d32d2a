// SPDX-License-Identifier: Apache-2.0
//! The Delta Lake log actions this store writes and reads (protocol spec,
//! "Actions"). Unknown actions in a commit are ignored, as the spec asks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Reader/writer versions: plain Parquet tables with no table features.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Protocol {
    pub min_reader_version: u32,
    pub min_writer_version: u32,
    /// Table features (protocol 3/7): kept so a checkpoint preserves them
    /// and the writer fence (`protocol.rs`) can read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader_features: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_features: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Format {
    pub provider: String,
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaData {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub format: Format,
    pub schema_string: String,
    pub partition_columns: Vec<String>,
    #[serde(default)]
    pub configuration: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_time: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Add {
    /// Relative to the table's directory.
    pub path: String,
    pub partition_values: BTreeMap<String, Option<String>>,
    pub size: i64,
    pub modification_time: i64,
    pub data_change: bool,
    /// JSON: `{"numRecords": n}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Remove {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<i64>,
    pub data_change: bool,
}

/// An application's transaction version: how exactly-once is kept here
/// (`ingero-writer-<id>` = the last WAL segment committed, `node:<name>` =
/// the node's highest stored batch sequence).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Txn {
    pub app_id: String,
    pub version: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<i64>,
}

/// One line of a commit file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    Protocol(Protocol),
    MetaData(MetaData),
    Add(Add),
    Remove(Remove),
    Txn(Txn),
    CommitInfo(serde_json::Value),
}

impl Add {
    /// `numRecords` from the file's statistics; unknown counts as huge (so
    /// compaction leaves such a file alone).
    pub fn rows(&self) -> u64 {
        self.stats
            .as_deref()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
            .and_then(|v| v["numRecords"].as_u64())
            .unwrap_or(u64::MAX)
    }
}

impl Action {
    /// Parses one line; `None` for actions this store does not use.
    pub fn parse(line: &str) -> Result<Option<Action>, serde_json::Error> {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let known = v
            .as_object()
            .and_then(|o| o.keys().next())
            .is_some_and(|k| matches!(k.as_str(), "protocol" | "metaData" | "add" | "remove" | "txn" | "commitInfo"));
        if !known {
            return Ok(None);
        }
        serde_json::from_value(v).map(Some)
    }
}

/// A commit file's body: newline-delimited JSON actions.
pub fn encode(actions: &[Action]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in actions {
        serde_json::to_writer(&mut out, a).expect("actions serialize");
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_spec_shaped_and_unknown_ones_skipped() {
        let a = Action::Txn(Txn { app_id: "node:a".into(), version: 7, last_updated: None });
        let body = String::from_utf8(encode(&[a])).unwrap();
        assert_eq!(body, "{\"txn\":{\"appId\":\"node:a\",\"version\":7}}\n");
        assert!(Action::parse(r#"{"domainMetadata":{"domain":"x"}}"#).unwrap().is_none());
        let add = r#"{"add":{"path":"date=2026-11-24/hour=10/p.parquet","partitionValues":{"date":"2026-11-24","hour":"10"},"size":5,"modificationTime":1,"dataChange":true,"tags":null}}"#;
        match Action::parse(add).unwrap() {
            Some(Action::Add(a)) => assert_eq!(a.partition_values["hour"].as_deref(), Some("10")),
            other => panic!("{other:?}"),
        }
    }
}
