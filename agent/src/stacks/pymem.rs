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
use super::python::Layout;

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

    pub(crate) fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.mem.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }

    fn u64_at(&self, addr: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.read(addr, 8)?.try_into().ok()?))
    }

    fn i32_at(&self, addr: u64) -> Option<i32> {
        Some(i32::from_le_bytes(self.read(addr, 4)?.try_into().ok()?))
    }

    /// True when `obj` is a code object (its type's tp_name is "code"): a
    /// 3.13 frame's executable may be something else, a stale frame anything.
    fn is_code(&mut self, obj: u64) -> bool {
        let Some(ty) = self.u64_at(obj + 8) else { return false };
        if self.code_type == Some(ty) {
            return true;
        }
        let name = self.u64_at(ty + 24).and_then(|p| self.read(p, 5));
        let yes = name.as_deref() == Some(b"code\0");
        if yes {
            self.code_type = Some(ty);
        }
        yes
    }

    /// A str's text: compact ASCII, or compact latin-1/UCS-2/UCS-4.
    pub(crate) fn string(&self, obj: u64) -> Option<String> {
        let c = &self.layout.code;
        let len = self.u64_at(obj + 16)?;
        let state = u32::from_le_bytes(self.read(obj + 32, 4)?.try_into().ok()?);
        let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
        if !compact || len > MAX_STR {
            return None;
        }
        if ascii {
            return String::from_utf8(self.read(obj + c.ascii_size, len as usize)?).ok();
        }
        let raw = self.read(obj + c.compact_size, (len * kind as u64) as usize)?;
        let chars: Option<String> = match kind {
            1 => Some(raw.iter().map(|&b| b as char).collect()),
            2 => raw.chunks_exact(2).map(|x| char::from_u32(u16::from_le_bytes([x[0], x[1]]) as u32)).collect(),
            4 => raw.chunks_exact(4).map(|x| char::from_u32(u32::from_le_bytes(x.try_into().unwrap()))).collect(),
            _ => None,
        };
        chars
    }

    fn bytes(&self, obj: u64) -> Option<Vec<u8>> {
        let len = self.u64_at(obj + 16)?;
        if len > MAX_TABLE {
            return None;
        }
        self.read(obj + 32, len as usize)
    }

    pub(crate) fn code(&mut self, obj: u64) -> Option<Arc<Code>> {
        if let Some(c) = self.codes.get(&obj) {
            return Some(c.clone());
        }
        if !self.is_code(obj) {
            return None;
        }
        let l = self.layout.code;
        let name_at = l.qualname.unwrap_or(l.name);
        let code = Arc::new(Code {
            file: self.string(self.u64_at(obj + l.filename)?)?,
            function: self.string(self.u64_at(obj + name_at)?)?,
            first_line: u32::try_from(self.i32_at(obj + l.firstlineno)?).ok()?,
            table: self.bytes(self.u64_at(obj + l.linetable)?)?,
        });
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        self.codes.insert(obj, code.clone());
        Some(code)
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
