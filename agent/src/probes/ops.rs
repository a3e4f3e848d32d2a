// SPDX-License-Identifier: Apache-2.0
//! The traced functions: which library, which symbol, whether the return is
//! probed (only where a duration is needed).

use super::abi::{COOKIE_BRACKET, COOKIE_COMM_INIT, COOKIE_RT_CALLEE, COOKIE_TIMED};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lib {
    /// CUDA runtime, libcudart.so.*
    Cudart,
    /// CUDA driver, libcuda.so.*
    Cuda,
    /// NCCL, libnccl.so.*
    Nccl,
    /// glibc (libc.so.6): only its `dlsym`/`dlvsym` entries, to probe CUDA/NCCL libraries
    /// loaded at run time before their first call.
    Libc,
}

impl Lib {
    pub fn name(self) -> &'static str {
        match self {
            Lib::Cudart => "cudart",
            Lib::Cuda => "cuda",
            Lib::Nccl => "nccl",
            Lib::Libc => "libc",
        }
    }

    /// Recognises a library by its file name (versioned sonames included).
    pub fn from_file_name(name: &str) -> Option<Lib> {
        if name == "libc.so.6" || name == "libdl.so.2" {
            return Some(Lib::Libc);
        }
        let stem = name.split(".so").next()?;
        if !name.contains(".so") {
            return None;
        }
        // Wheels repaired by auditwheel carry a content hash:
        // libcudart-d0da41ae.so.12, libnccl-6f1b2c3d.so.2.
        let stem = match stem.rsplit_once('-') {
            Some((base, hash))
                if !hash.is_empty() && hash.len() <= 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                base
            }
            _ => stem,
        };
        match stem {
            "libcudart" => Some(Lib::Cudart),
            "libcuda" => Some(Lib::Cuda),
            "libnccl" => Some(Lib::Nccl),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub id: u16,
    pub lib: Lib,
    pub symbol: &'static str,
    /// Return-probed: durations, errors, outliers.
    pub timed: bool,
    pub comm_init: bool,
}

impl Op {
    pub fn cookie(&self) -> u64 {
        self.id as u64
            | if self.timed { COOKIE_TIMED } else { 0 }
            | if self.bracketed() { COOKIE_BRACKET } else { 0 }
            | if self.comm_init { COOKIE_COMM_INIT } else { 0 }
            | if self.runtime_callee() { COOKIE_RT_CALLEE } else { 0 }
    }

    /// A driver call that the dynamic runtime makes for one of its
    /// entry-only calls (`cudaLaunchKernel` → `cuLaunchKernel`, `cudaFree` →
    /// `cuMemFree_v2`): when it returns into that runtime's code it is that
    /// call's own and is not counted again (see `enter` in
    /// ebpf/calls.bpf.c). Only these: a driver call the runtime makes for a
    /// runtime call we do not trace is the only record of it, and stays.
    pub fn runtime_callee(&self) -> bool {
        self.lib == Lib::Cuda && RUNTIME_CALLEES.iter().any(|s| self.symbol.starts_with(s))
    }

    /// An untimed runtime call that marks the thread as inside it while its
    /// frame lives (entry-only: see `enter` in ebpf/calls.bpf.c): the driver
    /// calls it makes (a launch under `cudaLaunchKernel`) are then not
    /// counted a second time. NCCL's and the driver's untimed ops make no
    /// traced calls of their own.
    pub fn bracketed(&self) -> bool {
        !self.timed && self.lib == Lib::Cudart
    }

    /// Whether a return probe is attached: only where the duration is the
    /// signal (syncs, copies, collectives, allocations), never on launches.
    pub fn return_probed(&self) -> bool {
        self.timed
    }

    /// Counted from a duty cycle when the agent's traps would cost a process
    /// more than `--trap-budget` (probes/duty.rs): the entry-only calls a
    /// program makes per kernel (launches, event records and waits,
    /// memsets, stream-ordered allocations), whose count is the signal and
    /// a sample estimates it. Never a timed call (durations and outliers
    /// come from every call), NCCL's, or `cudaFree` (its driver callee is
    /// timed, and rare).
    pub fn duty_cycled(&self) -> bool {
        !self.timed && self.lib != Lib::Nccl && self.lib != Lib::Libc && self.symbol != "cudaFree"
    }
}

/// Driver entry points whose callers in the dynamic runtime are entry-only
/// traced ops (prefixes: `_ptsz`/`Ex` variants included).
const RUNTIME_CALLEES: &[&str] = &[
    "cuLaunchKernel",
    "cuLaunchCooperativeKernel",
    "cuGraphLaunch",
    "cuStreamWaitEvent",
    "cuMemAllocAsync",
    "cuMemFree_v2",
    "cuEventRecord",
    "cuMemsetD",
];

macro_rules! ops {
    ($(($lib:ident, $sym:literal, $timed:literal $(, $ci:literal)?)),* $(,)?) => {
        const TABLE: &[(Lib, &str, bool, bool)] = &[$((Lib::$lib, $sym, $timed, false $(|| $ci)?)),*];
    };
}

// Order is the op id: append, never reorder (ids are only per agent run,
// but keep them stable for reading logs side by side).
ops![
    (Cudart, "cudaLaunchKernel", false),
    (Cudart, "cudaLaunchKernel_ptsz", false),
    (Cudart, "cudaLaunchKernelExC", false),
    (Cudart, "cudaLaunchKernelExC_ptsz", false),
    (Cudart, "cudaGraphLaunch", false),
    (Cudart, "cudaGraphLaunch_ptsz", false),
    (Cudart, "cudaFree", false),
    (Cudart, "cudaMemcpy", true),
    (Cudart, "cudaMemcpy_ptds", true),
    (Cudart, "cudaMemcpyAsync", true),
    (Cudart, "cudaMemcpyAsync_ptsz", true),
    (Cudart, "cudaStreamSynchronize", true),
    (Cudart, "cudaStreamSynchronize_ptsz", true),
    (Cudart, "cudaDeviceSynchronize", true),
    (Cudart, "cudaEventSynchronize", true),
    (Cudart, "cudaMalloc", true),
    (Cuda, "cuLaunchKernel", false),
    (Cuda, "cuLaunchKernel_ptsz", false),
    (Cuda, "cuLaunchKernelEx", false),
    (Cuda, "cuLaunchKernelEx_ptsz", false),
    (Cuda, "cuMemcpy", true),
    (Cuda, "cuMemcpyAsync", true),
    (Cuda, "cuMemcpyHtoD_v2", true),
    (Cuda, "cuMemcpyDtoH_v2", true),
    (Cuda, "cuMemcpyHtoDAsync_v2", true),
    (Cuda, "cuMemcpyDtoHAsync_v2", true),
    (Cuda, "cuCtxSynchronize", true),
    (Cuda, "cuStreamSynchronize", true),
    (Cuda, "cuMemAlloc_v2", true),
    (Nccl, "ncclAllReduce", true),
    (Nccl, "ncclAllGather", true),
    (Nccl, "ncclReduceScatter", true),
    (Nccl, "ncclBroadcast", true),
    (Nccl, "ncclSend", true),
    (Nccl, "ncclRecv", true),
    (Nccl, "ncclGroupStart", false),
    (Nccl, "ncclGroupEnd", true),
    (Nccl, "ncclCommInitRank", true, true),
    // What current PyTorch, vLLM and JAX stacks call besides the above.
    // Stream-ordered allocator and events: enqueue-only, counted at entry.
    (Cudart, "cudaMallocAsync", false),
    (Cudart, "cudaMallocAsync_ptsz", false),
    (Cudart, "cudaFreeAsync", false),
    (Cudart, "cudaFreeAsync_ptsz", false),
    (Cudart, "cudaEventRecord", false),
    (Cudart, "cudaEventRecord_ptsz", false),
    (Cudart, "cudaEventQuery", false),
    (Cudart, "cudaStreamWaitEvent", false),
    (Cudart, "cudaStreamWaitEvent_ptsz", false),
    (Cudart, "cudaMemsetAsync", false),
    (Cudart, "cudaMemsetAsync_ptsz", false),
    (Cudart, "cudaLaunchCooperativeKernel", false),
    (Cudart, "cudaLaunchCooperativeKernel_ptsz", false),
    (Cudart, "cudaMemcpyPeer", true),
    (Cudart, "cudaMemcpyPeerAsync", true),
    (Cudart, "cudaMemcpyPeerAsync_ptsz", true),
    // Driver: per-thread default stream variants (_ptsz: stream, _ptds: default stream).
    (Cuda, "cuStreamSynchronize_ptsz", true),
    (Cuda, "cuMemcpy_ptds", true),
    (Cuda, "cuMemcpyAsync_ptsz", true),
    (Cuda, "cuMemcpyHtoD_v2_ptds", true),
    (Cuda, "cuMemcpyDtoH_v2_ptds", true),
    (Cuda, "cuMemcpyHtoDAsync_v2_ptsz", true),
    (Cuda, "cuMemcpyDtoHAsync_v2_ptsz", true),
    (Cuda, "cuEventSynchronize", true),
    (Cuda, "cuStreamWaitEvent", false),
    (Cuda, "cuStreamWaitEvent_ptsz", false),
    (Cuda, "cuMemFree_v2", true),
    (Cuda, "cuMemAllocAsync", false),
    (Cuda, "cuMemAllocAsync_ptsz", false),
    (Cuda, "cuGraphLaunch", false),
    (Cuda, "cuGraphLaunch_ptsz", false),
    (Cuda, "cuLaunchCooperativeKernel", false),
    (Cuda, "cuLaunchCooperativeKernel_ptsz", false),
    // NCCL: PyTorch creates communicators with ncclCommInitRankConfig (same
    // first four arguments as ncclCommInitRank); abort/destroy can hang.
    (Nccl, "ncclCommInitRankConfig", true, true),
    (Nccl, "ncclCommSplit", true),
    (Nccl, "ncclReduce", true),
    (Nccl, "ncclAlltoAll", true),
    (Nccl, "ncclCommAbort", true),
    (Nccl, "ncclCommDestroy", true),
    // Memsets and event records: on the H100, PyTorch's went through the
    // runtimes cuBLAS and NCCL link statically (3,194 memsets and 9,000
    // event records in 1,500 steps, none through the dynamic runtime), so
    // only the driver's entry points see them. Enqueue-only: entry-counted.
    (Cudart, "cudaEventRecordWithFlags", false),
    (Cudart, "cudaEventRecordWithFlags_ptsz", false),
    (Cuda, "cuEventRecord", false),
    (Cuda, "cuEventRecord_ptsz", false),
    (Cuda, "cuEventRecordWithFlags", false),
    (Cuda, "cuEventRecordWithFlags_ptsz", false),
    (Cuda, "cuMemsetD8Async", false),
    (Cuda, "cuMemsetD8Async_ptsz", false),
    (Cuda, "cuMemsetD16Async", false),
    (Cuda, "cuMemsetD16Async_ptsz", false),
    (Cuda, "cuMemsetD32Async", false),
    (Cuda, "cuMemsetD32Async_ptsz", false),
];

/// Every traced op; the index is the op id carried in the attach cookie.
pub fn all() -> Vec<Op> {
    TABLE
        .iter()
        .enumerate()
        .map(|(i, &(lib, symbol, timed, comm_init))| Op { id: i as u16, lib, symbol, timed, comm_init })
        .collect()
}

pub fn by_id(id: u32) -> Option<Op> {
    all().into_iter().nth(id as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_versioned_sonames_only() {
        assert_eq!(Lib::from_file_name("libcudart.so.12"), Some(Lib::Cudart));
        assert_eq!(Lib::from_file_name("libcudart.so.13.0.48"), Some(Lib::Cudart));
        assert_eq!(Lib::from_file_name("libcuda.so.1"), Some(Lib::Cuda));
        assert_eq!(Lib::from_file_name("libnccl.so.2"), Some(Lib::Nccl));
        assert_eq!(Lib::from_file_name("libcudart_static.a"), None);
        assert_eq!(Lib::from_file_name("libcudnn.so.9"), None);
        assert_eq!(Lib::from_file_name("libcudart-d0da41ae.so.12"), Some(Lib::Cudart));
        assert_eq!(Lib::from_file_name("libnccl-6f1b2c3d.so.2"), Some(Lib::Nccl));
        assert_eq!(Lib::from_file_name("libcuda-extras.so.1"), None);
        assert_eq!(Lib::from_file_name("libc.so.6"), Some(Lib::Libc));
        assert_eq!(Lib::from_file_name("libcap.so.2"), None);
    }

    fn by_symbol(symbol: &str) -> Option<Op> {
        all().into_iter().find(|o| o.symbol == symbol)
    }

    #[test]
    fn every_traced_call_has_a_kind_reports_count_it_by() {
        use ingero_model::signals::op_kind;
        for o in all().into_iter().filter(|o| o.lib != Lib::Libc) {
            assert_ne!(op_kind(o.lib.name(), o.symbol), "other", "{}", o.symbol);
        }
        let kind = |s: &str| op_kind(by_symbol(s).unwrap().lib.name(), s);
        for (s, k) in [
            ("cuLaunchKernelEx_ptsz", "launch"),
            ("cudaGraphLaunch", "launch"),
            ("cudaEventSynchronize", "sync"),
            ("cuMemcpyDtoHAsync_v2", "copy"),
            ("cuMemsetD32Async", "memset"),
            ("cudaStreamWaitEvent", "event"),
            ("cudaEventRecordWithFlags", "event"),
            ("cudaFreeAsync", "memory"),
            ("cuMemAlloc_v2", "memory"),
            ("ncclAllReduce", "collective"),
            ("ncclSend", "collective"),
            ("ncclGroupEnd", "nccl control"),
            ("ncclCommInitRank", "nccl control"),
        ] {
            assert_eq!(kind(s), k, "{s}");
        }
    }

    #[test]
    fn a_duty_cycle_takes_runtime_calls_and_their_driver_calls_together() {
        let cycled: Vec<Op> = all().into_iter().filter(|o| o.duty_cycled()).collect();
        assert!(cycled.iter().all(|o| !o.return_probed()), "a timed call is never sampled");
        for s in ["cudaLaunchKernel", "cuLaunchKernel", "cudaEventRecord", "cuMemsetD32Async", "cudaStreamWaitEvent"] {
            assert!(cycled.iter().any(|o| o.symbol == s), "{s}");
        }
        for s in ["cudaFree", "ncclGroupStart", "cudaStreamSynchronize", "ncclAllReduce"] {
            assert!(!cycled.iter().any(|o| o.symbol == s), "{s}");
        }
        // A runtime call off while the driver call it makes is on would
        // count the driver's as the program's own: both go together, but
        // for cudaFree's timed callee (neither is cycled).
        for o in all().into_iter().filter(|o| o.runtime_callee() && o.symbol != "cuMemFree_v2") {
            assert!(o.duty_cycled(), "{}", o.symbol);
        }
    }

    #[test]
    fn only_driver_calls_under_entry_only_runtime_calls_are_runtime_callees() {
        let callees: Vec<_> = all().iter().filter(|o| o.runtime_callee()).map(|o| o.symbol).collect();
        assert_eq!(
            callees,
            [
                "cuLaunchKernel",
                "cuLaunchKernel_ptsz",
                "cuLaunchKernelEx",
                "cuLaunchKernelEx_ptsz",
                "cuStreamWaitEvent",
                "cuStreamWaitEvent_ptsz",
                "cuMemFree_v2",
                "cuMemAllocAsync",
                "cuMemAllocAsync_ptsz",
                "cuGraphLaunch",
                "cuGraphLaunch_ptsz",
                "cuLaunchCooperativeKernel",
                "cuLaunchCooperativeKernel_ptsz",
                "cuEventRecord",
                "cuEventRecord_ptsz",
                "cuEventRecordWithFlags",
                "cuEventRecordWithFlags_ptsz",
                "cuMemsetD8Async",
                "cuMemsetD8Async_ptsz",
                "cuMemsetD16Async",
                "cuMemsetD16Async_ptsz",
                "cuMemsetD32Async",
                "cuMemsetD32Async_ptsz",
            ]
        );
        // Each has its runtime caller traced entry-only (bracketed).
        for (driver, runtime) in [
            ("cuMemFree_v2", "cudaFree"),
            ("cuGraphLaunch", "cudaGraphLaunch"),
            ("cuEventRecordWithFlags", "cudaEventRecordWithFlags"),
            ("cuMemsetD8Async", "cudaMemsetAsync"),
        ] {
            assert!(by_symbol(driver).unwrap().cookie() & COOKIE_RT_CALLEE != 0);
            assert!(by_symbol(runtime).unwrap().bracketed());
        }
        assert_eq!(by_symbol("cuMemcpy").unwrap().cookie() & COOKIE_RT_CALLEE, 0);
    }

    #[test]
    fn ids_are_unique_and_fit_the_cookie() {
        let ops = all();
        assert!(ops.len() < 256);
        let comm: Vec<_> = ops.iter().filter(|o| o.comm_init).map(|o| o.symbol).collect();
        assert_eq!(comm, ["ncclCommInitRank", "ncclCommInitRankConfig"]);
        let mut syms: Vec<_> = ops.iter().map(|o| o.symbol).collect();
        syms.sort_unstable();
        syms.dedup();
        assert_eq!(syms.len(), ops.len(), "each symbol once");
        assert!(ops.iter().all(|o| by_id(o.id as u32).unwrap().symbol == o.symbol));
    }
}
