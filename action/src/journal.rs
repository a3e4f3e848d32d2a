// SPDX-License-Identifier: Apache-2.0
//! What remediation did and did not do, kept in the store (one small JSON
//! object per record under `_ingero/actions/<day>/`), so `ingero actions`
//! reads it from any machine, across restarts and replicas.

use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};
use ingero_store::Store;

const DIR: &str = "_ingero/actions";

/// One thing remediation did, would have done (dry-run), or held back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// RFC 3339.
    pub at: String,
    pub at_us: i64,
    /// `mark`, `taint`, `clear`, `untaint`, `held`, `error`.
    pub action: String,
    pub node: String,
    pub job: String,
    /// off, dry-run or on: dry-run records say what would have been done.
    pub mode: String,
    pub cause: String,
    /// The budget that held a mark back, the error, the report link.
    pub detail: String,
}

impl Record {
    pub fn new(action: &str, node: &str, job: &str, mode: crate::Mode, cause: &str, detail: String) -> Record {
        let now = chrono::Utc::now();
        Record {
            at: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            at_us: now.timestamp_micros(),
            action: action.into(),
            node: node.into(),
            job: job.into(),
            mode: mode.to_string(),
            cause: cause.into(),
            detail,
        }
    }
}

/// Appends one record (a new object: replicas never write the same key).
pub async fn append(store: &Store, r: &Record) -> Result<()> {
    let day = chrono::DateTime::from_timestamp_micros(r.at_us).unwrap_or_default().format("%Y-%m-%d");
    let rel = format!("{DIR}/{day}/{:020}-{:016x}.json", r.at_us, rand::random::<u64>());
    let body = serde_json::to_vec(r).map_err(|source| Error::Record { path: rel.clone(), source })?;
    store.object_store.put(&store.key(&rel), PutPayload::from(body)).await?;
    Ok(())
}

/// Records at or after `since_us`, oldest first. Day folders before the
/// start are not read.
pub async fn read(store: &Store, since_us: i64) -> Result<Vec<Record>> {
    let first_day =
        chrono::DateTime::from_timestamp_micros(since_us).unwrap_or_default().format("%Y-%m-%d").to_string();
    let root = store.key(DIR);
    let days = store.object_store.list_with_delimiter(Some(&root)).await?;
    let mut out = Vec::new();
    for day in days.common_prefixes {
        if day.filename().is_some_and(|d| d < first_day.as_str()) {
            continue;
        }
        let objects: Vec<_> = store.object_store.list(Some(&day)).try_collect().await?;
        for o in objects {
            let bytes = store.object_store.get(&o.location).await?.bytes().await?;
            let r: Record = serde_json::from_slice(&bytes)
                .map_err(|source| Error::Record { path: o.location.to_string(), source })?;
            if r.at_us >= since_us {
                out.push(r);
            }
        }
    }
    out.sort_by(|a, b| a.at_us.cmp(&b.at_us).then(a.node.cmp(&b.node)));
    Ok(out)
}
