// SPDX-License-Identifier: Apache-2.0
//! Test fixtures of the storage layer.

use crate::{Store, StoreOptions, StoreUrl};

/// A store on a fresh temporary directory (kept while the guard lives).
pub(crate) fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap();
    (dir, Store::open(&url, &StoreOptions::default()).unwrap())
}
