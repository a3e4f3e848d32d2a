// SPDX-License-Identifier: Apache-2.0
//! Object-store selection by URL: `file:///path` (or a plain path), `s3://`,
//! `gs://`, `az://`; [`super::Store`] opens one.

use std::path::{Path as FsPath, PathBuf};

use url::Url;

use crate::error::{Error, Result};

/// Default store location when none is given.
pub const DEFAULT_STORE: &str = "./ingero-data";

/// Options that do not fit in the URL.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// Endpoint of an S3-compatible server (MinIO, SeaweedFS, …).
    pub s3_endpoint: Option<String>,
}

/// A parsed, validated store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl(Url);

impl StoreUrl {
    pub fn parse(s: &str) -> Result<StoreUrl> {
        let bad = |reason: &str| Error::StoreUrl { url: s.to_string(), reason: reason.to_string() };
        if s.trim().is_empty() {
            return Err(bad("empty"));
        }
        let url = match Url::parse(s) {
            Ok(u) if u.scheme().len() > 1 => u,
            // A plain path (or a Windows-style drive letter): local filesystem.
            _ => {
                let abs = absolute(FsPath::new(s)).map_err(|e| bad(&e.to_string()))?;
                Url::from_directory_path(&abs).map_err(|_| bad("not an absolute path"))?
            }
        };
        match url.scheme() {
            "file" => {
                if url.host_str().is_some_and(|h| !h.is_empty() && h != "localhost") {
                    return Err(bad("file:// URLs take no host; use file:///absolute/path"));
                }
            }
            "s3" | "s3a" | "gs" | "az" | "abfs" | "abfss" => {
                if url.host_str().unwrap_or("").is_empty() {
                    return Err(bad("missing bucket, e.g. s3://bucket/prefix"));
                }
            }
            other => return Err(bad(&format!("unsupported scheme `{other}` (use file://, s3://, gs:// or az://)"))),
        }
        Ok(StoreUrl(url))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub(super) fn url(&self) -> &Url {
        &self.0
    }

    /// The local directory for `file://` stores.
    pub fn local_dir(&self) -> Option<PathBuf> {
        (self.0.scheme() == "file").then(|| self.0.to_file_path().ok()).flatten()
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_str())
    }
}

fn absolute(p: &FsPath) -> std::io::Result<PathBuf> {
    if p.is_absolute() { Ok(p.to_path_buf()) } else { Ok(std::env::current_dir()?.join(p)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_supported_urls_and_refuses_others() {
        assert_eq!(StoreUrl::parse("file:///tmp/x").unwrap().local_dir().unwrap(), PathBuf::from("/tmp/x"));
        let rel = StoreUrl::parse("./data").unwrap();
        assert!(rel.local_dir().unwrap().is_absolute());
        assert!(StoreUrl::parse("s3://bucket/prefix").unwrap().local_dir().is_none());
        assert!(StoreUrl::parse("gs://b").is_ok());
        for (bad, why) in [
            ("", "empty"),
            ("s3:///nobucket", "missing bucket"),
            ("ftp://host/x", "unsupported scheme `ftp`"),
            ("file://host/x", "take no host"),
        ] {
            let err = StoreUrl::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
