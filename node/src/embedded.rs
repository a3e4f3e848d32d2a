// SPDX-License-Identifier: Apache-2.0
//! `run --store`: single-node use with no server to run. An aggregator is
//! embedded on loopback and writes the Parquet dataset itself; the agent
//! ships to it as to any other. It links the aggregator (Parquet,
//! object_store), so it is a cargo feature of this binary (`store`, off by
//! default: the DaemonSet build and `cargo build --workspace` stay lean and
//! ship to an aggregator; the tests turn it on). The agent library never links it.

use std::path::PathBuf;

use ingero_agent::error::{Error, Result};

#[cfg(feature = "store")]
pub struct Embedded(ingero_server::Server);

#[cfg(not(feature = "store"))]
pub struct Embedded(());

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Embedded")
    }
}

/// Whether this build can run `--store` (checked before anything starts).
pub const AVAILABLE: bool = cfg!(feature = "store");

/// Why `--store` is refused by a build without it, and what to do instead.
pub fn unavailable() -> Error {
    Error::Config(
        "--store: this ingero-agent is built without the `store` feature (the lean DaemonSet build): \
         ship to an aggregator with --aggregator URL, or build the agent with \
         `cargo build --release -p ingero-node --features store`"
            .into(),
    )
}

impl Embedded {
    /// Starts the embedded aggregator (on the caller's runtime); returns it
    /// and its gRPC address.
    #[cfg(feature = "store")]
    pub async fn start(store: &str, s3_endpoint: Option<String>, wal: PathBuf) -> Result<(Embedded, String)> {
        let url = ingero_store::StoreUrl::parse(store).map_err(|e| Error::Config(e.to_string()))?;
        let opts = ingero_store::StoreOptions { s3_endpoint };
        let mut cfg = ingero_server::ServeConfig::ephemeral(url, opts, wal);
        cfg.commit.flush_age = std::time::Duration::from_secs(10);
        let s = ingero_server::Server::start(cfg).await.map_err(|e| Error::Config(format!("--store: {e}")))?;
        let u = s.grpc_url();
        Ok((Embedded(s), u))
    }

    #[cfg(not(feature = "store"))]
    pub async fn start(_store: &str, _s3_endpoint: Option<String>, _wal: PathBuf) -> Result<(Embedded, String)> {
        Err(unavailable())
    }

    /// Flushes what it holds and stops.
    pub async fn shutdown(self) -> Result<()> {
        #[cfg(feature = "store")]
        self.0.shutdown().await.map_err(|e| Error::Config(format!("--store shutdown: {e}")))?;
        Ok(())
    }
}
