// SPDX-License-Identifier: Apache-2.0
//! cgroup path → container id and pod UID, for both kubelet cgroup drivers,
//! containerd, CRI-O and docker, cgroup v1 and v2, every QoS class.

use std::path::{Path, PathBuf};

/// What a cgroup path says about its owner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CgroupOwner {
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
    pub qos: Option<&'static str>,
}

/// Parses e.g.
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice/cri-containerd-<64hex>.scope` (systemd)
/// or `/kubepods/burstable/pod1234-abcd/<64hex>` (cgroupfs).
pub(crate) fn parse(path: &str) -> CgroupOwner {
    let mut o = CgroupOwner::default();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        let s = seg.strip_suffix(".slice").or_else(|| seg.strip_suffix(".scope")).unwrap_or(seg);
        // Guaranteed pods sit directly under kubepods; the others under a QoS level.
        if s.contains("besteffort") {
            o.qos = Some("besteffort");
        } else if s.contains("burstable") {
            o.qos = Some("burstable");
        } else if (s == "kubepods" || s.starts_with("kubepods-pod")) && o.qos.is_none() {
            o.qos = Some("guaranteed");
        }
        if let Some(i) = s.rfind("pod") {
            let uid = &s[i + 3..];
            let uid = uid.replace('_', "-");
            if is_uid(&uid) {
                o.pod_uid = Some(uid);
                continue;
            }
        }
        let id = ["cri-containerd-", "crio-", "docker-", "containerd-", "libpod-"]
            .iter()
            .find_map(|p| s.strip_prefix(p))
            .unwrap_or(s);
        if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            o.container_id = Some(id.to_string());
        }
    }
    if o.pod_uid.is_none() && o.container_id.is_none() {
        o.qos = None;
    }
    o
}

fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.bytes()
            .enumerate()
            .all(|(i, b)| if [8, 13, 18, 23].contains(&i) { b == b'-' } else { b.is_ascii_hexdigit() })
}

/// The process's cgroup v2 path (the `0::` line), or the first v1 path.
pub(crate) fn of_pid(pid: u32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("0::").map(String::from))
        .or_else(|| s.lines().find_map(|l| l.splitn(3, ':').nth(2).map(String::from)))
}

/// cgroup v2 id (= inode of the cgroup directory) of a path as
/// /proc/PID/cgroup gives it, relative to the root of the agent's cgroup
/// namespace (`ns_root`, a directory of the mounted hierarchy).
pub(crate) fn id_of(ns_root: &Path, path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(resolve(ns_root, path)).map(|m| m.ino()).unwrap_or(0)
}

/// A /proc/PID/cgroup path as a directory of the mounted hierarchy. From a
/// private cgroup namespace (an agent pod's default) the cgroups of other
/// pods read `/../../kubepods.slice/…`: relative to the namespace root, so
/// `..` is resolved against it, lexically (never past the mount).
pub(crate) fn resolve(ns_root: &Path, path: &str) -> PathBuf {
    let mut out = ns_root.to_path_buf();
    for seg in path.split('/').filter(|s| !s.is_empty() && *s != ".") {
        if seg == ".." {
            out.pop();
        } else {
            out.push(seg);
        }
    }
    out
}

/// The initial cgroup namespace's inode (PROC_CGROUP_INIT_INO, fixed kernel ABI).
const PROC_CGROUP_INIT_INO: u64 = 0xEFFF_FFFB;

/// True when the agent runs in a cgroup namespace of its own.
pub(crate) fn in_private_namespace() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/cgroup").is_ok_and(|m| m.ino() != PROC_CGROUP_INIT_INO)
}

/// Where the root of the agent's cgroup namespace sits in the hierarchy
/// mounted at `mount`: the mount itself in the initial namespace (or when
/// the mount was made inside the namespace); otherwise the directory that
/// holds the agent, less the agent's own path within its namespace.
pub(crate) fn namespace_root(mount: &Path) -> PathBuf {
    let me = std::process::id();
    let own = of_pid(me).unwrap_or_default();
    let holds_me = |dir: &Path| {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .is_ok_and(|s| s.lines().any(|l| l.trim().parse::<u32>().ok() == Some(me)))
    };
    if !in_private_namespace() || holds_me(&resolve(mount, &own)) {
        return mount.to_path_buf();
    }
    let depth = own.split('/').filter(|s| !s.is_empty()).count();
    let mut stack = vec![mount.to_path_buf()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        if holds_me(&dir) {
            let mut root = dir;
            for _ in 0..depth {
                root.pop();
            }
            return root;
        }
        seen += 1;
        if seen > 100_000 {
            break;
        }
        if let Ok(rd) = std::fs::read_dir(&dir) {
            stack.extend(rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
    }
    tracing::warn!(mount = %mount.display(), "own cgroup not found in the mounted hierarchy; cgroup ids of other pods may be missing");
    mount.to_path_buf()
}

/// The `--cgroup-root` subtree, checked against a process's own cgroup
/// before the agent probes it. The kernel programs check the scope too, but
/// a probe placed on a file fires in every process that maps it: a process
/// outside the scope must never be why a file is probed.
pub(crate) struct Scope {
    dir: PathBuf,
    ns_root: PathBuf,
}

impl Scope {
    pub(crate) fn new(dir: &Path, mount: &Path) -> Scope {
        let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        Scope { dir: canon(dir), ns_root: canon(&namespace_root(mount)) }
    }

    /// The cgroup of `pid` when it lives outside the subtree (None when
    /// inside, or gone).
    pub(crate) fn outside(&self, pid: u32) -> Option<String> {
        let path = of_pid(pid)?;
        (!resolve(&self.ns_root, &path).starts_with(&self.dir)).then_some(path)
    }
}

/// Walks the cgroup tree: id (inode) → path, for naming cgroups in reports.
/// cgroup id → path relative to the mount; only under `scope` when the agent
/// is scoped with --cgroup-root (that subtree is its "node").
pub(crate) fn paths(
    mount: &std::path::Path,
    scope: Option<&std::path::Path>,
) -> std::collections::HashMap<u64, String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::HashMap::new();
    let mut stack = vec![scope.unwrap_or(mount).to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(m) = std::fs::metadata(&dir) {
            let rel = dir.strip_prefix(mount).map(|p| format!("/{}", p.display())).unwrap_or_default();
            out.insert(m.ino(), rel);
        }
        if let Ok(rd) = std::fs::read_dir(&dir) {
            stack.extend(rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
        if out.len() > 100_000 {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn both_drivers_all_runtimes_and_qos() {
        let sd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1d2c3b4a_1111_2222_3333_444455556666.slice/cri-containerd-{C}.scope"
        );
        let o = parse(&sd);
        assert_eq!(o.pod_uid.as_deref(), Some("1d2c3b4a-1111-2222-3333-444455556666"));
        assert_eq!(o.container_id.as_deref(), Some(C));
        assert_eq!(o.qos, Some("burstable"));
        let fs = format!("/kubepods/besteffort/pod1d2c3b4a-1111-2222-3333-444455556666/{C}");
        let o = parse(&fs);
        assert_eq!((o.pod_uid.is_some(), o.container_id.as_deref(), o.qos), (true, Some(C), Some("besteffort")));
        let g = format!("/kubepods.slice/kubepods-pod1d2c3b4a_1111_2222_3333_444455556666.slice/crio-{C}.scope");
        assert_eq!(parse(&g).qos, Some("guaranteed"));
        assert_eq!(parse(&format!("/system.slice/docker-{C}.scope")).container_id.as_deref(), Some(C));
        assert_eq!(parse("/user.slice/user-0.slice/session-1.scope"), CgroupOwner::default());
        // Seen from a private cgroup namespace: the owner is still read.
        let o = parse(&format!(
            "/../../kubepods-besteffort.slice/kubepods-besteffort-pod1d2c3b4a_1111_2222_3333_444455556666.slice/cri-containerd-{C}.scope"
        ));
        assert_eq!((o.pod_uid.is_some(), o.container_id.as_deref()), (true, Some(C)));
    }

    #[test]
    fn a_scope_holds_the_processes_of_its_subtree_only() {
        let mount = Path::new("/sys/fs/cgroup");
        let mount = if mount.join("cgroup.controllers").exists() { mount.to_path_buf() } else { mount.join("unified") };
        let own = of_pid(std::process::id()).expect("reading /proc/self/cgroup");
        let mine = resolve(&namespace_root(&mount), &own);
        let me = std::process::id();
        assert_eq!(Scope::new(&mine, &mount).outside(me), None, "own cgroup {}", mine.display());
        // A sibling whose name extends ours is not under ours.
        let sibling = mine.with_file_name(format!("{}-x", mine.file_name().map_or("".into(), |n| n.to_string_lossy())));
        assert_eq!(Scope::new(&sibling, &mount).outside(me).as_ref(), Some(&own));
        assert_eq!(Scope::new(&mine.join("child"), &mount).outside(me).as_ref(), Some(&own));
        assert_eq!(Scope::new(&sibling, &mount).outside(u32::MAX), None, "a process that is gone");
    }

    #[test]
    fn namespace_relative_paths_resolve_against_the_namespace_root() {
        let root = Path::new("/sys/fs/cgroup/kubepods.slice/a.slice/agent.scope");
        assert_eq!(resolve(root, "/"), root);
        assert_eq!(resolve(root, "/../../b.slice/w.scope"), Path::new("/sys/fs/cgroup/kubepods.slice/b.slice/w.scope"));
        assert_eq!(resolve(Path::new("/sys/fs/cgroup"), "/x/y"), Path::new("/sys/fs/cgroup/x/y"));
    }
}
