// SPDX-License-Identifier: Apache-2.0
//! Server-side authentication: bearer token on every gRPC call and on the
//! HTTP data API, TLS / mutual TLS (rustls) for the gRPC listener.

use std::path::Path;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tonic::Status;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::error::{Error, Result};
use ingero_store::metrics::Metrics;

/// What the server demands of its clients.
#[derive(Debug, Clone, Default)]
pub struct ServerAuth {
    /// Required `authorization: Bearer <token>`; None = open (loopback/dev).
    pub token: Option<Arc<str>>,
    pub tls: Option<ServerTls>,
}

#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// Clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca_pem: Option<Vec<u8>>,
}

impl ServerAuth {
    /// From the `serve` flags; files are read now so mistakes fail at start.
    pub fn from_files(
        token: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<ServerAuth> {
        let cfg = |e: String| Error::Config(e);
        let read =
            |what: &str, p: &Path| std::fs::read(p).map_err(|e| cfg(format!("reading {what} {}: {e}", p.display())));
        let token = token.map(ingero_proto::auth::read_token).transpose().map_err(|e| cfg(e.to_string()))?;
        let tls = match (cert, key) {
            (Some(c), Some(k)) => Some(ServerTls {
                cert_pem: read("--tls-cert", c)?,
                key_pem: read("--tls-key", k)?,
                client_ca_pem: client_ca.map(|p| read("--tls-client-ca", p)).transpose()?,
            }),
            (None, None) if client_ca.is_some() => {
                return Err(cfg("--tls-client-ca needs --tls-cert and --tls-key".into()));
            }
            (None, None) => None,
            _ => return Err(cfg("--tls-cert and --tls-key go together".into())),
        };
        Ok(ServerAuth { token: token.map(Into::into), tls })
    }

    pub fn tls_config(&self) -> Option<ServerTlsConfig> {
        let t = self.tls.as_ref()?;
        let mut c = ServerTlsConfig::new().identity(Identity::from_pem(&t.cert_pem, &t.key_pem));
        if let Some(ca) = &t.client_ca_pem {
            c = c.client_ca_root(Certificate::from_pem(ca));
        }
        Some(c)
    }
}

/// Compares without an early exit, so response time does not leak how much
/// of a guessed token was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn bearer_ok(expected: &str, got: Option<&[u8]>) -> bool {
    got.and_then(|v| v.strip_prefix(b"Bearer ")).is_some_and(|t| same(t, expected.as_bytes()))
}

/// The gRPC check, run on the request headers before the body is decoded:
/// an unauthenticated batch costs no decoding and is never stored.
#[derive(Debug, Clone)]
pub struct TokenCheck {
    token: Option<Arc<str>>,
    metrics: Arc<Metrics>,
}

impl TokenCheck {
    pub fn new(token: Option<Arc<str>>, metrics: Arc<Metrics>) -> TokenCheck {
        TokenCheck { token, metrics }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, req: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, Status> {
        let Some(expected) = &self.token else { return Ok(req) };
        let got = req.metadata().get("authorization").map(|v| v.as_bytes());
        if bearer_ok(expected, got) {
            return Ok(req);
        }
        self.metrics.reject(if got.is_none() { "unauthenticated" } else { "bad_token" });
        Err(Status::unauthenticated(if got.is_none() {
            "missing `authorization: Bearer <token>` (agent: --token-file)"
        } else {
            "wrong bearer token"
        }))
    }
}

/// The same check for the HTTP data API (`/api/v1/*`); probes and metrics stay open.
pub async fn http_check(token: Option<Arc<str>>, req: Request, next: Next) -> Response {
    if let Some(expected) = &token {
        let got = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
        if !bearer_ok(expected, got) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "missing or wrong bearer token\n",
            )
                .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_must_match_exactly() {
        assert!(bearer_ok("s3cret-token-0123", Some(b"Bearer s3cret-token-0123")));
        assert!(!bearer_ok("s3cret-token-0123", Some(b"Bearer s3cret-token-012")));
        assert!(!bearer_ok("s3cret-token-0123", Some(b"Bearer s3cret-token-01234")));
        assert!(!bearer_ok("s3cret-token-0123", Some(b"bearer s3cret-token-0123")));
        assert!(!bearer_ok("s3cret-token-0123", Some(b"s3cret-token-0123")));
        assert!(!bearer_ok("s3cret-token-0123", None));
    }

    #[test]
    fn tls_flags_must_come_in_pairs() {
        let e = ServerAuth::from_files(None, Some(Path::new("/c")), None, None).unwrap_err().to_string();
        assert!(e.contains("go together"), "{e}");
        let e = ServerAuth::from_files(None, None, None, Some(Path::new("/ca"))).unwrap_err().to_string();
        assert!(e.contains("needs --tls-cert"), "{e}");
    }
}
