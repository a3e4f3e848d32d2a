// SPDX-License-Identifier: Apache-2.0
//! The storage layer's error type; the serving layer and analysis each wrap
//! it in their own (`ingero_server::Error`, `ingero_analysis::Error`).

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad store URL `{url}`: {reason}")]
    StoreUrl { url: String, reason: String },
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Proto(#[from] ingero_model::Error),
    #[error("write-ahead log {path}: {reason}")]
    Wal { path: String, reason: String },
    #[error("state file: {0}")]
    State(String),
    /// Bad flags or files given to the server (exit code 2).
    #[error("{0}")]
    Config(String),
    /// The store cannot refuse a second create of one object, so replicas
    /// racing for a Delta version would overwrite each other's commits.
    #[error(
        "store {store} does not honour put-if-absent ({found}); replicas would overwrite each other's \
         commits. Run one `ingero serve` (no --replicas) on this store, or use a store with conditional \
         writes (S3 with If-None-Match, GCS, Azure Blob, a local directory)"
    )]
    NoPutIfAbsent { store: String, found: String },
    /// Another engine upgraded the table to a protocol this writer does not
    /// implement; writing anyway would corrupt it for every reader.
    #[error(
        "table {table} needs Delta {needs}, which this writer does not implement; ingero will not write to it. \
         Point --store at another location, or restore the table's protocol with the engine that upgraded it"
    )]
    TableProtocol { table: String, needs: String },
    /// Our columns cannot be merged into the table's schema (a type changed,
    /// or the table requires a column our files lack).
    #[error("table {table}: {reason}; ingero will not write to it. Point --store at another location")]
    TableSchema { table: String, reason: String },
    #[error("the aggregator is shutting down")]
    ShuttingDown,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when the caller's input caused it (a flag, URL, file, query or
    /// range): the CLI exits 2 and the gRPC API answers InvalidArgument or
    /// NotFound. Everything else is a failure while running (exit 1).
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Error::StoreUrl { .. }
                | Error::Config(_)
                | Error::NoPutIfAbsent { .. }
                | Error::TableProtocol { .. }
                | Error::TableSchema { .. }
        )
    }
}

/// Adds a context line to an `io::Error`.
pub trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::result::Result<T, std::io::Error> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io { context: context(), source })
    }
}
