// SPDX-License-Identifier: Apache-2.0
//! uprobe_multi links (Linux 6.6+): every probe one program has on a file,
//! in one link.
//!
//! A perf-event uprobe closes with a wait for RCU grace periods, under the
//! kernel's global `event_mutex` (perf_uprobe_destroy): ~80 ms a probe here,
//! and closes from several threads do not overlap. A stop or a detach of a
//! file's ~130 probes took 10 s that way. A multi link unregisters all its
//! probes, then waits once: 60 probes closed in 24 ms (vendor/README.md).
//! The programs run as before (same pt_regs, cookies per offset).

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::link::{Link, Links, MultiLink};
use super::plan::Planned;

/// BPF_LINK_CREATE (uapi bpf.h `enum bpf_cmd`).
const BPF_LINK_CREATE: libc::c_long = 28;
/// BPF_TRACE_UPROBE_MULTI (uapi bpf.h `enum bpf_attach_type`).
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// BPF_F_UPROBE_MULTI_RETURN: the programs run at the functions' returns.
const RETURN: u32 = 1;

/// `union bpf_attr`'s `link_create` with its `uprobe_multi` member (uapi
/// bpf.h, 6.6): the kernel reads only as many bytes as it is given.
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    pad: u32,
}

const _: () = {
    assert!(std::mem::size_of::<LinkCreate>() == 64);
    assert!(std::mem::offset_of!(LinkCreate, path) == 16);
    assert!(std::mem::offset_of!(LinkCreate, cookies) == 40);
    assert!(std::mem::offset_of!(LinkCreate, cnt) == 48);
    assert!(std::mem::offset_of!(LinkCreate, pid) == 56);
};

/// Places `plan` on `path` as two links, returns first (a call that passes
/// its entry probe then always has its return seen). Where the kernel
/// refuses a whole link (one offset it cannot probe), each probe gets a
/// link of its own and the ops refused are left out. Returns the symbols probed.
pub(crate) fn attach_plan(
    (entry, ret): (BorrowedFd<'_>, BorrowedFd<'_>),
    path: &Path,
    plan: &[Planned],
    links: &mut Links,
) -> std::io::Result<Vec<&'static str>> {
    match place((entry, ret), path, plan) {
        Ok(placed) => {
            links.extend(placed);
            Ok(plan.iter().map(|p| p.op.symbol).collect())
        }
        Err(_) => one_by_one((entry, ret), path, plan, links),
    }
}

/// The return link of `planned` (its timed ops), then its entry link; a
/// refused entry link drops the return link placed just before it.
fn place((entry, ret): (BorrowedFd<'_>, BorrowedFd<'_>), path: &Path, planned: &[Planned]) -> std::io::Result<Links> {
    let r = link_of(ret, path, planned.iter().filter(|p| p.ret), true)?;
    let e = link_of(entry, path, planned.iter(), false)?;
    Ok(r.into_iter().chain(e).map(Link::Multi).collect())
}

/// One link of `prog` at the planned probes (none: no link).
fn link_of<'a>(
    prog: BorrowedFd<'_>,
    path: &Path,
    planned: impl Iterator<Item = &'a Planned>,
    ret: bool,
) -> std::io::Result<Option<MultiLink>> {
    let (offsets, cookies): (Vec<u64>, Vec<u64>) = planned.map(|p| (p.offset, p.cookie)).unzip();
    if offsets.is_empty() { Ok(None) } else { attach(prog, path, &offsets, &cookies, ret).map(Some) }
}

/// A link per probe: the ops the kernel refuses are left out, as the
/// per-probe path leaves them.
fn one_by_one(
    (entry, ret): (BorrowedFd<'_>, BorrowedFd<'_>),
    path: &Path,
    plan: &[Planned],
    links: &mut Links,
) -> std::io::Result<Vec<&'static str>> {
    let mut done = Vec::new();
    let mut last = None;
    for p in plan {
        match place((entry, ret), path, std::slice::from_ref(p)) {
            Ok(placed) => {
                links.extend(placed);
                done.push(p.op.symbol);
            }
            Err(e) => {
                tracing::debug!(symbol = p.op.symbol, path = %path.display(), error = %e, "symbol not probed");
                last = Some(e);
            }
        }
    }
    match (done.is_empty(), last) {
        (true, Some(e)) => Err(e),
        _ => Ok(done),
    }
}

/// Attaches `prog` (loaded with `UProbe::load_multi`) at each file offset
/// of `path`, each with its cookie, for every process: at the functions'
/// entries, or at their returns (`ret`).
pub(crate) fn attach(
    prog: BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    ret: bool,
) -> std::io::Result<MultiLink> {
    assert_eq!(offsets.len(), cookies.len(), "one cookie per offset");
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    let attr = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        multi_flags: if ret { RETURN } else { 0 },
        ..LinkCreate::default()
    };
    // SAFETY: attr and everything it points to (path, offsets, cookies) live
    // across the call; the kernel copies them and keeps no pointer.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_LINK_CREATE, &attr as *const LinkCreate, std::mem::size_of::<LinkCreate>())
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh link fd that nothing else owns.
    Ok(MultiLink { _fd: unsafe { OwnedFd::from_raw_fd(fd as i32) } })
}

/// Whether the kernel makes uprobe_multi links for `prog` (loaded with
/// `load_multi`): libbpf's probe. A link on "/" fails with EBADF (not a
/// regular file) only where the kernel knows the attach type; EINVAL before.
pub(crate) fn supported(prog: BorrowedFd<'_>) -> bool {
    match attach(prog, Path::new("/"), &[0], &[0], false) {
        Ok(_) => false,
        Err(e) => e.raw_os_error() == Some(libc::EBADF),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use aya::programs::UProbe;

    use super::*;
    use crate::probes::ops;

    #[inline(never)]
    extern "C" fn first_target() -> u64 {
        std::hint::black_box(1)
    }

    #[inline(never)]
    extern "C" fn second_target() -> u64 {
        std::hint::black_box(2)
    }

    #[test]
    fn a_probe_the_kernel_refuses_leaves_the_others_placed() {
        // SAFETY: no arguments.
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var("CI").map_or(true, |v| v != "true"), "CI runs as root");
            eprintln!("SKIP: loading BPF programs needs root");
            return;
        }
        let mut ebpf = aya::EbpfLoader::new().load(crate::probes::features::FEATURES_OBJECT).unwrap();
        let p: &mut UProbe = ebpf.program_mut("has_uprobe_multi").unwrap().try_into().unwrap();
        p.load_multi().unwrap();
        let fd = p.fd().unwrap().as_fd();
        assert!(supported(fd), "uprobe_multi links (Linux 6.6+) on this machine's kernel");
        let code = |f: extern "C" fn() -> u64| crate::probes::trap_cost::code_location(f as usize as u64).unwrap();
        let ((path, a), (_, b)) = (code(first_target), code(second_target));
        let past_the_end = std::fs::metadata(&path).unwrap().len() + 4096;
        let ops = ops::all();
        let plan = [
            Planned { op: ops[0], offset: a, cookie: 1, ret: true },
            Planned { op: ops[1], offset: past_the_end, cookie: 2, ret: true },
            Planned { op: ops[2], offset: b, cookie: 3, ret: false },
        ];
        // Every offset good: a link of returns and one of entries.
        let mut links = Vec::new();
        let done = attach_plan((fd, fd), &path, &[plan[0], plan[2]], &mut links).unwrap();
        assert_eq!(done, vec![ops[0].symbol, ops[2].symbol]);
        assert_eq!(links.len(), 2);
        // One the kernel refuses: the others still placed, a link each.
        let mut links = Vec::new();
        let done = attach_plan((fd, fd), &path, &plan, &mut links).unwrap();
        assert_eq!(done, vec![ops[0].symbol, ops[2].symbol]);
        assert_eq!(links.len(), 3, "the first op's return and entry, the third's entry");
        // None placed: the kernel's reason.
        let mut links = Vec::new();
        assert!(attach_plan((fd, fd), &path, &plan[1..2], &mut links).is_err());
        assert!(links.is_empty());
    }
}
