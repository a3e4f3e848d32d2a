// SPDX-License-Identifier: Apache-2.0
//! A table's snapshot: its live files and transaction versions, and how one
//! commit's actions change it (no I/O: log.rs reads it, checkpoint.rs writes
//! and reads its checkpoints).

use std::collections::{BTreeMap, HashMap};

use super::action::{Action, Add, MetaData, Protocol};
use crate::error::{Error, Result};

/// What one table holds at one version.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub table: String,
    /// `None`: the table has no commit yet.
    pub version: Option<u64>,
    /// Live files by path (relative to the table directory).
    pub files: BTreeMap<String, Add>,
    pub txns: HashMap<String, i64>,
    /// When each app's latest `txn` was written (ms), where it says: a
    /// checkpoint leaves out those older than the table's transaction
    /// retention ([`super::txn_retention`]).
    pub txn_updated: HashMap<String, i64>,
    pub metadata: Option<MetaData>,
    pub protocol: Option<Protocol>,
    /// Files removed (compacted away), by path: when (ms); vacuum deletes
    /// them once that is older than the retention.
    pub tombstones: BTreeMap<String, i64>,
}

impl Snapshot {
    /// Applies one commit file's actions.
    pub fn apply_commit(&mut self, version: u64, body: &[u8]) -> Result<()> {
        let text = std::str::from_utf8(body)
            .map_err(|_| Error::State(format!("{}: Delta commit {version} is not UTF-8", self.table)))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let action = Action::parse(line)
                .map_err(|e| Error::State(format!("{}: Delta commit {version} is corrupt: {e}", self.table)))?;
            if let Some(a) = action {
                self.check(&a)?;
                self.apply(a);
            }
        }
        self.version = Some(version);
        Ok(())
    }

    fn check(&self, a: &Action) -> Result<()> {
        if let Action::Protocol(p) = a
            && p.min_reader_version > 1
        {
            return Err(Error::State(format!(
                "{}: the table needs Delta reader version {}; this ingero reads version 1 tables",
                self.table, p.min_reader_version
            )));
        }
        Ok(())
    }

    pub(crate) fn apply(&mut self, a: Action) {
        match a {
            Action::Add(add) => {
                self.tombstones.remove(&add.path);
                self.files.insert(add.path.clone(), add);
            }
            Action::Remove(r) => {
                self.files.remove(&r.path);
                self.tombstones.insert(r.path, r.deletion_timestamp.unwrap_or(0));
            }
            // The latest `txn` of an app is its version (the protocol's
            // rule); this writer never writes one below the current
            // ([`super::TableLog::try_commit`]), so latest is also highest.
            Action::Txn(t) => {
                match t.last_updated {
                    Some(ms) => self.txn_updated.insert(t.app_id.clone(), ms),
                    None => self.txn_updated.remove(&t.app_id),
                };
                self.txns.insert(t.app_id, t.version);
            }
            Action::MetaData(m) => self.metadata = Some(m),
            Action::Protocol(p) => self.protocol = Some(p),
            Action::CommitInfo(_) => {}
        }
    }

    /// Store-relative keys of the live files.
    pub fn keys(&self) -> impl Iterator<Item = String> + '_ {
        self.files.keys().map(|p| format!("{}/{p}", self.table))
    }

    /// Rows in the live files, from each file's `numRecords`; `None` when a
    /// file's statistics are missing or were not loaded (a reader's snapshot
    /// from [`super::log::current`] leaves them out), rather than a count
    /// that silently skips those files.
    pub fn rows(&self) -> Option<u64> {
        self.files
            .values()
            .map(|a| {
                let v: serde_json::Value = serde_json::from_str(a.stats.as_deref()?).ok()?;
                v["numRecords"].as_u64()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_unknown_when_a_file_has_no_statistics() {
        let mut snap = Snapshot::default();
        assert_eq!(snap.rows(), Some(0));
        for (path, rows) in [("a.parquet", 3), ("b.parquet", 4)] {
            snap.apply(Action::Add(super::super::table::add(path, 1, format!("{{\"numRecords\":{rows}}}"))));
        }
        assert_eq!(snap.rows(), Some(7));
        let mut bare = super::super::table::add("c.parquet", 1, String::new());
        bare.stats = None; // as a reader's snapshot holds it
        snap.apply(Action::Add(bare));
        assert_eq!(snap.rows(), None);
    }
}
