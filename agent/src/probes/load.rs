//! Loads the eBPF object, attaches the scheduler/IO/process tracepoints and,
//! per discovered library file, the call probes.

use std::collections::HashSet;
use std::path::Path;

use aya::maps::{Array, CgroupArray, HashMap as BpfHashMap, MapData};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{BtfTracePoint, UProbe};
use aya::{Btf, Ebpf, EbpfLoader};

use super::abi::Config;
use super::ops::{self, Lib};
use crate::error::{Error, Result};

/// The compiled programs (built by build.rs from ebpf/*.c).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ingero.bpf.o"));

/// Tracepoints: (program, tracepoint, required).
const TRACEPOINTS: &[(&str, &str, bool)] = &[
    ("on_switch", "sched_switch", true),
    ("on_wakeup", "sched_wakeup", true),
    ("on_wakeup_new", "sched_wakeup_new", true),
    ("on_exec", "sched_process_exec", true),
    ("on_exit", "sched_process_exit", true),
    ("on_fork", "sched_process_fork", false),
    ("on_oom_victim", "mark_victim", false),
    ("on_rq_issue", "block_rq_issue", false),
    ("on_rq_complete", "block_rq_complete", false),
];

pub struct Probes {
    pub ebpf: Ebpf,
    config: Config,
    /// Files already probed, by (device, inode): each is attached once.
    attached: HashSet<(u64, u64)>,
}

impl Probes {
    pub fn load() -> Result<Probes> {
        // Parse the kernel's BTF once, for CO-RE relocation and the tp_btf
        // attach points both (it is the largest allocation the agent makes).
        let btf =
            Btf::from_sys_fs().map_err(|e| Error::Bpf(format!("reading kernel BTF (/sys/kernel/btf/vmlinux): {e}")))?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .load(OBJECT)
            .map_err(|e| Error::Bpf(format!("loading eBPF object: {e}")))?;
        for name in ["call_entry", "call_return"] {
            let p: &mut UProbe = prog(&mut ebpf, name)?.try_into().map_err(|e| Error::Bpf(format!("{name}: {e}")))?;
            p.load().map_err(|e| Error::Bpf(format!("loading {name}: {e:#}")))?;
        }
        for &(name, tp, required) in TRACEPOINTS {
            let res = (|| -> std::result::Result<(), String> {
                let p: &mut BtfTracePoint =
                    prog(&mut ebpf, name).map_err(|e| e.to_string())?.try_into().map_err(|e| format!("{e}"))?;
                p.load(tp, &btf).map_err(|e| format!("{e:#}"))?;
                p.attach().map_err(|e| format!("{e:#}"))?;
                Ok(())
            })();
            if let Err(e) = res {
                if required {
                    return Err(Error::Bpf(format!("attaching tp_btf/{tp}: {e}")));
                }
                tracing::warn!(tracepoint = tp, error = %e, "optional tracepoint unavailable; continuing without it");
            }
        }
        let mut p = Probes { ebpf, config: Config::default(), attached: HashSet::new() };
        p.write_config()?;
        Ok(p)
    }

    fn write_config(&mut self) -> Result<()> {
        let mut cfg: Array<&mut MapData, Config> = map(&mut self.ebpf, "config")?;
        cfg.set(0, self.config, 0).map_err(|e| Error::Bpf(format!("config map: {e}")))
    }

    /// Which A/B aggregation map the programs fill now.
    pub fn active(&self) -> u32 {
        self.config.active
    }

    pub fn flip(&mut self) -> Result<u32> {
        self.config.active ^= 1;
        self.write_config()?;
        Ok(self.config.active)
    }

    /// Restricts tracing to the cgroup subtree at `dir` (cgroup v2 path).
    pub fn set_scope(&mut self, dir: &Path) -> Result<()> {
        let f = std::fs::File::open(dir).map_err(|e| Error::Config(format!("--cgroup-root {}: {e}", dir.display())))?;
        let mut arr: CgroupArray<&mut MapData> = map(&mut self.ebpf, "scope_cgroup")?;
        arr.set(0, f, 0).map_err(|e| Error::Bpf(format!("scope map: {e}")))?;
        self.config.scoped = 1;
        self.write_config()
    }

    /// Adds a process to the scheduler-tracked set (CUDA users add themselves).
    pub fn track(&mut self, tgid: u32) -> Result<()> {
        let mut m: BpfHashMap<&mut MapData, u32, u8> = map(&mut self.ebpf, "tracked")?;
        m.insert(tgid, 1, 0).map_err(|e| Error::Bpf(format!("tracked map: {e}")))
    }

    pub fn is_attached(&self, id: (u64, u64)) -> bool {
        self.attached.contains(&id)
    }

    /// Attaches every op of `lib` found in the file; returns the symbols probed.
    pub fn attach_library(&mut self, id: (u64, u64), path: &Path, lib: Lib) -> Result<Vec<&'static str>> {
        if !self.attached.insert(id) {
            return Ok(vec![]);
        }
        let mut done = Vec::new();
        for op in ops::all().into_iter().filter(|o| o.lib == lib) {
            let point =
                || UProbeAttachPoint { location: UProbeAttachLocation::Symbol(op.symbol), cookie: Some(op.cookie()) };
            let entry: &mut UProbe =
                prog(&mut self.ebpf, "call_entry")?.try_into().map_err(|e| Error::Bpf(format!("{e}")))?;
            match entry.attach(point(), path, UProbeScope::AllProcesses) {
                Ok(_) => {}
                // Absent in this build of the library (e.g. no _ptsz variants).
                Err(e) => {
                    tracing::debug!(symbol = op.symbol, path = %path.display(), error = %e, "symbol not probed");
                    continue;
                }
            }
            if op.timed {
                let ret: &mut UProbe =
                    prog(&mut self.ebpf, "call_return")?.try_into().map_err(|e| Error::Bpf(format!("{e}")))?;
                ret.attach(point(), path, UProbeScope::AllProcesses)
                    .map_err(|e| Error::Bpf(format!("uretprobe {} in {}: {e:#}", op.symbol, path.display())))?;
            }
            done.push(op.symbol);
        }
        Ok(done)
    }
}

fn prog<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name).ok_or_else(|| Error::Bpf(format!("program {name} missing from the object")))
}

/// A typed view of a map by name.
pub fn map<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf.map_mut(name).ok_or_else(|| Error::Bpf(format!("map {name} missing from the object")))?;
    T::try_from(m).map_err(|e| Error::Bpf(format!("map {name}: {e}")))
}
