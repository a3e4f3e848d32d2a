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
 * objects (file, name, line table) while the process lives, and the
 * innermost one's is copied here too (py_snap: a process can exit, and a
 * module's code object be freed, microseconds after its slow call). */
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
	__type(value, struct stall_record);
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
	__u64 fault; /* a read failed: the list was not walked to its end */
};

static long walk_thread(__u64 i, void *ctx)
{
	struct thread_walk *w = ctx;
	__u64 id = 0;
	if (!w->ts)
		return 1;
	if (bpf_probe_read_user(&id, sizeof(id), (void *)(w->ts + w->id_off))) {
		w->fault = 1;
		return 1;
	}
	if (id == w->want) {
		w->found = w->ts;
		return 1;
	}
	if (bpf_probe_read_user(&w->ts, sizeof(w->ts), (void *)(w->ts + w->next_off))) {
		w->fault = 1;
		return 1;
	}
	return 0;
}

struct frame_walk {
	__u64 frame;
	__u32 n;
	__u32 fault; /* a read failed: the stack is cut short */
	struct py_proc pp;
};

static long walk_frame(__u64 i, void *ctx)
{
	struct frame_walk *w = ctx;
	__u32 zero = 0;
	struct stall_record *r = bpf_map_lookup_elem(&stall_scratch, &zero);
	if (!r || !w->frame || w->n >= PY_MAX_FRAMES)
		return 1;
	struct stall_event *e = &r->e;
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
	if (bpf_probe_read_user(&w->frame, sizeof(w->frame), (void *)(f + w->pp.fr_previous))) {
		w->fault = 1;
		return 1;
	}
	return 0;
}

/* Reads `len` bytes at `src` into snapshot region `i` (at `dst`). */
static __always_inline void snap_read(struct py_snap *s, int i, void *dst, __u32 len, __u64 src)
{
	if (src && !bpf_probe_read_user(dst, len, (void *)src)) {
		s->addr[i] = src;
		s->len[i] = len;
	}
}

/* A str: its header and as much of its text as fits (a cut one is read
 * live, or not at all: userspace needs all of it). */
static __always_inline void snap_str(struct py_snap *s, int i, __u8 *dst, __u64 obj, const struct py_proc *pp)
{
	__u64 len = 0;
	__u32 state = 0;
	if (!obj || bpf_probe_read_user(&len, sizeof(len), (void *)(obj + 16)) ||
	    bpf_probe_read_user(&state, sizeof(state), (void *)(obj + 32)))
		return;
	__u64 n = ((state >> 6) & 1 ? pp->str_ascii : pp->str_compact) + len * ((state >> 2) & 7);
	if (n > PY_SNAP_STR)
		n = PY_SNAP_STR;
	/* The clamped value, not an earlier copy, reaches the read (the 6.1
	 * verifier does not carry the bound to a copy spilled before it). */
	barrier_var(n);
	snap_read(s, i, dst, n, obj);
}

/* A pointer field of the copied code object head (offsets are 8-aligned). */
static __always_inline __u64 head_ptr(const struct py_snap *s, __u16 off)
{
	return *(const __u64 *)(s->head + (off & (PY_SNAP_CODE - 8)));
}

/* Copies what resolving `code` reads (the regions of struct py_snap). */
static __always_inline void py_snap(struct py_snap *s, __u64 code, const struct py_proc *pp)
{
	if (pp->co_filename == PY_NONE || pp->co_name == PY_NONE || pp->co_linetable == PY_NONE)
		return;
	/* A small code object near the end of its mapping: the shorter head
	 * still holds every field read (userspace sets no offset past it). */
	snap_read(s, PY_SNAP_HEAD, s->head, PY_SNAP_CODE, code);
	if (!s->addr[PY_SNAP_HEAD])
		snap_read(s, PY_SNAP_HEAD, s->head, PY_SNAP_CODE_MIN, code);
	if (!s->addr[PY_SNAP_HEAD])
		return;
	__u64 ty = *(const __u64 *)(s->head + 8), tp_name = 0;
	snap_read(s, PY_SNAP_TYPE, s->type_ptr, sizeof(s->type_ptr), ty ? ty + 24 : 0);
	if (s->addr[PY_SNAP_TYPE])
		tp_name = *(const __u64 *)s->type_ptr;
	snap_read(s, PY_SNAP_TYPENAME, s->type_name, sizeof(s->type_name), tp_name);
	snap_str(s, PY_SNAP_FILE, s->file, head_ptr(s, pp->co_filename), pp);
	snap_str(s, PY_SNAP_NAME, s->name, head_ptr(s, pp->co_name), pp);
	__u64 table = head_ptr(s, pp->co_linetable), size = 0;
	if (!table || bpf_probe_read_user(&size, sizeof(size), (void *)(table + 16)))
		return;
	__u64 n = 32 + size;
	if (n > PY_SNAP_TABLE)
		n = PY_SNAP_TABLE;
	barrier_var(n);
	snap_read(s, PY_SNAP_LINES, s->lines, n, table);
}

#endif

/* Bytes of `r` to send: the event, and the snapshot when there is one. */
static __always_inline __u32 record_len(const struct stall_record *r)
{
	if (!r->snap.addr[PY_SNAP_HEAD])
		return sizeof(r->e);
	__u32 n = r->snap.len[PY_SNAP_LINES];
	if (n > PY_SNAP_TABLE)
		n = PY_SNAP_TABLE;
	barrier_var(n);
	return __builtin_offsetof(struct stall_record, snap.lines) + n;
}

#if defined(__TARGET_ARCH_x86) && !defined(INGERO_COMPAT)
/* A walk a failed read cut short (the counter the agent exports): a
 * non-sleepable probe cannot fault a page in, so a frame or thread state
 * that is not resident ends the walk. A thread the interpreter does not
 * know (a native worker thread) is no fault. */
static __always_inline __u32 py_fault(__u32 n)
{
	struct counters *cn = ctrs();
	if (cn)
		cn->py_faults++;
	return n;
}
#endif

/* Fills r->e.py with the calling thread's Python frames and r->snap with
 * the innermost one's code object; returns how many frames. */
static __always_inline __u32 py_stack(__u32 tgid, struct stall_record *r)
{
	for (int i = 0; i < PY_SNAP_REGIONS; i++) {
		r->snap.addr[i] = 0;
		r->snap.len[i] = 0;
	}
#if defined(__TARGET_ARCH_x86) && !defined(INGERO_COMPAT)
	struct py_proc *pp = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!pp)
		return 0;
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	__u64 interp = 0;
	struct thread_walk tw = { .want = BPF_CORE_READ(t, thread.fsbase), .next_off = pp->ts_next, .id_off = pp->ts_thread_id };
	if (bpf_probe_read_user(&interp, sizeof(interp), (void *)(pp->runtime + pp->interp_head)) ||
	    (interp && bpf_probe_read_user(&tw.ts, sizeof(tw.ts), (void *)(interp + pp->threads_head))))
		return py_fault(0);
	/* No interpreter yet (before Py_Initialize) or any more (finalized). */
	if (!interp)
		return 0;
	bpf_loop(PY_MAX_THREADS, walk_thread, &tw, 0);
	if (!tw.found)
		return tw.fault ? py_fault(0) : 0;
	struct frame_walk fw = { .pp = *pp };
	if (bpf_probe_read_user(&fw.frame, sizeof(fw.frame), (void *)(tw.found + pp->ts_frame)))
		return py_fault(0);
	if (pp->cframe_frame != PY_NONE && fw.frame &&
	    bpf_probe_read_user(&fw.frame, sizeof(fw.frame), (void *)(fw.frame + pp->cframe_frame)))
		return py_fault(0);
	bpf_loop(2 * PY_MAX_FRAMES, walk_frame, &fw, 0);
	if (fw.fault)
		py_fault(0);
	if (fw.n)
		py_snap(&r->snap, r->e.py[0].code, pp);
	return fw.n;
#else
	/* The thread pointer is matched on x86-64 only (arm64's TPIDR_EL0 is
	 * not pthread_self()): no Python frames there yet. Nor without
	 * bpf_loop (the compat object). */
	return 0;
#endif
}

#endif
