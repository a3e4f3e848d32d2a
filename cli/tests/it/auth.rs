// SPDX-License-Identifier: Apache-2.0
//! Authentication over real gRPC on loopback: bearer tokens, TLS and mutual
//! TLS (rustls, certificates made by rcgen), the HTTP data API, and requests
//! written by hand (garbage bytes, HTTP/1 to the gRPC port). Refused calls
//! store nothing and the server keeps serving.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::fixtures::*;
use ingero_model::Table;
use ingero_proto::auth::ClientAuth;
use ingero_proto::client::{IngestClient, RetryPolicy, SendError};
use ingero_server::Server;
use ingero_server::auth::{ServerAuth, ServerTls};
use ingero_sim::loadgen::synth_tables;
use ingero_store::StoreOptions;
use ingero_store::read::read_table;
use tonic::Code;

const TOKEN: &str = "7f3c9a1e5b2d4f608a1c3e5b7d9f1a2c";

fn quick() -> RetryPolicy {
    RetryPolicy { give_up_after: Duration::from_millis(300), ..RetryPolicy::default() }
}

async fn server(dir: &Path, auth: ServerAuth) -> Server {
    let store = format!("file://{}", dir.join("data").display());
    let mut cfg = serve_config(&store, &dir.join("wal"), StoreOptions::default());
    cfg.auth = auth;
    Server::start(cfg).await.unwrap()
}

fn batch(c: &mut IngestClient, w: i64) -> ingero_proto::pb::PushRequest {
    let now = chrono::Utc::now().timestamp_micros();
    let t0 = now - now % 1_000_000 - 60_000_000;
    c.request(&synth_tables(c.node(), t0 + w * 1_000_000, 16, w as u64)).unwrap()
}

fn code(r: Result<ingero_proto::pb::PushResponse, SendError>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(SendError::Rejected(s)) => s.code(),
        Err(SendError::Unavailable { last, .. }) => last.code(),
        Err(e) => panic!("{e}"),
    }
}

async fn stored_nodes(dir: &Path, server: &Server) -> Vec<String> {
    server.committer.flush().await.unwrap();
    let b = read_table(&server.store, Table::CallWindows).await.unwrap();
    let _ = dir;
    let mut n: Vec<String> = b
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name("node").unwrap().as_any().downcast_ref::<arrow::array::StringArray>().unwrap();
            c.iter().flatten().map(String::from).collect::<Vec<_>>()
        })
        .collect();
    n.sort();
    n.dedup();
    n
}

fn http(port: u16, path: &str, token: Option<&str>) -> String {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_nothing_is_stored_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), ServerAuth { token: Some(TOKEN.into()), tls: None }).await;
    let url = s.grpc_url();

    // No token, a wrong token, a token without "Bearer ": UNAUTHENTICATED.
    let mut anon = IngestClient::new(&url, "anon", quick()).unwrap();
    let req = batch(&mut anon, 0);
    assert_eq!(code(anon.push(&req).await), Code::Unauthenticated);
    let wrong_file = dir.path().join("wrong");
    std::fs::write(&wrong_file, "not-the-token-but-long-enough").unwrap();
    let wrong = ClientAuth::from_files(Some(&wrong_file), None, None, None).unwrap();
    let mut bad = IngestClient::with_auth(&url, "intruder", quick(), &wrong).unwrap();
    let req = batch(&mut bad, 0);
    assert_eq!(code(bad.push(&req).await), Code::Unauthenticated);

    // Garbage and HTTP/1.1 on the gRPC port, written by hand.
    for junk in [&b"\x00\x01\x02garbage\xff\xfe"[..], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nxx"]
    {
        let mut c = std::net::TcpStream::connect(s.grpc_addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = c.write_all(junk);
        let mut buf = [0u8; 256];
        let _ = c.read(&mut buf);
    }

    // The right token still works after all that.
    let tf = dir.path().join("token");
    std::fs::write(&tf, format!("{TOKEN}\n")).unwrap();
    let good = ClientAuth::from_files(Some(&tf), None, None, None).unwrap();
    let mut ok = IngestClient::with_auth(&url, "node-ok", quick(), &good).unwrap();
    let req = batch(&mut ok, 0);
    assert_eq!(code(ok.push(&req).await), Code::Ok);
    assert_eq!(stored_nodes(dir.path(), &s).await, vec!["node-ok".to_string()], "only the authenticated batch");

    // Refusals are counted by reason.
    let metrics = http(s.http_addr.port(), "/metrics", None);
    assert!(metrics.contains(r#"reason="unauthenticated"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"reason="bad_token"} 1"#), "{metrics}");

    // The HTTP data API wants the token too; probes do not.
    let port = s.http_addr.port();
    assert!(http(port, "/api/v1/stragglers", None).starts_with("HTTP/1.1 401"));
    assert!(http(port, "/api/v1/stragglers", Some("nope-nope-nope-nope")).starts_with("HTTP/1.1 401"));
    assert!(http(port, "/api/v1/stragglers", Some(TOKEN)).starts_with("HTTP/1.1 200"));
    assert!(http(port, "/healthz", None).starts_with("HTTP/1.1 200"));

    // The CLI: no token → one line, exit 2; with it, an answer.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ingero"))
        .args(["stragglers", "--server", &url])
        .env_remove("INGERO_TOKEN_FILE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("refused our credentials"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ingero"))
        .args(["stragglers", "--server", &url, "--token-file"])
        .arg(&tf)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    s.shutdown().await.unwrap();
}

struct Pki {
    ca: PathBuf,
    server_cert: Vec<u8>,
    server_key: Vec<u8>,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// A client certificate from a CA the server does not trust.
    rogue_cert: PathBuf,
    rogue_key: PathBuf,
}

fn pki(dir: &Path) -> Pki {
    let (ca1, ca2) = (ca("ingero test CA"), ca("someone else's CA"));
    let (sc, sk) = leaf(&ca1, &["localhost", "127.0.0.1"]);
    let (cc, ck) = leaf(&ca1, &["node-a"]);
    let (rc, rk) = leaf(&ca2, &["node-a"]);
    let w = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    Pki {
        ca: w("ca.pem", &ca1.pem()),
        server_cert: sc.into_bytes(),
        server_key: sk.into_bytes(),
        client_cert: w("client.pem", &cc),
        client_key: w("client.key", &ck),
        rogue_cert: w("rogue.pem", &rc),
        rogue_key: w("rogue.key", &rk),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_clients_with_a_trusted_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let tls = ServerTls {
        cert_pem: p.server_cert.clone(),
        key_pem: p.server_key.clone(),
        client_ca_pem: Some(std::fs::read(&p.ca).unwrap()),
    };
    let tf = dir.path().join("token");
    std::fs::write(&tf, TOKEN).unwrap();
    let s = server(dir.path(), ServerAuth { token: Some(TOKEN.into()), tls: Some(tls) }).await;
    let url = format!("https://127.0.0.1:{}", s.grpc_addr.port());

    // Trusted client certificate + token: stored.
    let good = ClientAuth::from_files(Some(&tf), Some(&p.ca), Some(&p.client_cert), Some(&p.client_key)).unwrap();
    let mut c = IngestClient::with_auth(&url, "node-mtls", quick(), &good).unwrap();
    let req = batch(&mut c, 0);
    assert_eq!(code(c.push(&req).await), Code::Ok);

    // No client certificate, or one from another CA: the handshake fails.
    let no_cert = ClientAuth::from_files(Some(&tf), Some(&p.ca), None, None).unwrap();
    let rogue = ClientAuth::from_files(Some(&tf), Some(&p.ca), Some(&p.rogue_cert), Some(&p.rogue_key)).unwrap();
    for (name, auth) in [("no-cert", no_cert), ("rogue", rogue)] {
        let mut c = IngestClient::with_auth(&url, name, quick(), &auth).unwrap();
        let req = batch(&mut c, 0);
        assert_ne!(code(c.push(&req).await), Code::Ok, "{name} was admitted");
    }
    // Plain text to the TLS port: refused.
    let mut plain = IngestClient::new(&format!("http://127.0.0.1:{}", s.grpc_addr.port()), "plain", quick()).unwrap();
    let req = batch(&mut plain, 0);
    assert_ne!(code(plain.push(&req).await), Code::Ok);
    // A trusted certificate without the token: UNAUTHENTICATED.
    let no_token = ClientAuth::from_files(None, Some(&p.ca), Some(&p.client_cert), Some(&p.client_key)).unwrap();
    let mut c = IngestClient::with_auth(&url, "no-token", quick(), &no_token).unwrap();
    let req = batch(&mut c, 0);
    assert_eq!(code(c.push(&req).await), Code::Unauthenticated);

    assert_eq!(stored_nodes(dir.path(), &s).await, vec!["node-mtls".to_string()]);
    s.shutdown().await.unwrap();
}

#[test]
fn bad_auth_configuration_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["serve".into(), format!("--token-file={}", empty.display())], "is empty"),
        (vec!["serve".into(), "--token-file=/nonexistent/token".into()], "reading token file"),
        (
            vec!["serve".into(), "--tls-cert=/nonexistent/c.pem".into(), "--tls-key=/nonexistent/k.pem".into()],
            "--tls-cert",
        ),
        (
            vec![
                "sql".into(),
                "--server=http://127.0.0.1:1".into(),
                "--tls-ca=/nonexistent/ca.pem".into(),
                "SELECT 1".into(),
            ],
            "CA bundle",
        ),
    ];
    for (args, want) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ingero"))
            .args(&args)
            .arg(format!("--wal-dir={}", dir.path().join("wal").display()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // `sql` has no --wal-dir: clap's own usage error is also exit 2; retry without it.
        let (code, err) = if err.contains("unexpected argument '--wal-dir") {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_ingero")).args(&args).output().unwrap();
            (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
        } else {
            (out.status.code(), err.to_string())
        };
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
