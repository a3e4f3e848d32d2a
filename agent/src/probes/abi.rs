// SPDX-License-Identifier: Apache-2.0
//! Rust mirrors of `ebpf/events.h`, with size and offset assertions so the
//! two layouts cannot drift.

use std::mem::{offset_of, size_of};

/// The header's numeric `#define`s, generated from it by build.rs.
#[allow(dead_code, unreachable_pub)]
pub(crate) mod c {
    include!(concat!(env!("OUT_DIR"), "/events_h.rs"));
}

/// One histogram definition for the whole product: the wire's.
pub(crate) const HIST_BUCKETS: usize = ingero_model::hist::BUCKETS;
const _: () = assert!(c::INGERO_HIST_BUCKETS as usize == HIST_BUCKETS, "events.h and proto/src/hist.rs disagree");

pub(crate) const COOKIE_TIMED: u64 = c::COOKIE_TIMED;
pub(crate) const COOKIE_COMM_INIT: u64 = c::COOKIE_COMM_INIT;
pub(crate) const COOKIE_BRACKET: u64 = c::COOKIE_BRACKET;
pub(crate) const COOKIE_RT_CALLEE: u64 = c::COOKIE_RT_CALLEE;
pub(crate) const COOKIE_STATIC_RT: u64 = c::COOKIE_STATIC_RT;
pub(crate) const COOKIE_DUTY: u64 = c::COOKIE_DUTY;
/// A mark's call returned while the duty gate was open.
pub(crate) const MARK_DUTY_ON: u32 = c::MARK_DUTY_ON as u32;
/// A mark's call returned while the aggregates' active half was b.
pub(crate) const MARK_HALF_B: u32 = c::MARK_HALF_B as u32;

/// `StallEvent::op` of an off-CPU episode outside any call (its `reason`: the syscall).
pub(crate) const OP_OFFCPU: u32 = c::OP_OFFCPU as u32;
/// Its `reason`: the syscall number under this mask…
pub(crate) const OFFCPU_NR_MASK: u32 = c::OFFCPU_NR_MASK as u32;
/// …and this flag for a select or poll that watched no file descriptor (a sleep).
pub(crate) const OFFCPU_NO_FDS: u32 = c::OFFCPU_NO_FDS as u32;
/// …and this flag when the thread has made a traced call (it feeds the GPU).
pub(crate) const OFFCPU_FEEDS: u32 = c::OFFCPU_FEEDS as u32;
pub(crate) const PROC_EXEC: u32 = c::PROC_EXEC as u32;
pub(crate) const PROC_EXIT: u32 = c::PROC_EXIT as u32;
pub(crate) const PROC_FORK: u32 = c::PROC_FORK as u32;
pub(crate) const PROC_OOM: u32 = c::PROC_OOM as u32;
pub(crate) const PROC_COMM_INIT: u32 = c::PROC_COMM_INIT as u32;
pub(crate) const PROC_DLOPEN: u32 = c::PROC_DLOPEN as u32;
pub(crate) const PROC_LIB_LOOKUP: u32 = c::PROC_LIB_LOOKUP as u32;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct CallKey {
    pub tgid: u32,
    pub op: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallVal {
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub hist: [u32; HIST_BUCKETS],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SchedVal {
    pub on_ns: u64,
    pub off_ns: u64,
    pub runq_ns: u64,
    pub runq_max_ns: u64,
    pub voluntary: u64,
    pub involuntary: u64,
    pub wakeups: u64,
    /// Part of `off_ns` spent inside a traced call.
    pub off_call_ns: u64,
    /// Part of `runq_ns` spent inside a traced call.
    pub runq_call_ns: u64,
}

/// A process's scheduler sums (`sched_a`/`sched_b`, key: tgid): its threads
/// that have made a traced call (they feed the GPU) apart from the rest.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SchedVals {
    pub feed: SchedVal,
    pub other: SchedVal,
}

impl SchedVal {
    /// Any time counted (a thread ran, waited or slept).
    pub(crate) fn any(&self) -> bool {
        self.on_ns | self.off_ns | self.runq_ns != 0
    }

    /// Both parts together: the whole process.
    pub(crate) fn plus(&self, o: &SchedVal) -> SchedVal {
        SchedVal {
            on_ns: self.on_ns + o.on_ns,
            off_ns: self.off_ns + o.off_ns,
            runq_ns: self.runq_ns + o.runq_ns,
            runq_max_ns: self.runq_max_ns.max(o.runq_max_ns),
            voluntary: self.voluntary + o.voluntary,
            involuntary: self.involuntary + o.involuntary,
            wakeups: self.wakeups + o.wakeups,
            off_call_ns: self.off_call_ns + o.off_call_ns,
            runq_call_ns: self.runq_call_ns + o.runq_call_ns,
        }
    }
}

/// The outermost traced call a thread is inside (`thread_calls`, key: tid).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ThreadCall {
    pub since_ns: u64,
    pub tgid: u32,
    pub op: u32,
    pub depth: u32,
    /// Traps of probed calls made inside traced calls (not calls of their
    /// own; 2 for a return-probed one): a running total, like `counts`.
    pub nested: u32,
    /// Stack pointer at the outermost call's entry.
    pub sp: u64,
    /// Entry-only call: the return address found at `sp`; 0 otherwise
    /// (the compat object's bracket).
    pub ret: u64,
    /// The code mapping of the dynamic runtime the thread launches through.
    pub text_lo: u64,
    pub text_hi: u64,
    /// When the slot was made (a reused tid's slot is another thread's).
    pub born: u64,
    /// Runtime launches the thread counted itself: running totals.
    pub counts: [OpCount; THREAD_COUNTS],
}

/// Op counters a thread slot has (`THREAD_COUNTS` in events.h).
pub(crate) const THREAD_COUNTS: usize = c::THREAD_COUNTS as usize;

/// One op's running count in a thread slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OpCount {
    /// Op id + 1; 0: unused.
    pub op: u32,
    /// Per half of the aggregates (`Config::active` at the launch); wraps:
    /// only differences mean anything.
    pub n: [u32; 2],
}

/// Key of a thread slot retired at exit or exec (`retired`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct RetiredKey {
    pub tid: u32,
    pub pad: u32,
    pub born: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CgroupVal {
    pub on_ns: u64,
    pub switches: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct IoKey {
    pub tgid: u32,
    pub dev: u32,
    pub op: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct IoVal {
    pub count: u64,
    pub bytes: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub hist: [u32; HIST_BUCKETS],
}

pub(crate) const USTACK_MAX: usize = c::USTACK_MAX as usize;
pub(crate) const PY_MAX_FRAMES: usize = c::PY_MAX_FRAMES as usize;
pub(crate) const PY_SNAP_REGIONS: usize = c::PY_SNAP_REGIONS as usize;
pub(crate) const PY_SNAP_CODE: usize = c::PY_SNAP_CODE as usize;
pub(crate) const PY_SNAP_CODE_MIN: usize = c::PY_SNAP_CODE_MIN as usize;
pub(crate) const PY_SNAP_STR: usize = c::PY_SNAP_STR as usize;
pub(crate) const PY_SNAP_TABLE: usize = c::PY_SNAP_TABLE as usize;
/// A `PyProc` offset the interpreter's version lacks.
pub(crate) const PY_NONE: u16 = c::PY_NONE as u16;

/// Where a CPython interpreter keeps its threads and frames (`struct py_proc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PyProc {
    pub runtime: u64,
    pub interp_head: u16,
    pub threads_head: u16,
    pub ts_next: u16,
    pub ts_thread_id: u16,
    pub ts_frame: u16,
    pub cframe_frame: u16,
    pub fr_previous: u16,
    pub fr_code: u16,
    pub fr_instr: u16,
    pub fr_owner: u16,
    pub instr_size: u16,
    pub pad: u16,
    pub co_filename: u16,
    pub co_name: u16,
    pub co_linetable: u16,
    pub str_ascii: u16,
    pub str_compact: u16,
    pub pad2: [u16; 3],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PyFrame {
    pub code: u64,
    pub instr: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct StallEvent {
    pub ts_ns: u64,
    pub duration_ns: u64,
    pub threshold_ns: u64,
    pub cgroup_id: u64,
    pub tgid: u32,
    pub tid: u32,
    pub op: u32,
    pub reason: u32,
    pub ustack_bytes: i32,
    pub py_frames: u32,
    pub ustack: [u64; USTACK_MAX],
    pub py: [PyFrame; PY_MAX_FRAMES],
}

impl Default for StallEvent {
    fn default() -> Self {
        StallEvent {
            ts_ns: 0,
            duration_ns: 0,
            threshold_ns: 0,
            cgroup_id: 0,
            tgid: 0,
            tid: 0,
            op: 0,
            reason: 0,
            ustack_bytes: 0,
            py_frames: 0,
            ustack: [0; USTACK_MAX],
            py: [PyFrame::default(); PY_MAX_FRAMES],
        }
    }
}

impl StallEvent {
    /// Native return addresses, innermost first.
    pub(crate) fn native(&self) -> &[u64] {
        let n = (self.ustack_bytes.max(0) as usize / 8).min(USTACK_MAX);
        let s = &self.ustack[..n];
        let end = s.iter().position(|&a| a == 0).unwrap_or(n);
        &s[..end]
    }

    /// Python frames, innermost first.
    pub(crate) fn python(&self) -> &[PyFrame] {
        &self.py[..(self.py_frames as usize).min(PY_MAX_FRAMES)]
    }
}

/// The innermost frame's code object as the kernel copied it (`struct py_snap`);
/// ~5 KB, so kept boxed and never copied.
#[repr(C)]
pub(crate) struct PySnap {
    pub addr: [u64; PY_SNAP_REGIONS],
    pub len: [u32; PY_SNAP_REGIONS],
    pub type_ptr: [u8; 8],
    pub type_name: [u8; 8],
    pub head: [u8; PY_SNAP_CODE],
    pub file: [u8; PY_SNAP_STR],
    pub name: [u8; PY_SNAP_STR],
    pub lines: [u8; PY_SNAP_TABLE],
}

impl PySnap {
    /// The snapshot after a record's event, if the record has one; the
    /// line table holds only what the record carries.
    pub(crate) fn from_tail(tail: &[u8]) -> Option<Box<PySnap>> {
        let lines = offset_of!(PySnap, lines);
        if tail.len() < lines {
            return None;
        }
        let mut s = Box::new(PySnap {
            addr: [0; PY_SNAP_REGIONS],
            len: [0; PY_SNAP_REGIONS],
            type_ptr: [0; 8],
            type_name: [0; 8],
            head: [0; PY_SNAP_CODE],
            file: [0; PY_SNAP_STR],
            name: [0; PY_SNAP_STR],
            lines: [0; PY_SNAP_TABLE],
        });
        let n = tail.len().min(size_of::<PySnap>());
        // SAFETY: PySnap is a repr(C) POD mirror (integer arrays only) and
        // `n` bytes fit both the source and it.
        unsafe { std::ptr::copy_nonoverlapping(tail.as_ptr(), &mut *s as *mut PySnap as *mut u8, n) };
        let carried = n - lines;
        s.len[c::PY_SNAP_LINES as usize] = s.len[c::PY_SNAP_LINES as usize].min(carried as u32);
        Some(s)
    }

    /// (address, bytes) of each region read, clamped to its capacity.
    pub(crate) fn regions(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let bufs: [&[u8]; PY_SNAP_REGIONS] =
            [&self.type_ptr, &self.type_name, &self.head, &self.file, &self.name, &self.lines];
        (0..PY_SNAP_REGIONS)
            .filter(|&i| self.addr[i] != 0)
            .map(move |i| (self.addr[i], &bufs[i][..(self.len[i] as usize).min(bufs[i].len())]))
    }

    /// The code object copied.
    pub(crate) fn code(&self) -> u64 {
        self.addr[c::PY_SNAP_HEAD as usize]
    }
}

impl std::fmt::Debug for PySnap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PySnap").field("addr", &self.addr).field("len", &self.len).finish_non_exhaustive()
    }
}

/// One record of the stall rings: the event, and its snapshot if any.
pub(crate) fn read_stall(bytes: &[u8]) -> Option<(StallEvent, Option<Box<PySnap>>)> {
    let event = read_event::<StallEvent>(bytes)?;
    Some((event, PySnap::from_tail(&bytes[size_of::<StallEvent>()..])))
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProcEvent {
    pub ts_ns: u64,
    pub cgroup_id: u64,
    pub kind: u32,
    pub tgid: u32,
    pub other: u32,
    pub value: i32,
    pub extra: u64,
    pub comm: [u8; 16],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub events: u64,
    pub ringbuf_drops: u64,
    pub map_full: u64,
    pub inflight_full: u64,
    /// Threads held at a new CUDA/NCCL library's first symbol lookup.
    pub lib_holds: u64,
    /// Time those threads were held (ns).
    pub lib_hold_ns: u64,
    /// Holds that ran out before the agent released them.
    pub lib_hold_timeouts: u64,
    /// Step marks lost to a full marks ring.
    pub mark_drops: u64,
    /// Switches of tracked threads no program saw.
    pub sched_missed: u64,
    /// Python call sites cut short by a failed read of the interpreter.
    pub py_faults: u64,
}

impl Counters {
    /// The increase since `before` (the counters only grow).
    pub(crate) fn since(&self, before: &Counters) -> Counters {
        Counters {
            events: self.events.saturating_sub(before.events),
            ringbuf_drops: self.ringbuf_drops.saturating_sub(before.ringbuf_drops),
            map_full: self.map_full.saturating_sub(before.map_full),
            inflight_full: self.inflight_full.saturating_sub(before.inflight_full),
            lib_holds: self.lib_holds.saturating_sub(before.lib_holds),
            lib_hold_ns: self.lib_hold_ns.saturating_sub(before.lib_hold_ns),
            lib_hold_timeouts: self.lib_hold_timeouts.saturating_sub(before.lib_hold_timeouts),
            mark_drops: self.mark_drops.saturating_sub(before.mark_drops),
            sched_missed: self.sched_missed.saturating_sub(before.sched_missed),
            py_faults: self.py_faults.saturating_sub(before.py_faults),
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Config {
    pub active: u32,
    pub scoped: u32,
    pub track_all: u32,
    pub pid_filter: u32,
    /// Depth of the agent's pid namespace + 1, found by the programs.
    pub pidns_level: u32,
    /// 1: hold a thread at a new CUDA/NCCL library's first lookup until it is probed.
    pub hold_dlopen: u32,
    /// Inode of the agent's pid namespace; 0 for the initial one.
    pub pidns_ino: u64,
    /// `--cgroup-root`: its cgroup id and depth below the hierarchy's root
    /// (read where the cgroup array cannot be: sleepable programs).
    pub scope_cgroup_id: u64,
    pub scope_level: u32,
    /// Longest hold at a new library's first lookup, ms (0: 1000).
    pub hold_max_ms: u32,
    /// Off-CPU episodes outside calls at least this long ship their site, µs (0: none).
    pub offcpu_site_us: u32,
    /// 1: return-probed calls go to the marks ring as they return (step inference).
    pub call_marks: u32,
}

/// A return-probed call as it returned (`marks` ring).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CallMark {
    /// Monotonic clock at the return.
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub op: u32,
    /// `MARK_DUTY_ON`, `MARK_HALF_B`.
    pub flags: u32,
}

/// Plain-old-data mirrors of the C structs: no padding holes with
/// uninitialised bytes (the size/offset assertions below), every bit pattern valid.
macro_rules! pod {
    ($($t:ty),*) => {
        $(
            // SAFETY: see above; `#[repr(C)]`, integer fields only.
            unsafe impl aya::Pod for $t {}
        )*
    };
}
pod!(
    CallKey, CallVal, SchedVal, SchedVals, ThreadCall, RetiredKey, CgroupVal, IoKey, IoVal, Counters, Config, PyProc,
    CallMark
);

const _: () = {
    assert!(size_of::<CallKey>() == 8);
    assert!(size_of::<CallVal>() == 32 + 4 * HIST_BUCKETS);
    assert!(offset_of!(CallVal, hist) == 32);
    assert!(size_of::<SchedVal>() == 72);
    assert!(offset_of!(SchedVal, off_call_ns) == 56);
    assert!(size_of::<SchedVals>() == 144);
    assert!(offset_of!(SchedVals, other) == 72);
    assert!(size_of::<ThreadCall>() == 64 + 12 * THREAD_COUNTS);
    assert!(size_of::<OpCount>() == 12);
    assert!(offset_of!(ThreadCall, born) == 56);
    assert!(offset_of!(ThreadCall, counts) == 64);
    assert!(size_of::<RetiredKey>() == 16);
    assert!(offset_of!(RetiredKey, born) == 8);
    assert!(offset_of!(ThreadCall, text_lo) == 40);
    assert!(offset_of!(ThreadCall, ret) == 32);
    assert!(offset_of!(ThreadCall, sp) == 24);
    assert!(offset_of!(ThreadCall, depth) == 16);
    assert!(offset_of!(ThreadCall, nested) == 20);
    assert!(size_of::<CgroupVal>() == 16);
    assert!(size_of::<IoKey>() == 16);
    assert!(size_of::<IoVal>() == 32 + 4 * HIST_BUCKETS);
    assert!(size_of::<StallEvent>() == 56 + 8 * USTACK_MAX + 16 * PY_MAX_FRAMES);
    assert!(offset_of!(StallEvent, tgid) == 32);
    assert!(offset_of!(StallEvent, ustack_bytes) == 48);
    assert!(offset_of!(StallEvent, ustack) == 56);
    assert!(offset_of!(StallEvent, py) == 56 + 8 * USTACK_MAX);
    assert!(size_of::<PyProc>() == 48);
    assert!(offset_of!(PyProc, co_filename) == 32);
    assert!(offset_of!(PyProc, str_compact) == 40);
    assert!(offset_of!(PySnap, len) == 8 * PY_SNAP_REGIONS);
    assert!(offset_of!(PySnap, type_ptr) == 12 * PY_SNAP_REGIONS);
    assert!(offset_of!(PySnap, head) == 12 * PY_SNAP_REGIONS + 16);
    assert!(offset_of!(PySnap, lines) == 12 * PY_SNAP_REGIONS + 16 + PY_SNAP_CODE + 2 * PY_SNAP_STR);
    assert!(size_of::<PySnap>() == 12 * PY_SNAP_REGIONS + 16 + PY_SNAP_CODE + 2 * PY_SNAP_STR + PY_SNAP_TABLE);
    assert!(offset_of!(PyProc, interp_head) == 8);
    assert!(offset_of!(PyProc, instr_size) == 28);
    assert!(size_of::<PyFrame>() == 16);
    assert!(size_of::<ProcEvent>() == 56);
    assert!(offset_of!(ProcEvent, extra) == 32);
    assert!(offset_of!(ProcEvent, comm) == 40);
    assert!(size_of::<Counters>() == 80);
    assert!(offset_of!(Counters, mark_drops) == 56);
    assert!(offset_of!(Counters, sched_missed) == 64);
    assert!(offset_of!(Counters, py_faults) == 72);
    assert!(offset_of!(Counters, lib_hold_timeouts) == 48);
    assert!(size_of::<Config>() == 56);
    assert!(offset_of!(Config, offcpu_site_us) == 48);
    assert!(offset_of!(Config, call_marks) == 52);
    assert!(size_of::<CallMark>() == 32);
    assert!(offset_of!(CallMark, tgid) == 16);
    assert!(offset_of!(CallMark, op) == 24);
    assert!(offset_of!(CallMark, flags) == 28);
    assert!(offset_of!(Config, scope_level) == 40);
    assert!(offset_of!(Config, pidns_ino) == 24);
};

/// Reads a `#[repr(C)]` event from ring-buffer bytes (None when too short).
pub(crate) fn read_event<T: Copy + Default>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    let mut out = T::default();
    // SAFETY: T is a repr(C) POD mirror and `bytes` holds at least size_of::<T>() bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), &mut out as *mut T as *mut u8, size_of::<T>()) };
    Some(out)
}
