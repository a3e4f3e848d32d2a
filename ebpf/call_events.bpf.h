/* SPDX-License-Identifier: GPL-2.0-only */
/* What a returning call sends to userspace as it happens, beside the
 * aggregates: an outlier with where it was made, and the return of a
 * step's rare calls (syncs, copies, collectives) that steps are found from. */
#ifndef INGERO_CALL_EVENTS_BPF_H
#define INGERO_CALL_EVENTS_BPF_H

#include "common.bpf.h"
#include "stacks.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1024 * 1024);
} stalls SEC(".maps");

/* Return-probed calls as they return (struct call_mark, 32 bytes): drained
 * every 10 ms, so 8,192 entries outlast ~800k such calls a second. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} marks SEC(".maps");

/* Reports an outlier call with where it was made (stacks.bpf.h). */
static __always_inline void outlier(struct pt_regs *ctx, __u64 pid_tgid, __u32 op, __u64 began, __u64 d, __u64 thr)
{
	__u32 zero = 0;
	struct stall_record *r = bpf_map_lookup_elem(&stall_scratch, &zero);
	if (!r)
		return;
	struct stall_event *e = &r->e;
	e->ts_ns = began;
	e->duration_ns = d;
	e->threshold_ns = thr;
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->tgid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->op = op;
	e->reason = 0;
	/* At the return the call's own frame is gone: the innermost native
	 * frame is its call site. */
	e->ustack_bytes = bpf_get_stack(ctx, e->ustack, sizeof(e->ustack), BPF_F_USER_STACK);
	e->py_frames = py_stack(e->tgid, r);
	/* Wakes the stacks worker (outliers are rare): it reads the frames'
	 * code objects while the process lives. */
	if (bpf_ringbuf_output(&stalls, r, record_len(r), 0)) {
		struct counters *cn = ctrs();
		if (cn)
			cn->ringbuf_drops++;
	}
}

/* Syncs, copies and collectives are the rare calls of a step (launches
 * make no mark), so one ring write each costs little. */
static __always_inline void mark(__u64 pid_tgid, __u32 op, __u64 end, __u64 d, __u32 flags)
{
	struct call_mark m = {
		.ts_ns = end, .dur_ns = d, .tgid = pid_tgid >> 32, .tid = (__u32)pid_tgid, .op = op, .flags = flags
	};
	if (bpf_ringbuf_output(&marks, &m, sizeof(m), BPF_RB_NO_WAKEUP)) {
		struct counters *cn = ctrs();
		if (cn)
			cn->mark_drops++;
	}
}

#endif
