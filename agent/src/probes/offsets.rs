// SPDX-License-Identifier: Apache-2.0
//! File offsets of the symbols to probe, read once per library file with
//! read(2) (through `podfs`) and handed to the kernel as absolute offsets.
//!
//! aya resolves a `Symbol` attach point by mapping the whole file, once per
//! probe. An mmap of a file with uprobes waits while a thread is held at its
//! first lookup (ebpf/libload.bpf.c), and a library takes ~45 attaches: under
//! load the agent spent the whole 1 s hold mapping files, and the held
//! thread's first calls went uncounted.

use std::collections::HashMap;
use std::path::Path;

use object::{Object, ObjectKind, ObjectSection, ObjectSymbol};

use crate::podfs::{Capped, open_regular};

/// `names` → file offset, for those the file defines (dynamic symbols first).
pub(crate) fn resolve(path: &Path, names: &[&str]) -> std::io::Result<HashMap<String, u64>> {
    let cache = Capped::new(open_regular(path)?);
    let obj = crate::podfs::parse_elf(&cache, crate::podfs::MAX_ELF_TABLES)?;
    let translate = matches!(obj.kind(), ObjectKind::Dynamic | ObjectKind::Executable);
    let mut out = HashMap::new();
    for s in obj.dynamic_symbols().chain(obj.symbols()) {
        if s.is_undefined() || s.address() == 0 {
            continue;
        }
        let Ok(name) = s.name() else { continue };
        if out.contains_key(name) || !names.contains(&name) {
            continue;
        }
        let offset = if !translate {
            s.address()
        } else {
            // Virtual address → file offset through the symbol's section,
            // as aya (and the kernel's uprobe_register) expect.
            let Some(sec) = s.section_index().and_then(|i| obj.section_by_index(i).ok()) else { continue };
            let Some((file_off, _)) = sec.file_range() else { continue };
            let Some(delta) = s.address().checked_sub(sec.address()) else { continue };
            file_off + delta
        };
        out.insert(name.to_string(), offset);
        if out.len() == names.len() {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets agree with where the bytes are: the file's bytes at the
    /// offset of a function are the bytes this process runs at its address.
    #[test]
    fn an_offset_points_at_the_functions_own_bytes() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc_line = maps.lines().find(|l| l.contains("libc.so.6") && l.contains("r-xp")).unwrap();
        let path = libc_line.split_whitespace().last().unwrap();
        let offs = resolve(Path::new(path), &["getpid", "no_such_symbol_here"]).unwrap();
        assert!(!offs.contains_key("no_such_symbol_here"));
        let off = offs["getpid"];
        let file = std::fs::read(path).unwrap();
        let f = libc::getpid as *const () as *const u8;
        // SAFETY: getpid's first 16 bytes are mapped code of this process.
        let live = unsafe { std::slice::from_raw_parts(f, 16) };
        assert_eq!(&file[off as usize..off as usize + 16], live);
    }
}
