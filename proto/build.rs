// SPDX-License-Identifier: Apache-2.0
//! Compiles `ingero.proto` and the kubelet's `podresources.proto` with the pure-Rust `protox` (no protoc binary needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=ingero.proto");
    println!("cargo:rerun-if-changed=podresources.proto");
    let fds = protox::compile(["ingero.proto", "podresources.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Payload bytes are shared, not copied, between decode, WAL and buffer.
        .bytes(".ingero.v1")
        .compile_fds(fds)?;
    Ok(())
}
