// SPDX-License-Identifier: Apache-2.0
//! `ingero` subcommands other than `serve`: each reads from a running server
//! (`--server`) or straight from a store (`--store`).

pub(crate) mod actions;
mod columns;
pub(crate) mod demo;
pub(crate) mod evaluate;
pub(crate) mod export;
pub(crate) mod import;
pub(crate) mod mcp;
pub(crate) mod offenders;
pub(crate) mod report;
pub(crate) mod simulate;
pub(crate) mod sql;
pub(crate) mod stragglers;

use std::time::Duration;

use clap::Args;

use crate::cli::{QueryArgs, StoreArgs};
use ingero_analysis::query::QueryEngine;
use ingero_store::Store;

/// A failure the user caused (exit 2) or one that happened while running (exit 1).
#[derive(Debug)]
pub(crate) enum Failure {
    Usage(String),
    Run(anyhow::Error),
    /// Stopped by Ctrl-C or SIGTERM after cleaning up (exit 130, as a shell reports SIGINT).
    Interrupted,
}

impl Failure {
    /// The exit code of every `ingero` command, decided here only.
    pub(crate) fn exit_code(&self) -> std::process::ExitCode {
        match self {
            Failure::Usage(_) => std::process::ExitCode::from(2),
            Failure::Run(_) => std::process::ExitCode::from(1),
            Failure::Interrupted => std::process::ExitCode::from(130),
        }
    }

    /// A library error: the caller's input (exit 2) or a failure while running (exit 1).
    pub(crate) fn lib(e: impl LibError) -> Failure {
        if e.is_input_error() { Failure::Usage(e.to_string()) } else { Failure::Run(e.into()) }
    }
}

/// The error types of the libraries below the CLI, each of which knows
/// whether the caller's input caused it.
pub(crate) trait LibError: std::error::Error + Send + Sync + 'static {
    fn is_input_error(&self) -> bool;
}

impl LibError for ingero_analysis::Error {
    fn is_input_error(&self) -> bool {
        self.is_input_error()
    }
}

impl LibError for ingero_action::Error {
    fn is_input_error(&self) -> bool {
        matches!(self, ingero_action::Error::Config(_))
    }
}

impl LibError for ingero_server::Error {
    fn is_input_error(&self) -> bool {
        self.is_input_error()
    }
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Run(e.into())
    }
}

pub(crate) type CmdResult<T = ()> = Result<T, Failure>;

/// Start of a time range: a duration ago (`10m`, `1h`) or an RFC 3339 time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Since {
    Ago(Duration),
    At(i64),
}

impl Since {
    pub(crate) fn parse(s: &str) -> Result<Since, String> {
        if let Ok(d) = humantime::parse_duration(s) {
            return Ok(Since::Ago(d));
        }
        let t = chrono::DateTime::parse_from_rfc3339(s).map_err(|_| {
            format!("`{s}` is neither a duration (10m, 1h) nor an RFC 3339 time (2026-11-21T06:00:00Z)")
        })?;
        if t.timestamp_micros() > chrono::Utc::now().timestamp_micros() {
            return Err(format!("`{s}` is in the future: give the start of the range"));
        }
        Ok(Since::At(t.timestamp_micros()))
    }

    pub(crate) fn start_us(&self) -> i64 {
        match self {
            Since::Ago(d) => chrono::Utc::now().timestamp_micros() - d.as_micros() as i64,
            Since::At(t) => *t,
        }
    }

    /// (since_secs, start_us) as the gRPC requests carry them.
    pub(crate) fn wire(&self) -> (u64, i64) {
        match self {
            Since::Ago(d) => (d.as_secs().max(1), 0),
            Since::At(t) => (0, *t),
        }
    }
}

/// `--server` or `--store`: where a read command gets its data.
#[derive(Debug, Clone, Args)]
pub(crate) struct SourceArgs {
    /// A running aggregator's gRPC address (e.g. http://ingero:7070).
    #[arg(long, env = "INGERO_SERVER", conflicts_with = "store")]
    pub server: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub query: QueryArgs,
    /// Bearer token for --server, read from this file.
    #[arg(long, env = "INGERO_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// CA bundle (PEM) of the server's certificate, for an https:// --server.
    #[arg(long, env = "INGERO_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mutual TLS, with --tls-key.
    #[arg(long, env = "INGERO_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// Client key (PEM) for mutual TLS, with --tls-cert.
    #[arg(long, env = "INGERO_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
}

/// A query client that sends the bearer token.
pub(crate) type Client = ingero_proto::pb::query_client::QueryClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, ingero_proto::auth::Bearer>,
>;

impl SourceArgs {
    /// The flags naming this source, for a command the output suggests (a
    /// drill-down that runs as shown, on the same data).
    pub(crate) fn flags(&self) -> String {
        match (&self.server, &self.store.s3_endpoint) {
            (Some(s), _) => format!("--server {s}"),
            (None, Some(e)) => format!("--store {} --s3-endpoint {e}", self.store.store),
            (None, None) => format!("--store {}", self.store.store),
        }
    }

    pub(crate) async fn engine(&self) -> CmdResult<QueryEngine> {
        // Checked before opening: opening a local store creates its
        // directory, and a read leaves no empty one behind.
        if let Some(dir) = self.store.store.local_dir()
            && !dir.join("_ingero").exists()
            && std::fs::read_dir(&dir).map(|mut d| d.next().is_none()).unwrap_or(true)
        {
            return Err(Failure::Usage(format!(
                "{} holds no Ingero data (pass --store URL of a dataset, or --server URL of a running aggregator)",
                self.store.store
            )));
        }
        let store = Store::open(&self.store.store, &self.store.options()).map_err(|e| Failure::Usage(e.to_string()))?;
        Ok(QueryEngine::open(&store, self.query.limits()).await?)
    }

    pub(crate) async fn client(&self) -> CmdResult<Option<Client>> {
        let Some(server) = &self.server else { return Ok(None) };
        let auth = ingero_proto::auth::ClientAuth::from_files(
            self.token_file.as_deref(),
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
        )
        .map_err(|e| Failure::Usage(e.to_string()))?;
        let ch = ingero_proto::auth::channel(server, &auth).map_err(|e| Failure::Usage(e.to_string()))?;
        let bearer = ingero_proto::auth::Bearer::from(&auth);
        Ok(Some(
            ingero_proto::pb::query_client::QueryClient::with_interceptor(ch, bearer)
                .max_decoding_message_size(1 << 30),
        ))
    }
}

/// Maps a gRPC status from the server to the right exit code.
pub(crate) fn status_failure(s: tonic::Status) -> Failure {
    match s.code() {
        tonic::Code::InvalidArgument | tonic::Code::NotFound => Failure::Usage(s.message().to_string()),
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
            Failure::Usage(format!("the server refused our credentials: {} (--token-file)", s.message()))
        }
        _ => Failure::Run(anyhow::anyhow!("server: {} ({:?})", s.message(), s.code())),
    }
}
