/* SPDX-License-Identifier: GPL-2.0-only */
/* One object, one set of shared maps (config, counters, tracked, scope). */
#include "calls.bpf.c"
#include "sched.bpf.c"
#include "io.bpf.c"
#include "libload.bpf.c"
#include "proc.bpf.c"
