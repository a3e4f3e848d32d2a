// SPDX-License-Identifier: Apache-2.0
//! Finding a CPython interpreter in a process and where its version keeps
//! threads, frames and code objects. 3.9–3.12: offsets per version (taken
//! from each version's own headers; a test recompiles them against every
//! installed interpreter). 3.13+: the `_Py_DebugOffsets` the interpreter
//! publishes at the start of `_PyRuntime` for debuggers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::elf::{Elf, Mapping};
use super::linetable::Format;
use crate::probes::abi::{PY_NONE, PY_SNAP_CODE_MIN, PY_SNAP_STR, PyProc};

/// CPython versions the tests run (pyenv on the CI image).
#[cfg(test)]
pub(crate) const TESTED: [&str; 5] = ["3.9", "3.10", "3.11", "3.12", "3.13"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version {
    pub major: u8,
    pub minor: u8,
}

impl Version {
    /// `3.11` or a file name holding it (`libpython3.11.so.1.0`, `python3.11d`).
    pub(crate) fn parse(s: &str) -> Option<Version> {
        let at = s.find("3.")?;
        let digits: String = s[at + 2..].chars().take_while(|c| c.is_ascii_digit()).collect();
        Some(Version { major: 3, minor: digits.parse().ok()? })
    }

    pub(crate) fn line_format(self) -> Format {
        match self.minor {
            ..=9 => Format::Lnotab,
            10 => Format::Pep626,
            _ => Format::Locations,
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Where a code object and a str keep what a frame needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CodeLayout {
    pub filename: u64,
    pub name: u64,
    /// 3.11+: co_qualname.
    pub qualname: Option<u64>,
    pub firstlineno: u64,
    pub linetable: u64,
    /// 3.11+: the bytecode inside the code object (instruction pointers are into it).
    pub code_adaptive: Option<u64>,
    /// sizeof(PyASCIIObject): an ASCII str's characters follow it.
    pub ascii_size: u64,
    /// sizeof(PyCompactUnicodeObject): other compact strs' characters follow it.
    pub compact_size: u64,
}

/// Everything needed to walk and resolve one interpreter's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub version: Version,
    pub kernel: PyProc,
    pub code: CodeLayout,
}

impl Layout {
    /// Tells the kernel where the code object's fields are, for the
    /// snapshot of an event's innermost frame (`struct py_snap`): an offset
    /// outside the copied head, or not a pointer's, turns it off.
    fn new(version: Version, mut kernel: PyProc, code: CodeLayout) -> Layout {
        let head = |off: u64| {
            u16::try_from(off).ok().filter(|&o| o % 8 == 0 && o as usize + 8 <= PY_SNAP_CODE_MIN).unwrap_or(PY_NONE)
        };
        kernel.co_filename = head(code.filename);
        kernel.co_name = head(code.qualname.unwrap_or(code.name));
        kernel.co_linetable = head(code.linetable);
        kernel.str_ascii = u16::try_from(code.ascii_size).unwrap_or(PY_NONE);
        kernel.str_compact = u16::try_from(code.compact_size).unwrap_or(PY_NONE);
        let strs = kernel.str_ascii as usize <= PY_SNAP_STR && kernel.str_compact as usize <= PY_SNAP_STR;
        if code.firstlineno as usize + 4 > PY_SNAP_CODE_MIN || !strs {
            kernel.co_filename = PY_NONE;
        }
        Layout { version, kernel, code }
    }
}

/// Offsets of the release builds of 3.9–3.13 (x86-64, LP64), from each
/// version's headers (`offsetof`); `python::tests` checks them again.
pub(crate) fn known(v: Version) -> Option<Layout> {
    // (interp_head, threads_head, ts_next, ts_thread_id, ts_frame, cframe_frame,
    //  fr_previous, fr_code, fr_instr, fr_owner, instr_size)
    let (k, c): ([u16; 11], [u64; 8]) = match v.minor {
        9 => ([32, 8, 8, 176, 24, PY_NONE, 24, 32, 104, PY_NONE, 4], [104, 112, 0, 40, 120, 0, 48, 72]),
        10 => ([32, 8, 8, 176, 24, PY_NONE, 24, 32, 96, PY_NONE, 4], [104, 112, 0, 40, 120, 0, 48, 72]),
        11 => ([40, 16, 8, 152, 56, 8, 48, 32, 56, 69, 8], [112, 120, 128, 72, 136, 184, 48, 72]),
        12 => ([40, 72, 8, 136, 56, 0, 8, 0, 56, 70, 8], [112, 120, 128, 68, 136, 192, 40, 56]),
        13 => ([632, 7344, 8, 152, 72, PY_NONE, 8, 0, 56, 70, 8], [112, 120, 128, 68, 136, 200, 40, 56]),
        _ => return None,
    };
    let kernel = PyProc {
        runtime: 0,
        interp_head: k[0],
        threads_head: k[1],
        ts_next: k[2],
        ts_thread_id: k[3],
        ts_frame: k[4],
        cframe_frame: k[5],
        fr_previous: k[6],
        fr_code: k[7],
        fr_instr: k[8],
        fr_owner: k[9],
        instr_size: k[10],
        ..PyProc::default()
    };
    let code = CodeLayout {
        filename: c[0],
        name: c[1],
        qualname: (v.minor >= 11).then_some(c[2]),
        firstlineno: c[3],
        linetable: c[4],
        code_adaptive: (v.minor >= 11).then_some(c[5]),
        ascii_size: c[6],
        compact_size: c[7],
    };
    Some(Layout::new(v, kernel, code))
}

/// 3.13's `_Py_DebugOffsets` as u64 words (the struct is all u64 after the
/// 8-byte cookie); indices of the fields used. Later versions reorder it.
mod debug {
    pub(super) const COOKIE: &[u8; 8] = b"xdebugpy";
    pub(super) const WORDS: usize = 71;
    pub(super) const INTERPRETERS_HEAD: usize = 5;
    pub(super) const THREADS_HEAD: usize = 9;
    pub(super) const TS_NEXT: usize = 21;
    pub(super) const TS_CURRENT_FRAME: usize = 23;
    pub(super) const TS_THREAD_ID: usize = 24;
    pub(super) const FR_PREVIOUS: usize = 29;
    pub(super) const FR_EXECUTABLE: usize = 30;
    pub(super) const FR_INSTR_PTR: usize = 31;
    pub(super) const FR_OWNER: usize = 33;
    pub(super) const CO_FILENAME: usize = 35;
    pub(super) const CO_NAME: usize = 36;
    pub(super) const CO_QUALNAME: usize = 37;
    pub(super) const CO_LINETABLE: usize = 38;
    pub(super) const CO_FIRSTLINENO: usize = 39;
    pub(super) const CO_CODE_ADAPTIVE: usize = 43;
    pub(super) const ASCII_SIZE: usize = 70;
}

/// The 3.13 layout from the interpreter's own debug offsets (`words`: the
/// start of `_PyRuntime`); None when the cookie or a value is off.
pub(crate) fn from_debug_offsets(v: Version, bytes: &[u8]) -> Option<Layout> {
    if v.minor != 13 || bytes.len() < 8 * debug::WORDS || &bytes[..8] != debug::COOKIE {
        return None;
    }
    let w = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap());
    let small = |i: usize| u16::try_from(w(i)).ok().filter(|&x| x != PY_NONE);
    use debug::*;
    let kernel = PyProc {
        runtime: 0,
        interp_head: small(INTERPRETERS_HEAD)?,
        threads_head: small(THREADS_HEAD)?,
        ts_next: small(TS_NEXT)?,
        ts_thread_id: small(TS_THREAD_ID)?,
        ts_frame: small(TS_CURRENT_FRAME)?,
        cframe_frame: PY_NONE,
        fr_previous: small(FR_PREVIOUS)?,
        fr_code: small(FR_EXECUTABLE)?,
        fr_instr: small(FR_INSTR_PTR)?,
        fr_owner: small(FR_OWNER)?,
        instr_size: 8,
        ..PyProc::default()
    };
    let ascii = w(ASCII_SIZE);
    let code = CodeLayout {
        filename: w(CO_FILENAME),
        name: w(CO_NAME),
        qualname: Some(w(CO_QUALNAME)),
        firstlineno: w(CO_FIRSTLINENO),
        linetable: w(CO_LINETABLE),
        code_adaptive: Some(w(CO_CODE_ADAPTIVE)),
        ascii_size: ascii,
        // utf8_length and utf8 follow the ASCII header.
        compact_size: ascii + 16,
    };
    Some(Layout::new(v, kernel, code))
}

/// The file of a process that defines `_PyRuntime`: libpython when it is
/// mapped (a shared build), else the executable (a static one).
pub(crate) fn interpreter_file(maps: &[Mapping]) -> Option<&Mapping> {
    let name = |m: &&Mapping| m.path.rsplit('/').next().unwrap_or("").to_string();
    maps.iter()
        .find(|m| name(m).starts_with("libpython3."))
        .or_else(|| maps.iter().find(|m| name(m).starts_with("python3.") && m.offset == 0))
}

/// A CPython process found: where the kernel walks it, and how its code objects read.
#[derive(Debug, Clone)]
pub(crate) struct Interpreter {
    pub layout: Layout,
    pub file: PathBuf,
}

/// What `find` reads of an interpreter file: its load segments and where
/// `_PyRuntime` and `Py_Version` are.
type FileFacts = Arc<(Elf, Vec<Option<u64>>)>;

/// Interpreter files already read, by (device, inode), the latest last:
/// the ranks of a job start together from one image, and a thread held at
/// its first library lookup waits while processes are registered one by
/// one (3.9 and 3.10 have no `Py_Version`: the search reads every symbol,
/// ~200 ms on a loaded 2-core node).
#[derive(Debug, Default)]
pub(crate) struct Files(Vec<((u64, u64), FileFacts)>);

const MAX_FILES: usize = 32;

impl Files {
    /// The facts of file `id`, opened by `open` unless already read.
    fn read(
        &mut self,
        id: (u64, u64),
        open: impl FnOnce() -> std::io::Result<(std::fs::File, PathBuf)>,
    ) -> std::io::Result<FileFacts> {
        if let Some((_, f)) = self.0.iter().find(|(k, _)| *k == id) {
            return Ok(f.clone());
        }
        let (file, path) = open()?;
        let facts = Elf::read_for(file, &["_PyRuntime", "Py_Version"])
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let facts = Arc::new(facts);
        if self.0.len() >= MAX_FILES {
            self.0.remove(0);
        }
        self.0.push((id, facts.clone()));
        Ok(facts)
    }
}

/// Finds the interpreter of `pid` and its layout; None for a process that
/// is not CPython. `read` reads the process's memory (for `Py_Version` and
/// the 3.13 debug offsets).
pub(crate) fn find(
    pid: u32,
    maps: &[Mapping],
    read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
    files: &mut Files,
) -> Result<Option<Interpreter>, String> {
    let Some(m) = interpreter_file(maps) else { return Ok(None) };
    let facts = files.read(m.id, || m.open(pid)).map_err(|e| format!("{}: {e}", m.path))?;
    let (elf, syms) = &*facts;
    let Some(runtime_v) = syms[0] else { return Ok(None) };
    let bias = m.bias(elf).ok_or_else(|| format!("{}: no load segment for its mapping", m.path))?;
    let runtime = bias.wrapping_add(runtime_v);
    // 3.11+ says its version in Py_Version (PY_VERSION_HEX); before, the file name does.
    let from_memory = syms[1].and_then(|a| read(bias.wrapping_add(a), 4)).map(|b| {
        let hex = u32::from_le_bytes(b[..4].try_into().unwrap());
        Version { major: (hex >> 24) as u8, minor: (hex >> 16) as u8 }
    });
    let version = from_memory.or_else(|| Version::parse(Path::new(&m.path).file_name()?.to_str()?));
    let Some(version) = version else { return Err(format!("{}: cannot tell the Python version", m.path)) };
    let layout = match version.minor {
        13 => read(runtime, 8 * debug::WORDS).and_then(|b| from_debug_offsets(version, &b)).or_else(|| known(version)),
        _ => known(version),
    };
    let Some(mut layout) = layout else {
        return Err(format!("Python {version} is not supported (3.9–3.13 are); no Python frames for it"));
    };
    layout.kernel.runtime = runtime;
    Ok(Some(Interpreter { layout, file: PathBuf::from(&m.path) }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The pyenv interpreter of version `v` (CI installs them; a missing one fails loudly).
    pub(crate) fn interpreter(v: &str) -> PathBuf {
        let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
        let dir = Path::new(&root).join("versions");
        let found = std::fs::read_dir(&dir).ok().and_then(|rd| {
            let mut all: Vec<_> = rd.flatten().map(|e| e.file_name().to_string_lossy().to_string()).collect();
            all.sort();
            all.into_iter().rev().find(|n| n.starts_with(&format!("{v}.")))
        });
        let Some(name) = found else {
            panic!("CPython {v} is not installed under {} (.ci/run installs it)", dir.display())
        };
        dir.join(name).join("bin").join(format!("python{v}"))
    }

    pub(crate) fn run_python(v: &str, code: &str) -> String {
        let out = std::process::Command::new(interpreter(v)).arg("-c").arg(code).output().unwrap();
        assert!(out.status.success(), "python {v}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn every_tested_version_copies_its_innermost_code_object_at_the_event() {
        for v in TESTED {
            let l = known(Version::parse(v).unwrap()).unwrap();
            let k = l.kernel;
            assert!(k.co_filename != PY_NONE && k.co_name != PY_NONE && k.co_linetable != PY_NONE, "{v}: {k:?}");
            assert_eq!(k.co_name as u64, l.code.qualname.unwrap_or(l.code.name), "{v}");
        }
    }

    #[test]
    fn an_interpreter_file_is_read_once_per_device_and_inode() {
        let mut files = Files::default();
        let exe = std::env::current_exe().unwrap();
        let me = || Ok((std::fs::File::open(&exe)?, exe.clone()));
        let a = files.read((1, 2), me).unwrap();
        assert!(Arc::ptr_eq(&a, &files.read((1, 2), || unreachable!("read again")).unwrap()), "read again");
        assert!(!Arc::ptr_eq(&a, &files.read((1, 3), me).unwrap()), "another file");
        for i in 0..MAX_FILES as u64 {
            files.read((2, i), me).unwrap();
        }
        assert_eq!(files.0.len(), MAX_FILES, "bounded");
        assert!(files.0.iter().all(|(k, _)| *k != (1, 2)), "the oldest goes first");
    }

    #[test]
    fn versions_from_names() {
        assert_eq!(Version::parse("libpython3.11.so.1.0"), Some(Version { major: 3, minor: 11 }));
        assert_eq!(Version::parse("python3.9d"), Some(Version { major: 3, minor: 9 }));
        assert_eq!(Version::parse("python"), None);
        assert!(known(Version { major: 3, minor: 14 }).is_none());
    }

    /// The table above against `offsetof` compiled with each installed
    /// version's own headers (internal ones included).
    #[test]
    fn offsets_match_each_versions_headers() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("off.c");
        std::fs::write(&src, OFFSETS_C).unwrap();
        for v in TESTED {
            let py = interpreter(v);
            let include = py.parent().unwrap().parent().unwrap().join("include").join(format!("python{v}"));
            let exe = dir.path().join(format!("off{v}"));
            let st = std::process::Command::new("cc")
                .arg(format!("-I{}", include.display()))
                .arg(&src)
                .arg("-o")
                .arg(&exe)
                .status()
                .unwrap();
            assert!(st.success(), "compiling against {v}'s headers");
            let out = String::from_utf8(std::process::Command::new(&exe).output().unwrap().stdout).unwrap();
            let got: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
            let l = known(Version::parse(v).unwrap()).unwrap();
            let k = l.kernel;
            let none = |x: u16| if x == PY_NONE { 0 } else { x as u64 };
            let want = [
                k.interp_head as u64,
                k.threads_head as u64,
                k.ts_next as u64,
                k.ts_thread_id as u64,
                k.ts_frame as u64,
                none(k.cframe_frame),
                k.fr_previous as u64,
                k.fr_code as u64,
                k.fr_instr as u64,
                none(k.fr_owner),
                l.code.filename,
                l.code.name,
                l.code.qualname.unwrap_or(0),
                l.code.firstlineno,
                l.code.linetable,
                l.code.code_adaptive.unwrap_or(0),
                l.code.ascii_size,
                l.code.compact_size,
            ];
            assert_eq!(got, want, "python {v}");
        }
    }

    const OFFSETS_C: &str = r#"
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#else
#include <frameobject.h>
#endif
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#define P(x) printf("%zu ", (size_t)(x))
int main(void) {
  P(offsetof(_PyRuntimeState, interpreters.head));
#if PY_VERSION_HEX >= 0x030B0000
  P(offsetof(PyInterpreterState, threads.head));
#else
  P(offsetof(PyInterpreterState, tstate_head));
#endif
  P(offsetof(PyThreadState, next));
  P(offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030D0000
  P(offsetof(PyThreadState, current_frame)); P(0);
#elif PY_VERSION_HEX >= 0x030B0000
  P(offsetof(PyThreadState, cframe)); P(offsetof(_PyCFrame, current_frame));
#else
  P(offsetof(PyThreadState, frame)); P(0);
#endif
#if PY_VERSION_HEX >= 0x030D0000
  P(offsetof(_PyInterpreterFrame, previous)); P(offsetof(_PyInterpreterFrame, f_executable));
  P(offsetof(_PyInterpreterFrame, instr_ptr)); P(offsetof(_PyInterpreterFrame, owner));
#elif PY_VERSION_HEX >= 0x030B0000
  P(offsetof(_PyInterpreterFrame, previous)); P(offsetof(_PyInterpreterFrame, f_code));
  P(offsetof(_PyInterpreterFrame, prev_instr)); P(offsetof(_PyInterpreterFrame, owner));
#else
  P(offsetof(PyFrameObject, f_back)); P(offsetof(PyFrameObject, f_code));
  P(offsetof(PyFrameObject, f_lasti)); P(0);
#endif
  P(offsetof(PyCodeObject, co_filename)); P(offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX >= 0x030B0000
  P(offsetof(PyCodeObject, co_qualname));
#else
  P(0);
#endif
  P(offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX >= 0x030A0000
  P(offsetof(PyCodeObject, co_linetable));
#else
  P(offsetof(PyCodeObject, co_lnotab));
#endif
#if PY_VERSION_HEX >= 0x030B0000
  P(offsetof(PyCodeObject, co_code_adaptive));
#else
  P(0);
#endif
  P(sizeof(PyASCIIObject)); P(sizeof(PyCompactUnicodeObject));
  return 0;
}
"#;
}

#[cfg(test)]
mod live {
    use super::tests::interpreter;
    use super::*;

    /// Each installed interpreter is found in a live process, with the
    /// layout of its version (3.13: read from its own debug offsets).
    #[test]
    fn finds_each_live_interpreter() {
        for v in TESTED {
            let mut child = std::process::Command::new(interpreter(v))
                .args(["-c", "import sys; print(1, flush=True); sys.stdin.read(1)"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut one = [0u8; 2];
            std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut one).unwrap();
            let pid = child.id();
            let maps = super::super::elf::parse_maps(&std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap());
            let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
            let read = |a: u64, n: usize| {
                use std::os::unix::fs::FileExt;
                let mut b = vec![0u8; n];
                mem.read_exact_at(&mut b, a).ok().map(|_| b)
            };
            let found = find(pid, &maps, &read, &mut Files::default());
            let _ = child.kill();
            let _ = child.wait();
            let i =
                found.unwrap_or_else(|e| panic!("python {v}: {e}")).unwrap_or_else(|| panic!("python {v}: not found"));
            let want = Version::parse(v).unwrap();
            assert_eq!(i.layout.version, want);
            let mut k = known(want).unwrap();
            k.kernel.runtime = i.layout.kernel.runtime;
            assert_eq!(i.layout, k, "python {v}");
            assert_ne!(i.layout.kernel.runtime, 0);
        }
    }
}
