// SPDX-License-Identifier: Apache-2.0
//! The storage layer's error type, which the aggregator shares (its query
//! and import variants are named here so every layer answers with one type).

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
    Proto(#[from] ingero_proto::Error),
    #[error("write-ahead log {path}: {reason}")]
    Wal { path: String, reason: String },
    #[error("state file: {0}")]
    State(String),
    /// A statement `ingero sql` refuses (not a query, empty) or SQL the
    /// engine rejects while planning or running it; the caller's to fix.
    #[error("{0}")]
    BadQuery(String),
    /// A time range or target that selects nothing, or an empty range.
    #[error("{0}")]
    NoData(String),
    #[error("query exceeded the {} timeout (--query-timeout)", humantime::format_duration(*.0))]
    QueryTimeout(std::time::Duration),
    /// Setting up the query engine over the store failed.
    #[error("query engine: {0}")]
    Engine(String),
    /// A file given to `ingero import` that is not a trace we can read.
    #[error("{path}: {reason}")]
    Import { path: String, reason: String },
    /// Bad flags or files given to the server (exit code 2).
    #[error("{0}")]
    Config(String),
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
            Error::StoreUrl { .. } | Error::Config(_) | Error::BadQuery(_) | Error::NoData(_) | Error::Import { .. }
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
