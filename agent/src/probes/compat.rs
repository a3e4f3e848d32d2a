// SPDX-License-Identifier: Apache-2.0
//! The compat object (kernels without attach cookies, `bpf_loop` or
//! compare-and-exchange): a pair of call programs per op, named by its id.

use std::collections::HashSet;

use aya::Ebpf;
use aya::maps::{Array, MapData};

use super::handles::{as_uprobe, map};
use super::ops;
use crate::error::{Error, Result};

/// The compat object's programs read their op's cookie from `op_cookies`.
fn write_op_cookies(ebpf: &mut Ebpf) -> Result<()> {
    let mut m: Array<&mut MapData, u64> = map(ebpf, "op_cookies")?;
    for op in ops::all() {
        m.set(u32::from(op.id), op.cookie(), 0).map_err(Error::map("op_cookies"))?;
    }
    Ok(())
}

pub(crate) fn names(op: &ops::Op) -> (String, String) {
    (format!("call_entry_{}", op.id), format!("call_return_{}", op.id))
}

/// Every op's programs (their cookies written first), loaded at start as the full object's pair is: a
/// library mapped later is probed as fast on either object (loading them
/// at first use delayed a new library's probes by the verifier's time).
/// The kernel verifies privileged loads in parallel (no verifier lock since
/// 5.0), so up to 4 threads share the ~130 programs: the agent's start on a
/// 5.10 node is the verifier's time over the threads, and 4 keeps a start
/// from taking more of a busy node than a few cores for a moment.
pub(crate) fn load_calls(ebpf: &mut Ebpf) -> Result<()> {
    write_op_cookies(ebpf)?;
    let names: HashSet<String> = ops::all()
        .iter()
        .flat_map(|op| {
            let (entry, ret) = names(op);
            if op.return_probed() { vec![entry, ret] } else { vec![entry] }
        })
        .collect();
    let mut progs: Vec<(&str, &mut aya::programs::Program)> =
        ebpf.programs_mut().filter(|(n, _)| names.contains(*n)).collect();
    if progs.len() < names.len() {
        let have: HashSet<&str> = progs.iter().map(|(n, _)| *n).collect();
        let name = names.iter().find(|n| !have.contains(n.as_str())).cloned().unwrap_or_default();
        return Err(Error::Missing { kind: "program", name });
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let chunk = progs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let loads: Vec<_> = progs
            .chunks_mut(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter_mut().try_for_each(|(name, p)| {
                        as_uprobe(p)?.load().map_err(Error::program(format!("loading {name}")))
                    })
                })
            })
            .collect();
        loads.into_iter().try_for_each(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
    })
}
