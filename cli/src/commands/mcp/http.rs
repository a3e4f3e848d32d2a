// SPDX-License-Identifier: Apache-2.0
//! Streamable HTTP for `ingero mcp --http`: the MCP service at `/mcp`, the
//! same bearer-token check as the aggregator's `/api/v1`, optional TLS and
//! mutual TLS (as `ingero serve`'s gRPC).

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::McpArgs;
use super::tools::Ingero;
use crate::commands::{CmdResult, Failure};

#[derive(Debug)]
pub(crate) struct HttpConfig {
    token: Option<Arc<str>>,
    tls: Option<Arc<rustls::ServerConfig>>,
    allowed_hosts: Vec<String>,
}

impl HttpConfig {
    /// Reads the token and the TLS files now, so a mistake fails at start.
    pub(crate) fn from_args(a: &McpArgs) -> Result<HttpConfig, String> {
        let token = a.http_token_file.as_deref().map(ingero_proto::auth::read_token).transpose();
        let token = token.map_err(|e| format!("--http-token-file: {e}"))?.map(Arc::from);
        let tls = match (&a.http_tls_cert, &a.http_tls_key) {
            (Some(c), Some(k)) => Some(Arc::new(tls_config(c, k, a.http_tls_client_ca.as_deref())?)),
            _ => None,
        };
        Ok(HttpConfig { token, tls, allowed_hosts: a.allowed_hosts.clone() })
    }
}

/// Clients whose certificate `ca` signed, and no others.
fn client_verifier(
    ca: &std::path::Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let what = |e: &dyn std::fmt::Display| format!("--http-tls-client-ca {}: {e}", ca.display());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).map_err(|e| what(&e))? {
        roots.add(c.map_err(|e| what(&e))?).map_err(|e| what(&e))?;
    }
    if roots.is_empty() {
        return Err(what(&"no certificate in the file"));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().map_err(|e| what(&e))
}

fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: Option<&std::path::Path>,
) -> Result<rustls::ServerConfig, String> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--http-tls-cert {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("--http-tls-cert {}: no certificate in the file", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--http-tls-key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?),
        None => builder.with_no_client_auth(),
    };
    let mut c = builder.with_single_cert(certs, key).map_err(|e| format!("--http-tls-cert/--http-tls-key: {e}"))?;
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(c)
}

fn router(tools: Ingero, cfg: &HttpConfig) -> axum::Router {
    let mut mcp = StreamableHttpServerConfig::default();
    if !cfg.allowed_hosts.is_empty() {
        mcp = mcp.with_allowed_hosts(cfg.allowed_hosts.clone());
    } else if cfg.token.is_some() {
        // DNS rebinding lets a web page reach a local server, but it cannot
        // learn the token: with one required, any Host name may be used.
        mcp = mcp.disable_allowed_hosts();
    }
    let service: StreamableHttpService<Ingero, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(tools.clone()), Default::default(), mcp);
    let token = cfg.token.clone();
    axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(move |req, next| ingero_server::auth::http_check(token.clone(), req, next)))
}

pub(crate) async fn serve(tools: Ingero, addr: SocketAddr, cfg: HttpConfig) -> CmdResult {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::Usage(format!("--http {addr}: cannot listen: {e}")))?;
    let local = listener.local_addr()?;
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    if !local.ip().is_loopback() && cfg.token.is_none() {
        tracing::warn!("MCP on {local} without --http-token-file: anyone who can reach it can read the data");
    }
    // The line a supervisor (or a test) waits for: the port is bound.
    eprintln!("ingero mcp: listening on {scheme}://{local}/mcp");
    let app = router(tools, &cfg);
    let Some(tls) = cfg.tls else {
        axum::serve(listener, app).with_graceful_shutdown(crate::shutdown_signal()).await?;
        return Ok(());
    };
    let acceptor = TlsAcceptor::from(tls);
    let shutdown = crate::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => r?,
            _ = &mut shutdown => return Ok(()),
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(e) => return tracing::debug!("TLS handshake with {peer} failed: {e}"),
            };
            let svc = TowerToHyperService::new(app);
            if let Err(e) = Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(tls), svc).await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
}
