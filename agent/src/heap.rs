// SPDX-License-Identifier: Apache-2.0
//! The agent's heap, kept to what it holds now. glibc keeps freed pages
//! unless told otherwise, so a burst (the kernel's BTF parsed at load, the
//! links of hundreds of probes closed after a churn) would stay resident.

/// One malloc arena for the whole agent, set before any thread starts. glibc
/// gives each thread an arena of its own (up to 8 per CPU) and reuses a page
/// freed in one only there: under library churn the agent's heap grew 4.5 MB
/// over 60 files with them, 1.3 MB with one (BENCHMARKS.md). Its threads
/// allocate little (a window's rows a second, an attach now and then), so
/// they seldom meet at the arena's lock.
pub fn one_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a glibc tunable; no thread has allocated yet
    // beyond this one.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns freed heap pages to the kernel (a few ms: it walks the free
/// lists), after the bursts named above.
pub fn release_free() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
