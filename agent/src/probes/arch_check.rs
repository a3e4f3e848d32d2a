// SPDX-License-Identifier: Apache-2.0
//! Checks, without an arm64 machine, that the eBPF object built for aarch64
//! reads arguments the arm64 way: its CO-RE relocations must name the
//! fields of `struct user_pt_regs` (regs[]) and the x86-64 object those
//! of `struct pt_regs` (si, dx, sp, ax). A tiny reader of the ELF sections
//! `.BTF` and `.BTF.ext` (the formats of linux/btf.h and libbpf's btf.h).

use std::collections::BTreeSet;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// The bytes of an ELF64 (little-endian) section by name.
fn section<'a>(elf: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(elf, 0x28) as usize,
        u16_at(elf, 0x3a) as usize,
        u16_at(elf, 0x3c) as usize,
        u16_at(elf, 0x3e) as usize,
    );
    let hdr = |i: usize| shoff + i * shentsize;
    let body = |i: usize| {
        let (off, size) = (u64_at(elf, hdr(i) + 0x18) as usize, u64_at(elf, hdr(i) + 0x20) as usize);
        &elf[off..off + size]
    };
    let names = body(shstrndx);
    (0..shnum).find_map(|i| {
        let n = u32_at(elf, hdr(i)) as usize;
        let end = names[n..].iter().position(|&c| c == 0)? + n;
        (&names[n..end] == name.as_bytes()).then(|| body(i))
    })
}

struct Btf<'a> {
    strings: &'a [u8],
    /// Per type id (1-based; index 0 is void): (name, kind, members' names).
    types: Vec<(String, u32, Vec<String>)>,
}

impl<'a> Btf<'a> {
    fn parse(b: &'a [u8]) -> Btf<'a> {
        let hdr_len = u32_at(b, 4) as usize;
        let (type_off, type_len) = (u32_at(b, 8) as usize, u32_at(b, 12) as usize);
        let (str_off, str_len) = (u32_at(b, 16) as usize, u32_at(b, 20) as usize);
        let strings = &b[hdr_len + str_off..hdr_len + str_off + str_len];
        let mut btf = Btf { strings, types: vec![(String::new(), 0, vec![])] };
        let (mut o, end) = (hdr_len + type_off, hdr_len + type_off + type_len);
        while o < end {
            let (name, info) = (btf.str(u32_at(b, o)), u32_at(b, o + 4));
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            o += 12;
            let mut members = Vec::new();
            let extra = match kind {
                1 | 14 | 17 => 4, // int, var, decl tag
                3 => 12,          // array
                4 | 5 => {
                    // struct, union: (name, type, offset) per member
                    members = (0..vlen).map(|i| btf.str(u32_at(b, o + i * 12))).collect();
                    vlen * 12
                }
                6 | 13 => vlen * 8,   // enum, func proto
                15 | 19 => vlen * 12, // datasec, enum64
                _ => 0,
            };
            o += extra;
            btf.types.push((name, kind, members));
        }
        btf
    }

    fn str(&self, off: u32) -> String {
        let s = &self.strings[off as usize..];
        String::from_utf8_lossy(&s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())]).into_owned()
    }
}

/// `struct.member` for every CO-RE field relocation of the object.
pub(crate) fn core_fields(elf: &[u8]) -> BTreeSet<String> {
    let btf = Btf::parse(section(elf, ".BTF").expect(".BTF section"));
    let ext = section(elf, ".BTF.ext").expect(".BTF.ext section");
    let hdr_len = u32_at(ext, 4) as usize;
    let (relo_off, relo_len) = (u32_at(ext, 24) as usize, u32_at(ext, 28) as usize);
    let relos = &ext[hdr_len + relo_off..hdr_len + relo_off + relo_len];
    let rec_size = u32_at(relos, 0) as usize;
    let mut o = 4;
    let mut out = BTreeSet::new();
    while o < relos.len() {
        let n = u32_at(relos, o + 4) as usize;
        o += 8;
        for i in 0..n {
            let r = o + i * rec_size;
            let (ty, access) = (u32_at(relos, r + 4) as usize, btf.str(u32_at(relos, r + 8)));
            let Some((name, kind, members)) = btf.types.get(ty) else { continue };
            // "0:3" = the root object, then member 3 of it.
            let first = access.split(':').nth(1).and_then(|m| m.parse::<usize>().ok());
            if let (4 | 5, Some(m)) = (kind, first) {
                out.insert(format!("{name}.{}", members.get(m).cloned().unwrap_or_default()));
            }
        }
        o += n * rec_size;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::core_fields;

    static X86: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ingero-x86_64.bpf.o"));
    static ARM64: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ingero-aarch64.bpf.o"));

    #[test]
    fn each_architecture_reads_its_own_registers() {
        let x86 = core_fields(X86);
        let arm = core_fields(ARM64);
        for f in ["pt_regs.si", "pt_regs.dx", "pt_regs.sp", "pt_regs.ax"] {
            assert!(x86.contains(f), "x86-64 object lacks {f}: {x86:?}");
        }
        assert!(!x86.iter().any(|f| f.starts_with("user_pt_regs.")), "{x86:?}");
        assert!(arm.contains("user_pt_regs.regs"), "aarch64 object lacks user_pt_regs.regs: {arm:?}");
        assert!(!arm.iter().any(|f| f.starts_with("pt_regs.")), "x86 registers in the aarch64 object: {arm:?}");
        // Both read their own stack pointer (dlopen call frames; on x86-64
        // also the NCCL id, which arm64 passes behind x2).
        assert!(x86.contains("pt_regs.sp") && arm.contains("user_pt_regs.sp"), "{x86:?} {arm:?}");
        // Kernel structures are relocated the same way on both.
        for f in ["task_struct.tgid", "pid.level", "upid.ns"] {
            assert!(x86.contains(f) && arm.contains(f), "{f}");
        }
    }
}
