/* SPDX-License-Identifier: GPL-2.0-only */
/* Where an outlier call was made: the native user stack (frame pointers,
 * by the kernel) and, in a CPython process, the Python frames of the
 * calling thread. Runs only for outliers, never on the per-call path.
 *
 * The thread's PyThreadState is found by walking the interpreter's thread
 * list for the one whose thread_id (pthread_self) is this thread's thread
 * pointer, with bpf_loop: any number of threads. No cache: a cached state
 * of a thread that exited could be read after it is freed. Frames are
 * copied as (code object, instruction) pairs; userspace reads the code
 * objects (file, name, line table) while the process lives. */
#ifndef INGERO_STACKS_BPF_H
#define INGERO_STACKS_BPF_H

#include "common.bpf.h"

#define PY_MAX_THREADS (1 << 16)
#define PY_FRAME_OWNED_BY_CSTACK 3 /* 3.12+: the C-stack shim frame of an entry */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct py_proc);
} py_procs SEC(".maps");

/* Per CPU: the outlier event being built (too big for the stack), copied
 * to the ring buffer once complete. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stall_event);
} stall_scratch SEC(".maps");

/* The walks need bpf_loop (5.17): the compat object (ingero.bpf.c) has no
 * Python frames. */
#if defined(__TARGET_ARCH_x86) && !defined(INGERO_COMPAT)
struct thread_walk {
	__u64 ts;
	__u64 want;
	__u64 found;
	__u64 next_off;
	__u64 id_off;
};

static long walk_thread(__u64 i, void *ctx)
{
	struct thread_walk *w = ctx;
	__u64 id = 0;
	if (!w->ts || bpf_probe_read_user(&id, sizeof(id), (void *)(w->ts + w->id_off)))
		return 1;
	if (id == w->want) {
		w->found = w->ts;
		return 1;
	}
	if (bpf_probe_read_user(&w->ts, sizeof(w->ts), (void *)(w->ts + w->next_off)))
		return 1;
	return 0;
}

struct frame_walk {
	__u64 frame;
	__u32 n;
	__u32 pad;
	struct py_proc pp;
};

static long walk_frame(__u64 i, void *ctx)
{
	struct frame_walk *w = ctx;
	__u32 zero = 0;
	struct stall_event *e = bpf_map_lookup_elem(&stall_scratch, &zero);
	if (!e || !w->frame || w->n >= PY_MAX_FRAMES)
		return 1;
	__u64 f = w->frame, code = 0, instr = 0;
	__u8 owner = 0;
	bpf_probe_read_user(&code, sizeof(code), (void *)(f + w->pp.fr_code));
	if (w->pp.instr_size == 4) {
		__s32 lasti = 0;
		bpf_probe_read_user(&lasti, sizeof(lasti), (void *)(f + w->pp.fr_instr));
		instr = (__u64)(__s64)lasti;
	} else {
		bpf_probe_read_user(&instr, sizeof(instr), (void *)(f + w->pp.fr_instr));
	}
	if (w->pp.fr_owner != PY_NONE)
		bpf_probe_read_user(&owner, sizeof(owner), (void *)(f + w->pp.fr_owner));
	__u32 n = w->n;
	if (code && owner != PY_FRAME_OWNED_BY_CSTACK && n < PY_MAX_FRAMES) {
		e->py[n].code = code;
		e->py[n].instr = instr;
		w->n = n + 1;
	}
	if (bpf_probe_read_user(&w->frame, sizeof(w->frame), (void *)(f + w->pp.fr_previous)))
		return 1;
	return 0;
}

#endif

/* Fills e->py with the calling thread's Python frames; returns how many. */
static __always_inline __u32 py_stack(__u32 tgid, struct stall_event *e)
{
#if defined(__TARGET_ARCH_x86) && !defined(INGERO_COMPAT)
	struct py_proc *pp = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!pp)
		return 0;
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	__u64 interp = 0;
	struct thread_walk tw = { .want = BPF_CORE_READ(t, thread.fsbase), .next_off = pp->ts_next, .id_off = pp->ts_thread_id };
	if (bpf_probe_read_user(&interp, sizeof(interp), (void *)(pp->runtime + pp->interp_head)) || !interp ||
	    bpf_probe_read_user(&tw.ts, sizeof(tw.ts), (void *)(interp + pp->threads_head)))
		return 0;
	bpf_loop(PY_MAX_THREADS, walk_thread, &tw, 0);
	if (!tw.found)
		return 0;
	struct frame_walk fw = { .pp = *pp };
	if (bpf_probe_read_user(&fw.frame, sizeof(fw.frame), (void *)(tw.found + pp->ts_frame)))
		return 0;
	if (pp->cframe_frame != PY_NONE && fw.frame &&
	    bpf_probe_read_user(&fw.frame, sizeof(fw.frame), (void *)(fw.frame + pp->cframe_frame)))
		return 0;
	bpf_loop(2 * PY_MAX_FRAMES, walk_frame, &fw, 0);
	return fw.n;
#else
	/* The thread pointer is matched on x86-64 only (arm64's TPIDR_EL0 is
	 * not pthread_self()): no Python frames there yet. Nor without
	 * bpf_loop (the compat object). */
	return 0;
#endif
}

#endif
