// SPDX-License-Identifier: Apache-2.0
//! The built eBPF objects read instruction by instruction: every helper
//! call and atomic operation each function makes, against the first kernel
//! that has it. A program that needs a newer kernel than its object's floor
//! (5.10 for the compat object, 5.17 for the full one) fails here, in CI,
//! instead of on a user's node at load time.

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::features;
use super::ops;
use super::setup::{COMPAT_OBJECT, OBJECT};

/// Op ids the compat object has a program pair for (COMPAT_OPS, ebpf/events.h).
const COMPAT_OPS: usize = super::abi::c::COMPAT_OPS as usize;

type Version = (u32, u32);

/// Helper id (uapi `enum bpf_func_id`) → name and first mainline kernel.
const HELPERS: &[(i32, &str, Version)] = &[
    (1, "map_lookup_elem", (3, 19)),
    (2, "map_update_elem", (3, 19)),
    (3, "map_delete_elem", (3, 19)),
    (4, "probe_read", (4, 1)),
    (5, "ktime_get_ns", (4, 1)),
    (12, "tail_call", (4, 2)),
    (14, "get_current_pid_tgid", (4, 2)),
    (16, "get_current_comm", (4, 2)),
    (35, "get_current_task", (4, 8)),
    (37, "current_task_under_cgroup", (4, 9)),
    (67, "get_stack", (4, 18)),
    (80, "get_current_cgroup_id", (4, 18)),
    (112, "probe_read_user", (5, 5)),
    (113, "probe_read_kernel", (5, 5)),
    (114, "probe_read_user_str", (5, 5)),
    (115, "probe_read_kernel_str", (5, 5)),
    (123, "get_current_ancestor_cgroup_id", (5, 6)),
    (125, "ktime_get_boot_ns", (5, 8)),
    (130, "ringbuf_output", (5, 8)),
    (131, "ringbuf_reserve", (5, 8)),
    (132, "ringbuf_submit", (5, 8)),
    (148, "copy_from_user", (5, 10)),
    (158, "get_current_task_btf", (5, 11)),
    (174, "get_attach_cookie", (5, 15)),
    (175, "task_pt_regs", (5, 15)),
    (180, "find_vma", (5, 17)),
    (181, "loop", (5, 17)),
    (191, "copy_from_user_task", (5, 18)),
];

/// Atomic operations other than a plain add (fetch, xchg, cmpxchg, and/or/xor).
const ATOMICS_SINCE: Version = (5, 12);
/// `uprobe.s` sections: sleepable uprobe programs.
const SLEEPABLE_UPROBE_SINCE: Version = (5, 19);

/// What one function of an object needs: (version, why) per use.
/// Every function of `obj`: (section, name, instructions).
fn functions(obj: &[u8]) -> Vec<(String, String, &[u8])> {
    let file = object::File::parse(obj).expect("a BPF ELF object");
    let mut out = Vec::new();
    for sym in file.symbols().filter(|s| s.kind() == SymbolKind::Text && s.size() > 0) {
        let sec = file.section_by_index(sym.section_index().expect("in a section")).expect("section");
        let (at, len) = (sym.address() as usize, sym.size() as usize);
        let data: &[u8] = sec.data().expect("section data");
        out.push((sec.name().unwrap_or("").to_string(), sym.name().unwrap().to_string(), &data[at..at + len]));
    }
    out
}

fn needs(obj: &[u8]) -> Vec<(String, Vec<(Version, String)>)> {
    let mut out = Vec::new();
    for (sec, name, code) in functions(obj) {
        let mut uses = Vec::new();
        if sec.starts_with("uprobe.s") {
            uses.push((SLEEPABLE_UPROBE_SINCE, "sleepable uprobe".to_string()));
        }
        let mut i = 0;
        while i + 8 <= code.len() {
            let (op, src, imm) =
                (code[i], code[i + 1] >> 4, i32::from_le_bytes(code[i + 4..i + 8].try_into().unwrap()));
            match (op, src) {
                // BPF_JMP | BPF_CALL to a helper (src 1: a BPF function; 2: a kfunc).
                (0x85, 0) => match HELPERS.iter().find(|h| h.0 == imm) {
                    Some(&(_, name, v)) => uses.push((v, format!("bpf_{name}"))),
                    None => {
                        panic!("{name}: helper {imm} is not in HELPERS: add it with its first kernel")
                    }
                },
                (0x85, 2) => panic!("{name}: kfunc call: not supported on the kernels we target"),
                // BPF_STX | BPF_ATOMIC (W or DW): imm 0 is a plain add (XADD, any kernel).
                (0xc3 | 0xdb, _) if imm != 0 => uses.push((ATOMICS_SINCE, format!("atomic op {imm:#x}"))),
                _ => {}
            }
            // BPF_LD | BPF_IMM | BPF_DW takes two slots.
            i += if op == 0x18 { 16 } else { 8 };
        }
        out.push((name, uses));
    }
    out
}

/// Linux 6.13+ runs a function whose frame, rounded up to 16 bytes, is this
/// big or bigger on a per-CPU private stack (verifier.c,
/// BPF_PRIV_STACK_MIN_SIZE): shared by every run of it on that CPU.
const PRIVATE_STACK_FROM: usize = 64;

/// The frame one function uses: its deepest access below r10, or pointer
/// made from r10 (handed to a helper or kept in a register).
fn frame_bytes(code: &[u8]) -> usize {
    let (mut deepest, mut from_fp) = (0i64, [false; 11]);
    for insn in code.chunks_exact(8) {
        let (op, dst, src) = (insn[0], usize::from(insn[1] & 0xf), usize::from(insn[1] >> 4));
        let off = i64::from(i16::from_le_bytes([insn[2], insn[3]]));
        let imm = i64::from(i32::from_le_bytes(insn[4..8].try_into().unwrap()));
        match op & 0x7 {
            // LDX: a load from the frame; the loaded register is a value.
            0x1 => {
                if src == 10 {
                    deepest = deepest.max(-off);
                }
                from_fp[dst] = false;
            }
            // ST / STX into the frame.
            0x2 | 0x3 if dst == 10 => deepest = deepest.max(-off),
            // ALU64: `rX = r10` makes a frame pointer, `rX += imm` moves it.
            0x7 if dst != 10 => match op {
                0xbf => from_fp[dst] = src == 10,
                0x07 if from_fp[dst] => deepest = deepest.max(-imm),
                _ => from_fp[dst] = false,
            },
            // A call clobbers r0-r5.
            0x5 if op == 0x85 => from_fp[..6].fill(false),
            _ => {}
        }
    }
    deepest.max(0) as usize
}

/// Every function of `obj`: (section, name, frame bytes).
fn frames(obj: &[u8]) -> Vec<(String, String, usize)> {
    functions(obj).into_iter().map(|(sec, name, code)| (sec, name, frame_bytes(code))).collect()
}

/// Functions of `obj` that need a kernel newer than `floor`, with why.
fn above(obj: &[u8], floor: Version) -> Vec<String> {
    needs(obj)
        .into_iter()
        .flat_map(|(f, uses)| {
            uses.into_iter().filter(|u| u.0 > floor).map(move |u| format!("{f}: {} ({:?})", u.1, u.0))
        })
        .collect()
}

fn parse_version(s: &str) -> Version {
    let (a, b) = s.split_once('.').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

#[test]
fn the_compat_object_loads_on_linux_5_10() {
    assert_eq!(above(COMPAT_OBJECT, (5, 10)), Vec::<String>::new());
}

#[test]
fn the_full_object_needs_no_more_than_its_features() {
    // Chosen when cookies, bpf_loop and cmpxchg are present (5.17); the
    // hold (dlsym_entry and its wait's step) is loaded only with sleepable
    // uprobes on top.
    let hold = ["dlsym_entry", "still_held"];
    let floor = parse_version(features::LOOP.since);
    let over: Vec<String> =
        above(OBJECT, floor).into_iter().filter(|l| !hold.iter().any(|h| l.starts_with(h))).collect();
    assert_eq!(over, Vec::<String>::new());
    let needs = needs(OBJECT);
    let dlsym = &needs.iter().find(|(f, _)| f == "dlsym_entry").expect("dlsym_entry in the full object").1;
    let newest = dlsym.iter().map(|u| u.0).max().unwrap();
    assert_eq!(newest, parse_version(features::SLEEPABLE_UPROBE.since), "{dlsym:?}");
}

#[test]
fn each_feature_probe_needs_exactly_its_feature() {
    let obj: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/features.bpf.o"));
    let needs = needs(obj);
    // uprobe_multi is probed by asking for a link, not by a helper.
    for f in features::ALL.into_iter().filter(|f| *f != features::UPROBE_MULTI) {
        let uses = &needs.iter().find(|(n, _)| n == f.program).unwrap_or_else(|| panic!("no {}", f.program)).1;
        let newest = uses.iter().map(|u| u.0).max().unwrap_or((0, 0));
        assert_eq!(newest, parse_version(f.since), "{}: {uses:?}", f.name);
    }
}

#[test]
fn every_op_has_a_compat_program_pair() {
    assert!(ops::all().len() <= COMPAT_OPS, "{} ops: raise COMPAT_OPS in ebpf/events.h and here", ops::all().len());
    let names: Vec<String> = needs(COMPAT_OBJECT).into_iter().map(|(n, _)| n).collect();
    for id in 0..COMPAT_OPS {
        for kind in ["call_entry", "call_return"] {
            assert!(names.contains(&format!("{kind}_{id}")), "{kind}_{id} missing from the compat object");
        }
    }
}

#[test]
fn a_newer_helper_is_caught() {
    // The check itself: the full object does use 5.15+ helpers.
    let over = above(OBJECT, (5, 10));
    assert!(over.iter().any(|l| l.contains("bpf_get_attach_cookie")), "{over:?}");
    assert!(over.iter().any(|l| l.contains("bpf_loop")), "{over:?}");
    assert!(over.iter().any(|l| l.contains("atomic op 0xf1")), "{over:?}");
}

#[test]
fn the_hold_never_runs_on_a_private_stack() {
    // A held thread yields its CPU inside dlsym_entry (and the functions it
    // calls, all in .text); on a private stack the next lookup on that CPU
    // would overwrite the held thread's frame (an oops on 6.18).
    let frames = frames(OBJECT);
    assert!(frames.iter().any(|f| f.1 == "dlsym_entry"), "{frames:?}");
    let big: Vec<_> = frames
        .iter()
        .filter(|(sec, _, bytes)| {
            (sec == "uprobe.s" || sec == ".text") && bytes.next_multiple_of(16) >= PRIVATE_STACK_FROM
        })
        .collect();
    assert!(big.is_empty(), "frames of {PRIVATE_STACK_FROM}+ bytes: {big:?}");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn no_uprobe_program_runs_on_a_private_stack() {
    // A uprobe program can be preempted on a preemptible kernel: one with a
    // big frame has a tail call, which keeps the kernel from giving it a
    // private stack (ebpf/calls.bpf.c, own_stack).
    let needs = needs(OBJECT);
    let unguarded: Vec<_> = frames(OBJECT)
        .into_iter()
        .filter(|(sec, _, _)| sec.starts_with("uprobe") || sec.starts_with("uretprobe"))
        .filter(|(_, _, bytes)| bytes.next_multiple_of(16) >= PRIVATE_STACK_FROM)
        .filter(|(_, f, _)| !needs.iter().any(|(n, uses)| n == f && uses.iter().any(|u| u.1 == "bpf_tail_call")))
        .collect();
    assert_eq!(unguarded, Vec::new());
}

#[test]
fn a_frame_is_measured_by_its_deepest_slot() {
    // r1 = r10; r1 += -72; call 1; *(u64 *)(r10 - 16) = r0; r0 = *(u64 *)(r10 - 8)
    let code: Vec<u8> = [
        [0xbf, 0xa1, 0, 0, 0, 0, 0, 0],
        [0x07, 0x01, 0, 0, 0xb8, 0xff, 0xff, 0xff],
        [0x85, 0x00, 0, 0, 1, 0, 0, 0],
        [0x7b, 0x0a, 0xf0, 0xff, 0, 0, 0, 0],
        [0x79, 0xa0, 0xf8, 0xff, 0, 0, 0, 0],
    ]
    .concat();
    assert_eq!(frame_bytes(&code), 72);
    assert_eq!(frame_bytes(&code[16..]), 16);
    // The check sees the full object's big frames (call_return keeps a
    // whole event on its stack).
    assert!(frames(OBJECT).iter().any(|f| f.1 == "call_return" && f.2 >= PRIVATE_STACK_FROM));
}
