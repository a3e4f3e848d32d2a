// SPDX-License-Identifier: Apache-2.0
//! Closes the uprobes of detached library files on a thread of its own.
//! Each close waits out an RCU grace period and an RCU-tasks-trace one (until
//! every sleepable program in flight, a held lookup included, has returned):
//! for perf-event uprobes ~10-80 ms a probe, seconds for a file's ~60; a
//! uprobe_multi link waits once for all of its probes (probes/multi.rs). On
//! the probe loop that stalled windows and every held lookup behind it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use crate::probes::link::Closing;
use aya::maps::{Array, MapData};

use crate::loop_config::LoopStats;

pub(crate) struct Detacher {
    tx: mpsc::Sender<Vec<Closing>>,
    stats: Arc<LoopStats>,
}

impl std::fmt::Debug for Detacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Detacher")
    }
}

impl Detacher {
    /// `paused`: the kernel's switch that stops library holds while probes
    /// are closed (ebpf/libload.bpf.c): a close waits for every sleepable
    /// program in flight while it holds the lock the agent's next attach
    /// needs, so a held thread would wait for an attach that waits for it.
    pub(crate) fn start(stats: Arc<LoopStats>, mut paused: Option<Array<MapData, u32>>) -> Detacher {
        let (tx, rx) = mpsc::channel::<Vec<Closing>>();
        let counted = stats.clone();
        let spawned = std::thread::Builder::new().name("ingero-detach".into()).spawn(move || {
            for links in rx {
                let mut pause = |on: u32| {
                    if let Some(Err(e)) = paused.as_mut().map(|m| m.set(0, on, 0)) {
                        tracing::warn!(error = %e, "setting holds_paused");
                    }
                };
                for link in links {
                    pause(1);
                    drop(link);
                    pause(0);
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
        Detacher { tx, stats }
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
