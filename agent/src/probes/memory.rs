// SPDX-License-Identifier: Apache-2.0
//! Kernel memory held by the agent's BPF maps, read the way the kernel
//! charges it: `memlock` of every `anon_inode:bpf-map` fd in
//! `/proc/PID/fdinfo` (since Linux 5.11 charged to the memory cgroup of the
//! process that created the maps, i.e. the agent's pod). Per-CPU maps grow
//! with the number of *possible* CPUs, so the same agent needs more on a
//! 224-CPU GPU node than on a laptop: `at_cpus` extrapolates.

use std::path::Path;

/// Map types whose values are replicated per possible CPU.
const PERCPU_TYPES: [u32; 3] = [
    5,  // BPF_MAP_TYPE_PERCPU_HASH
    6,  // BPF_MAP_TYPE_PERCPU_ARRAY
    10, // BPF_MAP_TYPE_LRU_PERCPU_HASH
];
const HASH: u32 = 1;
const LRU_HASH: u32 = 9;
const BPF_F_NO_PREALLOC: u32 = 1;

/// One map as fdinfo describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapInfo {
    pub map_type: u32,
    pub max_entries: u64,
    pub map_flags: u32,
    pub memlock: u64,
}

impl MapInfo {
    /// Parses one fdinfo text; None when it is not a BPF map.
    pub fn parse(text: &str) -> Option<MapInfo> {
        let mut m = MapInfo::default();
        let mut is_map = false;
        for line in text.lines() {
            let Some((k, v)) = line.split_once(':') else { continue };
            let v = v.trim();
            match k {
                "map_type" => {
                    m.map_type = v.parse().ok()?;
                    is_map = true;
                }
                "max_entries" => m.max_entries = v.parse().ok()?,
                "map_flags" => m.map_flags = u32::from_str_radix(v.trim_start_matches("0x"), 16).ok()?,
                "memlock" => m.memlock = v.parse().ok()?,
                _ => {}
            }
        }
        is_map.then_some(m)
    }

    /// The part of `memlock` that scales with the number of possible CPUs.
    fn per_cpu_bytes(&self, cpus: u64) -> u64 {
        if PERCPU_TYPES.contains(&self.map_type) {
            return self.memlock;
        }
        // A preallocated shared hash keeps one spare element per CPU.
        if self.map_type == HASH && self.map_flags & BPF_F_NO_PREALLOC == 0 && self.max_entries > 0 {
            return self.memlock * cpus / (self.max_entries + cpus);
        }
        0
    }
}

/// The maps of one process.
#[derive(Debug, Clone, Default)]
pub struct MapMemory {
    pub maps: Vec<MapInfo>,
    /// Possible CPUs of this machine (what per-CPU maps were sized for).
    pub possible_cpus: u64,
}

impl MapMemory {
    /// Reads every BPF map fd of `pid` (`/proc/PID/fdinfo`).
    pub fn of_pid(pid: u32) -> std::io::Result<MapMemory> {
        Self::read(Path::new(&format!("/proc/{pid}")))
    }

    fn read(proc_pid: &Path) -> std::io::Result<MapMemory> {
        let mut maps = Vec::new();
        for e in std::fs::read_dir(proc_pid.join("fd"))?.flatten() {
            let is_map = std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf-map");
            if !is_map {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(proc_pid.join("fdinfo").join(e.file_name())) {
                maps.extend(MapInfo::parse(&text));
            }
        }
        Ok(MapMemory { maps, possible_cpus: possible_cpus() })
    }

    /// Bytes charged now.
    pub fn total(&self) -> u64 {
        self.maps.iter().map(|m| m.memlock).sum()
    }

    /// Bytes the same maps would need on a node with `cpus` possible CPUs.
    pub fn at_cpus(&self, cpus: u64) -> u64 {
        let here = self.possible_cpus.max(1);
        let (lru_here, lru_there) = (u64::from(lru_entries(here)), u64::from(lru_entries(cpus)));
        self.maps
            .iter()
            .map(|m| {
                // The LRU maps the loader sizes by CPU count (load::LRU_MAPS).
                if m.map_type == LRU_HASH && m.max_entries == lru_here {
                    return m.memlock * lru_there / lru_here;
                }
                let pc = m.per_cpu_bytes(here);
                m.memlock - pc + pc * cpus / here
            })
            .sum()
    }
}

/// Number of possible CPUs (`/sys/devices/system/cpu/possible`, e.g. `0-223`).
pub fn possible_cpus() -> u64 {
    std::fs::read_to_string("/sys/devices/system/cpu/possible").ok().and_then(|s| parse_cpu_list(&s)).unwrap_or(1)
}

fn parse_cpu_list(s: &str) -> Option<u64> {
    let mut n = 0;
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<u64>().ok()? - a.parse::<u64>().ok()? + 1,
            None => {
                part.parse::<u64>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// Entries of an LRU map on a node with `cpus` possible CPUs. The kernel's
/// common LRU keeps up to 128 free entries per CPU (LOCAL_FREE_TARGET): at
/// 16,384 entries and 128+ CPUs the per-CPU lists hold them all and live
/// entries (a thread's call in progress) are evicted while the map is far
/// from full. Twice that per CPU, never below the built-in 16,384.
pub(crate) fn lru_entries(cpus: u64) -> u32 {
    (cpus.saturating_mul(256)).clamp(16_384, 1 << 20) as u32
}

/// Logs the maps' kernel memory at load, and keeps it for the metrics.
pub(crate) fn log_map_memory(stats: &crate::loop_config::LoopStats) {
    if let Ok(mm) = MapMemory::of_pid(std::process::id()) {
        stats.kernel_map_bytes.store(mm.total(), std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            kernel_map_mib = mm.total() >> 20,
            possible_cpus = mm.possible_cpus,
            at_256_cpus_mib = mm.at_cpus(256) >> 20,
            "BPF maps loaded"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fdinfo_and_cpu_lists() {
        let t = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nmap_type:\t5\nkey_size:\t8\n\
                 value_size:\t1040\nmax_entries:\t1024\nmap_flags:\t0x0\nmap_extra:\t0x0\n\
                 memlock:\t2260992\nmap_id:\t42\nfrozen:\t0\n";
        let m = MapInfo::parse(t).unwrap();
        assert_eq!((m.map_type, m.max_entries, m.memlock), (5, 1024, 2_260_992));
        assert!(MapInfo::parse("pos:\t0\nflags:\t02\n").is_none());
        assert_eq!(parse_cpu_list("0-223\n"), Some(224));
        assert_eq!(parse_cpu_list("0,2-3"), Some(3));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn per_cpu_maps_scale_with_cpus_and_shared_ones_do_not() {
        let mm = MapMemory {
            maps: vec![
                MapInfo { map_type: 5, max_entries: 10, map_flags: 0, memlock: 2000 },
                MapInfo { map_type: 2, max_entries: 10, map_flags: 0, memlock: 500 },
                // Preallocated hash: (10 + 2 spare) elements of 100 bytes.
                MapInfo { map_type: 1, max_entries: 10, map_flags: 0, memlock: 1200 },
            ],
            possible_cpus: 2,
        };
        assert_eq!(mm.total(), 3700);
        assert_eq!(mm.at_cpus(2), 3700);
        assert_eq!(mm.at_cpus(256), 2000 * 128 + 500 + 1000 + 100 * 256);
    }

    #[test]
    fn lru_maps_sized_by_the_loader_grow_with_cpus() {
        let mm = MapMemory {
            maps: vec![
                // One of load::LRU_MAPS (16,384 entries below 64 CPUs) and a fixed-size LRU map.
                MapInfo { map_type: 9, max_entries: 16_384, map_flags: 0, memlock: 1_000_000 },
                MapInfo { map_type: 9, max_entries: 65_536, map_flags: 0, memlock: 4_000_000 },
            ],
            possible_cpus: 2,
        };
        assert_eq!(mm.at_cpus(2), 5_000_000);
        assert_eq!(mm.at_cpus(256), 4_000_000 + 4_000_000, "65,536 entries at 256 CPUs");
    }

    #[test]
    fn lru_maps_keep_twice_every_cpus_free_list() {
        assert_eq!(lru_entries(2), 16_384, "the built-in size on small nodes");
        assert_eq!(lru_entries(64), 16_384);
        assert_eq!(lru_entries(128), 32_768, "128 CPUs x 128 free entries would hold all 16,384");
        assert_eq!(lru_entries(224), 57_344);
        assert_eq!(lru_entries(256), 65_536);
    }
}
