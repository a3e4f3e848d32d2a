// SPDX-License-Identifier: Apache-2.0
//! Finds CUDA/NCCL libraries mapped by processes, through /proc/PID/maps,
//! opened via /proc/PID/root so libraries inside containers are found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::ops::Lib;

/// One library file mapped by some process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// (device, inode) from the maps line: one attach per distinct file.
    pub id: (u64, u64),
    /// Path that reaches the file from the agent's mount namespace.
    pub path: PathBuf,
    /// `/proc/PID/map_files/START-END` of one of its mappings: reaches the
    /// file even where the path does not (another mount namespace, renamed).
    pub map_file: Option<PathBuf>,
    /// Path as the process sees it.
    pub mapped_as: String,
    pub lib: Lib,
    pub pid: u32,
}

impl Found {
    /// A library file named directly (no process maps it yet).
    pub fn at_path(path: &Path, lib: Lib) -> Found {
        Found {
            id: (0, 0),
            path: path.to_path_buf(),
            map_file: None,
            mapped_as: path.display().to_string(),
            lib,
            pid: 0,
        }
    }
}

/// Parses `/proc/PID/maps` text for traced libraries.
pub fn parse_maps(pid: u32, maps: &str, proc_root: &Path) -> Vec<Found> {
    let mut out: BTreeMap<(u64, u64), Found> = BTreeMap::new();
    for m in crate::procmaps::lines(maps).filter(|m| m.path.starts_with('/')) {
        // A library deleted after it was loaded (an unpacked wheel's temp
        // copy) is still what runs: reached through its mapping alone, never
        // through the path, which may name another file now.
        let (path, deleted) = m.path.strip_suffix(" (deleted)").map_or((m.path, false), |p| (p, true));
        let Some(lib) = path.rsplit('/').next().and_then(Lib::from_file_name) else { continue };
        let map_file = proc_root.join(pid.to_string()).join("map_files").join(m.range);
        out.entry(m.id()).or_insert_with(|| Found {
            id: m.id(),
            path: match deleted {
                true => map_file.clone(),
                false => proc_root.join(pid.to_string()).join("root").join(path.trim_start_matches('/')),
            },
            map_file: Some(map_file),
            mapped_as: m.path.to_string(),
            lib,
            pid,
        });
    }
    out.into_values().collect()
}

/// Libraries mapped by one process (empty when it is gone or unreadable).
pub fn scan_pid(pid: u32) -> Vec<Found> {
    match crate::podfs::read_maps(pid) {
        Ok(m) => parse_maps(pid, &m, Path::new("/proc")),
        Err(_) => Vec::new(),
    }
}

/// Processes to look at: those under the cgroup subtree, or all of them.
pub fn pids(scope: Option<&Path>) -> Vec<u32> {
    match scope {
        Some(dir) => {
            let mut out = Vec::new();
            walk_procs(dir, &mut out, 0);
            out.sort_unstable();
            out.dedup();
            out
        }
        None => std::fs::read_dir("/proc")
            .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default(),
    }
}

fn walk_procs(dir: &Path, out: &mut Vec<u32>, depth: usize) {
    if depth > 32 {
        return;
    }
    if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk_procs(&e.path(), out, depth + 1);
            }
        }
    }
}

/// Directories where CUDA/NCCL libraries usually live on a node.
const WELL_KNOWN_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/local/cuda/lib64",
    "/usr/local/nvidia/lib64",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
];

/// Library files given explicitly (`--lib`, a file or a directory) or found in
/// the usual install locations, ready to probe before any process maps them.
pub fn well_known(extra: &[PathBuf]) -> Vec<Found> {
    use std::os::unix::fs::MetadataExt;
    let mut files: Vec<PathBuf> = Vec::new();
    for d in WELL_KNOWN_DIRS.iter().map(PathBuf::from).chain(extra.iter().cloned()) {
        if d.is_file() {
            files.push(d);
        } else if let Ok(rd) = std::fs::read_dir(&d) {
            files.extend(rd.flatten().map(|e| e.path()));
        }
    }
    let mut out: BTreeMap<(u64, u64), Found> = BTreeMap::new();
    for f in files {
        let Some(lib) = f.file_name().and_then(|n| n.to_str()).and_then(Lib::from_file_name) else { continue };
        // Follow symlinks: the id is the real file's.
        let Ok(md) = std::fs::metadata(&f) else { continue };
        if !md.is_file() {
            continue;
        }
        let dev = md.dev();
        // /proc/PID/maps shows the device as major:minor; match its encoding.
        let id = ((libc_major(dev) << 32) | libc_minor(dev), md.ino());
        out.entry(id).or_insert_with(|| Found {
            id,
            path: f.clone(),
            map_file: None,
            mapped_as: f.display().to_string(),
            lib,
            pid: 0,
        });
    }
    out.into_values().collect()
}

fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)
}

fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_versioned_libraries_once_per_file() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 08:01 1234 /usr/lib/libcudart.so.12.9.79
7f0000001000-7f0000002000 r-xp 00001000 08:01 1234 /usr/lib/libcudart.so.12.9.79
7f0000003000-7f0000004000 r-xp 00000000 00:2a 99 /opt/conda/lib/libnccl.so.2
7f0000005000-7f0000006000 r-xp 00000000 08:01 77 /usr/lib/libc.so.6
7f0000007000-7f0000008000 rw-p 00000000 00:00 0 [heap]
7f0000009000-7f000000a000 r-xp 00000000 08:01 55 /tmp/libcuda.so.1 (deleted)
";
        let f = parse_maps(42, maps, Path::new("/proc"));
        assert_eq!(f.len(), 4, "nccl, the deleted driver, libc (for its dlopen) and cudart, each once");
        assert_eq!(f[0].lib, Lib::Nccl);
        assert_eq!(f[0].path, PathBuf::from("/proc/42/root/opt/conda/lib/libnccl.so.2"));
        // Deleted: reached through its mapping only (the path may be another file now).
        assert_eq!((f[1].lib, f[1].mapped_as.as_str()), (Lib::Cuda, "/tmp/libcuda.so.1 (deleted)"));
        assert_eq!(f[1].path, PathBuf::from("/proc/42/map_files/7f0000009000-7f000000a000"));
        assert_eq!(f[2].lib, Lib::Libc);
        assert_eq!(f[3].id, ((8 << 32) | 1, 1234));
        assert_eq!(f[3].mapped_as, "/usr/lib/libcudart.so.12.9.79");
        assert_eq!(f[3].map_file, Some(PathBuf::from("/proc/42/map_files/7f0000000000-7f0000001000")));
    }
}
