// SPDX-License-Identifier: Apache-2.0
//! Compiles the C eBPF programs in ../ebpf with clang (CO-RE, BTF), once per
//! supported architecture: the object for the target is embedded in the
//! agent, the other is kept so tests check that it builds and relocates
//! against that architecture's register layout.
use std::path::{Path, PathBuf};
use std::process::Command;

/// (Rust target_arch, libbpf __TARGET_ARCH_*, Debian multiarch include dir).
const ARCHES: &[(&str, &str, &str)] =
    &[("x86_64", "x86", "/usr/include/x86_64-linux-gnu"), ("aarch64", "arm64", "/usr/include/aarch64-linux-gnu")];

fn main() {
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../ebpf");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for f in std::fs::read_dir(&src).expect("ebpf/ directory").flatten() {
        println!("cargo:rerun-if-changed={}", f.path().display());
    }
    println!("cargo:rerun-if-env-changed=INGERO_CLANG");
    if !Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        panic!("libbpf headers not found: apt-get install clang libbpf-dev linux-libc-dev");
    }
    let target = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    if !ARCHES.iter().any(|a| a.0 == target) {
        panic!("the eBPF programs support x86_64 and aarch64, not {target}");
    }
    // asm/types.h is the same generic header on both: the host's serves
    // when the other architecture's multiarch headers are not installed.
    let host_inc = ARCHES.iter().map(|a| a.2).find(|d| Path::new(d).join("asm/types.h").exists());
    for &(rust_arch, bpf_arch, inc) in ARCHES {
        let inc = if Path::new(inc).join("asm/types.h").exists() { Some(inc) } else { host_inc };
        let Some(inc) = inc else { panic!("no asm/types.h: apt-get install linux-libc-dev") };
        // (object, source, extra flags): the full object (Linux >= 5.17),
        // the compat one (5.10 to 5.16, ebpf/ingero.bpf.c says what it
        // lacks) and the feature probes `check` and the loader run.
        for (name, source, flags) in [
            ("ingero", "ingero.bpf.c", &[][..]),
            ("ingero-compat", "ingero.bpf.c", &["-DINGERO_COMPAT"][..]),
            ("features", "features.bpf.c", &[][..]),
        ] {
            let out = out_dir.join(format!("{name}-{rust_arch}.bpf.o"));
            compile(&src.join(source), inc, bpf_arch, flags, &out);
            if rust_arch == target {
                std::fs::copy(&out, out_dir.join(format!("{name}.bpf.o"))).expect("copying the eBPF object");
            }
        }
    }
}

fn compile(source: &Path, inc: &str, bpf_arch: &str, flags: &[&str], out: &Path) {
    let src = source.parent().expect("ebpf/");
    let clang = std::env::var("INGERO_CLANG").unwrap_or_else(|_| "clang".into());
    // -mcpu=v3: 32-bit jumps and ALU (Linux >= 5.1); compare-and-exchange
    // (5.12) only where the source asks for it (not in the compat object).
    let status = Command::new(&clang)
        .args(["-target", "bpf", "-mcpu=v3", "-O2", "-g", "-Wall", "-Werror"])
        .args(flags)
        .arg(format!("-D__TARGET_ARCH_{bpf_arch}"))
        .arg(format!("-I{inc}"))
        .arg(format!("-I{}", src.display()))
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("clang failed to compile {} {flags:?} for {bpf_arch} ({s})", source.display()),
        Err(e) => panic!("cannot run `{clang}` ({e}): apt-get install clang libbpf-dev linux-libc-dev"),
    }
}
