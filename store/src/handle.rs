// SPDX-License-Identifier: Apache-2.0
//! An opened store: the object store behind a [`StoreUrl`], its key prefix,
//! and durable writes.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode};

use super::url::{StoreOptions, StoreUrl};
use crate::error::{Error, IoContext, Result};

/// An opened store: the object store, the key prefix, and for local stores
/// the directory (so writes can be fsynced).
#[derive(Debug, Clone)]
pub struct Store {
    pub url: StoreUrl,
    pub object_store: Arc<dyn ObjectStore>,
    pub prefix: Path,
    pub local_dir: Option<PathBuf>,
}

impl Store {
    /// Opens the store; local directories are created when missing.
    pub fn open(url: &StoreUrl, opts: &StoreOptions) -> Result<Store> {
        let bad = |reason: String| Error::StoreUrl { url: url.to_string(), reason };
        let u = url.url();
        let bucket = u.host_str().unwrap_or_default().to_string();
        let prefix = Path::from(u.path().trim_matches('/'));
        let object_store: Arc<dyn ObjectStore> = match u.scheme() {
            "file" => {
                let dir = url.local_dir().ok_or_else(|| bad("not a local path".into()))?;
                std::fs::create_dir_all(&dir).ctx(|| format!("creating store directory {}", dir.display()))?;
                let fs = LocalFileSystem::new_with_prefix(&dir).map_err(|e| bad(e.to_string()))?;
                return Ok(Store {
                    url: url.clone(),
                    object_store: Arc::new(fs),
                    prefix: Path::default(),
                    local_dir: Some(dir),
                });
            }
            "s3" | "s3a" => {
                let mut b = AmazonS3Builder::from_env().with_bucket_name(&bucket);
                if let Some(ep) = &opts.s3_endpoint {
                    b = b
                        .with_endpoint(ep)
                        .with_allow_http(ep.starts_with("http://"))
                        .with_virtual_hosted_style_request(false);
                }
                Arc::new(b.build().map_err(|e| bad(e.to_string()))?)
            }
            "gs" => Arc::new(
                GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&bucket)
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            _ => Arc::new(
                MicrosoftAzureBuilder::from_env()
                    .with_container_name(&bucket)
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
        };
        Ok(Store { url: url.clone(), object_store, prefix, local_dir: None })
    }

    /// Key under the store prefix.
    pub fn key(&self, rel: &str) -> Path {
        if self.prefix.as_ref().is_empty() { Path::from(rel) } else { Path::from(format!("{}/{rel}", self.prefix)) }
    }

    /// Writes an object; for local stores also fsyncs the file and its directory
    /// so a committed flush survives a machine crash, not only a process crash.
    pub async fn put_durable(&self, rel: &str, bytes: bytes::Bytes) -> Result<()> {
        self.object_store.put(&self.key(rel), bytes.into()).await?;
        if let Some(dir) = &self.local_dir {
            let path = dir.join(rel);
            tokio::task::spawn_blocking(move || fsync_file_and_dir(&path))
                .await
                .map_err(|e| Error::State(e.to_string()))??;
        }
        Ok(())
    }
}

impl Store {
    /// Creates an object only if it does not exist yet (the Delta log's
    /// commit protocol); `false` when another writer created it first.
    pub async fn put_if_absent(&self, rel: &str, bytes: bytes::Bytes) -> Result<bool> {
        match self.object_store.put_opts(&self.key(rel), bytes.into(), PutMode::Create.into()).await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        if let Some(dir) = &self.local_dir {
            let path = dir.join(rel);
            tokio::task::spawn_blocking(move || fsync_file_and_dir(&path))
                .await
                .map_err(|e| Error::State(e.to_string()))??;
        }
        Ok(true)
    }
}

fn fsync_file_and_dir(path: &FsPath) -> Result<()> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).ctx(|| format!("fsync {}", path.display()))?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent).and_then(|f| f.sync_all()).ctx(|| format!("fsync {}", parent.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_prefix() {
        let url = StoreUrl::parse("s3://bucket/some/prefix/").unwrap();
        let store = Store::open(&url, &StoreOptions { s3_endpoint: Some("http://127.0.0.1:1".into()) }).unwrap();
        assert_eq!(store.key("a/b.parquet").as_ref(), "some/prefix/a/b.parquet");
    }
}
