// SPDX-License-Identifier: Apache-2.0
//! Files in a pod are hostile input. A library path read from
//! `/proc/PID/maps` is opened through `/proc/PID/root`, which belongs to the
//! pod: its owner can put a FIFO where a deleted library was (an `open` for
//! reading then blocks the agent's probe loop for good), a symlink pointing
//! out of its root, or a sparse ELF file whose headers claim gigabytes.
//!
//! So every such file is opened without blocking (`O_NONBLOCK`: a FIFO opens
//! at once), resolved inside the pod's root (`openat2` with
//! `RESOLVE_IN_ROOT`: `..` and absolute symlinks stop at that root, magic
//! links are refused), accepted only if it is a regular file, and parsed
//! through [`Capped`], which refuses any single read past a bound instead of
//! allocating what the file claims.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path};

use object::ReadRef;
use object::read::{ReadCache, ReadCacheOps};

/// The largest single read an ELF parse may make: a section header table,
/// a symbol or string table. libtorch_cuda's `.dynstr`, among the largest
/// real ones, is a few MB.
pub(crate) const MAX_READ: u64 = 256 << 20;

/// The most of a `/proc/PID/maps` read: the kernel's default
/// `vm.max_map_count` (65,530 mappings) at ~250 bytes a line. A process
/// controls its own maps (mappings, their paths), so its text is read capped.
pub(crate) const MAX_MAPS: u64 = 16 << 20;
/// The most of a `/proc/PID/environ` read (the job variables are looked up
/// in it; a container's environment is a few KB, `execve` allows MBs).
pub(crate) const MAX_ENVIRON: u64 = 1 << 20;
/// The most of a `/proc/PID/cmdline` read (it is only shown).
pub(crate) const MAX_CMDLINE: u64 = 64 << 10;

/// Reads at most `cap` bytes of a file a process controls (procfs text):
/// a longer one is cut at its last whole line (or NUL), so no parser sees a
/// torn record, and said at debug.
pub(crate) fn read_capped(path: impl AsRef<Path>, cap: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut b = Vec::new();
    File::open(path.as_ref())?.take(cap).read_to_end(&mut b)?;
    if b.len() as u64 == cap {
        let keep = b.iter().rposition(|&c| c == b'\n' || c == 0).map_or(0, |i| i + 1);
        b.truncate(keep);
        tracing::debug!(path = %path.as_ref().display(), cap, "read cut at its cap");
    }
    Ok(b)
}

/// [`read_capped`] of `/proc/PID/maps`, as text (a path that is not UTF-8
/// keeps its line, with replacement characters: it will not open).
pub(crate) fn read_maps(pid: u32) -> io::Result<String> {
    // No copy where it is UTF-8 (a 16 MiB text was read twice over).
    read_capped(format!("/proc/{pid}/maps"), MAX_MAPS)
        .map(|b| String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// `struct open_how` (linux/openat2.h): libc's is non-exhaustive.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const OPEN_FLAGS: i32 = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

/// `/proc/PID/root/REST` split into (`/proc/PID/root`, `REST`).
fn split_pod_root(path: &Path) -> Option<(&Path, &Path)> {
    let mut c = path.components();
    let ok = c.next() == Some(Component::RootDir)
        && c.next() == Some(Component::Normal("proc".as_ref()))
        && matches!(c.next(), Some(Component::Normal(p)) if p.as_bytes().iter().all(u8::is_ascii_digit))
        && c.next() == Some(Component::Normal("root".as_ref()));
    if !ok {
        return None;
    }
    let rest = c.as_path();
    let root_len = path.as_os_str().len() - rest.as_os_str().len();
    let root = Path::new(std::ffi::OsStr::from_bytes(&path.as_os_str().as_bytes()[..root_len]));
    Some((root, rest))
}

/// `openat2(dir, rel, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`.
fn open_in_root(root: &Path, rel: &Path) -> io::Result<File> {
    let dir = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_DIRECTORY).open(root)?;
    let rel = std::ffi::CString::new(rel.as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in path"))?;
    let how =
        OpenHow { flags: OPEN_FLAGS as u64, mode: 0, resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS };
    // SAFETY: every pointer is valid for the call; the size is that of `how`.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, dir.as_raw_fd(), rel.as_ptr(), &how as *const OpenHow, size_of::<OpenHow>())
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// Opens a file that may belong to a pod, for reading: never blocks, never
/// leaves the pod's root, and only a regular file is returned.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    let file = match split_pod_root(path) {
        Some((root, rel)) => match open_in_root(root, rel) {
            // Before Linux 5.6: no openat2; still never blocking, never a FIFO.
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => open_plain(path)?,
            other => other?,
        },
        None => open_plain(path)?,
    };
    let ft = file.metadata()?.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {what}", path.display())));
    }
    Ok(file)
}

fn open_plain(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(OPEN_FLAGS & !libc::O_RDONLY).open(path)
}

/// The most symbol and string table bytes an ELF file may state for the
/// agent to parse it: `object` reads every symbol table whole when it parses
/// a file, and a sparse file can state any size. Real ones are far smaller
/// (libpython under 1 MiB, glibc 0.1 MiB, a debug build of this agent 30 MiB).
pub(crate) const MAX_ELF_TABLES: u64 = 64 << 20;
/// The most section headers a file may state (`e_shnum`, or section 0's
/// size when it overflows): read whole before anything else.
const MAX_SECTIONS: u64 = 1 << 16;

/// What parsing `data` would read of its symbol and string tables, from
/// its ELF and section headers alone; None when those are not ELF, or
/// state more section headers than any real file has.
fn elf_table_bytes<'a, R: ReadRef<'a>>(data: R) -> Option<u64> {
    match object::FileKind::parse(data).ok()? {
        object::FileKind::Elf32 => table_bytes::<object::elf::FileHeader32<object::Endianness>, R>(data),
        object::FileKind::Elf64 => table_bytes::<object::elf::FileHeader64<object::Endianness>, R>(data),
        _ => None,
    }
}

fn table_bytes<'a, H: object::read::elf::FileHeader, R: ReadRef<'a>>(data: R) -> Option<u64> {
    use object::elf::{SHT_DYNSYM, SHT_STRTAB, SHT_SYMTAB};
    use object::read::elf::SectionHeader;
    let h = H::parse(data).ok()?;
    let e = h.endian().ok()?;
    if h.shnum(e, data).ok()? as u64 > MAX_SECTIONS {
        return None;
    }
    let sections = h.section_headers(e, data).ok()?;
    Some(
        sections
            .iter()
            .filter(|s| matches!(s.sh_type(e), SHT_SYMTAB | SHT_DYNSYM | SHT_STRTAB))
            .fold(0u64, |n, s| n.saturating_add(s.sh_size(e).into())),
    )
}

/// Parses an ELF file read through `cache`, unless its headers state more
/// than `max_tables` bytes of symbol and string tables (checked before any
/// table is read).
pub(crate) fn parse_elf(cache: &Capped<File>, max_tables: u64) -> io::Result<object::File<'_, &Capped<File>>> {
    match elf_table_bytes(cache) {
        Some(n) if n > max_tables => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("symbol tables of {} MiB, over the {} MiB the agent reads", n >> 20, max_tables >> 20),
        )),
        Some(_) => object::File::parse(cache).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        None => Err(io::Error::new(io::ErrorKind::InvalidData, "not an ELF file the agent reads")),
    }
}

/// An ELF reader that refuses single reads over [`MAX_READ`] and past the
/// end of the file, where `object`'s own cache would allocate what a
/// crafted header claims.
#[derive(Debug)]
pub(crate) struct Capped<R: ReadCacheOps> {
    inner: ReadCache<R>,
    len: Option<u64>,
}

impl<R: ReadCacheOps> Capped<R> {
    pub(crate) fn new(r: R) -> Self {
        let inner = ReadCache::new(r);
        let len = (&inner).len().ok();
        Capped { inner, len }
    }
}

impl<'a, R: ReadCacheOps> ReadRef<'a> for &'a Capped<R> {
    fn len(self) -> Result<u64, ()> {
        self.len.ok_or(())
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        let end = offset.checked_add(size).ok_or(())?;
        if size > MAX_READ || end > self.len.ok_or(())? {
            return Err(());
        }
        (&self.inner).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let end = range.end.min(range.start.saturating_add(MAX_READ));
        (&self.inner).read_bytes_at_until(range.start..end, delimiter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_a_pods_root() {
        let (root, rel) = split_pod_root(Path::new("/proc/42/root/usr/lib/libc.so.6")).unwrap();
        assert_eq!((root, rel), (Path::new("/proc/42/root"), Path::new("usr/lib/libc.so.6")));
        assert!(split_pod_root(Path::new("/proc/self/root/x")).is_none());
        assert!(split_pod_root(Path::new("/usr/lib/x")).is_none());
    }

    #[test]
    fn a_fifo_is_refused_at_once_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("libpython3.11.so.1.0 (deleted)");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let t = std::time::Instant::now();
        let e = open_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        // Through a process's root, as the agent reaches pod files.
        let via_root = Path::new(&format!("/proc/{}/root", std::process::id())).join(fifo.strip_prefix("/").unwrap());
        assert!(open_regular(&via_root).unwrap_err().to_string().contains("FIFO"));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn a_symlink_cannot_leave_the_pods_root() {
        // A "pod" root with a link to an absolute path: resolved inside the
        // root it names nothing; followed on the host it would be /etc/hostname.
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.path().join("escape")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc/hostname", root.path().join("dotdot")).unwrap();
        for link in ["escape", "dotdot"] {
            let e = open_in_root(root.path(), Path::new(link)).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{link}: {e}");
        }
        std::fs::write(root.path().join("lib.so"), b"x").unwrap();
        assert!(open_in_root(root.path(), Path::new("lib.so")).is_ok());
    }

    #[test]
    fn procfs_text_is_read_capped_at_a_whole_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("maps");
        std::fs::write(&p, "line one\nline two\nline three\n").unwrap();
        assert_eq!(read_capped(&p, 1 << 20).unwrap(), b"line one\nline two\nline three\n");
        assert_eq!(read_capped(&p, 20).unwrap(), b"line one\nline two\n", "cut at the last whole line");
        assert_eq!(read_capped(&p, 5).unwrap(), b"", "no whole line fits");
        std::fs::write(&p, b"a=1\0b=2\0c=3").unwrap();
        assert_eq!(read_capped(&p, 9).unwrap(), b"a=1\0b=2\0", "environ: cut at a NUL");
        let own = read_maps(std::process::id()).unwrap();
        assert!(own.lines().count() > 5 && own.ends_with('\n'), "{own}");
    }

    #[test]
    fn a_sparse_file_claiming_gigabytes_is_not_allocated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sparse.so");
        let f = File::create(&p).unwrap();
        f.set_len(64 << 30).unwrap();
        let c = Capped::new(open_regular(&p).unwrap());
        assert!((&c).read_bytes_at(0, 8 << 30).is_err(), "a read past the cap must be refused");
        assert!((&c).read_bytes_at(1 << 30, 4096).is_ok());
        assert!((&c).read_bytes_at((64 << 30) - 8, 16).is_err(), "past the end");
        assert!(object::File::parse(&c).is_err(), "zeros are no ELF");
    }
}
