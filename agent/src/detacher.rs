// SPDX-License-Identifier: Apache-2.0
//! Closes the uprobes of detached library files on a thread of its own.
//! Each close waits out an RCU grace period and an RCU-tasks-trace one (until
//! every sleepable program in flight, a held lookup included, has returned):
//! for perf-event uprobes ~10-80 ms a probe, seconds for a file's ~60; a
//! uprobe_multi link waits once for all of its probes (probes/multi.rs). On
//! the probe loop that stalled windows and every held lookup behind it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};

use crate::probes::link::Closing;
use aya::maps::{Array, MapData};

use crate::loop_config::LoopStats;

pub(crate) struct Detacher {
    tx: mpsc::Sender<Vec<Closing>>,
    stats: Arc<LoopStats>,
    paused: Arc<HoldPause>,
}

/// Threads that close the probes at a stop.
const STOP_THREADS: usize = 16;

impl std::fmt::Debug for Detacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Detacher")
    }
}

/// The kernel's switch that stops library holds while probes are closed
/// (ebpf/libload.bpf.c, holds_paused): a close waits for every sleepable
/// program in flight while it holds the lock the agent's next attach
/// needs, so a held thread would wait for an attach that waits for it.
/// Shared by every thread that closes probes (the detacher, the duty
/// cycle): holds resume when the last of them is done.
pub(crate) struct HoldPause {
    map: Mutex<(Option<Array<MapData, u32>>, u32)>,
}

impl std::fmt::Debug for HoldPause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HoldPause")
    }
}

impl HoldPause {
    /// None: no hold is loaded, nothing to pause.
    pub(crate) fn new(map: Option<Array<MapData, u32>>) -> HoldPause {
        HoldPause { map: Mutex::new((map, 0)) }
    }

    /// Runs `close` with holds paused.
    pub(crate) fn during<T>(&self, close: impl FnOnce() -> T) -> T {
        self.set(true);
        let out = close();
        self.set(false);
        out
    }

    fn set(&self, on: bool) {
        let mut g = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let (map, closers) = &mut *g;
        *closers = if on { *closers + 1 } else { closers.saturating_sub(1) };
        let value = u32::from(*closers > 0);
        if let Some(Err(e)) = map.as_mut().map(|m| m.set(0, value, 0)) {
            tracing::warn!(error = %e, "setting holds_paused");
        }
    }
}

impl Detacher {
    pub(crate) fn start(stats: Arc<LoopStats>, paused: Arc<HoldPause>) -> Detacher {
        let (tx, rx) = mpsc::channel::<Vec<Closing>>();
        let (counted, pause) = (stats.clone(), paused.clone());
        let spawned = std::thread::Builder::new().name("ingero-detach".into()).spawn(move || {
            for links in rx {
                for link in links {
                    pause.during(|| drop(link));
                    counted.uprobes_detaching.fetch_sub(1, Ordering::Relaxed);
                }
                // What those probes' bookkeeping held goes back to the kernel:
                // the agent's memory follows the probes it has now, not its peak.
                crate::heap::release_free();
            }
        });
        if let Err(e) = spawned {
            // Sends fail from now on, and links are closed where taken.
            tracing::warn!(error = %e, "no detacher thread: unused probes are closed on the probe loop");
        }
        Detacher { tx, stats, paused }
    }

    /// Closes `links` now, on threads of their own (the agent stops): each
    /// close waits out grace periods, ~150 ms a file one after another
    /// (256 files would outlast a pod's 30-s grace), and waits begun
    /// together end together. A thread that cannot start closes its share
    /// where it is.
    pub(crate) fn close_now(&self, links: Vec<Closing>) {
        let per = links.len().div_ceil(STOP_THREADS).max(1);
        let mut links = links.into_iter().peekable();
        let mut shares = Vec::new();
        while links.peek().is_some() {
            shares.push(links.by_ref().take(per).collect::<Vec<Closing>>());
        }
        self.paused.during(|| {
            std::thread::scope(|s| {
                for share in shares {
                    let _ =
                        std::thread::Builder::new().name("ingero-close".into()).spawn_scoped(s, move || drop(share));
                }
            });
        });
    }

    /// Hands links over to be closed (closed here if the thread is gone).
    pub(crate) fn send(&self, links: Vec<Closing>) {
        if let Err(mpsc::SendError(links)) = self.tx.send(links) {
            let n = links.len() as u64;
            drop(links);
            self.stats.uprobes_detaching.fetch_sub(n, Ordering::Relaxed);
        }
    }
}
