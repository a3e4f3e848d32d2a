// SPDX-License-Identifier: Apache-2.0
//! Mapped files of a process and their ELF symbols: the address of a
//! symbol in a process (`_PyRuntime`), and the symbol a return address
//! falls in (native frames).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

/// One file-backed line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// (device, inode): one symbol table per distinct file.
    pub id: (u64, u64),
    pub path: String,
    pub range: String,
}

impl Mapping {
    /// The mapped file, opened for reading, and the path it was opened by.
    /// Through the mapping itself first (`/proc/PID/map_files`): the very
    /// file mapped, whatever its path names now. What is read here is
    /// cached by (device, inode) and serves every process that maps the
    /// file, so a pod that renames another file over the mapped one's path
    /// must not decide the symbols another pod's frames get.
    pub(crate) fn open(&self, pid: u32) -> io::Result<(File, PathBuf)> {
        let by_map = PathBuf::from(format!("/proc/{pid}/map_files/{}", self.range));
        match crate::podfs::open_regular(&by_map) {
            Ok(f) => Ok((f, by_map)),
            // map_files needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE).
            Err(_) => self.open_by_root(pid),
        }
    }

    /// Through the process's root (its mount namespace), refusing a file
    /// that is not the mapped one. An overlay file's (device, inode) is
    /// not the one its mapping shows on every kernel: not compared there.
    fn open_by_root(&self, pid: u32) -> io::Result<(File, PathBuf)> {
        use std::os::unix::fs::MetadataExt;
        let root = Path::new(&format!("/proc/{pid}/root")).join(self.path.trim_start_matches('/'));
        let f = crate::podfs::open_regular(&root)?;
        let md = f.metadata()?;
        if (crate::procmaps::dev_of(md.dev()), md.ino()) != self.id && !crate::probes::files::is_overlay(&f) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not the file mapped at {} (replaced since it was mapped)", root.display(), self.range),
            ));
        }
        Ok((f, root))
    }

    /// Load bias: process address = bias + ELF virtual address.
    pub(crate) fn bias(&self, elf: &Elf) -> Option<u64> {
        // The kernel maps whole pages: a mapping starts at its segment's offset rounded down.
        let page = |x: u64| x & !0xfff;
        let seg = elf.loads.iter().find(|s| page(s.offset) == self.offset).or_else(|| {
            elf.loads.iter().find(|s| page(s.offset) <= self.offset && self.offset < s.offset + s.filesz)
        })?;
        Some(self.start.wrapping_add(seg.offset).wrapping_sub(self.offset).wrapping_sub(seg.vaddr))
    }

    /// The ELF virtual address of `addr`, an address inside this mapping.
    pub(crate) fn vaddr(&self, elf: &Elf, addr: u64) -> Option<u64> {
        Some(addr.wrapping_sub(self.bias(elf)?))
    }
}

/// File-backed mappings of a process, by address.
pub(crate) fn parse_maps(text: &str) -> Vec<Mapping> {
    crate::procmaps::lines(text)
        .filter(|m| m.inode != 0 && m.path.starts_with('/'))
        .map(|m| Mapping {
            start: m.start,
            end: m.end,
            offset: m.offset,
            id: m.id(),
            path: m.path.to_string(),
            range: m.range.to_string(),
        })
        .collect()
}

/// The mapping holding `addr`.
pub(crate) fn mapping_of(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    maps.iter().find(|m| m.start <= addr && addr < m.end)
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
}

/// Files are read with read(2), never mmap(2): mapping a file waits while
/// any thread sits in a sleepable uprobe (a thread held at a library lookup),
/// which made every lookup during a hold last as long as the hold.
///
/// What is kept of an ELF file: its load segments and function/object
/// symbols sorted by address (the file itself is not kept open).
#[derive(Debug, Default)]
pub(crate) struct Elf {
    pub loads: Vec<Load>,
    /// (address, size, name), sorted by address.
    symbols: Vec<(u64, u64, String)>,
}

/// The most symbol and string table bytes a file may state for the agent
/// to keep its symbols (native frames' function names): they are kept in
/// memory while the file is in use. A libpython states under 1 MiB, glibc
/// 0.1 MiB; a bigger file (an unstripped C++ program, libtorch_cuda's names)
/// gives its frames a file and offset but no function name.
pub(crate) const MAX_TABLE_BYTES: u64 = 8 << 20;

/// PT_LOAD segments: file range and virtual address of each.
fn load_segments<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Vec<Load> {
    obj.segments()
        .map(|s| {
            let (offset, filesz) = s.file_range();
            Load { offset, vaddr: s.address(), filesz }
        })
        .collect()
}

impl Elf {
    /// [`Elf::read`] of the file at `path`.
    #[cfg(test)]
    pub(crate) fn open(path: &Path) -> io::Result<Elf> {
        Self::read(crate::podfs::open_regular(path)?, path)
    }

    /// Load segments and symbols of an open file (`path`: what opened it);
    /// a file whose tables exceed [`MAX_TABLE_BYTES`] is kept without
    /// symbols (and said once, at debug).
    pub(crate) fn read(file: File, path: &Path) -> io::Result<Elf> {
        let cache = crate::podfs::Capped::new(file);
        let obj = crate::podfs::parse_elf(&cache, MAX_TABLE_BYTES).map_err(|e| {
            tracing::debug!(path = %path.display(), error = %e, "native frames without function names");
            e
        })?;
        let loads = load_segments(&obj);
        let mut symbols: Vec<(u64, u64, String)> = obj
            .symbols()
            .chain(obj.dynamic_symbols())
            .filter(|s| !s.is_undefined() && s.address() != 0)
            // Functions only: a frame's address is code, and a data object's
            // name on it (`_PyRuntime`, seen) would name a place it is not.
            .filter(|s| s.kind() == object::SymbolKind::Text)
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
            .collect();
        symbols.sort();
        Ok(Elf { loads, symbols })
    }

    /// [`Elf::read_for`] of the file at `path`.
    #[cfg(test)]
    pub(crate) fn open_for(path: &Path, names: &[&str]) -> io::Result<(Elf, Vec<Option<u64>>)> {
        Self::read_for(crate::podfs::open_regular(path)?, names)
    }

    /// Only the load segments and the addresses of `names` (dynamic
    /// symbols first): what finding an interpreter needs, without building
    /// the whole table (a libpython has ~15,000 symbols).
    pub(crate) fn read_for(file: File, names: &[&str]) -> io::Result<(Elf, Vec<Option<u64>>)> {
        let cache = crate::podfs::Capped::new(file);
        let obj = crate::podfs::parse_elf(&cache, crate::podfs::MAX_ELF_TABLES)?;
        let loads = load_segments(&obj);
        let mut found = vec![None; names.len()];
        for s in obj.dynamic_symbols().chain(obj.symbols()) {
            if s.is_undefined() {
                continue;
            }
            let Ok(n) = s.name_bytes() else { continue };
            if let Some(i) = names.iter().position(|x| x.as_bytes() == n) {
                found[i].get_or_insert(s.address());
                if found.iter().all(Option::is_some) {
                    break;
                }
            }
        }
        Ok((Elf { loads, symbols: Vec::new() }, found))
    }

    /// What this table holds in memory, roughly (for the cache's budget).
    pub(crate) fn bytes(&self) -> usize {
        self.symbols.iter().map(|s| std::mem::size_of::<(u64, u64, String)>() + s.2.len()).sum::<usize>()
            + self.loads.len() * std::mem::size_of::<Load>()
    }

    /// The symbol containing `vaddr` (or the closest one below it when
    /// sizes are unknown).
    pub(crate) fn symbol_at(&self, vaddr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= vaddr).checked_sub(1)?;
        let (a, size, name) = &self.symbols[i];
        (*size == 0 || vaddr < a + size).then_some(name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let text = "55d1c0000000-55d1c0001000 r--p 00000000 08:01 1234 /usr/bin/python3.11\n\
                    7f0000000000-7f0000021000 rw-p 00000000 00:00 0 \n\
                    7f1000000000-7f1000100000 r-xp 00040000 fd:00 99 /lib/lib with space.so\n";
        let m = parse_maps(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].path, "/lib/lib with space.so");
        assert_eq!((m[1].offset, m[1].id), (0x40000, ((0xfd << 32), 99)));
        assert_eq!(mapping_of(&m, 0x7f1000000010).unwrap().id.1, 99);
        assert!(mapping_of(&m, 0x7f0000000010).is_none());
    }

    /// A copy of glibc whose `.dynsym` header claims 200 MiB (the file made
    /// sparse to match): its symbols are not read, and nothing that size
    /// is allocated; the untouched copy still resolves.
    #[test]
    fn a_file_claiming_huge_symbol_tables_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("libc-copy.so");
        std::fs::copy("/usr/lib/x86_64-linux-gnu/libc.so.6", &good).unwrap();
        let (_, found) = Elf::open_for(&good, &["malloc"]).unwrap();
        assert!(found[0].is_some(), "the untouched copy resolves malloc");
        assert!(Elf::open(&good).unwrap().bytes() > 0);

        let mut b = std::fs::read(&good).unwrap();
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u16_at = |b: &[u8], o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap()) as usize;
        let (shoff, shentsize, shnum) = (u64_at(&b, 0x28) as usize, u16_at(&b, 0x3a), u16_at(&b, 0x3c));
        let dynsym = (0..shnum)
            .map(|i| shoff + i * shentsize)
            .find(|&h| u32::from_le_bytes(b[h + 4..h + 8].try_into().unwrap()) == object::elf::SHT_DYNSYM)
            .expect("glibc has a .dynsym");
        b[dynsym + 32..dynsym + 40].copy_from_slice(&(200u64 << 20).to_le_bytes());
        let bad = dir.path().join("libc-claims.so");
        std::fs::write(&bad, &b).unwrap();
        std::fs::OpenOptions::new().write(true).open(&bad).unwrap().set_len(1 << 30).unwrap();

        let e = Elf::open(&bad).unwrap_err().to_string();
        assert!(e.contains("symbol tables of 200 MiB, over the 8 MiB"), "{e}");
        let e = Elf::open_for(&bad, &["malloc"]).unwrap_err().to_string();
        assert!(e.contains("symbol tables of 200 MiB, over the 64 MiB"), "{e}");
    }

    /// glibc's `malloc`, as this process maps it: found by address through
    /// its maps (this test binary's own tables, 30 MiB in a debug build,
    /// are over what the agent keeps).
    #[test]
    fn own_symbols_through_own_maps() {
        let maps = parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let addr = libc::malloc as *const () as usize as u64;
        let m = mapping_of(&maps, addr).expect("libc is mapped");
        let (f, path) = m.open(std::process::id()).unwrap();
        let elf = Elf::read(f, &path).unwrap();
        let name = elf.symbol_at(m.vaddr(&elf, addr).unwrap()).unwrap();
        assert!(name.contains("malloc"), "{name}");
    }

    /// Only functions name a frame: glibc's `environ` (a data object) names
    /// no address, its `malloc` does.
    #[test]
    fn data_objects_name_no_frame() {
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let (_, at) = Elf::open_for(libc, &["environ", "malloc"]).unwrap();
        let elf = Elf::open(libc).unwrap();
        let (environ, malloc) = (at[0].expect("glibc has environ"), at[1].expect("and malloc"));
        assert!(elf.symbol_at(environ).is_none_or(|n| !n.contains("environ")), "{:?}", elf.symbol_at(environ));
        assert!(elf.symbol_at(malloc).is_some_and(|n| n.contains("malloc")));
    }

    /// A process maps a library, then renames another file over its path
    /// and puts a third at the name its maps now show (what a pod can do to
    /// its own files): the agent reads the file that is mapped, or, through
    /// the path, refuses the impostor.
    #[test]
    fn a_file_renamed_over_a_mapped_one_is_not_read_for_it() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libmapped.so");
        std::fs::copy("/usr/lib/x86_64-linux-gnu/libc.so.6", &lib).unwrap();
        let len = std::fs::metadata(&lib).unwrap().len() as usize;
        let file = File::open(&lib).unwrap();
        // SAFETY: a fresh read-only private mapping of a file we own, unmapped below.
        let at =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        assert_ne!(at, libc::MAP_FAILED);
        let impostor = dir.path().join("impostor");
        std::fs::write(&impostor, b"\x7fELF not the mapped file").unwrap();
        std::fs::rename(&impostor, &lib).unwrap();
        // The mapping now reads `PATH (deleted)`: a name the pod can create too.
        std::fs::write(format!("{} (deleted)", lib.display()), b"\x7fELF not the mapped file either").unwrap();

        let maps = parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let m = mapping_of(&maps, at as u64).expect("the copy is mapped").clone();
        let root_only = m.open_by_root(std::process::id()).map(|_| ()).unwrap_err().to_string();
        assert!(root_only.contains("replaced since it was mapped"), "{root_only}");
        // As root (CI): through the mapping, the very file, with its symbols.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let (f, path) = m.open(std::process::id()).unwrap();
            assert!(path.to_string_lossy().contains("/map_files/"), "{}", path.display());
            let (_, found) = Elf::read_for(f, &["malloc"]).unwrap();
            assert!(found[0].is_some(), "the mapped copy's malloc");
        }
        // SAFETY: the mapping made above, of `len` bytes.
        unsafe { libc::munmap(at, len) };
    }
}
