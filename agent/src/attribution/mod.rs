// SPDX-License-Identifier: Apache-2.0
//! Who a process is: name, cgroup, container, pod, job.

pub(crate) mod apiserver;
pub(crate) mod cgroup;
pub(crate) mod environ;
pub(crate) mod podresources;

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;

use self::apiserver::{PodMeta, PodWatch};
use self::podresources::Gpus;

/// Where pod metadata comes from; both optional (single-node mode has neither).
#[derive(Debug, Clone, Default)]
pub struct KubeSources {
    pub watch: Option<PodWatch>,
    pub gpus: Option<Gpus>,
}

/// Everything known about one process.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcInfo {
    /// Start time (clock ticks since boot, /proc/PID/stat field 22): with
    /// the pid, what identifies a process (pids are reused).
    pub start_time: u64,
    pub comm: String,
    pub cmdline: String,
    pub cgroup_path: String,
    pub cgroup_id: u64,
    pub owner: cgroup::CgroupOwner,
    pub env: environ::JobEnv,
    pub nccl_comm: Option<String>,
    pub nccl_rank: Option<(i32, i32)>,
    pub libraries: Vec<String>,
    /// The pod, resolved again every window (a pod may appear after its process).
    pub pod: Option<Arc<PodMeta>>,
    /// GPU device ids of the container (kubelet PodResources).
    pub gpus: Option<String>,
    /// A thread of it has made a traced call: its scheduler rows are those
    /// threads' from then on (kept while the process lives, so a window in
    /// which they all slept is no window of its idle threads).
    pub feeds_gpu: bool,
}

impl ProcInfo {
    /// Job identity: the pod's owner (Job, JobSet, PyTorchJob, Deployment…),
    /// else the NCCL communicator, else the torchrun master address, else a bare pod.
    pub(crate) fn job(&self) -> Option<String> {
        let pod = self.pod.as_ref();
        pod.filter(|p| p.owned)
            .map(|p| p.job.clone())
            .or_else(|| self.nccl_comm.clone().map(|c| format!("nccl:{c}")))
            .or_else(|| self.env.master.clone().map(|m| format!("torch:{m}")))
            .or_else(|| pod.map(|p| p.job.clone()))
    }

    /// Container name from the pod, else the short container id.
    pub(crate) fn container(&self) -> Option<String> {
        let id = self.owner.container_id.as_deref();
        self.pod
            .as_ref()
            .and_then(|p| p.container(id))
            .map(String::from)
            .or_else(|| id.map(|c| c[..12.min(c.len())].to_string()))
    }

    fn pod_container(&self, pm: &PodMeta) -> Option<String> {
        pm.container(self.owner.container_id.as_deref()).map(String::from)
    }

    /// Changes whenever what process_meta says about the process changes.
    pub(crate) fn meta_key(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.pod.as_ref().map(|p| (&p.name, &p.job, &p.labels_json)), &self.gpus, &self.nccl_comm).hash(&mut h);
        (&self.libraries, &self.cgroup_path, self.nccl_rank, &self.comm).hash(&mut h);
        h.finish()
    }
}

/// Caches process facts; re-reads a process when asked (exec, first sight).
pub(crate) struct Attributor {
    /// The cgroup v2 mount.
    cgroup_mount: PathBuf,
    /// The root of the agent's cgroup namespace within it (/proc paths are relative to it).
    cgroup_root: PathBuf,
    procs: HashMap<u32, ProcInfo>,
    /// Cached processes found gone at the last prune.
    gone: HashSet<u32>,
    watch: Option<PodWatch>,
    gpus: Option<Gpus>,
    /// This window's pods by UID.
    pods: HashMap<String, Arc<PodMeta>>,
}

impl Attributor {
    pub(crate) fn new(cgroup_root: PathBuf) -> Self {
        // cgroup paths in /proc are relative to the agent's cgroup namespace.
        let ns_root = cgroup::namespace_root(&cgroup_root);
        Attributor {
            cgroup_mount: cgroup_root,
            cgroup_root: ns_root,
            procs: HashMap::new(),
            gone: HashSet::new(),
            watch: None,
            gpus: None,
            pods: HashMap::new(),
        }
    }

    pub(crate) fn with_kubernetes(mut self, watch: Option<PodWatch>, gpus: Option<Gpus>) -> Self {
        self.watch = watch;
        self.gpus = gpus;
        self
    }

    /// Called once per window: takes the current pods, and re-reads the cgroup
    /// of processes not yet placed in a container, so "unknown" is never final.
    /// True when a cached process's name could not be read: it is gone
    /// from /proc (`rename`).
    pub(crate) fn begin_window(&mut self) -> bool {
        if let Some(w) = &self.watch {
            self.pods = w.snapshot();
        }
        let unnamed = self.rename();
        for (pid, p) in self.procs.iter_mut() {
            if p.owner.pod_uid.is_none() && p.owner.container_id.is_none() {
                let path = cgroup::of_pid(*pid).map(|c| mount_relative(&self.cgroup_mount, &self.cgroup_root, &c));
                if let Some(path) = path.filter(|path| *path != p.cgroup_path) {
                    p.cgroup_id = cgroup::id_of(&self.cgroup_mount, &path);
                    p.owner = cgroup::parse(&path);
                    p.cgroup_path = path;
                }
            }
        }
        unnamed
    }

    /// Names as they are now: a process renames itself after it was first
    /// read (`prctl(PR_SET_NAME)`, `setproctitle`, PyTorch's DataLoader
    /// workers after their fork, vLLM's engine), and rows carry the name of
    /// their window. One read of `/proc/PID/comm` per cached process a
    /// window (the task's lock only), for the same process (a reused pid is
    /// pruned after the window instead). The command line is not read
    /// again: that read takes the process's mmap lock, which the agent's
    /// loop must not wait on every window. Returns whether a process's
    /// name could not be read: it exited and was reaped, and the name it
    /// had at its exit is its exit event's (`exited_as`).
    fn rename(&mut self) -> bool {
        let mut unnamed = false;
        for (pid, p) in self.procs.iter_mut() {
            let Ok(now) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
                unnamed = true;
                continue;
            };
            let now = now.trim_end();
            if !now.is_empty() && now != p.comm && start_time(*pid) == Some(p.start_time) {
                p.comm = now.to_string();
            }
        }
        unnamed
    }

    /// The name a process had when it exited (its exit event's): one that
    /// renames itself and exits within a window has no `/proc` entry left
    /// to read when the window is built.
    pub(crate) fn exited_as(&mut self, pid: u32, comm: &[u8]) {
        let name = comm.split(|&b| b == 0).next().unwrap_or_default();
        if let Some(p) = self.procs.get_mut(&pid).filter(|_| !name.is_empty()) {
            p.comm = String::from_utf8_lossy(name).into_owned();
        }
    }

    /// The pod with this UID, if the API server told us about it.
    pub(crate) fn pod(&self, uid: Option<&str>) -> Option<Arc<PodMeta>> {
        uid.and_then(|u| self.pods.get(u)).cloned()
    }

    pub(crate) fn refresh(&mut self, pid: u32) -> &mut ProcInfo {
        let info = read(pid, &self.cgroup_mount, &self.cgroup_root);
        let e = self.procs.entry(pid).or_default();
        // Facts learned from probes survive a re-read.
        let (comm, rank, libs) = (e.nccl_comm.take(), e.nccl_rank.take(), std::mem::take(&mut e.libraries));
        *e = info;
        e.nccl_comm = comm;
        e.nccl_rank = rank;
        e.libraries = libs;
        e
    }

    pub(crate) fn get(&mut self, pid: u32) -> &mut ProcInfo {
        if !self.procs.contains_key(&pid) {
            self.refresh(pid);
        }
        let pod = self.pod(self.procs[&pid].owner.pod_uid.as_deref());
        let p = self.procs.get_mut(&pid).expect("inserted above");
        p.gpus = match (&self.gpus, &pod) {
            (Some(g), Some(pm)) => p.pod_container(pm).and_then(|c| g.of(&pm.namespace, &pm.name, &c)),
            _ => None,
        };
        p.pod = pod;
        p
    }

    pub(crate) fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Processes cached now.
    pub(crate) fn len(&self) -> usize {
        self.procs.len()
    }

    /// Finds processes that are gone or whose pid now names another
    /// process (a lost exit event, pid reuse) and returns them, once, for
    /// the caller to drop their other state. A reused pid's facts are
    /// dropped at once; a gone process's are kept until the next prune (its
    /// last calls may land in the window after it is first found gone, as
    /// `crate::exits` explains). Called after a window is built, so a
    /// process's last rows keep its name.
    pub(crate) fn prune(&mut self) -> Vec<u32> {
        let (mut found, mut drop) = (Vec::new(), Vec::new());
        let mut gone = HashSet::new();
        for (pid, p) in &self.procs {
            match start_time(*pid) {
                Some(t) if t == p.start_time => {}
                None if self.gone.contains(pid) => drop.push(*pid),
                None => {
                    gone.insert(*pid);
                    found.push(*pid);
                }
                Some(_) => {
                    drop.push(*pid);
                    found.push(*pid);
                }
            }
        }
        for pid in &drop {
            self.procs.remove(pid);
        }
        self.gone = gone;
        found
    }
}

/// /proc/PID/stat field 22 (after the parenthesised comm, which may hold spaces).
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// A /proc/PID/cgroup path as a path below the mount (`/../..` resolved).
fn mount_relative(mount: &std::path::Path, ns_root: &std::path::Path, path: &str) -> String {
    if mount == ns_root {
        return path.to_string();
    }
    let abs = cgroup::resolve(ns_root, path);
    abs.strip_prefix(mount).map(|r| format!("/{}", r.display())).unwrap_or_else(|_| path.to_string())
}

/// The command line, arguments joined by spaces, capped (a pod's process
/// writes what it likes there).
fn cmdline(pid: u32) -> String {
    crate::podfs::read_capped(format!("/proc/{pid}/cmdline"), crate::podfs::MAX_CMDLINE)
        .map(|b| join_args(&b))
        .unwrap_or_default()
}

/// NUL-separated arguments joined by spaces, at most `CMDLINE_MAX` bytes,
/// cut on a character boundary (a cut inside a multi-byte character
/// panicked: a pod's process chooses its arguments).
fn join_args(raw: &[u8]) -> String {
    let mut s =
        raw.split(|&c| c == 0).filter(|s| !s.is_empty()).map(String::from_utf8_lossy).collect::<Vec<_>>().join(" ");
    let mut end = s.len().min(CMDLINE_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

const CMDLINE_MAX: usize = 4096;

fn read(pid: u32, mount: &std::path::Path, ns_root: &std::path::Path) -> ProcInfo {
    let comm =
        std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default();
    let cgroup_path = cgroup::of_pid(pid).map(|c| mount_relative(mount, ns_root, &c)).unwrap_or_default();
    ProcInfo {
        start_time: start_time(pid).unwrap_or(0),
        comm,
        cmdline: cmdline(pid),
        cgroup_id: cgroup::id_of(mount, &cgroup_path),
        owner: cgroup::parse(&cgroup_path),
        cgroup_path,
        env: environ::of_pid(pid),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_joined_and_cut_on_a_character_boundary() {
        assert_eq!(join_args(b"python3\0train.py\0--lr\x000.1\0"), "python3 train.py --lr 0.1");
        // 'é' is two bytes: after "ab " byte 4096 falls inside one.
        let raw = [b"ab\0".as_slice(), "é".repeat(3000).as_bytes()].concat();
        let s = join_args(&raw);
        assert_eq!(s.len(), 4095);
        assert!(s.starts_with("ab éé"));
        // Invalid UTF-8 is replaced, never a panic.
        assert_eq!(join_args(b"a\xff\0b"), "a\u{fffd} b");
    }

    #[test]
    fn a_gone_process_is_kept_one_prune_and_a_reused_pid_none() {
        let mut a = Attributor::new(PathBuf::from("/sys/fs/cgroup"));
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id();
        a.get(pid);
        let me = std::process::id();
        a.get(me).start_time += 1; // as if our pid had been reused
        assert_eq!(a.prune(), vec![me], "a reused pid is found and dropped at once");
        assert_eq!(a.len(), 1);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(a.prune(), vec![pid], "gone: found once, its facts kept for its last calls");
        assert_eq!(a.get(pid).comm, "sleep");
        assert!(a.prune().is_empty(), "found only once");
        assert_eq!(a.len(), 0);
    }

    #[test]
    fn a_reaped_process_is_reported_unnamed_and_takes_its_exit_name() {
        let mut a = Attributor::new(PathBuf::from("/sys/fs/cgroup"));
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id();
        a.get(pid);
        assert!(!a.begin_window(), "alive: its name is read");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(a.begin_window(), "reaped: the caller must look for its exit event");
        assert_eq!(a.get(pid).comm, "sleep", "a failed read keeps the cached name");
        a.exited_as(pid, b"late-name\0\0\0\0\0\0\0");
        assert_eq!(a.get(pid).comm, "late-name");
    }
}
