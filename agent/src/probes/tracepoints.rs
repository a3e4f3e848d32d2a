// SPDX-License-Identifier: Apache-2.0
//! The scheduler, process and block tracepoints, attached at load, and the
//! syscall-exit one of off-CPU sites, attached only when asked for.

use aya::programs::BtfTracePoint;
use aya::{Btf, Ebpf};

use crate::error::{Error, Result};

/// Tracepoints: (programs, tracepoint, required). Where a tracepoint's
/// prototype changed, the programs are tried in order and the first the
/// verifier accepts is attached (block_rq_issue lost its queue in 5.11).
const TRACEPOINTS: &[(&[&str], &str, bool)] = &[
    (&["on_switch"], "sched_switch", true),
    (&["on_wakeup"], "sched_wakeup", true),
    (&["on_wakeup_new"], "sched_wakeup_new", true),
    (&["on_exec"], "sched_process_exec", true),
    (&["on_exit"], "sched_process_exit", true),
    (&["on_fork"], "sched_process_fork", false),
    (&["on_oom_victim"], "mark_victim", false),
    (&["on_rq_issue_q", "on_rq_issue"], "block_rq_issue", false),
    (&["on_rq_complete"], "block_rq_complete", false),
];

/// Attaches the scheduler, process and block tracepoints; an optional one
/// the kernel lacks is logged and left out.
pub(super) fn attach(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    for &(names, tp, required) in TRACEPOINTS {
        let mut res = Err(Error::Missing { kind: "program", name: tp.into() });
        for name in names {
            res = (|| -> Result<()> {
                let p = prog(ebpf, name)?;
                p.load(tp, btf).map_err(Error::program(format!("loading tp_btf/{tp} ({name})")))?;
                p.attach().map_err(Error::program(format!("attaching tp_btf/{tp}")))?;
                Ok(())
            })();
            if res.is_ok() {
                break;
            }
        }
        if let Err(e) = res {
            if required {
                return Err(e);
            }
            tracing::warn!(tracepoint = tp, error = %e, "optional tracepoint unavailable; continuing without it");
        }
    }
    Ok(())
}

/// The program that ships an off-CPU episode's site at its syscall's exit
/// (ebpf/sched.bpf.c), loaded not attached: false where the verifier refuses it.
pub(super) fn load_sys_exit(ebpf: &mut Ebpf, btf: &Btf) -> bool {
    let res = (|| -> Result<()> {
        let p = prog(ebpf, SYS_EXIT)?;
        p.load("sys_exit", btf).map_err(Error::program("loading tp_btf/sys_exit"))
    })();
    if let Err(e) = &res {
        tracing::warn!(error = %e, "off-CPU call sites unavailable");
    }
    res.is_ok()
}

/// Every syscall on the node runs it from now on (one array lookup while
/// no episode waits for its exit).
pub(super) fn attach_sys_exit(ebpf: &mut Ebpf) -> Result<()> {
    let p = prog(ebpf, SYS_EXIT)?;
    p.attach().map_err(Error::program("attaching tp_btf/sys_exit"))?;
    Ok(())
}

const SYS_EXIT: &str = "on_sys_exit";

/// A tracepoint program by name, as the verifier will see it.
fn prog<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut BtfTracePoint> {
    let p = ebpf.program_mut(name).ok_or_else(|| Error::Missing { kind: "program", name: name.into() })?;
    p.try_into().map_err(Error::program(name.to_string()))
}
