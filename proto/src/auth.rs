// SPDX-License-Identifier: Apache-2.0
//! Client-side authentication: a bearer token read from a file (a mounted
//! Kubernetes Secret) and TLS / mutual TLS (rustls) from PEM files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Shortest token accepted: anything shorter is guessable.
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("reading {what} {}: {source}", .path.display())]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("token file {} {}", .0.display(), .1)]
    BadToken(PathBuf, &'static str),
    #[error("{0}")]
    Config(String),
}

/// Reads a bearer token: surrounding whitespace is ignored; it must be at
/// least [`MIN_TOKEN_LEN`] visible ASCII characters.
pub fn read_token(path: &Path) -> Result<String, AuthError> {
    let raw = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
        what: "token file",
        path: path.into(),
        source,
    })?;
    let t = raw.trim();
    if t.is_empty() {
        return Err(AuthError::BadToken(path.into(), "is empty"));
    }
    if !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(AuthError::BadToken(path.into(), "must hold one line of visible ASCII characters"));
    }
    if t.len() < MIN_TOKEN_LEN {
        return Err(AuthError::BadToken(path.into(), "is shorter than 16 characters"));
    }
    Ok(t.to_string())
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|source| AuthError::Read { what, path: path.into(), source })
}

/// How a client proves who it is and checks the server.
#[derive(Debug, Clone, Default)]
pub struct ClientAuth {
    /// `authorization: Bearer <token>` on every call.
    pub token: Option<String>,
    /// CA bundle that signed the server's certificate (TLS); without it the
    /// system roots are used for `https://` addresses.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (mutual TLS).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientAuth {
    /// From the usual flags; every path is read now so a typo fails at start.
    pub fn from_files(
        token: Option<&Path>,
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<ClientAuth, AuthError> {
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((read_pem("client certificate", c)?, read_pem("client key", k)?)),
            (None, None) => None,
            _ => return Err(AuthError::Config("--tls-cert and --tls-key go together".into())),
        };
        Ok(ClientAuth {
            token: token.map(read_token).transpose()?,
            ca_pem: ca.map(|p| read_pem("CA bundle", p)).transpose()?,
            identity,
        })
    }

    fn uses_tls(&self, server: &str) -> bool {
        server.starts_with("https://") || self.ca_pem.is_some() || self.identity.is_some()
    }

    /// The `authorization` header value, if a token is set.
    pub fn header(&self) -> Option<MetadataValue<Ascii>> {
        // read_token only admits visible ASCII, so this cannot fail.
        self.token.as_ref().and_then(|t| format!("Bearer {t}").parse().ok())
    }
}

/// Adds the bearer token to every call of a generated client
/// (`QueryClient::with_interceptor(channel, Bearer::from(&auth))`).
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl From<&ClientAuth> for Bearer {
    fn from(a: &ClientAuth) -> Bearer {
        Bearer(a.header())
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.0 {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

/// A lazily connected channel to an aggregator (TLS when the address is
/// `https://` or certificates are given).
pub fn channel(server: &str, auth: &ClientAuth) -> Result<Channel, AuthError> {
    let bad = |e: String| AuthError::Config(format!("bad server address `{server}`: {e}"));
    if auth.uses_tls(server) && server.starts_with("http://") {
        return Err(bad("TLS certificates are given: use an https:// address".into()));
    }
    let mut endpoint = Endpoint::from_shared(server.to_string())
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .http2_keep_alive_interval(Duration::from_secs(30));
    if auth.uses_tls(server) {
        let mut tls = ClientTlsConfig::new();
        tls = match &auth.ca_pem {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = &auth.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| bad(format!("TLS: {e}")))?;
    }
    Ok(endpoint.connect_lazy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_checked() {
        let dir = std::env::temp_dir().join(format!("ingero-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t");
        std::fs::write(&f, "  0123456789abcdef0123\n").unwrap();
        assert_eq!(read_token(&f).unwrap(), "0123456789abcdef0123");
        std::fs::write(&f, "\n").unwrap();
        assert!(read_token(&f).unwrap_err().to_string().ends_with("is empty"));
        std::fs::write(&f, "short").unwrap();
        assert!(read_token(&f).unwrap_err().to_string().contains("shorter than 16"));
        std::fs::write(&f, "0123456789 abcdef0123").unwrap();
        assert!(read_token(&f).unwrap_err().to_string().contains("visible ASCII"));
        assert!(read_token(&dir.join("missing")).unwrap_err().to_string().starts_with("reading token file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn certificates_need_https() {
        let auth = ClientAuth { ca_pem: Some(b"x".to_vec()), ..Default::default() };
        let e = channel("http://127.0.0.1:1", &auth).unwrap_err().to_string();
        assert!(e.contains("use an https:// address"), "{e}");
        let e = ClientAuth::from_files(None, None, Some(Path::new("/c")), None).unwrap_err().to_string();
        assert!(e.contains("go together"), "{e}");
    }
}
