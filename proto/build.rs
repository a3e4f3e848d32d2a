// SPDX-License-Identifier: Apache-2.0
//! Compiles `ingero.proto` and the kubelet's `podresources.proto` with the pure-Rust `protox` (no protoc binary needed).
//!
//! Two passes: messages and clients with prost's codec, then the servers
//! with `received::FrameCodec`, which keeps each request's frame so the
//! aggregator writes the bytes it received to its WAL instead of encoding
//! the request again.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=ingero.proto");
    println!("cargo:rerun-if-changed=podresources.proto");
    let fds = protox::compile(["ingero.proto", "podresources.proto"], ["."])?;
    // Without feature `grpc` the crate has no tonic: messages only.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(false)
        // Payload bytes are shared, not copied, between decode, WAL and buffer.
        .bytes(".ingero.v1")
        .compile_fds(fds.clone())?;
    if !grpc {
        return Ok(());
    }

    let servers = PathBuf::from(std::env::var("OUT_DIR")?).join("servers");
    std::fs::create_dir_all(&servers)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .out_dir(&servers)
        .codec_path("crate::received::FrameCodec")
        // Every message is the first pass's, except the pushed batch, which
        // the server receives with its frame.
        .extern_path(".ingero.v1", "crate::pb")
        .extern_path(".ingero.v1.PushRequest", "crate::received::ReceivedPush")
        .extern_path(".v1", "crate::podresources")
        .compile_fds(fds)?;
    Ok(())
}
