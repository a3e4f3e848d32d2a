// SPDX-License-Identifier: Apache-2.0
//! The serving layer's error type: the storage errors below it, plus what
//! configuring and running the gRPC and HTTP servers can add. Analysis wraps
//! it in its own (`ingero_analysis::Error`).

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Opening the store, its write-ahead log or a commit failed.
    #[error(transparent)]
    Store(#[from] ingero_store::Error),
    /// Bad flags or files given to the server: TLS material, tokens,
    /// replica lists (exit code 2).
    #[error("{0}")]
    Config(String),
    /// Binding a listener or reading its address.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The gRPC or HTTP server stopped with an error while running.
    #[error("{0}")]
    Serve(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when the caller's input caused it (a flag, URL or file): the CLI
    /// exits 2. Everything else is a failure while running (exit 1).
    pub fn is_input_error(&self) -> bool {
        match self {
            Error::Store(e) => e.is_input_error(),
            Error::Config(_) => true,
            Error::Io { .. } | Error::Serve(_) => false,
        }
    }
}

/// Adds a context line to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::result::Result<T, std::io::Error> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io { context: context(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_errors_are_the_callers_whatever_layer_found_them() {
        assert!(Error::Config("--replicas".into()).is_input_error());
        let url = ingero_store::Error::StoreUrl { url: "x://".into(), reason: "scheme".into() };
        assert!(Error::from(url).is_input_error());
        assert!(!Error::Serve("gRPC server: broken pipe".into()).is_input_error());
        assert!(!Error::from(ingero_store::Error::ShuttingDown).is_input_error());
    }
}
