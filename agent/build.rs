//! Compiles the C eBPF programs in ../ebpf with clang (CO-RE, BTF).
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../ebpf");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("ingero.bpf.o");
    for f in std::fs::read_dir(&src).expect("ebpf/ directory").flatten() {
        println!("cargo:rerun-if-changed={}", f.path().display());
    }
    let clang = std::env::var("INGERO_CLANG").unwrap_or_else(|_| "clang".into());
    if !std::path::Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        panic!("libbpf headers not found: apt-get install clang libbpf-dev linux-libc-dev");
    }
    let arch_inc =
        format!("/usr/include/{}-linux-gnu", std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or("x86_64".into()));
    let status = Command::new(&clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror", "-D__TARGET_ARCH_x86"])
        .arg(format!("-I{arch_inc}"))
        .arg(format!("-I{}", src.display()))
        .arg("-c")
        .arg(src.join("ingero.bpf.c"))
        .arg("-o")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("clang failed to compile ebpf/ingero.bpf.c ({s})"),
        Err(e) => panic!("cannot run `{clang}` ({e}): apt-get install clang libbpf-dev linux-libc-dev"),
    }
}
