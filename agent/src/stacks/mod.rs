// SPDX-License-Identifier: Apache-2.0
//! Where outlier calls are made (probe → **stacks** → window): the kernel
//! captures return addresses and, for CPython threads, (code object,
//! instruction) pairs; this stage turns them into file / function / line
//! frames while the process lives, and gives each distinct stack an id (a
//! hash of its frames, the same in every window and on every node). It runs
//! on its own thread (`worker`): a process that stalls and exits while the
//! probe loop is busy (scanning another process, closing a window) keeps
//! its frames.

pub(crate) mod elf;
pub(crate) mod linetable;
pub(crate) mod pymem;
pub(crate) mod python;
pub(crate) mod worker;

use std::collections::HashMap;
use std::sync::Arc;

use elf::{Elf, Mapping};
use pymem::ProcMem;

use crate::probes::abi::{PySnap, StallEvent};

/// ELF files whose symbols are kept (by device and inode)...
const MAX_FILES: usize = 512;
/// ...and what their tables may hold in all: past either, the cache starts
/// over (each file's own tables are capped by `elf::MAX_TABLE_BYTES`).
const MAX_SYMBOL_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Python,
    Native,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Python => "python",
            Kind::Native => "native",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Frame {
    pub kind: Kind,
    pub file: String,
    pub function: String,
    pub line: Option<u32>,
    pub offset: Option<u64>,
}

/// A resolved stack, innermost frame first (Python frames, then native).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stack {
    pub id: u64,
    pub frames: Vec<Frame>,
}

impl Stack {
    fn new(frames: Vec<Frame>) -> Stack {
        // FNV-1a: stable across builds and hosts (std's hasher is not promised to be).
        let mut h: u64 = 0xcbf29ce484222325;
        let mut eat = |b: &[u8]| {
            for &x in b.iter().chain([0xff].iter()) {
                h = (h ^ x as u64).wrapping_mul(0x100000001b3);
            }
        };
        for f in &frames {
            eat(f.kind.name().as_bytes());
            eat(f.file.as_bytes());
            eat(f.function.as_bytes());
            eat(&f.line.unwrap_or(0).to_le_bytes());
            eat(&f.offset.unwrap_or(0).to_le_bytes());
        }
        // 63 bits: Delta Lake and the engines reading it have no unsigned
        // 64-bit type, so ids are stored as signed longs (never negative).
        Stack { id: h & (i64::MAX as u64), frames }
    }
}

/// One outlier call (or off-CPU episode) and where it was made.
#[derive(Debug, Clone)]
pub(crate) struct Stall {
    pub event: StallEvent,
    pub stack: Option<Arc<Stack>>,
    /// The thread's name when the event arrived (None: it was gone).
    pub thread: Option<String>,
}

/// A thread's name as the kernel holds it now (procfs, not the pod's
/// files; at most 16 bytes).
pub(crate) fn thread_name(tgid: u32, tid: u32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/comm")).ok()?;
    let s = s.trim_end_matches('\n');
    (!s.is_empty()).then(|| s.to_string())
}

/// A CPython process found: its memory, ready for code objects, and its maps.
#[derive(Debug)]
pub(crate) struct Found {
    pub mem: ProcMem,
    pub maps: Vec<Mapping>,
    pub file: std::path::PathBuf,
}

/// Looks at a process for a CPython interpreter (`files`: interpreter files already read).
pub(crate) fn find(pid: u32, files: &mut python::Files) -> Result<Option<Found>, String> {
    let Ok(text) = crate::podfs::read_maps(pid) else { return Ok(None) };
    let maps = elf::parse_maps(&text);
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok();
    let read = |addr: u64, len: usize| {
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; len];
        mem.as_ref()?.read_exact_at(&mut b, addr).ok().map(|_| b)
    };
    let Some(interp) = python::find(pid, &maps, &read, files)? else { return Ok(None) };
    let mem = ProcMem::open(pid, interp.layout).map_err(|e| e.to_string())?;
    Ok(Some(Found { mem, maps, file: interp.file }))
}

/// Stacks remembered per process by their raw frames: a loop's outliers
/// recur at a few sites, and a flood of them must not cost a read each.
const MAX_SEEN: usize = 1024;

#[derive(Debug, Default)]
struct Proc {
    python: Option<ProcMem>,
    maps: Vec<Mapping>,
    /// Raw frames (return addresses, then (code, instruction) pairs) → the
    /// stack they resolved to, wholly. A code object's address is trusted
    /// as `ProcMem`'s own cache trusts it.
    seen: HashMap<Vec<u64>, Arc<Stack>>,
}

/// What is known of each process's interpreter and mappings (the worker's).
#[derive(Debug, Default)]
pub(crate) struct Resolver {
    procs: HashMap<u32, Proc>,
    files: HashMap<(u64, u64), Option<Arc<Elf>>>,
    /// What `files` holds, by `Elf::bytes`.
    files_bytes: usize,
}

impl Resolver {
    pub(crate) fn insert(&mut self, pid: u32, interp: Found) {
        self.procs.insert(pid, Proc { python: Some(interp.mem), maps: interp.maps, seen: HashMap::new() });
    }

    /// The stack of one outlier call; None when nothing could be resolved
    /// (the process exited before, or it captured no frames). `snap`: the
    /// kernel's copy of the innermost Python frame's code object.
    pub(crate) fn resolve(&mut self, e: &StallEvent, snap: Option<&PySnap>) -> Option<Arc<Stack>> {
        let raw: Vec<u64> =
            e.native().iter().copied().chain(e.python().iter().flat_map(|f| [f.code, f.instr])).collect();
        // With a copy of the code object, it is what the frame was (an
        // address may have been freed and reused since it was remembered).
        if let Some(s) = self.procs.get(&e.tgid).and_then(|p| p.seen.get(&raw)).filter(|_| snap.is_none()) {
            return Some(s.clone());
        }
        let mut frames = self.python_frames(e, snap);
        frames.extend(self.native_frames(e));
        if frames.is_empty() {
            return None;
        }
        // Only a stack resolved wholly is remembered (a frame missed now may read later).
        let whole = frames.len() == e.native().len() + e.python().len();
        let stack = Arc::new(Stack::new(frames));
        if whole {
            let p = self.procs.entry(e.tgid).or_default();
            if p.seen.len() >= MAX_SEEN {
                p.seen.clear();
            }
            p.seen.insert(raw, stack.clone());
        }
        Some(stack)
    }

    fn python_frames(&mut self, e: &StallEvent, snap: Option<&PySnap>) -> Vec<Frame> {
        let Some(mem) = self.procs.get_mut(&e.tgid).and_then(|p| p.python.as_mut()) else { return Vec::new() };
        let mut out = Vec::new();
        for (i, f) in e.python().iter().enumerate() {
            let copied = snap.filter(|_| i == 0).and_then(|s| mem.code_at_event(s, f.code));
            let Some(code) = copied.or_else(|| mem.code(f.code)) else { continue };
            let line = mem.line(f.code, &code, f.instr);
            out.push(Frame {
                kind: Kind::Python,
                file: code.file.clone(),
                function: code.function.clone(),
                line,
                offset: None,
            });
        }
        out
    }

    fn native_frames(&mut self, e: &StallEvent) -> Vec<Frame> {
        let addrs = e.native();
        if addrs.is_empty() {
            return Vec::new();
        }
        let pid = e.tgid;
        let p = self.procs.entry(pid).or_default();
        if addrs.iter().any(|&a| elf::mapping_of(&p.maps, a).is_none()) {
            // A library loaded since (or a process seen for the first time).
            // An exited process reads empty: what was known stays.
            let now = crate::podfs::read_maps(pid).map(|t| elf::parse_maps(&t)).unwrap_or_default();
            if !now.is_empty() {
                p.maps = now;
            }
        }
        let maps = p.maps.clone();
        let mut out = Vec::new();
        for &a in addrs {
            let Some(m) = elf::mapping_of(&maps, a) else {
                tracing::debug!(
                    pid,
                    addr = format_args!("{a:#x}"),
                    maps = maps.len(),
                    "native frame outside any file mapping"
                );
                continue;
            };
            let elf = self.elf(pid, m);
            // A return address: the call is the instruction before it.
            let function = elf
                .as_ref()
                .and_then(|f| m.vaddr(f, a.saturating_sub(1)).and_then(|v| f.symbol_at(v)))
                .unwrap_or("")
                .to_string();
            out.push(Frame {
                kind: Kind::Native,
                file: m.path.clone(),
                function,
                line: None,
                offset: Some(a - m.start + m.offset),
            });
        }
        out
    }

    fn elf(&mut self, pid: u32, m: &Mapping) -> Option<Arc<Elf>> {
        if let Some(e) = self.files.get(&m.id) {
            return e.clone();
        }
        let elf = match m.open(pid).and_then(|(f, path)| Elf::read(f, &path)) {
            Ok(e) => Some(Arc::new(e)),
            // Exited (its slow call was its last): neither its mappings nor
            // its root reach the file, which another process mapping it may; a
            // failure of this kind is not the file's, and is not remembered
            // (it hid the file's symbols from every later process).
            Err(_) if !root_reachable(pid) => {
                let elf = self.through_another(pid, m)?;
                return self.remember(m.id, Some(elf));
            }
            Err(_) => None,
        };
        self.remember(m.id, elf)
    }

    /// The file of `m` opened through another process known to map it.
    fn through_another(&self, pid: u32, m: &Mapping) -> Option<Arc<Elf>> {
        let others = self.procs.iter().filter(|(p, _)| **p != pid);
        let mut through = others.filter_map(|(p, proc)| Some((*p, proc.maps.iter().find(|x| x.id == m.id)?)));
        through.find_map(|(p, x)| x.open(p).and_then(|(f, path)| Elf::read(f, &path)).ok()).map(Arc::new)
    }

    fn remember(&mut self, id: (u64, u64), elf: Option<Arc<Elf>>) -> Option<Arc<Elf>> {
        let bytes = elf.as_ref().map_or(0, |e| e.bytes());
        if self.files.len() >= MAX_FILES || self.files_bytes + bytes > MAX_SYMBOL_BYTES {
            self.files.clear();
            self.files_bytes = 0;
        }
        self.files_bytes += bytes;
        self.files.insert(id, elf.clone());
        elf
    }

    /// Forgets an exited process (its entry in the kernel goes with `Probes::forget`).
    pub(crate) fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }
}

/// Whether the process's root (its mount namespace) can still be entered:
/// not after it exited, zombie or reaped.
fn root_reachable(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/root")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn libc_of(pid: u32) -> Mapping {
        let maps = elf::parse_maps(&crate::podfs::read_maps(pid).unwrap());
        maps.into_iter().find(|m| m.path.contains("libc.so")).expect("sleep maps libc")
    }

    #[test]
    fn an_exited_process_names_its_frames_through_another_that_maps_the_file() {
        let mut r = Resolver::default();
        let mut a = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let mut b = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let (pa, pb) = (a.id(), b.id());
        // Loaded: the dynamic loader has mapped libc once /proc shows it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while [pa, pb].iter().any(|&p| crate::podfs::read_maps(p).map_or(true, |t| !t.contains("libc.so"))) {
            assert!(std::time::Instant::now() < deadline, "sleep never mapped libc");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let m = libc_of(pa);
        r.procs.entry(pb).or_default().maps = vec![libc_of(pb)];
        a.kill().unwrap();
        a.wait().unwrap();
        assert!(!root_reachable(pa));
        let elf = r.elf(pa, &m).expect("opened through the other process's root");
        let (_, at) = Elf::read_for(libc_of(pb).open(pb).unwrap().0, &["malloc"]).unwrap();
        assert!(elf.symbol_at(at[0].expect("libc has malloc")).is_some(), "with its symbols");
        // With no process left to open it through: nothing, and nothing remembered.
        r.files.clear();
        b.kill().unwrap();
        b.wait().unwrap();
        assert!(r.elf(pa, &m).is_none());
        assert!(r.files.is_empty(), "a failure of the process, not the file, was remembered");
        let mut c = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        while crate::podfs::read_maps(c.id()).map_or(true, |t| !t.contains("libc.so")) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(r.elf(c.id(), &libc_of(c.id())).is_some(), "a later process of the same file is named");
        c.kill().unwrap();
        c.wait().unwrap();
    }
}
