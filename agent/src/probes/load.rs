// SPDX-License-Identifier: Apache-2.0
//! Loads the eBPF object, attaches the scheduler/IO/process tracepoints and,
//! per discovered library file, the call probes.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use aya::maps::{Array, CgroupArray, HashMap as BpfHashMap, MapData};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::{Btf, Ebpf};

use super::abi::{Config, PyProc};
use super::attached::Attachments;
use super::features::{Features, Object};
use super::files::{FileId, OpenLib};
use super::libs::Found;
use super::link::{Closing, Link, Links};
use super::ops::{self, Lib};
use crate::error::{Error, Result};

/// Also where other modules look maps up by name.
pub use super::handles::map;
use super::handles::{as_uprobe, prog};
use super::setup::{NO_HOLD, cgroup_id_and_level, load_hold, load_notice, open_object};

#[derive(Debug)]
pub struct Probes {
    pub ebpf: Ebpf,
    config: Config,
    /// Files already probed, by what the kernel probes: each is attached
    /// once, and detached when no scanned process maps it (`detach_unused`).
    attached: Attachments,
    /// pid → (device, inode) of a maps line → the file it is, so a rescan
    /// does not reopen every library of every process.
    resolved: HashMap<u32, HashMap<(u64, u64), FileId>>,
    /// (device, inode) of a maps line → the probed file it led to, whoever
    /// mapped it (kept past that process's exit).
    probed_ids: HashMap<(u64, u64), FileId>,
    /// The library-lookup hold program loaded (the kernel supports it).
    dlopen_hold: bool,
    /// The lookup notice (ebpf/libnotify.bpf.c) loaded: used where no hold is.
    lookup_notice: bool,
    /// What the kernel can do, and so which object is loaded.
    pub features: Features,
    /// What one trap costs a probed call here (ns), measured at load.
    pub trap_ns: Option<f64>,
    /// The syscall-exit program of off-CPU sites loaded (the full object),
    /// and attached (only when asked for: it runs at every syscall).
    offcpu_sites: bool,
    offcpu_attached: bool,
    /// The hot probes' duty cycle (`start_duty`; none before, and on kernels
    /// without uprobe_multi links: there those probes stay on).
    pub(crate) duty: Option<super::duty::Duty>,
}

/// What `attach_found` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Attached {
    /// The file was probed before (through this or another path).
    Already,
    /// Probed now: the symbols found in it.
    Now(Vec<&'static str>),
}

/// The initial pid namespace's inode (PROC_PID_INIT_INO, fixed kernel ABI).
const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

/// The agent's pid namespace: its inode, or None for the initial one.
pub fn own_pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata("/proc/self/ns/pid").ok()?.ino();
    (ino != PROC_PID_INIT_INO).then_some(ino)
}

/// What the programs must know before any of them runs: whose events they
/// may act on (`--cgroup-root`, `--pid`) and whether they may hold a thread
/// at a library lookup. Written before the first program is attached: the
/// tracepoints fire at once, and an agent that learnt its scope later
/// acted on, and could hold, every process on the node meanwhile.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cgroup_root: Option<std::path::PathBuf>,
    pub pids: Vec<u32>,
    pub hold_dlopen: bool,
    pub hold_max: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { cgroup_root: None, pids: Vec::new(), hold_dlopen: true, hold_max: Duration::from_secs(1) }
    }
}

impl Probes {
    /// Probes the kernel's features and loads the object it can run, for
    /// every process on the node.
    pub fn load() -> Result<Probes> {
        let features = Features::probe()?;
        Self::load_with(features, &Settings::default())
    }

    /// Loads the object `features` choose (tests force the compat one),
    /// its settings in place before anything is attached.
    pub fn load_with(features: Features, settings: &Settings) -> Result<Probes> {
        let object = features.object();
        if object == Object::Compat {
            tracing::warn!(
                "kernel without attach cookies, bpf_loop or compare-and-exchange: compat programs (`ingero-agent check` lists what is lost)"
            );
        }
        // Pids in every event are those of the agent's own namespace (a kind
        // node, a nested container), so /proc lookups and --pid agree. No
        // hold until the hold's program is known to load (below).
        let config = Config { pidns_ino: own_pid_namespace().unwrap_or(0), ..Config::default() };
        let mut p = Probes {
            ebpf: open_object(object)?,
            config,
            attached: Attachments::default(),
            resolved: HashMap::new(),
            probed_ids: HashMap::new(),
            dlopen_hold: false,
            lookup_notice: false,
            features,
            trap_ns: None,
            offcpu_sites: false,
            offcpu_attached: false,
            duty: None,
        };
        p.settle(settings)?;
        let btf = Btf::from_sys_fs()?;
        p.dlopen_hold = match object {
            Object::Full => {
                for name in ["call_entry", "call_return"] {
                    let prog = as_uprobe(prog(&mut p.ebpf, name)?)?;
                    let loaded = if p.features.multi_links() { prog.load_multi() } else { prog.load() };
                    loaded.map_err(Error::program(format!("loading {name}")))?;
                }
                load_hold(&mut p.ebpf, &p.features)
            }
            Object::Compat => {
                super::compat::load_calls(&mut p.ebpf)?;
                tracing::warn!("{NO_HOLD}");
                false
            }
        };
        // Also beside the hold: what `--no-dlopen-hold` probes glibc's lookups with.
        p.lookup_notice = load_notice(&mut p.ebpf);
        super::tracepoints::attach(&mut p.ebpf, &btf)?;
        p.offcpu_sites = object == Object::Full && super::tracepoints::load_sys_exit(&mut p.ebpf, &btf);
        p.trap_ns = super::trap_cost::measure_or_warn(&mut p.ebpf);
        p.set_hold_dlopen(settings.hold_dlopen, settings.hold_max)?;
        Ok(p)
    }

    /// Writes whose events the programs act on; the hold stays off.
    fn settle(&mut self, s: &Settings) -> Result<()> {
        if let Some(root) = &s.cgroup_root {
            self.set_scope(root)?;
        }
        if !s.pids.is_empty() {
            for &pid in &s.pids {
                self.track(pid)?;
            }
            self.set_targets(&s.pids)?;
        }
        self.write_config()
    }

    /// The entry and return programs of `op`: one shared pair (the cookie
    /// names the op), or the op's own pair in the compat object.
    fn call_programs(&self, op: &ops::Op) -> (String, String) {
        match self.features.object() {
            Object::Full => ("call_entry".into(), "call_return".into()),
            Object::Compat => super::compat::names(op),
        }
    }

    fn write_config(&mut self) -> Result<()> {
        let mut cfg: Array<&mut MapData, Config> = map(&mut self.ebpf, "config")?;
        cfg.set(0, self.config, 0).map_err(Error::map("config"))
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
    fn set_scope(&mut self, dir: &Path) -> Result<()> {
        let f = std::fs::File::open(dir).map_err(|e| Error::Config(format!("--cgroup-root {}: {e}", dir.display())))?;
        let mut arr: CgroupArray<&mut MapData> = map(&mut self.ebpf, "scope_cgroup")?;
        arr.set(0, f, 0).map_err(Error::map("scope_cgroup"))?;
        let (id, level) =
            cgroup_id_and_level(dir).map_err(|e| Error::Config(format!("--cgroup-root {}: {e}", dir.display())))?;
        self.config.scope_cgroup_id = id;
        self.config.scope_level = level;
        self.config.scoped = 1;
        self.write_config()
    }

    /// Adds a process to the scheduler-tracked set (CUDA users add themselves).
    fn track(&mut self, tgid: u32) -> Result<()> {
        let mut m: BpfHashMap<&mut MapData, u32, u8> = map(&mut self.ebpf, "tracked")?;
        m.insert(tgid, 1, 0).map_err(Error::map("tracked"))
    }

    /// `--pid`: only these processes' calls are counted, decided in the kernel.
    fn set_targets(&mut self, pids: &[u32]) -> Result<()> {
        let mut m: BpfHashMap<&mut MapData, u32, u8> = map(&mut self.ebpf, "targets")?;
        for &p in pids {
            m.insert(p, 1, 0).map_err(Error::map("targets (at most 1024 --pid)"))?;
        }
        self.config.pid_filter = 1;
        self.write_config()
    }

    /// Whether a thread is held at a new CUDA/NCCL library's first lookup until it is probed.
    pub fn set_hold_dlopen(&mut self, on: bool, max: std::time::Duration) -> Result<()> {
        self.config.hold_dlopen = (on && self.dlopen_hold) as u32;
        self.config.hold_max_ms = max.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
        self.write_config()
    }

    /// Return-probed calls go to the marks ring as they return (steps).
    pub fn set_call_marks(&mut self, on: bool) -> Result<()> {
        self.config.call_marks = on as u32;
        self.write_config()
    }

    /// Off-CPU episodes outside calls at least `min` long ship with their
    /// call site (0: none). False where the kernel's object cannot.
    pub fn set_offcpu_sites(&mut self, min: Duration) -> Result<bool> {
        let us = min.as_micros().min(u128::from(u32::MAX)) as u32;
        let on = us > 0 && self.offcpu_sites;
        if on && !self.offcpu_attached {
            super::tracepoints::attach_sys_exit(&mut self.ebpf)?;
            self.offcpu_attached = true;
        }
        self.config.offcpu_site_us = if on { us } else { 0 };
        self.write_config()?;
        Ok(on)
    }

    /// Tells the kernel a file is probed, so no thread is held at a lookup
    /// in it (ebpf/libload.bpf.c keys files by the kernel's own device
    /// number, MKDEV: major << 20 | minor). An overlayfs file's real inode
    /// is not known here: the kernel learns it at its first hold instead.
    fn mark_probed(&mut self, id: &FileId) {
        let FileId::Inode(dev, ino) = *id else { return };
        if let Ok(mut m) = map::<BpfHashMap<&mut MapData, [u8; 16], u8>>(&mut self.ebpf, "probed_files") {
            let _ = m.insert(kernel_file_key(dev, ino), 1, 0);
        }
    }

    /// Tells the kernel this process has been scanned since it mapped a
    /// CUDA/NCCL library: its lookups in probed files go on at once.
    pub fn mark_known(&mut self, pid: u32) {
        if let Ok(mut m) = map::<BpfHashMap<&mut MapData, u32, u8>>(&mut self.ebpf, "known_procs") {
            let _ = m.insert(pid, 1, 0);
            // Exited meanwhile: the kernel's exit cleanup ran before this
            // insert, so nothing else would remove it.
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = m.remove(&pid);
            }
        }
    }

    /// Lets a thread held at a library lookup go on: its process's
    /// libraries are probed (0 tells the kernel so; it then remembers the file).
    pub fn release(&mut self, tgid: u32, tid: u32) {
        let key = (u64::from(tgid) << 32) | u64::from(tid);
        // BPF_EXIST: a thread whose hold already ended (and removed its
        // entry) must not get one back from this write, never to be removed.
        if let Ok(mut m) = map::<BpfHashMap<&mut MapData, u64, u64>>(&mut self.ebpf, "held") {
            let _ = m.insert(key, 0, BPF_EXIST);
        }
    }

    /// True when the file behind this maps line of `pid` is known to be probed.
    pub fn is_attached(&self, f: &Found) -> bool {
        self.resolved.get(&f.pid).and_then(|m| m.get(&f.id)).is_some_and(|id| self.attached.contains(id))
    }

    /// Whether a maps line of the same (device, inode), in any process, led
    /// to a file probed now: attaching it for this one costs nothing new.
    pub fn probed_elsewhere(&self, f: &Found) -> bool {
        self.probed_ids.get(&f.id).is_some_and(|id| self.attached.contains(id))
    }

    fn note_probed(&mut self, maps_id: (u64, u64), id: &FileId) {
        if self.probed_ids.len() >= 4_096 {
            let attached = &self.attached;
            self.probed_ids.retain(|_, id| attached.contains(id)); // detached since
        }
        self.probed_ids.insert(maps_id, id.clone());
    }

    /// Drops what was learnt of a process that has exited.
    pub fn forget(&mut self, pid: u32) {
        self.resolved.remove(&pid);
        if let Ok(mut m) = map::<BpfHashMap<&mut MapData, u32, u8>>(&mut self.ebpf, "known_procs") {
            let _ = m.remove(&pid);
        }
        if let Ok(mut m) = map::<BpfHashMap<&mut MapData, u32, PyProc>>(&mut self.ebpf, "py_procs") {
            let _ = m.remove(&pid);
        }
    }

    /// Tells the programs where a CPython process keeps its threads and frames.
    pub(crate) fn set_python(&mut self, pid: u32, p: &PyProc) -> Result<()> {
        let mut m: BpfHashMap<&mut MapData, u32, PyProc> = map(&mut self.ebpf, "py_procs")?;
        m.insert(pid, *p, 0).map_err(Error::map("py_procs (at most 4096 Python processes)"))
    }

    /// Probes the file behind `f` unless the same file (by what the kernel
    /// probes, see `files`) already is. The file is held open while its
    /// probes go in, so a process that exits at once cannot take it away;
    /// it counts as attached only once every probe is in, and a failure
    /// removes the probes it did place, so the next scan retries cleanly.
    pub fn attach_found(&mut self, f: &Found) -> Result<Attached> {
        let open = f.map_file.iter().chain(std::iter::once(&f.path)).find_map(|p| OpenLib::open(p).ok());
        let Some(open) = open else {
            let cause = OpenLib::open(&f.path).err().unwrap_or_else(|| std::io::Error::other("vanished"));
            return Err(Error::Open { what: format!("{} (pid {})", f.mapped_as, f.pid), cause });
        };
        if f.pid != 0 {
            self.resolved.entry(f.pid).or_default().insert(f.id, open.id.clone());
        }
        if self.attached.contains(&open.id) {
            self.note_probed(f.id, &open.id);
            return Ok(Attached::Already);
        }
        // A runtime inside another file (an executable built with nvcc's
        // default `-cudart static`): its code mapping is not the runtime's
        // alone, so its launches keep the frame record (ebpf/calls.bpf.c).
        let name = Path::new(&f.mapped_as).file_name().and_then(|n| n.to_str());
        let static_runtime = f.lib == Lib::Cudart && name.and_then(Lib::from_file_name) != Some(Lib::Cudart);
        let mut hot = Vec::new();
        let (mut syms, links) = self.attach_library(&open.fd_path(), f.lib, static_runtime, &mut hot)?;
        let id = open.id.clone();
        self.mark_probed(&id);
        self.note_probed(f.id, &id);
        if let Some(duty) = self.duty.as_ref().filter(|_| !hot.is_empty()) {
            syms.extend(duty.add(id.clone(), open, f.lib, &hot));
        }
        // Probed ahead of use (pid 0: `--lib`, the usual directories): kept.
        self.attached.insert(id, links, f.pid == 0);
        Ok(Attached::Now(syms))
    }

    /// The switch that keeps threads from being held while probes are
    /// closed (ebpf/libload.bpf.c, holds_paused), for the detacher thread;
    /// None where no hold is loaded.
    pub fn take_holds_paused(&mut self) -> Option<Array<MapData, u32>> {
        if !self.dlopen_hold {
            return None;
        }
        self.ebpf.take_map("holds_paused").and_then(|m| Array::try_from(m).ok())
    }

    /// Starts the duty cycle where the kernel makes uprobe_multi links for
    /// the full object (Linux 6.6+); returns whether it runs. Elsewhere the
    /// hot probes stay on: counts exact, cost unbounded (`ingero-agent check`).
    pub(crate) fn start_duty(&mut self, window: Duration, pause: std::sync::Arc<crate::detacher::HoldPause>) -> bool {
        if !self.features.multi_links() || self.features.object() != super::features::Object::Full {
            return false;
        }
        let fd = self.ebpf.program("call_entry").and_then(|p| p.fd().ok()).map(|fd| fd.as_fd().try_clone_to_owned());
        let gate = self.ebpf.take_map("duty_gate").and_then(|m| Array::try_from(m).ok());
        let Some((fd, gate)) = fd.zip(gate) else { return false };
        match fd.and_then(|fd| super::duty::Duty::start(fd, gate, window, pause)) {
            Ok(d) => {
                self.duty = Some(d);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "no duty cycle: the hot probes stay on whatever they cost");
                false
            }
        }
    }

    /// Library files probed now.
    pub fn probed_files(&self) -> usize {
        self.attached.len()
    }

    /// Takes the probes of every file that no scanned process has mapped
    /// for `ttl` (files probed ahead of use stay); returns how many files and
    /// their links, which detach when dropped, slowly (grace periods,
    /// 10-80 ms a probe): the caller drops them off the probe loop. The kernel's record of probed files is trimmed to match,
    /// so a process that maps such a file later is held at its first lookup.
    pub fn take_unused(&mut self, ttl: Duration) -> (usize, Vec<Closing>) {
        let in_use: HashSet<&FileId> = self.resolved.values().flat_map(|m| m.values()).collect();
        let gone = self.attached.take_unused(&in_use, Instant::now(), ttl);
        let n = gone.len();
        let taken = self.take_links(gone);
        if n > 0 {
            self.trim_probed_files();
        }
        (n, taken)
    }

    /// Takes the probes of every file, to be closed at once (the agent
    /// stops: closed one after another they take ~150 ms a file).
    pub(crate) fn take_all(&mut self) -> Vec<Closing> {
        let all = self.attached.take_all();
        self.take_links(all)
    }

    /// The links of `gone`'s files, off their programs and the duty cycle.
    fn take_links(&mut self, gone: Vec<(FileId, Links)>) -> Vec<Closing> {
        let mut taken = Vec::new();
        for (id, _) in &gone {
            let hot = self.duty.as_ref().map(|d| d.remove(id)).unwrap_or_default();
            taken.extend(hot.into_iter().map(|l| Box::new(l) as Closing));
        }
        for link in gone.into_iter().flat_map(|(_, links)| links) {
            let (name, id) = match link {
                Link::Perf(name, id) => (name, id),
                Link::Multi(m) => {
                    taken.push(Box::new(m) as Closing);
                    continue;
                }
            };
            match prog(&mut self.ebpf, &name)
                .and_then(as_uprobe)
                .and_then(|p| p.take_link(id).map_err(Error::program("taking a uprobe link")))
            {
                Ok(link) => taken.push(Box::new(link)),
                Err(e) => tracing::warn!(program = name, error = %e, "detaching a uprobe"),
            }
        }
        taken
    }

    /// Keeps in `probed_files` only the files still probed. An overlayfs
    /// file's kernel key is learnt by the kernel alone, so it goes too: its
    /// next new process is held once more, briefly, and the kernel relearns it.
    fn trim_probed_files(&mut self) {
        let keep: HashSet<[u8; 16]> = self.attached.inodes().map(|(dev, ino)| kernel_file_key(dev, ino)).collect();
        if let Ok(mut m) = map::<BpfHashMap<&mut MapData, [u8; 16], u8>>(&mut self.ebpf, "probed_files") {
            let stale: Vec<[u8; 16]> = m.keys().filter_map(|k| k.ok()).filter(|k| !keep.contains(k)).collect();
            for k in stale {
                let _ = m.remove(&k);
            }
        }
    }

    fn detach_links(&mut self, links: impl Iterator<Item = Link>) {
        for link in links {
            // A multi link goes as it drops here.
            let Link::Perf(name, id) = link else { continue };
            if let Ok(p) = prog(&mut self.ebpf, &name).and_then(as_uprobe)
                && let Err(e) = p.detach(id)
            {
                tracing::warn!(program = name, error = %e, "detaching a uprobe");
            }
        }
    }

    /// Attaches every op of `lib` found in the file; returns the symbols
    /// probed and the probes. All or nothing: on an error the probes placed
    /// are removed.
    /// The duty-cycled ops go to `hot` instead, for the duty cycle to place.
    fn attach_library(
        &mut self,
        path: &Path,
        lib: Lib,
        static_runtime: bool,
        hot: &mut Vec<super::plan::Planned>,
    ) -> Result<(Vec<&'static str>, Links)> {
        let mut links: Links = Vec::new();
        match self.attach_ops(path, lib, static_runtime, (&mut links, hot)) {
            Ok(syms) => Ok((syms, links)),
            Err(e) => {
                self.detach_links(links.into_iter());
                Err(e)
            }
        }
    }

    fn attach_ops(
        &mut self,
        path: &Path,
        lib: Lib,
        static_runtime: bool,
        (links, hot): (&mut Links, &mut Vec<super::plan::Planned>),
    ) -> Result<Vec<&'static str>> {
        if lib == Lib::Libc {
            // Both where the hold is on: the notice stands aside while it
            // is, and takes over if the hold is turned off at run time.
            let mut done = Vec::new();
            if self.dlopen_hold && self.config.hold_dlopen != 0 {
                done = self.attach_dlopen(path, "dlsym_entry", links)?;
            }
            if self.lookup_notice {
                for s in self.attach_dlopen(path, "dlsym_notify", links)? {
                    if !done.contains(&s) {
                        done.push(s);
                    }
                }
            }
            return Ok(done);
        }
        let mut plan = super::plan::plan(path, lib, static_runtime)?;
        if self.duty.is_some() {
            hot.extend(plan.iter().filter(|p| p.op.duty_cycled()));
            plan.retain(|p| !p.op.duty_cycled());
        }
        if self.features.multi_links() {
            let fd = |name: &str| self.ebpf.program(name).map(|p| p.fd());
            let (Some(Ok(entry)), Some(Ok(ret))) = (fd("call_entry"), fd("call_return")) else {
                return Err(Error::Missing { kind: "loaded program", name: "call_entry/call_return".into() });
            };
            return super::multi::attach_plan((entry.as_fd(), ret.as_fd()), path, &plan, links)
                .map_err(|cause| Error::Open { what: format!("{} (uprobe_multi links)", path.display()), cause });
        }
        let mut done = Vec::new();
        for p in plan {
            let point = || UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(p.offset),
                cookie: (self.features.object() == Object::Full).then_some(p.cookie),
            };
            let (entry_name, return_name) = self.call_programs(&p.op);
            // Return first: a call that passes the entry probe then always
            // has its return seen, so the kernel's per-thread call state
            // (entered at entry, left at return) can never be left behind.
            if p.ret {
                let ret = prog(&mut self.ebpf, &return_name).and_then(as_uprobe)?;
                match ret.attach(point(), path, UProbeScope::AllProcesses) {
                    Ok(id) => links.push(Link::Perf(return_name, id)),
                    // Absent in this build of the library (e.g. no _ptsz variants).
                    Err(e) => {
                        tracing::debug!(symbol = p.op.symbol, path = %path.display(), error = %e, "symbol not probed");
                        continue;
                    }
                }
            }
            let entry = prog(&mut self.ebpf, &entry_name).and_then(as_uprobe)?;
            match entry.attach(point(), path, UProbeScope::AllProcesses) {
                Ok(id) => links.push(Link::Perf(entry_name, id)),
                Err(e) if p.ret => {
                    return Err(Error::program(format!("uprobe {} in {}", p.op.symbol, path.display()))(e));
                }
                Err(e) => {
                    tracing::debug!(symbol = p.op.symbol, path = %path.display(), error = %e, "symbol not probed");
                    continue;
                }
            }
            done.push(p.op.symbol);
        }
        Ok(done)
    }
}

impl Probes {
    /// glibc's `dlsym` and `dlvsym`, entry only, with the hold or the
    /// notice (ebpf/libload.bpf.c, libnotify.bpf.c): never a return probe
    /// on the loader's functions, which read their own return address to
    /// pick the caller's RUNPATH.
    fn attach_dlopen(&mut self, path: &Path, program: &str, links: &mut Links) -> Result<Vec<&'static str>> {
        let mut done = Vec::new();
        let offsets = super::offsets::resolve(path, &["dlsym", "dlvsym"])
            .map_err(|e| Error::Open { what: format!("{} (symbols)", path.display()), cause: e })?;
        for symbol in ["dlsym", "dlvsym"] {
            // A libc without them (before glibc 2.34 they live in libdl).
            let Some(&offset) = offsets.get(symbol) else { continue };
            let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: None };
            let entry = prog(&mut self.ebpf, program).and_then(as_uprobe)?;
            if let Ok(id) = entry.attach(point, path, UProbeScope::AllProcesses) {
                links.push(Link::Perf(program.into(), id));
                done.push(symbol);
            }
        }
        Ok(done)
    }
}

/// `bpf_map_update_elem` flag: update an existing entry only (uapi bpf.h).
const BPF_EXIST: u64 = 2;

/// A file as `probed_files` keys it (ebpf/libload.bpf.c `struct file_id`):
/// inode, then the kernel's own device number (MKDEV: major << 20 | minor).
fn kernel_file_key(dev: u64, ino: u64) -> [u8; 16] {
    let kdev = (libc::major(dev) << 20) | libc::minor(dev);
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&ino.to_ne_bytes());
    key[8..12].copy_from_slice(&kdev.to_ne_bytes());
    key
}
