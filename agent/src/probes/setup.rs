// SPDX-License-Identifier: Apache-2.0
//! Opening the eBPF object and loading the programs that are optional on
//! some kernels (the library hold, the lookup notice), each saying what is
//! lost where the kernel refuses it.

use std::path::Path;

use aya::{Ebpf, EbpfLoader};

use super::features::{Features, Object};
use super::handles::{as_uprobe, prog};
use crate::error::{Error, Result};

/// The compiled programs (built by build.rs from ebpf/*.c): for Linux
/// >= 5.17, and the compat build for 5.10 to 5.16 (`features::Object`).
pub(crate) static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ingero.bpf.o"));
pub(crate) static COMPAT_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ingero-compat.bpf.o"));

/// LRU maps sized with the node (`lru_entries`): calls and block requests in
/// progress, and each thread's current call.
const LRU_MAPS: [&str; 3] = ["inflight", "io_inflight", "thread_calls"];

pub(super) const NO_HOLD: &str = "no library hold on this kernel: a library dlopen'd and called at once misses its first calls (until the agent, woken at the library's first lookup, has probed it)";

/// Where nothing can be held: a CUDA/NCCL library's first lookup in a
/// process wakes the agent (ebpf/libnotify.bpf.c) instead of its next rescan.
/// Parses the object and creates its maps; no program is loaded yet.
pub(super) fn open_object(object: Object) -> Result<Ebpf> {
    // EbpfLoader::new() parses the kernel's BTF for CO-RE itself; the loader
    // (and that parse) is dropped on return, before the second parse, for
    // the tp_btf attach points. Two parses alive at once were the agent's
    // peak memory (2 x ~15 MB).
    let mut loader = EbpfLoader::new();
    let lru_entries = super::memory::lru_entries(super::memory::possible_cpus());
    for name in LRU_MAPS {
        loader.map_max_entries(name, lru_entries);
    }
    Ok(loader.load(if object == Object::Full { OBJECT } else { COMPAT_OBJECT })?)
}

pub(super) fn load_notice(ebpf: &mut Ebpf) -> bool {
    load_or_warn(
        ebpf,
        "dlsym_notify",
        "no library lookup notice: a library dlopen'd at run time is found at the next rescan",
    )
}

/// Loads one uprobe program; where the kernel refuses it, says what is lost.
fn load_or_warn(ebpf: &mut Ebpf, name: &str, lost: &str) -> bool {
    let loaded =
        prog(ebpf, name).and_then(as_uprobe).and_then(|p| p.load().map_err(Error::program(format!("loading {name}"))));
    if let Err(e) = &loaded {
        tracing::warn!(error = %e, "{lost}");
    }
    loaded.is_ok()
}

/// The hold at a new library's first lookup (ebpf/libload.bpf.c): only where
/// the kernel has what it needs (`Features::library_hold`).
pub(super) fn load_hold(ebpf: &mut Ebpf, features: &Features) -> bool {
    if !features.library_hold() {
        tracing::warn!("{NO_HOLD}");
        return false;
    }
    load_or_warn(ebpf, "dlsym_entry", "no library hold: a library dlopen'd and called at once misses its first calls")
}

/// A cgroup v2 directory's id (its inode number) and its depth below the
/// hierarchy's root (the mount point, whose parent is another filesystem).
pub(super) fn cgroup_id_and_level(dir: &Path) -> std::io::Result<(u64, u32)> {
    use std::os::unix::fs::MetadataExt;
    let dir = dir.canonicalize()?;
    let md = std::fs::metadata(&dir)?;
    let mut level = 0;
    let mut p = dir.as_path();
    while let Some(parent) = p.parent() {
        if std::fs::metadata(parent)?.dev() != md.dev() {
            break;
        }
        level += 1;
        p = parent;
    }
    Ok((md.ino(), level))
}
