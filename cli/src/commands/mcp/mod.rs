// SPDX-License-Identifier: Apache-2.0
//! `ingero mcp`: a Model Context Protocol server an AI assistant can question
//! (stragglers, stall reports, SQL, names seen, schemas), over stdio (an
//! assistant starts it) or streamable HTTP (a shared deployment, with the
//! bearer token and TLS the API uses).
//!
//! The server is the cargo feature `mcp` (the container image and the tests
//! build it; the quick start leaves it out: rmcp and its macros are 40 s of
//! a first build). Without it, `ingero mcp` says how to get it.

#[cfg(feature = "mcp")]
mod http;
#[cfg(feature = "mcp")]
mod rows;
#[cfg(feature = "mcp")]
mod schema;
#[cfg(feature = "mcp")]
mod tools;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::{CmdResult, Failure, SourceArgs};

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Serve streamable HTTP at http(s)://ADDR/mcp instead of stdio.
    #[arg(long, env = "INGERO_MCP_HTTP")]
    pub http: Option<SocketAddr>,
    /// With --http: require `Authorization: Bearer <token>` (the token read from this file).
    #[arg(long, env = "INGERO_MCP_TOKEN_FILE", requires = "http")]
    pub http_token_file: Option<PathBuf>,
    /// With --http: serve HTTPS with this certificate chain (PEM), with --http-tls-key.
    #[arg(long, env = "INGERO_MCP_TLS_CERT", requires_all = ["http", "http_tls_key"])]
    pub http_tls_cert: Option<PathBuf>,
    /// Private key (PEM) for --http-tls-cert.
    #[arg(long, env = "INGERO_MCP_TLS_KEY", requires = "http_tls_cert")]
    pub http_tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by this CA (PEM).
    #[arg(long, env = "INGERO_MCP_TLS_CLIENT_CA", requires = "http_tls_cert")]
    pub http_tls_client_ca: Option<PathBuf>,
    /// With --http: Host names clients may use (DNS-rebinding protection).
    /// Default: loopback names only, or any host when a token is required.
    #[arg(long = "allowed-host", env = "INGERO_MCP_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Most rows one `sql` or `list_targets` call returns.
    #[arg(long, env = "INGERO_MCP_MAX_ROWS", default_value_t = 1000)]
    pub max_rows: usize,
    #[command(flatten)]
    pub rank: crate::cli::RankArgs,
}

#[cfg(not(feature = "mcp"))]
pub(crate) async fn run(_: McpArgs) -> CmdResult {
    Err(Failure::Usage(
        "this `ingero` was built without the MCP server: build it with \
         `cargo build --release -p ingero --features mcp` (the container image has it)"
            .into(),
    ))
}

#[cfg(feature = "mcp")]
pub(crate) async fn run(a: McpArgs) -> CmdResult {
    use rmcp::ServiceExt;
    if a.max_rows == 0 {
        return Err(Failure::Usage("--max-rows must be > 0".into()));
    }
    // Fail at start, not at the first tool call: a bad store URL or an
    // unreadable credential file is a usage error now.
    if a.source.server.is_some() {
        a.source.client().await?;
    } else {
        a.source.engine().await?;
    }
    let tools = tools::Ingero::new(a.source.clone(), a.rank.detector(), a.max_rows);
    match a.http {
        None => {
            if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                eprintln!(
                    "ingero mcp: speaking MCP (JSON-RPC) on stdin/stdout for an assistant that starts it; \
                     --http ADDR serves it over HTTP instead (Ctrl-D ends)"
                );
            }
            let running = tools
                .serve(rmcp::transport::stdio())
                .await
                .map_err(|e| Failure::Run(anyhow::anyhow!("MCP over stdio: {e}")))?;
            running.waiting().await.map_err(|e| Failure::Run(e.into()))?;
            Ok(())
        }
        Some(addr) => {
            let cfg = http::HttpConfig::from_args(&a).map_err(Failure::Usage)?;
            http::serve(tools, addr, cfg).await
        }
    }
}
