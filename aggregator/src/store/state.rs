// SPDX-License-Identifier: Apache-2.0
//! Commit state kept in the store: the last flushed WAL segment and the
//! highest sequence stored per node. Written after a segment's Parquet files,
//! so it never claims data that is not there.

use std::collections::BTreeMap;

use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};

use super::Store;
use super::layout::STATE_KEY;
use crate::error::{Error, Result};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CommitState {
    /// Every WAL segment up to and including this one is in the store.
    pub committed_segment: u64,
    /// Highest batch sequence stored, per node.
    pub high_water: BTreeMap<String, u64>,
}

impl CommitState {
    pub(crate) async fn load(store: &Store) -> Result<CommitState> {
        match store.object_store.get(&store.key(STATE_KEY)).await {
            Ok(r) => {
                let bytes = r.bytes().await?;
                serde_json::from_slice(&bytes)
                    .map_err(|e| Error::State(format!("{STATE_KEY} in {} is corrupt: {e}", store.url)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(CommitState::default()),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) async fn save(&self, store: &Store) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::State(e.to_string()))?;
        store.put_durable(STATE_KEY, json.into()).await
    }

    /// True when `(node, seq)` is already stored or earlier than what is.
    pub(crate) fn is_duplicate(&self, node: &str, seq: u64) -> bool {
        self.high_water.get(node).is_some_and(|&hw| seq <= hw)
    }

    pub(crate) fn record(&mut self, node: &str, seq: u64) {
        match self.high_water.get_mut(node) {
            Some(hw) => *hw = (*hw).max(seq),
            None => {
                self.high_water.insert(node.to_string(), seq);
            }
        }
    }
}
