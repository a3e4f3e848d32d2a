/* SPDX-License-Identifier: GPL-2.0-only */
/* CUDA runtime, driver and NCCL calls: one entry and one return program,
 * attached to every traced symbol with the op id as the attach cookie.
 * Calls are aggregated in shared maps with atomic adds (count, errors, sum,
 * max, histogram) that userspace drains once per window; outliers and
 * step marks go to ring buffers (call_events.bpf.h). Shared, not per-CPU: a per-CPU
 * map of these 1 KiB values costs ~1 MiB per possible CPU (224 on a GPU
 * node), charged to the agent's memory cgroup. */
#include "common.bpf.h"
#include "stacks.bpf.h"
#include "call_events.bpf.h"

#define MAX_TRACKED_CALLS 1024

struct call_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TRACKED_CALLS);
	__type(key, struct call_key);
	__type(value, struct call_val);
};
/* Double buffer: programs fill the active one, userspace drains the other. */
struct call_map calls_a SEC(".maps");
struct call_map calls_b SEC(".maps");

/* Always zero: the initial value of a new aggregate (too big for the stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct call_val);
} zero_call SEC(".maps");

/* The duty cycle's gate (agent/src/probes/duty.rs): 1 while the
 * duty-cycled probes count. Their links are placed before it opens and
 * closed after it shuts, so the time a call was counted is exactly the
 * time it was open, however long placing and closing take. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} duty_gate SEC(".maps");

static __always_inline int duty_shut(__u64 cookie)
{
	if (!(cookie & COOKIE_DUTY))
		return 0;
	__u32 k = 0;
	__u32 *open = bpf_map_lookup_elem(&duty_gate, &k);
	return !open || !*open;
}

/* The gate as a returning call sees it (struct call_mark's flags). */
static __always_inline __u32 duty_open(void)
{
	__u32 k = 0;
	__u32 *open = bpf_map_lookup_elem(&duty_gate, &k);
	return open && *open ? MARK_DUTY_ON : 0;
}

/* Always zero: a new thread slot's first value (off the stack: a frame of
 * 64 bytes or more gets a per-CPU private stack on recent kernels). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct thread_call);
} zero_slot SEC(".maps");

/* Makes this thread's slot (rare: its first traced call), or NULL when the
 * map refuses it (the call is then counted in the shared aggregate). */
static __always_inline struct thread_call *slot_make(__u32 tid, __u32 tgid)
{
	__u32 zero = 0;
	struct thread_call *z = bpf_map_lookup_elem(&zero_slot, &zero);
	if (!z || bpf_map_update_elem(&thread_calls, &tid, z, BPF_ANY))
		return 0;
	struct thread_call *tc = bpf_map_lookup_elem(&thread_calls, &tid);
	if (tc) {
		tc->tgid = tgid;
		tc->born = bpf_ktime_get_ns();
	}
	return tc;
}

struct inflight_key {
	__u64 pid_tgid;
	__u32 op;
	__u32 pad;
};

/* Start time of calls in progress; LRU so threads that die mid-call do not leak. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct inflight_key);
	__type(value, __u64);
} inflight SEC(".maps");

/* Outlier threshold per op (ns); 0 = no outlier reporting. Set by userspace:
 * the floor (--outlier-min), or the absolute threshold; what holds for a
 * process with no baseline of its own for the op yet. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_OPS);
	__type(key, __u32);
	__type(value, __u64);
} thresholds SEC(".maps");

/* Outlier threshold per process and op (ns): N x the process's own median
 * of the op, at least the floor. One process's calls never move another's
 * threshold. Userspace removes a process's entries when it exits. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct call_key);
	__type(value, __u64);
} proc_thresholds SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} procs SEC(".maps");

AGG_FN(calls_a_get, calls_a, struct call_key, struct call_val)
AGG_FN(calls_b_get, calls_b, struct call_key, struct call_val)

static __always_inline struct call_val *call_agg(struct config *c, struct call_key *k)
{
	__u32 zero = 0;
	struct call_val *z = bpf_map_lookup_elem(&zero_call, &zero);
	if (!z)
		return 0;
	return c->active ? calls_b_get(k, z) : calls_a_get(k, z);
}

static __always_inline void track(__u32 tgid)
{
	__u8 one = 1;
	if (!bpf_map_lookup_elem(&tracked, &tgid))
		bpf_map_update_elem(&tracked, &tgid, &one, BPF_NOEXIST);
}

/* ncclCommInitRank(comm, nranks, ncclUniqueId commId, rank): the 128-byte
 * id is passed by value, which each ABI places differently. */
static __always_inline void comm_init(struct pt_regs *ctx, __u32 tgid, struct counters *cn)
{
	struct proc_event *e = bpf_ringbuf_reserve(&procs, sizeof(*e), 0);
	if (!e) {
		if (cn)
			cn->ringbuf_drops++;
		return;
	}
	__u64 id = 0;
#if defined(__TARGET_ARCH_arm64)
	/* AAPCS64: a composite over 16 bytes goes by reference in x2; rank in x3. */
	bpf_probe_read_user(&id, sizeof(id), (void *)PT_REGS_PARM3(ctx));
	e->other = (__u32)PT_REGS_PARM4(ctx);
#else
	/* SysV x86-64: a 128-byte struct goes in memory, above the return
	 * address; rank takes the third integer register. */
	bpf_probe_read_user(&id, sizeof(id), (void *)(PT_REGS_SP(ctx) + 8));
	e->other = (__u32)PT_REGS_PARM3(ctx);
#endif
	e->ts_ns = bpf_ktime_get_ns();
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->kind = PROC_COMM_INIT;
	e->tgid = tgid;
	e->value = (__s32)PT_REGS_PARM2(ctx);
	e->extra = id;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* True while an entry-only call recorded in tc has not returned: its
 * return address is still in the slot its entry found it in. Once it
 * returns, the caller's next call overwrites that slot (same frame, same
 * stack pointer), unless it is the same call site calling the same
 * function again, which records itself anew. */
static __always_inline int entry_only_live(struct thread_call *tc, __u64 sp)
{
	__u64 ret = 0;
	if (!tc->ret || sp >= tc->sp)
		return 0;
	if (bpf_probe_read_user(&ret, sizeof(ret), (void *)tc->sp))
		return 0;
	return ret == tc->ret;
}

/* Enters a call in the thread's slot, made at its first call (the slot
 * keeps the runtime it has learnt and its launch counts): an entry-only
 * call's frame and the return address found there (depth 0), or the
 * outermost return-probed call (ret 0, depth 1). In place: no map update
 * per call once the thread has its slot. */
static __always_inline void slot_enter(struct thread_call *tc, __u32 tid, __u32 tgid, __u32 op, __u64 now, __u64 sp,
				       __u64 ret, __u32 depth)
{
	if (!tc)
		tc = slot_make(tid, tgid);
	if (!tc)
		return;
	tc->since_ns = now;
	tc->tgid = tgid;
	tc->op = op;
	tc->sp = sp;
	tc->ret = ret;
	tc->depth = depth;
}

/* An entry-only call's frame and return address (the bracket). */
static __always_inline void record_frame(struct thread_call *tc, __u32 tid, __u32 tgid, __u32 op, __u64 now, __u64 sp)
{
	__u64 ret = 0;
	bpf_probe_read_user(&ret, sizeof(ret), (void *)sp);
	slot_enter(tc, tid, tgid, op, now, sp, ret, 0);
}

/* What enter() found a call to be. */
#define ENTER_OWN 0	/* the program's own call: count it */
#define ENTER_NESTED 1	/* made by a traced call, counted there */
#define ENTER_COUNTED 2 /* a runtime launch, counted in the thread's slot */

/* A call made by a traced call: not counted, but it trapped, and traps
 * again at its return when return-probed (userspace adds those traps to the
 * agent's cost). Only this thread writes its slot. */
static __always_inline int nested_in(struct thread_call *tc, __u64 cookie)
{
	tc->nested += cookie & COOKIE_TIMED ? 2 : 1;
	return ENTER_NESTED;
}

#ifdef INGERO_COMPAT
/* Linux < 5.17 (no bpf_find_vma): a runtime launch (COOKIE_BRACKET)
 * records its frame and return address, and a driver call below that
 * frame while the address is still there is the launch's own. One user
 * read per launch (~95 ns here). */
static __always_inline int enter(struct pt_regs *ctx, __u32 tid, __u32 tgid, __u32 op, __u64 cookie, __u64 now,
				 __u64 sp, __u32 half)
{
	struct thread_call *tc = bpf_map_lookup_elem(&thread_calls, &tid);
	int nested = tc && (tc->depth > 0 ? sp < tc->sp : entry_only_live(tc, sp));
	if (cookie & COOKIE_BRACKET) {
		if (nested && tc)
			return nested_in(tc, cookie);
		record_frame(tc, tid, tgid, op, now, sp);
		return ENTER_OWN;
	}
	if (!(cookie & COOKIE_TIMED))
		return nested && tc ? nested_in(tc, cookie) : ENTER_OWN;
	if (nested) {
		/* Inside an entry-only call nothing will undo a deeper depth. */
		if (tc->depth > 0)
			ADD(tc->depth, 1);
		return nested_in(tc, cookie);
	}
	slot_enter(tc, tid, tgid, op, now, sp, 0, 1);
	return ENTER_OWN;
}
#else
struct text_range {
	__u64 lo;
	__u64 hi;
};

static long text_of_vma(struct task_struct *task, struct vm_area_struct *vma, void *ctx)
{
	struct text_range *r = ctx;
	r->lo = vma->vm_start;
	r->hi = vma->vm_end;
	return 0;
}

/* The code mapping of the dynamic runtime a launch runs in (its first
 * launch on a thread, or its first through another copy of the runtime,
 * learns it; then one compare per launch). False while the process's mmap
 * lock is taken: learnt at the next launch. Not inlined: its frame stays
 * small (a private stack is no place for a walk of the process's maps). */
static __noinline int runtime_text(__u64 ip, struct text_range *r)
{
	return !bpf_find_vma(bpf_get_current_task_btf(), ip, text_of_vma, r, 0) && r->hi;
}

static __always_inline void learn_runtime(struct thread_call *tc, __u64 ip)
{
	struct text_range r = {};
	if (!runtime_text(ip, &r))
		return;
	tc->text_lo = r.lo;
	tc->text_hi = r.hi;
	/* A frame recorded while unlearnt must not make a later driver call
	 * the program makes from that same frame pass for a nested one. */
	tc->ret = 0;
}

/* Counts a launch in the thread's own slot: only this thread writes it, so
 * no atomic and no shared cache line (userspace reads the running totals).
 * False when the slot's few op counters are all taken by other ops. */
static __always_inline int slot_count(struct thread_call *tc, __u32 op, __u32 half)
{
	half &= 1;
	for (int i = 0; i < THREAD_COUNTS; i++) {
		if (tc->counts[i].op == op + 1) {
			tc->counts[i].n[half]++;
			return 1;
		}
		if (tc->counts[i].op == 0) {
			tc->counts[i].n[half] = 1;
			tc->counts[i].op = op + 1;
			return 1;
		}
	}
	return 0;
}

/* The address this call returns to: on x86-64 the word at the stack
 * pointer, on arm64 the link register. */
static __always_inline __u64 return_address(struct pt_regs *ctx)
{
#if defined(__TARGET_ARCH_x86)
	__u64 ret = 0;
	bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP(ctx));
	return ret;
#else
	return PT_REGS_RET(ctx);
#endif
}

/* Enters a call on this thread; returns 1 when the call is made by a traced
 * call (counted there, not again):
 * - inside a return-probed call: its frame is below that call's entry
 *   frame (the stack grows down; a state left behind by a return never
 *   seen is replaced, never trusted forever);
 * - a driver call that an entry-only runtime call makes (COOKIE_RT_CALLEE
 *   ops: the driver's launches under cudaLaunchKernel): it returns into
 *   the runtime's code, which the thread's slot has learnt (or, for a
 *   runtime linked into another file, while the launch's return address
 *   is still where its entry found it).
 * An entry-only runtime launch (COOKIE_BRACKET) reads its slot and counts
 * itself there: one trap, one lookup, no user memory read, no shared
 * aggregate per launch (the bracket's return-address read was ~95 ns of a
 * launch's ~335 here; the aggregate's lookup and atomic add ~50). */
static __always_inline int enter(struct pt_regs *ctx, __u32 tid, __u32 tgid, __u32 op, __u64 cookie, __u64 now,
				 __u64 sp, __u32 half)
{
	struct thread_call *tc = bpf_map_lookup_elem(&thread_calls, &tid);
	if (tc && tc->depth > 0 && sp < tc->sp) {
		if (cookie & COOKIE_TIMED)
			ADD(tc->depth, 1);
		return nested_in(tc, cookie);
	}
	if (cookie & COOKIE_BRACKET) {
		/* A runtime inside another file (the executable, NCCL) shares
		 * its code mapping with the program's own code: its launches
		 * keep the frame-and-return-address record instead. */
		if (cookie & COOKIE_STATIC_RT) {
			record_frame(tc, tid, tgid, op, now, sp);
			return ENTER_OWN;
		}
		if (!tc) {
			/* The thread's first launch: from now on a CUDA user. */
			tc = slot_make(tid, tgid);
			if (!tc)
				return ENTER_OWN;
			track(tgid);
		}
		__u64 ip = PT_REGS_IP(ctx);
		if (ip < tc->text_lo || ip >= tc->text_hi)
			learn_runtime(tc, ip);
		/* Not learnt (the process's mmap lock was taken: seen for a whole
		 * first burst of launches): this launch keeps the frame record,
		 * so its driver call is still known for the runtime's own. */
		if (!tc->text_hi)
			record_frame(tc, tid, tgid, op, now, sp);
		return slot_count(tc, op, half) ? ENTER_COUNTED : ENTER_OWN;
	}
	if ((cookie & COOKIE_RT_CALLEE) && tc) {
		if (tc->text_hi) {
			__u64 ret = return_address(ctx);
			if (ret >= tc->text_lo && ret < tc->text_hi)
				return nested_in(tc, cookie);
		}
		if (entry_only_live(tc, sp))
			return nested_in(tc, cookie);
	}
	if (!(cookie & COOKIE_TIMED))
		return ENTER_OWN;
	slot_enter(tc, tid, tgid, op, now, sp, 0, 1);
	return ENTER_OWN;
}
#endif

static __always_inline int on_entry(struct pt_regs *ctx, __u64 cookie)
{
	struct config *c = cfg();
	if (!c || !in_scope(c))
		return 0;
	__u64 pid_tgid = current_ids(c);
	__u32 tgid = pid_tgid >> 32;
	__u32 op = cookie & COOKIE_OP_MASK;
	if (!tgid)
		return 0;
	if (c->pid_filter && !bpf_map_lookup_elem(&targets, &tgid))
		return 0;
	if (duty_shut(cookie))
		return 0;
	/* A clock read only where a start time is kept (entry-only launches
	 * keep none: this runs at every launch). */
	__u64 now = cookie & COOKIE_TIMED ? bpf_ktime_get_ns() : 0;
	/* A launch counted in its thread's slot is one of the events userspace
	 * adds from the slots: nothing more to do here. */
	if (enter(ctx, (__u32)pid_tgid, tgid, op, cookie, now, PT_REGS_SP(ctx), c->active) != ENTER_OWN)
		return 0;
	struct counters *cn = ctrs();
	if (cn)
		cn->events++;
	if (cookie & COOKIE_COMM_INIT)
		comm_init(ctx, tgid, cn);
	if (cookie & COOKIE_TIMED) {
		track(tgid);
		struct inflight_key k = { .pid_tgid = pid_tgid, .op = op };
		if (bpf_map_update_elem(&inflight, &k, &now, BPF_ANY) && cn)
			cn->inflight_full++;
		return 0;
	}
	/* Entry-only op (launches): count it now. The process is marked a
	 * CUDA user at its first count of a window (its aggregate is new), not
	 * at every launch: one map lookup less per launch. */
	struct call_key key = { .tgid = tgid, .op = op };
	struct call_val *v = call_agg(c, &key);
	if (v) {
		if (!v->count)
			track(tgid);
		ADD(v->count, 1);
	}
	return 0;
}

/* Leaves a return-probed call on this thread (the outermost one clears
 * the state; an entry-only call's record is not this call's to clear). */
static __always_inline void leave(__u32 tid)
{
	struct thread_call *tc = bpf_map_lookup_elem(&thread_calls, &tid);
	if (!tc || tc->depth == 0)
		return;
	if (tc->depth > 1) {
		ADD(tc->depth, -1);
		return;
	}
#ifdef INGERO_COMPAT
	bpf_map_delete_elem(&thread_calls, &tid);
#else
	/* Kept for the runtime it has learnt; removed at thread exit. */
	tc->depth = 0;
#endif
}

static __always_inline int on_return(struct pt_regs *ctx, __u64 cookie)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	__u64 pid_tgid = current_ids(c);
	__u32 op = cookie & COOKIE_OP_MASK;
	if (!pid_tgid)
		return 0;
	leave((__u32)pid_tgid);
	if (!(cookie & COOKIE_TIMED))
		return 0;
	struct inflight_key k = { .pid_tgid = pid_tgid, .op = op };
	__u64 *start = bpf_map_lookup_elem(&inflight, &k);
	if (!start)
		return 0; /* entry not seen (out of scope, or attached mid-call) */
	__u64 began = *start;
	__u64 end = bpf_ktime_get_ns();
	__u64 d = end - began;
	bpf_map_delete_elem(&inflight, &k);
	if (c->call_marks)
		mark(pid_tgid, op, end, d, duty_open() | (c->active ? MARK_HALF_B : 0));

	struct call_key key = { .tgid = pid_tgid >> 32, .op = op };
	struct call_val *v = call_agg(c, &key);
	if (v) {
		ADD(v->count, 1);
		if ((int)PT_REGS_RC(ctx) != 0)
			ADD(v->errors, 1);
		ADD(v->total_ns, d);
		atomic_max(&v->max_ns, d);
		__u32 b = hist_bucket(d);
		/* Kept: the compiler knows b is in range and would drop the check the
		 * verifier needs (it may reload b's source unbounded from the stack). */
		barrier_var(b);
		if (b < INGERO_HIST_BUCKETS)
			ADD(v->hist[b], 1);
	}
	__u64 *thr = bpf_map_lookup_elem(&proc_thresholds, &key);
	if (!thr) {
		__u32 opi = op;
		thr = bpf_map_lookup_elem(&thresholds, &opi);
	}
	if (thr && *thr && d > *thr)
		outlier(ctx, pid_tgid, op, began, d, *thr);
	return 0;
}

#ifndef INGERO_COMPAT
#if defined(__TARGET_ARCH_x86)
/* Never filled: a tail call into it always falls through. It is here for
 * what the verifier does with it: Linux 6.13+ runs a program whose frame is
 * 64 bytes or more on a per-CPU private stack, except a program with a tail
 * call. A uprobe program runs with preemption on; on a preemptible kernel
 * (PREEMPT_LAZY, PREEMPT) a second run on the same CPU would share the
 * preempted run's frame, pointers included. On x86-64 only: other JITs mix
 * tail calls and subprograms (call_return walks stacks in subprograms) from
 * later kernels than our 5.17 floor, and arm64 is not tested here. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} own_stack SEC(".maps");
#define OWN_STACK(ctx) bpf_tail_call(ctx, &own_stack, 0)
#else
#define OWN_STACK(ctx)
#endif

/* One entry and one return program for every op: the cookie names it. */
SEC("uprobe")
int call_entry(struct pt_regs *ctx)
{
	OWN_STACK(ctx);
	return on_entry(ctx, bpf_get_attach_cookie(ctx));
}

SEC("uretprobe")
int call_return(struct pt_regs *ctx)
{
	OWN_STACK(ctx);
	return on_return(ctx, bpf_get_attach_cookie(ctx));
}
#else
/* Linux < 5.15 has no attach cookies: one program pair per op id, each
 * reading its op's cookie (flags included) from this array, which the
 * agent fills at load. A program is loaded only when its op is attached. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, COMPAT_OPS);
	__type(key, __u32);
	__type(value, __u64);
} op_cookies SEC(".maps");

static __always_inline __u64 op_cookie(__u32 op)
{
	__u64 *c = bpf_map_lookup_elem(&op_cookies, &op);
	return c ? *c : op;
}

#define OP_PROGS(n)                                                   \
	SEC("uprobe") int call_entry_##n(struct pt_regs *ctx)          \
	{                                                             \
		return on_entry(ctx, op_cookie(n));                   \
	}                                                             \
	SEC("uretprobe") int call_return_##n(struct pt_regs *ctx)      \
	{                                                             \
		return on_return(ctx, op_cookie(n));                  \
	}
#define OP_PROGS10(t)                                                  \
	OP_PROGS(t##0) OP_PROGS(t##1) OP_PROGS(t##2) OP_PROGS(t##3)      \
	OP_PROGS(t##4) OP_PROGS(t##5) OP_PROGS(t##6) OP_PROGS(t##7)      \
	OP_PROGS(t##8) OP_PROGS(t##9)
OP_PROGS(0) OP_PROGS(1) OP_PROGS(2) OP_PROGS(3) OP_PROGS(4)
OP_PROGS(5) OP_PROGS(6) OP_PROGS(7) OP_PROGS(8) OP_PROGS(9)
OP_PROGS10(1) OP_PROGS10(2) OP_PROGS10(3) OP_PROGS10(4) OP_PROGS10(5)
OP_PROGS10(6) OP_PROGS10(7) OP_PROGS10(8) OP_PROGS10(9)
#endif

/* The cheapest possible uprobe: the baseline the overhead benchmark compares
 * call_entry against (node/benches/overhead.rs). */
SEC("uprobe")
int bare_uprobe(struct pt_regs *ctx)
{
	return 0;
}
