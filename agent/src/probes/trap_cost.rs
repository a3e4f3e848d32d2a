// SPDX-License-Identifier: Apache-2.0
//! What one uprobe trap costs a workload on this node, measured once at
//! start. BPF_STATS_RUN_TIME counts only the programs; the trap around them
//! (breakpoint, kernel entry, single-step of the displaced instruction) is
//! most of a probed call's cost: ~0.7 µs here, ~3 µs on a GPU cloud VM,
//! depending on the CPU, its mitigations and the probed instruction. The
//! agent probes one function of its own with an empty program, for its own
//! process only, and times calls with and without the probe.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};

use crate::error::{Error, Result};

/// Calls per timed run: ~15 ms at 0.7 µs a trap, ~60 ms at 3 µs.
const CALLS: u32 = 20_000;
const ROUNDS: usize = 3;

// The probed function: a real call that does next to nothing, with the
// frame-pointer prologue the CUDA libraries' functions open with (x86-64
// `push rbp`, as `cudaLaunchKernel` in libcudart 12; arm64 `stp x29, x30`).
// A trap's cost depends on the probed instruction: a kernel emulates a
// push, but single-steps most others out of line, which took 9.2 µs a call
// here against 0.7 µs (a Rust function's first `mov` to the stack).
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.ingero_trap_target,\"ax\",@progbits",
    ".globl ingero_trap_target",
    ".hidden ingero_trap_target",
    ".type ingero_trap_target,@function",
    "ingero_trap_target:",
    "push rbp",
    "mov rbp, rsp",
    "mov rax, rdi",
    "pop rbp",
    "ret",
    ".size ingero_trap_target, .-ingero_trap_target",
    ".popsection",
);
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".pushsection .text.ingero_trap_target,\"ax\",@progbits",
    ".globl ingero_trap_target",
    ".hidden ingero_trap_target",
    ".type ingero_trap_target,@function",
    "ingero_trap_target:",
    "stp x29, x30, [sp, #-16]!",
    "mov x29, sp",
    "ldp x29, x30, [sp], #16",
    "ret",
    ".size ingero_trap_target, .-ingero_trap_target",
    ".popsection",
);

unsafe extern "C" {
    /// Returns its argument (the assembly above).
    fn ingero_trap_target(x: u64) -> u64;
}

extern "C" fn target(x: u64) -> u64 {
    // SAFETY: the assembly above touches only its own stack frame and x0/rax.
    unsafe { ingero_trap_target(x) }
}

fn time_calls(f: extern "C" fn(u64) -> u64) -> Duration {
    let f = std::hint::black_box(f);
    let mut x = 0u64;
    let t = Instant::now();
    for i in 0..CALLS {
        x = f(x ^ u64::from(i));
    }
    std::hint::black_box(x);
    t.elapsed()
}

/// The file and file offset of the code at `addr` in this process.
pub(crate) fn code_location(addr: u64) -> Result<(PathBuf, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|cause| Error::Runtime { what: "reading /proc/self/maps", cause })?;
    crate::procmaps::lines(&maps)
        .find(|m| (m.start..m.end).contains(&addr) && m.executable() && m.path.starts_with('/'))
        .map(|m| (PathBuf::from(m.path), addr - m.start + m.offset))
        .ok_or_else(|| Error::Config("the agent's own code is not in /proc/self/maps".into()))
}

/// Nanoseconds one trap adds to a call: the least of a few runs with the
/// probe minus the least without (other work on the CPU only adds time).
pub(crate) fn measure(ebpf: &mut Ebpf) -> Result<f64> {
    let (path, offset) = code_location(ingero_trap_target as *const () as usize as u64)?;
    let prog: &mut UProbe = ebpf
        .program_mut("bare_uprobe")
        .ok_or_else(|| Error::Missing { kind: "program", name: "bare_uprobe".into() })?
        .try_into()
        .map_err(Error::program("bare_uprobe"))?;
    prog.load().map_err(Error::program("loading bare_uprobe"))?;
    let me = NonZeroU32::new(std::process::id()).ok_or_else(|| Error::Config("process id 0".into()))?;
    // Minima of a few runs each (other work on the CPU only adds time);
    // one attachment: each detach waits out a grace period in the kernel.
    let bare = (0..ROUNDS).map(|_| time_calls(target)).min().unwrap_or(Duration::MAX);
    let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: None };
    let link = prog
        .attach(point, &path, UProbeScope::OneProcess(me))
        .map_err(Error::program(format!("bare_uprobe on {}", path.display())))?;
    let probed = (0..ROUNDS).map(|_| time_calls(target)).min().unwrap_or(Duration::MAX);
    prog.detach(link).map_err(Error::program("detaching bare_uprobe"))?;
    prog.unload().map_err(Error::program("unloading bare_uprobe"))?;
    Ok(probed.saturating_sub(bare).as_nanos() as f64 / f64::from(CALLS))
}

/// `measure`, logged; None where it fails (the agent's cost is then not reported).
pub(crate) fn measure_or_warn(ebpf: &mut Ebpf) -> Option<f64> {
    match measure(ebpf) {
        Ok(ns) => {
            tracing::info!(trap_ns = ns.round() as u64, "what a probed call's trap costs on this node");
            Some(ns)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot measure the trap cost: the agent's cost to workloads is not reported");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_own_code_is_found_in_its_maps() {
        let (path, offset) = code_location(ingero_trap_target as *const () as usize as u64).unwrap();
        assert!(path.is_file(), "{path:?}");
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(offset < size, "offset {offset} inside the {size}-byte file");
        assert!(code_location(0).is_err());
    }
}
