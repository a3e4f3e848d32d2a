// SPDX-License-Identifier: Apache-2.0
//! The writer fence: this store writes plain Parquet Delta tables (reader
//! 1, writer 2). Another engine may upgrade a shared table (deletion
//! vectors, column mapping, check constraints, generated or identity
//! columns); a writer that does not implement such a feature corrupts the
//! table for everyone if it writes anyway, so it refuses, naming what the
//! table needs.

use super::action::Protocol;
use crate::error::{Error, Result};

/// Writer features (protocol 7) whose rules this writer keeps: it never
/// removes rows (compaction rewrites them with `dataChange: false`).
const WRITER_FEATURES: &[&str] = &["appendOnly"];

impl Protocol {
    /// What this store creates tables with.
    pub fn ours() -> Protocol {
        Protocol { min_reader_version: 1, min_writer_version: 2, reader_features: None, writer_features: None }
    }
}

/// Ok when this writer may commit to a table with `protocol`; a table with
/// no protocol yet is ours to create.
pub fn check_writable(table: &str, protocol: Option<&Protocol>) -> Result<()> {
    let Some(p) = protocol else { return Ok(()) };
    let needs = match p.min_writer_version {
        0..=2 => return Ok(()),
        7 => {
            let unknown: Vec<&str> = p
                .writer_features
                .iter()
                .flatten()
                .map(String::as_str)
                .filter(|f| !WRITER_FEATURES.contains(f))
                .collect();
            if unknown.is_empty() {
                return Ok(());
            }
            format!("writer features {}", unknown.join(", "))
        }
        v => format!("writer version {v} (check constraints, change data feed, column mapping or identity columns)"),
    };
    Err(Error::TableProtocol { table: table.to_string(), needs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(version: u32, features: &[&str]) -> Protocol {
        Protocol {
            min_writer_version: version,
            writer_features: (version == 7).then(|| features.iter().map(|s| s.to_string()).collect()),
            ..Protocol::ours()
        }
    }

    #[test]
    fn plain_tables_and_known_features_are_writable_others_are_refused_by_name() {
        assert!(check_writable("t", None).is_ok());
        assert!(check_writable("t", Some(&Protocol::ours())).is_ok());
        assert!(check_writable("t", Some(&with(7, &["appendOnly"]))).is_ok());
        let e = check_writable("call_windows", Some(&with(7, &["appendOnly", "deletionVectors"]))).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("call_windows") && msg.contains("deletionVectors") && !msg.contains("appendOnly"),
            "{msg}"
        );
        let msg = check_writable("t", Some(&with(5, &[]))).unwrap_err().to_string();
        assert!(msg.contains("writer version 5"), "{msg}");
    }

    /// A table another engine upgraded: with only features this writer
    /// keeps, commits go on and checkpoints carry the features; with one it
    /// does not implement, the next commit is refused and nothing written.
    #[tokio::test]
    async fn an_upgraded_table_keeps_its_features_or_refuses_the_writer() {
        use crate::delta::action::{self, Action};
        use crate::delta::log::{Snapshot, commit_key};
        use crate::delta::table::{TableLog, add};
        use arrow::datatypes::{DataType, Field, Schema};

        let (dir, store) = crate::fixtures::temp_store();
        let logical = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        let mut log = TableLog::open(&store, "t", &logical).await.unwrap();
        log.commit(&store, vec![], vec![], None, serde_json::json!({})).await.unwrap();
        let upgrade = |features: &[&str]| action::encode(&[Action::Protocol(with(7, features))]);
        let v = Snapshot::load(&store, "t").await.unwrap().version.unwrap() + 1;
        assert!(store.put_if_absent(&commit_key("t", v), upgrade(&["appendOnly"]).into()).await.unwrap());
        for i in 0..100 {
            let file = add(&format!("date=2026-11-27/hour=1/f{i}.parquet"), 100, crate::delta::stats::rows_only(1));
            log.commit(&store, vec![file], vec![], None, serde_json::json!({})).await.unwrap();
        }
        let snap = Snapshot::load(&store, "t").await.unwrap();
        assert!(dir.path().join("t/_delta_log/00000000000000000100.checkpoint.parquet").exists());
        let features = snap.protocol.as_ref().and_then(|p| p.writer_features.clone());
        assert_eq!(features, Some(vec!["appendOnly".to_string()]), "the checkpoint dropped the table's features");

        let v = snap.version.unwrap() + 1;
        assert!(store.put_if_absent(&commit_key("t", v), upgrade(&["deletionVectors"]).into()).await.unwrap());
        let file = add("date=2026-11-27/hour=1/late.parquet", 100, crate::delta::stats::rows_only(1));
        let err = log.commit(&store, vec![file], vec![], None, serde_json::json!({})).await.unwrap_err();
        assert!(err.to_string().contains("deletionVectors"), "{err}");
        assert!(!dir.path().join(format!("t/_delta_log/{:020}.json", v + 1)).exists(), "a commit was written");
    }
}
