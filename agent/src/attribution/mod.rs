// SPDX-License-Identifier: Apache-2.0
//! Who a process is: name, cgroup, container, pod, job.

pub(crate) mod apiserver;
pub(crate) mod cgroup;
pub(crate) mod environ;
pub(crate) mod podresources;

use std::collections::HashMap;
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
        (&self.libraries, &self.cgroup_path, self.nccl_rank).hash(&mut h);
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
    pub(crate) fn begin_window(&mut self) {
        if let Some(w) = &self.watch {
            self.pods = w.snapshot();
        }
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

    /// Drops processes that are gone or whose pid now names another
    /// process (a lost exit event, pid reuse); returns the pids dropped.
    /// Called after a window is built, so a process's last rows keep its name.
    pub(crate) fn prune(&mut self) -> Vec<u32> {
        let stale: Vec<u32> =
            self.procs.iter().filter(|(pid, p)| start_time(**pid) != Some(p.start_time)).map(|(pid, _)| *pid).collect();
        for pid in &stale {
            self.procs.remove(pid);
        }
        stale
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

fn read(pid: u32, mount: &std::path::Path, ns_root: &std::path::Path) -> ProcInfo {
    let comm =
        std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default();
    let mut cmdline = crate::podfs::read_capped(format!("/proc/{pid}/cmdline"), crate::podfs::MAX_CMDLINE)
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    cmdline.truncate(4096);
    let cgroup_path = cgroup::of_pid(pid).map(|c| mount_relative(mount, ns_root, &c)).unwrap_or_default();
    ProcInfo {
        start_time: start_time(pid).unwrap_or(0),
        comm,
        cmdline,
        cgroup_id: cgroup::id_of(mount, &cgroup_path),
        owner: cgroup::parse(&cgroup_path),
        cgroup_path,
        env: environ::of_pid(pid),
        ..Default::default()
    }
}
