// SPDX-License-Identifier: Apache-2.0
//! The stacks stage on its own thread: each outlier call or off-CPU episode
//! is resolved as the kernel reports it (the ring wakes the worker), not
//! when the probe loop next looks. A Python process that stalls and exits
//! while the loop scans another process's libraries (100–200 ms on a busy
//! node) lost every frame: its memory and maps were gone when the loop
//! came to read them. It also keeps a read of a pod's memory that blocks
//! (a hostile process can back its frames with a FUSE file) from holding
//! the probe loop, which releases held threads and ships windows.
//!
//! Order is what makes it exact. A process is registered with the worker
//! before the kernel is told to walk its frames, and the worker reads the
//! rings before it takes its commands: every event it reads finds its
//! process known. A flush (at each window's close) is answered after the
//! worker has read the rings again, so it covers every event reported
//! before it was asked for.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Found, Resolver, Stall};
use crate::error::{Error, Result};
use crate::probes::abi::{PySnap, StallEvent};
use crate::probes::drain::StallRings;
use crate::probes::load::Probes;
use crate::wake::Wake;

/// A window's close waits for the worker to answer a flush while it makes
/// progress (a backlog of outliers: a flood, a slow machine), up to
/// `FLUSH_MAX`; a worker silent for `FLUSH_IDLE` is taken for stuck.
const FLUSH_IDLE: Duration = Duration::from_secs(1);
const FLUSH_MAX: Duration = Duration::from_secs(5);
/// The ring wakes the worker; this only bounds a missed wakeup.
const IDLE_WAIT: Duration = Duration::from_millis(200);
/// Past `BATCHES_FREE` batches in `BATCH_SPAN`, what comes next waits
/// `BATCH_GAP` (a flush does not): at most ~400 wakeups a second however many
/// threads sleep past `--offcpu-site-min`, and none while stalls are rare (a
/// process that stalls as it ends exits within milliseconds).
const BATCHES_FREE: u32 = 20;
const BATCH_SPAN: Duration = Duration::from_millis(100);
const BATCH_GAP: Duration = Duration::from_millis(5);
/// Resolved stalls waiting for the probe loop: past this the worker waits,
/// the kernel's rings fill and count their drops (`ringbuf_drops`).
const OUT_BOUND: usize = 8192;

enum Cmd {
    Register(u32, Box<Found>),
    Forget(u32),
    Flush(u64),
}

enum Out {
    /// Boxed: the channel's slots are allocated at its bound.
    Stall(Box<Stall>),
    Flushed(u64),
}

/// The probe loop's handle on the worker.
pub(crate) struct Stacks {
    cmds: mpsc::Sender<Cmd>,
    out: mpsc::Receiver<Out>,
    wake: Arc<Wake>,
    /// Processes already looked at for an interpreter.
    checked: HashSet<u32>,
    /// Interpreter files already read.
    files: super::python::Files,
    asked: u64,
    answered: u64,
    /// A flush went unanswered in time (logged once, until it answers).
    stuck: bool,
}

impl std::fmt::Debug for Stacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stacks").field("asked", &self.asked).field("answered", &self.answered).finish()
    }
}

impl Stacks {
    pub(crate) fn start(rings: StallRings) -> Result<Stacks> {
        let wake = Arc::new(Wake::new("eventfd for the stacks worker")?);
        let (cmds, cmd_rx) = mpsc::channel();
        let (out_tx, out) = mpsc::sync_channel(OUT_BOUND);
        let w = Worker {
            rings,
            cmds: cmd_rx,
            out: out_tx,
            wake: wake.clone(),
            resolver: Resolver::default(),
            batches: 0,
            span_start: Instant::now(),
        };
        // Never joined: a worker blocked on a pod's memory must not hold the
        // agent's stop. It returns once this handle is dropped.
        std::thread::Builder::new()
            .name("ingero-stacks".into())
            .spawn(move || w.run())
            .map_err(|cause| Error::Runtime { what: "spawning the stacks worker", cause })?;
        Ok(Stacks {
            cmds,
            out,
            wake,
            checked: HashSet::new(),
            files: Default::default(),
            asked: 0,
            answered: 0,
            stuck: false,
        })
    }

    /// Looks once at a process that uses CUDA for a CPython interpreter and,
    /// when there is one, tells the programs how to walk its frames.
    pub(crate) fn register(&mut self, pid: u32, probes: &mut Probes) {
        if !self.checked.insert(pid) {
            return;
        }
        let found = match super::find(pid, &mut self.files) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => return tracing::warn!(pid, error = %e, "no Python frames for this process"),
        };
        let (layout, file) = (found.mem.layout, found.file.display().to_string());
        // Before the kernel walks it: the worker knows it before any of its frames.
        let _ = self.cmds.send(Cmd::Register(pid, Box::new(found)));
        match probes.set_python(pid, &layout.kernel) {
            Ok(()) => tracing::info!(pid, version = %layout.version, file, "Python frames on"),
            Err(e) => {
                let _ = self.cmds.send(Cmd::Forget(pid));
                tracing::warn!(pid, error = %e, "no Python frames for this process");
            }
        }
    }

    pub(crate) fn forget(&mut self, pid: u32) {
        self.checked.remove(&pid);
        let _ = self.cmds.send(Cmd::Forget(pid));
    }

    /// What the worker has resolved so far; never waits.
    pub(crate) fn take(&mut self) -> Vec<Stall> {
        let mut got = Vec::new();
        while let Ok(o) = self.out.try_recv() {
            self.receive(o, &mut got);
        }
        got
    }

    /// Every stall the kernel reported until now, resolved. Not waited for
    /// while the worker is stuck (a window's close would pay `FLUSH_IDLE`
    /// each time), except at the last window (`last`): the agent's stop.
    pub(crate) fn flush(&mut self, last: bool) -> Vec<Stall> {
        let mut got = self.take();
        if self.stuck && !last {
            return got;
        }
        self.asked += 1;
        let _ = self.cmds.send(Cmd::Flush(self.asked));
        self.wake.signal();
        let (start, mut progress) = (Instant::now(), Instant::now());
        while self.answered < self.asked {
            let until = (progress + FLUSH_IDLE).min(start + FLUSH_MAX);
            match self.out.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(o) => {
                    progress = Instant::now();
                    self.receive(o, &mut got);
                }
                Err(_) => {
                    if !std::mem::replace(&mut self.stuck, true) {
                        tracing::warn!(
                            waited = ?start.elapsed(),
                            "the stacks worker did not finish (a read of a process's memory blocked, or a flood of outliers): the rest ship in a later window, if at all"
                        );
                    }
                    break;
                }
            }
        }
        got
    }

    fn receive(&mut self, o: Out, got: &mut Vec<Stall>) {
        if std::mem::take(&mut self.stuck) {
            tracing::info!("the stacks worker answers again");
        }
        match o {
            Out::Stall(s) => got.push(*s),
            Out::Flushed(n) => self.answered = self.answered.max(n),
        }
    }
}

impl Drop for Stacks {
    fn drop(&mut self) {
        // The command channel closes with this handle; wake the worker to see it.
        self.wake.signal();
    }
}

/// The worker thread: the rings, the resolver and the channels.
struct Worker {
    rings: StallRings,
    cmds: mpsc::Receiver<Cmd>,
    out: mpsc::SyncSender<Out>,
    wake: Arc<Wake>,
    resolver: Resolver,
    /// Batches since `span_start`.
    batches: u32,
    span_start: Instant,
}

/// The handle is gone: the worker returns.
struct Gone;

impl Worker {
    fn run(mut self) {
        let _ = self.serve();
    }

    fn serve(&mut self) -> std::result::Result<(), Gone> {
        loop {
            self.rings.wait(self.wake.fd(), IDLE_WAIT);
            self.wake.clear();
            // Read before the commands: each event's process is registered.
            let events = self.rings.read();
            let batch = !events.is_empty();
            let flush = self.commands()?;
            self.resolve(events)?;
            if let Some(n) = flush {
                // Whatever was reported before the flush was asked for is in the rings now.
                let more = self.rings.read();
                self.resolve(more)?;
                self.out.send(Out::Flushed(n)).map_err(|_| Gone)?;
            } else if batch {
                self.pace();
            }
        }
    }

    /// Waits `BATCH_GAP` once batches come faster than `BATCHES_FREE` a span.
    fn pace(&mut self) {
        if self.span_start.elapsed() >= BATCH_SPAN {
            (self.batches, self.span_start) = (0, Instant::now());
        }
        self.batches += 1;
        if self.batches > BATCHES_FREE {
            self.wake.wait(BATCH_GAP);
        }
    }

    /// Applies the commands sent so far; the last flush asked for, if any.
    fn commands(&mut self) -> std::result::Result<Option<u64>, Gone> {
        let mut flush = None;
        loop {
            match self.cmds.try_recv() {
                Ok(Cmd::Register(pid, found)) => self.resolver.insert(pid, *found),
                Ok(Cmd::Forget(pid)) => self.resolver.forget(pid),
                Ok(Cmd::Flush(n)) => flush = Some(n),
                Err(mpsc::TryRecvError::Empty) => return Ok(flush),
                Err(mpsc::TryRecvError::Disconnected) => return Err(Gone),
            }
        }
    }

    fn resolve(&mut self, events: Vec<(StallEvent, Option<Box<PySnap>>)>) -> std::result::Result<(), Gone> {
        for (event, snap) in events {
            let stack = self.resolver.resolve(&event, snap.as_deref());
            tracing::debug!(
                pid = event.tgid,
                tid = event.tid,
                native = event.native().len(),
                ustack_bytes = event.ustack_bytes,
                python = event.py_frames,
                frames = stack.as_ref().map_or(0, |s| s.frames.len()),
                "stall"
            );
            // Read now, while the thread most likely lives: a worker thread
            // named by its framework is known by that name.
            let thread = super::thread_name(event.tgid, event.tid);
            self.out.send(Out::Stall(Box::new(Stall { event, stack, thread }))).map_err(|_| Gone)?;
        }
        Ok(())
    }
}
