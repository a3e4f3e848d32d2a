//! The agent's error type.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("eBPF: {0}")]
    Bpf(String),
    #[error("{0}")]
    Config(String),
    #[error("spool {path}: {source}")]
    Spool {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Send(#[from] ingero_proto::client::SendError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
