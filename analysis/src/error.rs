// SPDX-License-Identifier: Apache-2.0
//! The analysis layer's error type: what reading the store back can add to
//! the storage errors below it (a query refused or timed out, a range that
//! selects nothing, a trace that cannot be imported).

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the tables, the Delta log or the object store failed.
    #[error(transparent)]
    Store(#[from] ingero_store::Error),
    /// A row that does not fit its table (the model's checks).
    #[error(transparent)]
    Model(#[from] ingero_model::Error),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// A statement `ingero sql` refuses (not a query, empty) or SQL the
    /// engine rejects while planning or running it; the caller's to fix.
    #[error("{0}")]
    BadQuery(String),
    /// A time range or target that selects nothing, or an empty range.
    #[error("{0}")]
    NoData(String),
    /// A target that names more than one thing (a bare pid found on
    /// several nodes): the caller's to narrow.
    #[error("{0}")]
    Ambiguous(String),
    #[error("query exceeded the {} timeout (--query-timeout)", humantime::format_duration(*.0))]
    QueryTimeout(std::time::Duration),
    /// Setting up the query engine over the store failed.
    #[error("query engine: {0}")]
    Engine(String),
    /// A file given to `ingero import` that is not a trace we can read.
    #[error("{path}: {reason}")]
    Import { path: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when the caller's input caused it (a flag, URL, file, query or
    /// range): the CLI exits 2 and the gRPC API answers InvalidArgument or
    /// NotFound. Everything else is a failure while running (exit 1).
    pub fn is_input_error(&self) -> bool {
        match self {
            Error::Store(e) => e.is_input_error(),
            Error::BadQuery(_) | Error::NoData(_) | Error::Ambiguous(_) | Error::Import { .. } => true,
            Error::Model(_) | Error::Arrow(_) | Error::QueryTimeout(_) | Error::Engine(_) => false,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(source: std::io::Error) -> Self {
        Error::Store(ingero_store::Error::Io { context: "I/O".into(), source })
    }
}
