// SPDX-License-Identifier: Apache-2.0
//! The agent's error type.

use aya::maps::MapError;
use aya::programs::ProgramError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the eBPF object: {0}")]
    Object(#[from] aya::EbpfError),
    #[error("reading kernel BTF (/sys/kernel/btf/vmlinux): {0}")]
    Btf(#[from] aya::BtfError),
    /// A program or map the object must hold is not there (a build mismatch).
    #[error("{kind} {name} is missing from the eBPF object")]
    Missing { kind: &'static str, name: String },
    /// Loading or attaching one program; `what` names the program and target.
    #[error("{what}: {cause}")]
    Program { what: String, cause: ProgramError },
    #[error("eBPF map {name}: {cause}")]
    Map { name: String, cause: MapError },
    /// A library file that could not be opened for probing.
    #[error("opening {what}: {cause}")]
    Open { what: String, cause: std::io::Error },
    #[error("{what}: {cause}")]
    Runtime { what: &'static str, cause: std::io::Error },
    /// Bad flags or host facts: the agent exits 2.
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

impl Error {
    /// The process exit code for this error, decided here only: 2 for bad
    /// flags or a host that cannot run the agent, 1 for anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) => 2,
            _ => 1,
        }
    }

    pub(crate) fn program(what: impl Into<String>) -> impl FnOnce(ProgramError) -> Error {
        let what = what.into();
        move |cause| Error::Program { what, cause }
    }

    pub(crate) fn map(name: impl Into<String>) -> impl FnOnce(MapError) -> Error {
        let name = name.into();
        move |cause| Error::Map { name, cause }
    }
}
