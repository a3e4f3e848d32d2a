// SPDX-License-Identifier: Apache-2.0
//! Reading a live CPython process's objects through /proc/PID/mem: the
//! code object of a captured frame (file, qualified name, line table) and
//! the strs and bytes it points to. Every read is bounded and checked: a
//! process that exits or a frame that was reused gives None, never garbage.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::linetable;
use super::python::{CodeLayout, Layout};
use crate::probes::abi::PySnap;

const MAX_STR: u64 = 4096;
const MAX_TABLE: u64 = 1 << 16;
/// Code objects remembered per process (a training loop has a few hundred).
const MAX_CODES: usize = 16_384;

/// What a frame needs from its code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Code {
    pub file: String,
    pub function: String,
    pub first_line: u32,
    pub table: Vec<u8>,
}

/// Bytes of a process's address space: the live process (`/proc/PID/mem`)
/// or what the kernel copied at the event (`PySnap`).
pub(crate) trait Memory {
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>>;

    fn u64_at(&self, addr: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.read(addr, 8)?.try_into().ok()?))
    }

    fn i32_at(&self, addr: u64) -> Option<i32> {
        Some(i32::from_le_bytes(self.read(addr, 4)?.try_into().ok()?))
    }
}

impl Memory for File {
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }
}

/// A read lies wholly inside one region the kernel copied, or fails.
impl Memory for PySnap {
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let end = addr.checked_add(len as u64)?;
        self.regions()
            .find(|&(at, b)| at <= addr && end <= at + b.len() as u64)
            .map(|(at, b)| b[(addr - at) as usize..(end - at) as usize].to_vec())
    }
}

/// One process's memory and the code objects read from it.
#[derive(Debug)]
pub(crate) struct ProcMem {
    mem: File,
    pub layout: Layout,
    codes: HashMap<u64, Arc<Code>>,
    /// The address of the `code` type, once a code object has been seen.
    code_type: Option<u64>,
}

impl ProcMem {
    pub(crate) fn open(pid: u32, layout: Layout) -> std::io::Result<ProcMem> {
        Ok(ProcMem { mem: File::open(format!("/proc/{pid}/mem"))?, layout, codes: HashMap::new(), code_type: None })
    }

    /// A captured frame's code object, read live (remembered by address).
    pub(crate) fn code(&mut self, obj: u64) -> Option<Arc<Code>> {
        if let Some(c) = self.codes.get(&obj) {
            return Some(c.clone());
        }
        let code = Arc::new(read_code(&self.mem, &self.layout.code, obj, &mut self.code_type)?);
        self.remember(obj, code.clone());
        Some(code)
    }

    /// The innermost frame's code object from the kernel's copy of it, as
    /// it was at the event: right even when the process has exited or the
    /// address has since been freed and reused (it replaces what the cache
    /// held for that address).
    pub(crate) fn code_at_event(&mut self, snap: &PySnap, obj: u64) -> Option<Arc<Code>> {
        if snap.code() != obj {
            return None;
        }
        let code = Arc::new(read_code(snap, &self.layout.code, obj, &mut self.code_type)?);
        self.remember(obj, code.clone());
        Some(code)
    }

    fn remember(&mut self, obj: u64, code: Arc<Code>) {
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        self.codes.insert(obj, code);
    }

    /// The line a frame executes: `instr` is f_lasti (3.9: bytes; 3.10:
    /// code units) or a pointer into the code object's bytecode (3.11+).
    pub(crate) fn line(&self, code_obj: u64, code: &Code, instr: u64) -> Option<u32> {
        let v = self.layout.version;
        let byte_offset = match self.layout.code.code_adaptive {
            Some(at) => instr.checked_sub(code_obj + at)?,
            None if v.minor == 10 => (instr as i64).checked_mul(2).filter(|&b| b >= 0)? as u64,
            None => u64::try_from(instr as i64).ok()?,
        };
        linetable::line_at(v.line_format(), &code.table, code.first_line, byte_offset)
            .or(Some(code.first_line).filter(|_| byte_offset == 0))
    }
}

/// True when `obj` is a code object (its type's tp_name is "code"): a 3.13
/// frame's executable may be something else, a stale frame anything.
fn is_code(m: &impl Memory, obj: u64, code_type: &mut Option<u64>) -> bool {
    let Some(ty) = m.u64_at(obj + 8) else { return false };
    if *code_type == Some(ty) {
        return true;
    }
    let name = m.u64_at(ty + 24).and_then(|p| m.read(p, 5));
    let yes = name.as_deref() == Some(b"code\0");
    if yes {
        *code_type = Some(ty);
    }
    yes
}

/// A str's text: compact ASCII, or compact latin-1/UCS-2/UCS-4.
fn string(m: &impl Memory, c: &CodeLayout, obj: u64) -> Option<String> {
    let len = m.u64_at(obj + 16)?;
    let state = u32::from_le_bytes(m.read(obj + 32, 4)?.try_into().ok()?);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
    if !compact || len > MAX_STR {
        return None;
    }
    if ascii {
        return String::from_utf8(m.read(obj + c.ascii_size, len as usize)?).ok();
    }
    let raw = m.read(obj + c.compact_size, (len * kind as u64) as usize)?;
    match kind {
        1 => Some(raw.iter().map(|&b| b as char).collect()),
        2 => raw.chunks_exact(2).map(|x| char::from_u32(u16::from_le_bytes([x[0], x[1]]) as u32)).collect(),
        4 => raw.chunks_exact(4).map(|x| char::from_u32(u32::from_le_bytes(x.try_into().unwrap()))).collect(),
        _ => None,
    }
}

fn bytes(m: &impl Memory, obj: u64) -> Option<Vec<u8>> {
    let len = m.u64_at(obj + 16)?;
    if len > MAX_TABLE {
        return None;
    }
    m.read(obj + 32, len as usize)
}

/// What a frame needs from the code object at `obj`, wholly or not at all.
fn read_code(m: &impl Memory, l: &CodeLayout, obj: u64, code_type: &mut Option<u64>) -> Option<Code> {
    if !is_code(m, obj, code_type) {
        return None;
    }
    let name_at = l.qualname.unwrap_or(l.name);
    Some(Code {
        file: string(m, l, m.u64_at(obj + l.filename)?)?,
        function: string(m, l, m.u64_at(obj + name_at)?)?,
        first_line: u32::try_from(m.i32_at(obj + l.firstlineno)?).ok()?,
        table: bytes(m, m.u64_at(obj + l.linetable)?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::abi::c;
    use crate::stacks::python::{Version, known};

    /// A 3.12 code object as the kernel copies it: `co_qualname` "Trainer.step"
    /// in "train.py" from line 7, type "code", a 3-byte line table.
    fn snapshot(table_carried: usize) -> Box<PySnap> {
        let l = known(Version { major: 3, minor: 12 }).unwrap().code;
        let mut tail = vec![0u8; std::mem::offset_of!(PySnap, lines)];
        let mut s = PySnap::from_tail(&tail).unwrap();
        let (code, ty, name, file, qual, table) = (0x1000u64, 0x5000u64, 0x6000u64, 0x2000u64, 0x3000u64, 0x4000u64);
        let put = |b: &mut [u8], at: u64, v: &[u8]| b[at as usize..at as usize + v.len()].copy_from_slice(v);
        put(&mut s.head, 8, &ty.to_le_bytes());
        put(&mut s.head, l.filename, &file.to_le_bytes());
        put(&mut s.head, l.qualname.unwrap(), &qual.to_le_bytes());
        put(&mut s.head, l.firstlineno, &7i32.to_le_bytes());
        put(&mut s.head, l.linetable, &table.to_le_bytes());
        s.type_ptr = name.to_le_bytes();
        s.type_name = *b"code\0\0\0\0";
        let ascii_str = |b: &mut [u8], text: &str| {
            put(b, 16, &(text.len() as u64).to_le_bytes());
            put(b, 32, &((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes());
            put(b, l.ascii_size, text.as_bytes());
            l.ascii_size as u32 + text.len() as u32
        };
        let file_len = ascii_str(&mut s.file, "train.py");
        let qual_len = ascii_str(&mut s.name, "Trainer.step");
        put(&mut s.lines, 16, &3u64.to_le_bytes());
        put(&mut s.lines, 32, &[0xf0, 0x01, 0x02]);
        for (i, addr, len) in [
            (c::PY_SNAP_TYPE, ty + 24, 8),
            (c::PY_SNAP_TYPENAME, name, 8),
            (c::PY_SNAP_HEAD, code, 256),
            (c::PY_SNAP_FILE, file, file_len),
            (c::PY_SNAP_NAME, qual, qual_len),
            (c::PY_SNAP_LINES, table, 35),
        ] {
            s.addr[i as usize] = addr;
            s.len[i as usize] = len;
        }
        // As the ring delivers it: cut after the table's bytes carried.
        tail.clear();
        // SAFETY: PySnap is plain old data.
        let bytes = unsafe { std::slice::from_raw_parts(&*s as *const PySnap as *const u8, size_of::<PySnap>()) };
        tail.extend_from_slice(&bytes[..std::mem::offset_of!(PySnap, lines) + table_carried]);
        PySnap::from_tail(&tail).unwrap()
    }

    #[test]
    fn a_code_object_reads_from_the_kernels_copy_alone() {
        let layout = known(Version { major: 3, minor: 12 }).unwrap();
        let s = snapshot(35);
        let mut ty = None;
        let code = read_code(&*s, &layout.code, 0x1000, &mut ty).expect("resolved from the copy");
        assert_eq!(
            code,
            Code { file: "train.py".into(), function: "Trainer.step".into(), first_line: 7, table: vec![0xf0, 1, 2] }
        );
        assert_eq!(ty, Some(0x5000));
        // A read crossing a region's end, or of what was not copied, fails.
        assert_eq!(s.read(0x1000 + 250, 8), None);
        assert_eq!(s.read(0x9000, 1), None);
    }

    #[test]
    fn a_line_table_cut_by_the_record_gives_no_code_rather_than_a_wrong_line() {
        let layout = known(Version { major: 3, minor: 12 }).unwrap();
        let s = snapshot(34);
        assert_eq!(read_code(&*s, &layout.code, 0x1000, &mut None), None);
        // Nor does a record without the snapshot's head.
        assert!(PySnap::from_tail(&[0u8; 16]).is_none());
    }
}
