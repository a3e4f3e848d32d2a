// SPDX-License-Identifier: Apache-2.0
//! The CUDA runtime linked statically (`nvcc`'s default, `-cudart static`):
//! no libcudart.so is mapped, its functions live in the executable or in
//! another library. Such a process still maps the driver (libcuda.so.1,
//! always dynamic), so its other executable mappings are searched once each
//! for the runtime's symbols.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use object::{Object, ObjectSymbol};

use super::libs::Found;
use super::ops::Lib;

/// The symbol that marks a CUDA runtime: every version exports it.
const MARKER: &str = "cudaLaunchKernel";

/// Files already searched, by maps (device, inode): each is read once.
#[derive(Debug, Default)]
pub(crate) struct StaticRuntimes {
    searched: HashMap<(u64, u64), bool>,
}

impl StaticRuntimes {
    /// Like `libs::scan_pid`, and where the process maps the driver but no
    /// libcudart, the executable or library that holds a statically linked runtime.
    pub(crate) fn scan_pid(&mut self, pid: u32) -> Vec<Found> {
        let Ok(m) = crate::podfs::read_maps(pid) else { return Vec::new() };
        let mut found = super::libs::parse_maps(pid, &m, Path::new("/proc"));
        let driver_only = found.iter().any(|f| f.lib == Lib::Cuda) && !found.iter().any(|f| f.lib == Lib::Cudart);
        if driver_only {
            found.extend(self.find(pid, &m, Path::new("/proc")));
        }
        found
    }

    /// Executable mappings of `pid` (from its maps text) that hold a CUDA
    /// runtime, as libraries to probe with the runtime's ops. Only called
    /// for processes that map the driver but no libcudart.
    pub(crate) fn find(&mut self, pid: u32, maps: &str, proc_root: &Path) -> Vec<Found> {
        let mut out = Vec::new();
        for m in crate::procmaps::lines(maps).filter(|m| m.executable() && m.live_file()) {
            let name = m.path.rsplit('/').next().unwrap_or("");
            if Lib::from_file_name(name).is_some() || is_system_library(name) {
                continue;
            }
            let id = m.id();
            let map_file = proc_root.join(pid.to_string()).join("map_files").join(m.range);
            let hit = *self.searched.entry(id).or_insert_with(|| has_symbol(&map_file, MARKER).unwrap_or(false));
            if hit && !out.iter().any(|x: &Found| x.id == id) {
                out.push(Found {
                    id,
                    path: proc_root.join(pid.to_string()).join("root").join(m.path.trim_start_matches('/')),
                    map_file: Some(map_file),
                    mapped_as: m.path.to_string(),
                    lib: Lib::Cudart,
                    pid,
                });
            }
        }
        out
    }
}

/// glibc, the C++ runtime and the loader never hold a CUDA runtime.
fn is_system_library(name: &str) -> bool {
    ["libc.so", "libc-", "libm.so", "libpthread", "libdl", "librt", "ld-linux", "libstdc++", "libgcc_s", "libz.so"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// True when the ELF file defines `symbol` (dynamic or static symbol table).
/// Read with read(2), not mmap(2): an mmap waits while a thread is held at
/// a library lookup (a sleepable uprobe), and this runs during such holds.
pub(crate) fn has_symbol(path: &Path, symbol: &str) -> std::io::Result<bool> {
    let cache = crate::podfs::Capped::new(crate::podfs::open_regular(path)?);
    let Ok(obj) = crate::podfs::parse_elf(&cache, crate::podfs::MAX_ELF_TABLES) else { return Ok(false) };
    let defines = |s: object::Symbol<'_, '_, &crate::podfs::Capped<File>>| !s.is_undefined() && s.name() == Ok(symbol);
    Ok(obj.dynamic_symbols().any(defines) || obj.symbols().any(defines))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_runtime_in_an_executable_and_not_in_the_agent() {
        // This test binary links no CUDA runtime.
        let me = std::env::current_exe().unwrap();
        assert!(!has_symbol(&me, MARKER).unwrap());
        assert!(has_symbol(&me, "main").unwrap());
        assert!(is_system_library("libc.so.6") && !is_system_library("train_cuda"));
    }
}
