//! `ingero-agent check`: can this host run the agent? Each failure says how to fix it.

use std::path::Path;

pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
    pub fix: &'static str,
}

fn cap_eff() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("CapEff:").map(|v| u64::from_str_radix(v.trim(), 16).unwrap_or(0)))
        })
        .unwrap_or(0)
}

/// Mounts tracefs when it is missing (uprobes are created through it).
pub fn ensure_tracefs() -> Result<(), String> {
    let p = Path::new("/sys/kernel/tracing");
    if p.join("uprobe_events").exists() {
        return Ok(());
    }
    let src = std::ffi::CString::new("nodev").expect("static");
    let target = std::ffi::CString::new("/sys/kernel/tracing").expect("static");
    let fstype = std::ffi::CString::new("tracefs").expect("static");
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("mount -t tracefs nodev /sys/kernel/tracing failed: {}", std::io::Error::last_os_error()))
    }
}

pub fn run_checks() -> Vec<Check> {
    let mut out = Vec::new();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let (maj, min) = {
        let mut it = release.split(|c: char| !c.is_ascii_digit()).filter_map(|s| s.parse::<u32>().ok());
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    };
    out.push(Check {
        name: "kernel",
        ok: (maj, min) >= (5, 15),
        detail: release.clone(),
        fix: "run on Linux 5.15 or newer (uprobe cookies, tp_btf, ring buffers)",
    });
    out.push(Check {
        name: "BTF",
        ok: Path::new("/sys/kernel/btf/vmlinux").exists(),
        detail: "/sys/kernel/btf/vmlinux".into(),
        fix: "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (all major distributions since 2021)",
    });
    let tracefs = ensure_tracefs();
    out.push(Check {
        name: "tracefs",
        ok: tracefs.is_ok(),
        detail: tracefs.err().unwrap_or_else(|| "/sys/kernel/tracing".into()),
        fix: "mount -t tracefs nodev /sys/kernel/tracing (in Kubernetes: hostPath mount of /sys/kernel/tracing)",
    });
    out.push(Check {
        name: "uprobes",
        ok: Path::new("/sys/bus/event_source/devices/uprobe").exists(),
        detail: "/sys/bus/event_source/devices/uprobe".into(),
        fix: "use a kernel with CONFIG_UPROBE_EVENTS=y",
    });
    let caps = cap_eff();
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    let ok = has(21) || (has(39) && has(38));
    out.push(Check {
        name: "capabilities",
        ok,
        detail: format!("CapEff={caps:#x} (need CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN)"),
        fix: "run as root, or grant CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_SYS_RESOURCE",
    });
    out.push(Check {
        name: "cgroup v2",
        ok: Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
            || Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists(),
        detail: "/sys/fs/cgroup".into(),
        fix: "boot with systemd.unified_cgroup_hierarchy=1 (cgroup v1 hosts get process-level attribution only)",
    });
    out
}

/// Which traced libraries are mapped, by which processes.
pub fn libraries() -> Vec<(String, Vec<u32>)> {
    let mut by: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    for pid in crate::probes::libs::pids(None) {
        for f in crate::probes::libs::scan_pid(pid) {
            by.entry(f.mapped_as).or_default().push(pid);
        }
    }
    by.into_iter().collect()
}
