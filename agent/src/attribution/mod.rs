//! Who a process is: name, cgroup, container, pod, job.

pub mod cgroup;
pub mod environ;

use std::collections::HashMap;
use std::path::PathBuf;

/// Everything known about one process.
#[derive(Debug, Clone, Default)]
pub struct ProcInfo {
    pub comm: String,
    pub cmdline: String,
    pub cgroup_path: String,
    pub cgroup_id: u64,
    pub owner: cgroup::CgroupOwner,
    pub env: environ::JobEnv,
    pub nccl_comm: Option<String>,
    pub nccl_rank: Option<(i32, i32)>,
    pub libraries: Vec<String>,
}

impl ProcInfo {
    /// Job identity: NCCL communicator, else torchrun master address.
    pub fn job(&self) -> Option<String> {
        self.nccl_comm
            .clone()
            .map(|c| format!("nccl:{c}"))
            .or_else(|| self.env.master.clone().map(|m| format!("torch:{m}")))
    }
}

/// Caches process facts; re-reads a process when asked (exec, first sight).
pub struct Attributor {
    pub cgroup_root: PathBuf,
    procs: HashMap<u32, ProcInfo>,
}

impl Attributor {
    pub fn new(cgroup_root: PathBuf) -> Self {
        Attributor { cgroup_root, procs: HashMap::new() }
    }

    pub fn refresh(&mut self, pid: u32) -> &mut ProcInfo {
        let info = read(pid, &self.cgroup_root);
        let e = self.procs.entry(pid).or_default();
        // Facts learned from probes survive a re-read.
        let (comm, rank, libs) = (e.nccl_comm.take(), e.nccl_rank.take(), std::mem::take(&mut e.libraries));
        *e = info;
        e.nccl_comm = comm;
        e.nccl_rank = rank;
        e.libraries = libs;
        e
    }

    pub fn get(&mut self, pid: u32) -> &mut ProcInfo {
        if !self.procs.contains_key(&pid) {
            self.refresh(pid);
        }
        self.procs.get_mut(&pid).expect("inserted above")
    }

    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }
}

fn read(pid: u32, root: &std::path::Path) -> ProcInfo {
    let comm =
        std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default();
    let mut cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    cmdline.truncate(4096);
    let cgroup_path = cgroup::of_pid(pid).unwrap_or_default();
    ProcInfo {
        comm,
        cmdline,
        cgroup_id: cgroup::id_of(root, &cgroup_path),
        owner: cgroup::parse(&cgroup_path),
        cgroup_path,
        env: environ::of_pid(pid),
        ..Default::default()
    }
}
