/* SPDX-License-Identifier: GPL-2.0-only */
/* One object, one set of shared maps (config, counters, tracked, scope).
 *
 * Built twice (agent/build.rs): as is, for Linux >= 5.17 (attach cookies,
 * bpf_loop, compare-and-exchange), and with INGERO_COMPAT for 5.10 to 5.16:
 * one call program per op instead of cookies, no Python frames, no library
 * hold, a racy max. The agent probes the kernel's features and loads the
 * object it can (agent/src/probes/features.rs states each loss). */
#include "calls.bpf.c"
#include "libnotify.bpf.c" /* loaded where the hold below is not */
#ifndef INGERO_COMPAT
#include "libload.bpf.c" /* before sched: a held thread's wait is not run-queue wait */
#endif
#include "sched.bpf.c"
#include "io.bpf.c"
#include "proc.bpf.c"
