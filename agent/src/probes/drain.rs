// SPDX-License-Identifier: Apache-2.0
//! Reads the kernel's aggregates once per window (flip A/B, then drain the
//! idle half, so no increment is lost) and the event ring buffers.

use super::unpreempted::Unpreempted;
use std::time::Duration;

use aya::Pod;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};

use super::abi::{
    CallKey, CallMark, CallVal, CgroupVal, Counters, HIST_BUCKETS, IoKey, IoVal, ProcEvent, PySnap, RetiredKey,
    SchedVals, StallEvent, ThreadCall, read_event, read_stall,
};
use super::load::{Probes, map};
use super::thread_counts::ThreadCounts;
use crate::error::{Error, Result};
use std::collections::HashMap;

/// One window's worth of kernel aggregates.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    pub calls: Vec<(CallKey, CallVal)>,
    pub sched: Vec<(u32, SchedVals)>,
    pub cgroups: Vec<(u64, CgroupVal)>,
    pub io: Vec<(IoKey, IoVal)>,
    /// Each thread's slot at the window's end (tid → slot): the call it is
    /// inside and the launches it counted.
    pub threads: Vec<(u32, ThreadCall)>,
    /// Probed calls made inside traced calls, per tgid (each trapped).
    pub nested: HashMap<u32, u64>,
    /// Cumulative since load, summed over CPUs.
    pub counters: Counters,
}

/// Reads every aggregate of the idle half and empties it. The maps are
/// shared by all CPUs (atomic adds in the programs), so one value per key.
fn drain_map<K: Pod + Eq + std::hash::Hash, V: Pod>(probes: &mut Probes, name: &str) -> Result<Vec<(K, V)>> {
    let mut m: BpfHashMap<&mut MapData, K, V> = map(&mut probes.ebpf, name)?;
    let keys: Vec<K> = m.keys().filter_map(|k| k.ok()).collect();
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        let Ok(v) = m.get(&k, 0) else { continue };
        out.push((k, v));
        // Nothing writes the idle half, so removing loses nothing.
        let _ = m.remove(&k);
    }
    Ok(out)
}

/// What a flip took: the half to drain once nothing writes it any more.
#[derive(Debug)]
pub(crate) struct Flipped {
    idle: u32,
}

impl Flipped {
    /// The half flipped away from (`MARK_HALF_B` set in its marks: 1).
    pub(crate) fn idle(&self) -> u32 {
        self.idle
    }
}

/// Makes the other half active. Programs that read the old index may still
/// be writing the old half, the thread slots' launch counts included: drain
/// it only after a grace period that began after this (`grace::Grace`).
pub(crate) fn flip(probes: &mut Probes) -> Result<Flipped> {
    let _rt = Unpreempted::for_maps(&probes.features);
    let idle = probes.active();
    probes.flip()?;
    Ok(Flipped { idle })
}

/// Reads and empties the idle half, and adds the launches threads counted
/// in their own slots' idle half (retired slots first: see `thread_counts`).
pub(crate) fn drain(probes: &mut Probes, f: Flipped, per_thread: &mut ThreadCounts) -> Result<Drained> {
    let _rt = Unpreempted::for_maps(&probes.features);
    let retired = drain_map::<RetiredKey, ThreadCall>(probes, "retired")?;
    // None: the read failed; the slots' last reads are kept, and their
    // growth ships at the next window.
    let live = thread_slots(probes).map_err(|e| tracing::warn!(error = %e, "reading the thread slots")).ok();
    let s = if f.idle == 0 { "a" } else { "b" };
    let mut calls = drain_map::<CallKey, CallVal>(probes, &format!("calls_{s}"))?;
    let sched = drain_map::<u32, SchedVals>(probes, &format!("sched_{s}"))?;
    let cgroups = drain_map::<u64, CgroupVal>(probes, &format!("cgcpu_{s}"))?;
    let io = drain_map::<IoKey, IoVal>(probes, &format!("io_{s}"))?;
    let growth = per_thread.window(&retired, live.as_deref(), f.idle as usize & 1);
    let threads = live.unwrap_or_default();
    add_counts(&mut calls, growth.calls);
    let mut counters = counters(probes)?;
    counters.events += per_thread.total();
    Ok(Drained { calls, sched, cgroups, io, threads, nested: growth.nested, counters })
}

/// Every thread slot, read without changing the map: the programs own it.
fn thread_slots(probes: &mut Probes) -> Result<Vec<(u32, ThreadCall)>> {
    let m: BpfHashMap<&mut MapData, u32, ThreadCall> = map(&mut probes.ebpf, "thread_calls")?;
    Ok(m.iter().filter_map(|kv| kv.ok()).collect())
}

fn add_counts(calls: &mut Vec<(CallKey, CallVal)>, counts: HashMap<(u32, u32), u64>) {
    let at: HashMap<(u32, u32), usize> = calls.iter().enumerate().map(|(i, (k, _))| ((k.tgid, k.op), i)).collect();
    for ((tgid, op), n) in counts {
        match at.get(&(tgid, op)) {
            Some(&i) => calls[i].1.count += n,
            None => calls.push((
                CallKey { tgid, op },
                CallVal { count: n, errors: 0, total_ns: 0, max_ns: 0, hist: [0; HIST_BUCKETS] },
            )),
        }
    }
}

pub(crate) fn counters(probes: &mut Probes) -> Result<Counters> {
    let m: PerCpuArray<&mut MapData, Counters> = map(&mut probes.ebpf, "counters")?;
    let per_cpu = m.get(&0, 0).map_err(Error::map("counters"))?;
    let mut c = Counters::default();
    for v in per_cpu.iter() {
        c.events += v.events;
        c.ringbuf_drops += v.ringbuf_drops;
        c.map_full += v.map_full;
        c.inflight_full += v.inflight_full;
        c.lib_holds += v.lib_holds;
        c.lib_hold_ns += v.lib_hold_ns;
        c.lib_hold_timeouts += v.lib_hold_timeouts;
        c.mark_drops += v.mark_drops;
        c.sched_missed += v.sched_missed;
        c.py_faults += v.py_faults;
    }
    Ok(c)
}

/// The ring buffers, owned outside the `Ebpf` so they stay mapped.
pub(crate) struct Rings {
    procs: RingBuf<aya::maps::MapData>,
    /// Return-probed calls as they return (steps).
    marks: RingBuf<aya::maps::MapData>,
}

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rings").finish_non_exhaustive()
    }
}

fn take_ring(probes: &mut Probes, name: &str) -> Result<RingBuf<MapData>> {
    let m = probes.ebpf.take_map(name).ok_or_else(|| Error::Missing { kind: "map", name: name.into() })?;
    RingBuf::try_from(m).map_err(Error::map(name))
}

/// Outlier calls and off-CPU episodes with their sites: read by the stacks
/// worker as they come (`crate::stacks::worker`), while their processes live.
pub(crate) struct StallRings {
    stalls: RingBuf<aya::maps::MapData>,
    /// Off-CPU episodes outside calls (their own ring: they never crowd
    /// outlier calls out).
    offcpu: RingBuf<aya::maps::MapData>,
}

impl std::fmt::Debug for StallRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StallRings").finish_non_exhaustive()
    }
}

impl StallRings {
    pub(crate) fn take(probes: &mut Probes) -> Result<StallRings> {
        Ok(StallRings { stalls: take_ring(probes, "stalls")?, offcpu: take_ring(probes, "offcpu")? })
    }

    /// Outlier calls, then off-CPU episodes (`op` [`super::abi::OP_OFFCPU`]),
    /// each with its innermost Python frame's code object if it has one.
    pub(crate) fn read(&mut self) -> Vec<(StallEvent, Option<Box<PySnap>>)> {
        let mut out = Vec::new();
        while let Some(item) = self.stalls.next() {
            out.extend(read_stall(&item));
        }
        while let Some(item) = self.offcpu.next() {
            out.extend(read_stall(&item));
        }
        out
    }

    /// Sleeps until an event is ready, `also` is readable, or `timeout` passes.
    pub(crate) fn wait(&self, also: std::os::fd::RawFd, timeout: Duration) {
        use std::os::fd::AsRawFd;
        let pfd = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let mut fds = [pfd(self.stalls.as_raw_fd()), pfd(self.offcpu.as_raw_fd()), pfd(also)];
        // SAFETY: valid pollfds we own, for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout.as_millis().max(1) as i32) };
    }
}

impl Rings {
    pub(crate) fn take(probes: &mut Probes) -> Result<Rings> {
        Ok(Rings { procs: take_ring(probes, "procs")?, marks: take_ring(probes, "marks")? })
    }

    /// Return-probed calls as they returned, oldest first.
    pub(crate) fn marks(&mut self) -> Vec<CallMark> {
        let mut out = Vec::new();
        while let Some(item) = self.marks.next() {
            out.extend(read_event::<CallMark>(&item));
        }
        out
    }

    /// Sleeps until a process event is ready, `also` is readable, or `timeout` passes.
    pub(crate) fn wait_procs(&self, also: Option<std::os::fd::RawFd>, timeout: Duration) {
        use std::os::fd::AsRawFd;
        let pfd = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let mut fds = [pfd(self.procs.as_raw_fd()), pfd(also.unwrap_or(-1))];
        // SAFETY: valid pollfds we own, for the duration of the call (poll ignores fd -1).
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout.as_millis().max(1) as i32) };
    }

    pub(crate) fn procs(&mut self) -> Vec<ProcEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.procs.next() {
            out.extend(read_event::<ProcEvent>(&item));
        }
        out
    }
}
