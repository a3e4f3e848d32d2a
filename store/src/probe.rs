// SPDX-License-Identifier: Apache-2.0
//! Checks, before several replicas trust it, that the store honours
//! put-if-absent.
//!
//! Each Delta commit is created only if its version does not exist yet; when
//! two replicas race for a version, the store must refuse the second. A store
//! that silently overwrites (an S3-compatible server that ignores
//! `If-None-Match`) loses one replica's commit: files written, acknowledged,
//! never visible. One writer never races, so only replicas need the check.

use object_store::{ObjectStoreExt, PutMode, PutPayload};

use crate::error::{Error, Result};
use crate::handle::Store;

/// Where probe objects live (outside every table).
const PROBE_DIR: &str = "_ingero/probe";

/// Creates one object twice with put-if-absent; the second create must be
/// refused and the first body kept. The probe object is removed afterwards.
pub async fn put_if_absent(store: &Store, who: &str) -> Result<()> {
    let tag: String = who.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let rel = format!("{PROBE_DIR}/put-if-absent-{tag}-{}", chrono::Utc::now().timestamp_micros());
    let key = store.key(&rel);
    let os = &store.object_store;
    let verdict = async {
        os.put_opts(&key, PutPayload::from_static(b"first"), PutMode::Create.into())
            .await
            .map_err(|e| refused(store, e))?;
        match os.put_opts(&key, PutPayload::from_static(b"second"), PutMode::Create.into()).await {
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(refused(store, e)),
            Ok(_) => return Err(overwrote(store)),
        }
        let kept = os.get(&key).await?.bytes().await?;
        if kept.as_ref() == b"first" { Ok(()) } else { Err(overwrote(store)) }
    }
    .await;
    // Best effort: a leftover probe object is harmless (it is outside every table).
    if let Err(e) = os.delete(&key).await {
        tracing::debug!(key = %key, error = %e, "could not remove the put-if-absent probe object");
    }
    verdict
}

fn overwrote(store: &Store) -> Error {
    Error::NoPutIfAbsent {
        store: store.url.to_string(),
        found: "a second create of the same object succeeded and replaced the first".into(),
    }
}

/// A store that cannot do conditional writes at all is a configuration
/// problem; any other failure (network, credentials) is reported as itself.
fn refused(store: &Store, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. } => {
            Error::NoPutIfAbsent { store: store.url.to_string(), found: format!("it refuses conditional writes: {e}") }
        }
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_store_honours_it_and_keeps_no_probe_object() {
        let (dir, store) = crate::fixtures::temp_store();
        put_if_absent(&store, "http://replica-0:7070").await.unwrap();
        let left = std::fs::read_dir(dir.path().join(PROBE_DIR)).unwrap().count();
        assert_eq!(left, 0, "the probe object was not removed");
    }
}
