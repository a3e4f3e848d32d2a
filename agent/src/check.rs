// SPDX-License-Identifier: Apache-2.0
//! `ingero-agent check`: can this host run the agent? Read-only (it mounts
//! and changes nothing); each finding says how to fix it. Features are
//! probed (the programs are loaded and the tracepoints attached, then
//! dropped), never inferred from a kernel version.

use std::path::Path;

use crate::attribution::cgroup;
use crate::probes::features::{Feature, Object};
use crate::probes::load::{Probes, own_pid_namespace};
use crate::probes::memory::MapMemory;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    /// The agent runs, with less (e.g. no pod attribution).
    Warn,
    /// The agent cannot run.
    Fail,
}

#[derive(Debug)]
pub struct Check {
    pub name: &'static str,
    pub level: Level,
    pub detail: String,
    pub fix: &'static str,
    /// What `fix` is: how to fix it, or (a missing kernel feature) what is lost.
    pub hint: &'static str,
}

impl Check {
    fn new(name: &'static str, ok: bool, detail: impl Into<String>, fix: &'static str) -> Check {
        Check { name, level: if ok { Level::Ok } else { Level::Fail }, detail: detail.into(), fix, hint: "fix" }
    }

    fn warn_unless(name: &'static str, ok: bool, detail: impl Into<String>, fix: &'static str) -> Check {
        Check { name, level: if ok { Level::Ok } else { Level::Warn }, detail: detail.into(), fix, hint: "fix" }
    }

    /// A kernel feature: present, or missing with what the agent loses.
    fn feature(f: Feature, has: bool) -> Check {
        let detail = format!("{} (Linux {}+)", if has { "yes" } else { "missing" }, f.since);
        Check { name: f.name, level: if has { Level::Ok } else { Level::Warn }, detail, fix: f.without, hint: "lost" }
    }

    pub fn ok(&self) -> bool {
        self.level != Level::Fail
    }
}

fn cap_eff() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("CapEff:").map(|v| u64::from_str_radix(v.trim(), 16).unwrap_or(0)))
        })
        .unwrap_or(0)
}

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// What the agent needs before it loads anything (cheap; `run` checks these).
pub fn run_checks() -> Vec<Check> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let mut out = vec![
        Check::warn_unless(
            "kernel",
            true,
            format!("{release} {}", std::env::consts::ARCH),
            "the programs are built for x86_64 and aarch64",
        ),
        Check::new(
            "BTF",
            Path::new("/sys/kernel/btf/vmlinux").exists(),
            "/sys/kernel/btf/vmlinux",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (all major distributions since 2021)",
        ),
        Check::new(
            "uprobes",
            Path::new("/sys/bus/event_source/devices/uprobe/type").exists(),
            "perf PMU (tracefs not needed)",
            "use a kernel with CONFIG_UPROBE_EVENTS=y",
        ),
    ];
    let caps = cap_eff();
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    out.push(Check::new(
        "capabilities",
        has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)),
        format!("CapEff={caps:#x}: BPF+PERFMON or SYS_ADMIN"),
        "run as root, or grant CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_SYS_RESOURCE, CAP_SYS_NICE",
    ));
    out.push(Check::warn_unless(
        "process scans",
        has(CAP_SYS_PTRACE) && has(CAP_DAC_READ_SEARCH),
        if has(CAP_SYS_PTRACE) && has(CAP_DAC_READ_SEARCH) {
            "SYS_PTRACE + DAC_READ_SEARCH: every process".to_string()
        } else {
            "no SYS_PTRACE/DAC_READ_SEARCH: own user's only".to_string()
        },
        "grant CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (the Helm chart does)",
    ));
    out.push(Check::warn_unless(
        "cgroup v2",
        Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
            || Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists(),
        "/sys/fs/cgroup",
        "boot with systemd.unified_cgroup_hierarchy=1 (cgroup v1 hosts get process-level attribution only)",
    ));
    out.push(pid_namespace());
    out.push(cgroup_namespace());
    out
}

fn pid_namespace() -> Check {
    let detail = match own_pid_namespace() {
        None => "initial: the whole host, host pids".to_string(),
        Some(ino) => format!("pid:[{ino}] (kind node?): this namespace and below, its pids"),
    };
    Check::warn_unless("pid namespace", true, detail, "run with hostPID: true to trace the whole host")
}

fn cgroup_namespace() -> Check {
    let mount = Path::new("/sys/fs/cgroup");
    if !cgroup::in_private_namespace() {
        return Check::warn_unless("cgroup namespace", true, "initial", "");
    }
    let root = cgroup::namespace_root(mount);
    let found = root != mount;
    Check::warn_unless(
        "cgroup namespace",
        found,
        if found {
            format!("private, root {}", root.display())
        } else {
            "private; own cgroup not under /sys/fs/cgroup".to_string()
        },
        "mount the host's /sys/fs/cgroup (read-only hostPath, as the Helm chart does)",
    )
}

/// Loads the programs and attaches the tracepoints (then drops them): the
/// feature probe for attach cookies, tracepoint prototypes and ring
/// buffers; and measures the kernel memory the maps take on this node.
pub fn load_checks() -> Vec<Check> {
    let probes = match Probes::load() {
        Ok(p) => p,
        Err(e) => {
            return vec![Check::new(
                "eBPF programs",
                false,
                e.to_string(),
                "see the error: a kernel without BTF, tp_btf or ring buffers (Linux 5.10+ has them), or missing capabilities",
            )];
        }
    };
    let object = match probes.features.object() {
        Object::Full => "full",
        Object::Compat => "compat, for Linux 5.10-5.16",
    };
    let mut out = vec![Check::new("eBPF programs", true, format!("load ({object}); tracepoints attach"), "")];
    out.extend(probes.features.table().iter().map(|&(f, has)| Check::feature(f, has)));
    if let Some(ns) = probes.trap_ns {
        // A launch-bound training loop makes ~10k launches a second.
        let percent = ns * 10_000.0 / 1e9 * 100.0;
        out.push(Check::new(
            "trap cost",
            true,
            format!("{ns:.0} ns a probed call; at 10,000 launches/s {percent:.1}% of a CPU"),
            "",
        ));
    }
    let duty = probes.features.multi_links() && probes.features.object() == Object::Full;
    out.push(Check::warn_unless(
        "trap budget",
        duty,
        if duty {
            "kept: launch probes cycled over --trap-budget"
        } else {
            "not kept: no uprobe_multi, every probe on"
        },
        "Linux 6.6+ (or leave --no-uprobe-multi off)",
    ));
    if let Ok(mm) = MapMemory::of_pid(std::process::id()) {
        let limit = own_memory_limit();
        let fits = limit.is_none_or(|l| mm.total() * 2 <= l);
        let limit_txt = limit.map_or("no memory limit".to_string(), |l| format!("limit {} MiB", l >> 20));
        out.push(Check::warn_unless(
            "kernel memory",
            fits,
            format!(
                "maps {} MiB ({} CPUs; {} MiB at 256); {limit_txt}",
                mm.total() >> 20,
                mm.possible_cpus,
                mm.at_cpus(256) >> 20
            ),
            "raise the agent's memory limit (Helm: agent.resources.limits.memory) to at least twice the maps' size",
        ));
    }
    drop(probes);
    out
}

/// memory.max of the agent's own cgroup, when there is one.
fn own_memory_limit() -> Option<u64> {
    let mount = Path::new("/sys/fs/cgroup");
    let own = cgroup::of_pid(std::process::id())?;
    let dir = cgroup::resolve(&cgroup::namespace_root(mount), &own);
    std::fs::read_to_string(dir.join("memory.max")).ok()?.trim().parse().ok()
}

/// Which traced libraries are mapped, by which processes.
pub fn libraries() -> Vec<(String, Vec<u32>)> {
    let mut by: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    for pid in crate::probes::libs::pids(None) {
        for f in crate::probes::libs::scan_pid(pid) {
            if f.lib == crate::probes::ops::Lib::Libc {
                continue;
            }
            by.entry(f.mapped_as).or_default().push(pid);
        }
    }
    by.into_iter().collect()
}
