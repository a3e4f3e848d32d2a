// SPDX-License-Identifier: Apache-2.0
//! Test children die with their test. nextest kills a test at its timeout and
//! no `Drop` runs: an agent, aggregator, S3 server or workload left behind
//! would go on tracing, holding ports and loading the machine, and the next
//! tests would fail for it (CI saw an agent test time out behind one).

use std::process::Command;

/// `cmd` gets SIGKILL when the thread that spawns it exits. Spawn from the
/// test's own thread, never from a pool thread (`spawn_blocking` threads exit
/// when idle, and the child would go with them).
pub fn dies_with_test(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_child_dies_when_its_spawning_thread_ends() {
        let pid = std::thread::spawn(|| dies_with_test(Command::new("sleep").arg("30")).spawn().unwrap().id())
            .join()
            .unwrap();
        // Reaped by nobody (its parent is this process): gone or a zombie.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = state.rsplit(')').next().unwrap_or("").split_whitespace().next().unwrap_or("");
            if state.is_empty() || state == "Z" {
                break;
            }
            assert!(Instant::now() < deadline, "child {pid} outlived its thread (state {state})");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
