// SPDX-License-Identifier: Apache-2.0
//! Reads the kernel's aggregates once per window (flip A/B, then drain the
//! idle half, so no increment is lost) and the event ring buffers.

use super::unpreempted::Unpreempted;
use std::time::Duration;

use aya::Pod;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};

use super::abi::{
    CallKey, CallVal, CgroupVal, Counters, IoKey, IoVal, ProcEvent, SchedVal, StallEvent, ThreadCall, read_event,
};
use super::load::{Probes, map};
use crate::error::{Error, Result};

/// One window's worth of kernel aggregates.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    pub calls: Vec<(CallKey, CallVal)>,
    pub sched: Vec<(u32, SchedVal)>,
    pub cgroups: Vec<(u64, CgroupVal)>,
    pub io: Vec<(IoKey, IoVal)>,
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

/// Returns once every program that may have read the old active index has
/// finished, so draining the idle half loses no update. Programs run inside
/// an RCU read-side section (non-sleepable: the kernel's BPF dispatch takes
/// rcu_read_lock), and membarrier(MEMBARRIER_CMD_GLOBAL) is
/// synchronize_rcu(). A fixed sleep loses counts whenever a vCPU is
/// descheduled mid-program (a cloud VM's steal time; seen under qemu), so
/// the sleep is kept only where a grace period could wait for a held thread.
fn wait_for_running_programs(holds_possible: bool) {
    /// MEMBARRIER_CMD_GLOBAL (uapi linux/membarrier.h).
    const GLOBAL: libc::c_long = 1;
    // A thread held at a library lookup spins in the kernel, and that keeps
    // grace periods from ending until the hold does (seen on 6.1 and this
    // machine's 6.18): the agent, which is to release the thread, would wait
    // for it, and the thread's next lookup would be held again (a workload
    // paused for seconds in the pods test). While holds are on: a margin.
    if holds_possible {
        std::thread::sleep(Duration::from_millis(5));
        return;
    }
    // SAFETY: membarrier takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, GLOBAL, 0 as libc::c_long, 0 as libc::c_long) };
    if r != 0 {
        // nohz_full kernels refuse GLOBAL: the old margin, generous.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Flips the active half and drains the other one.
pub(crate) fn drain(probes: &mut Probes) -> Result<Drained> {
    let _rt = Unpreempted::for_maps(&probes.features);
    let idle = probes.active();
    probes.flip()?;
    wait_for_running_programs(probes.holds_on());
    let s = if idle == 0 { "a" } else { "b" };
    let calls = drain_map::<CallKey, CallVal>(probes, &format!("calls_{s}"))?;
    let sched = drain_map::<u32, SchedVal>(probes, &format!("sched_{s}"))?;
    let cgroups = drain_map::<u64, CgroupVal>(probes, &format!("cgcpu_{s}"))?;
    let io = drain_map::<IoKey, IoVal>(probes, &format!("io_{s}"))?;
    Ok(Drained { calls, sched, cgroups, io, counters: counters(probes)? })
}

/// The traced call each thread is inside now (tid → call), read without
/// changing the map: the programs own it.
pub(crate) fn calls_in_flight(probes: &mut Probes) -> Result<Vec<(u32, ThreadCall)>> {
    let _rt = Unpreempted::for_maps(&probes.features);
    let m: BpfHashMap<&mut MapData, u32, ThreadCall> = map(&mut probes.ebpf, "thread_calls")?;
    Ok(m.iter().filter_map(|kv| kv.ok()).collect())
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
    }
    Ok(c)
}

/// The two ring buffers, owned outside the `Ebpf` so they stay mapped.
pub(crate) struct Rings {
    stalls: RingBuf<aya::maps::MapData>,
    procs: RingBuf<aya::maps::MapData>,
}

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rings").finish_non_exhaustive()
    }
}

impl Rings {
    pub(crate) fn take(probes: &mut Probes) -> Result<Rings> {
        let mut take = |name: &str| -> Result<RingBuf<MapData>> {
            let m = probes.ebpf.take_map(name).ok_or_else(|| Error::Missing { kind: "map", name: name.into() })?;
            RingBuf::try_from(m).map_err(Error::map(name))
        };
        Ok(Rings { stalls: take("stalls")?, procs: take("procs")? })
    }

    pub(crate) fn stalls(&mut self) -> Vec<StallEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.stalls.next() {
            out.extend(read_event::<StallEvent>(&item));
        }
        out
    }

    /// Sleeps until a process event is ready or `timeout` passes.
    pub(crate) fn wait_procs(&self, timeout: Duration) {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd { fd: self.procs.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd we own, for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, timeout.as_millis().max(1) as i32) };
    }

    pub(crate) fn procs(&mut self) -> Vec<ProcEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.procs.next() {
            out.extend(read_event::<ProcEvent>(&item));
        }
        out
    }
}
