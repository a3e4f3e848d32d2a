/* SPDX-License-Identifier: GPL-2.0-only */
/* Scheduler: per-thread off-CPU and run-queue time of tracked processes,
 * summed per process (tgid) apart for the threads that feed the GPU and the
 * rest, split by whether the thread was inside a
 * traced CUDA/NCCL call (waiting for the device or its peers) or not (a
 * host stall), plus on-CPU time of every cgroup so a report
 * can name the noisy neighbour. Keys are always tgid for processes and tid
 * for threads: a thread id is never taken for a process id. */
#include "common.bpf.h"

#define TASK_RUNNING 0
#define ST_OFF 1  /* switched out while blocked/sleeping */
#define ST_RUNQ 2 /* runnable, waiting for a CPU */
#define ST_HELD 3 /* gave its CPU away while the agent holds it (libload.bpf.c) */

struct sched_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct sched_vals);
};
struct sched_map sched_a SEC(".maps");
struct sched_map sched_b SEC(".maps");

struct cgroup_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct cgroup_val);
};
struct cgroup_map cgcpu_a SEC(".maps");
struct cgroup_map cgcpu_b SEC(".maps");

struct thread_state {
	__u64 since_ns;
	__u32 state;
	__u32 in_call; /* switched out inside a traced call: waiting for the device or peers */
	__u32 feeds;   /* has made a traced call (it had a call slot when switched out) */
	__u32 pad;
	/* Where it went to sleep outside any call: the user ip and syscall
	 * number the kernel saved at the syscall's entry (ip 0: not known). */
	__u64 sleep_ip;
	__s64 sleep_nr;
	__u64 sleep_args[2]; /* its first two arguments (a select or poll with no fds is a sleep) */
	/* An episode long enough to ship its site (site_end != 0), until the
	 * syscall it slept in returns to user space: there, in the thread's own
	 * context, its stacks are still the ones it slept with. */
	__u64 site_start;
	__u64 site_end;
};

/* Per tracked thread (tid): what it is waiting for and since when. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct thread_state);
} threads SEC(".maps");

/* Per CPU: when the running task was switched in. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} cpu_since SEC(".maps");

/* Off-CPU episodes outside calls (--offcpu-site-min), with their sites: a
 * ring of their own, so a node of sleeping threads never crowds the
 * outlier calls out of theirs. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 512 * 1024);
} offcpu SEC(".maps");

/* Episodes waiting for their syscall's exit, node-wide: while there are
 * none, the exit hook (run at every syscall on the node) returns after one
 * array lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __s64);
} offcpu_pending SEC(".maps");

AGG_FN(sched_a_get, sched_a, __u32, struct sched_vals)
AGG_FN(sched_b_get, sched_b, __u32, struct sched_vals)
AGG_FN(cgcpu_a_get, cgcpu_a, __u64, struct cgroup_val)
AGG_FN(cgcpu_b_get, cgcpu_b, __u64, struct cgroup_val)

/* Always zero: a process's first sums (off the stack: two of them are 144 bytes). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sched_vals);
} zero_sched SEC(".maps");

/* The process's sums for a thread that feeds the GPU or for the rest. */
static __always_inline struct sched_val *sched_agg(struct config *c, __u32 tgid, __u32 feeds)
{
	__u32 zero = 0;
	struct sched_vals *z = bpf_map_lookup_elem(&zero_sched, &zero);
	if (!z)
		return 0;
	struct sched_vals *v = c->active ? sched_b_get(&tgid, z) : sched_a_get(&tgid, z);
	if (!v)
		return 0;
	return feeds ? &v->feed : &v->other;
}

static __always_inline int is_tracked(struct config *c, __u32 tgid)
{
	return c->track_all || bpf_map_lookup_elem(&tracked, &tgid) != 0;
}

static __always_inline void pending_add(__s64 n)
{
	__u32 zero = 0;
	__s64 *p = bpf_map_lookup_elem(&offcpu_pending, &zero);
	if (p)
		__sync_fetch_and_add(p, n);
}

/* Off-CPU sites need the user registers of a sleeping task
 * (bpf_task_pt_regs, 5.15) and the thread pointer (x86-64): not in the
 * compat object, nor on arm64 yet. */
#if defined(__TARGET_ARCH_x86) && !defined(INGERO_COMPAT)
#define OFFCPU_SITES 1
/* The fields read of the kernel's struct pt_regs, relocated by CO-RE. */
struct pt_regs___co {
	unsigned long di, si, orig_ax, ip;
} __attribute__((preserve_access_index));
/* A thread going to sleep outside any call: note where (a syscall's user
 * ip and number; an episode that is not a syscall, a page fault, is never
 * matched at a syscall's exit). */
static __always_inline void sleeps_at(struct config *c, struct task_struct *t, struct thread_state *ts)
{
	ts->sleep_ip = 0;
	if (!c->offcpu_site_us || ts->in_call)
		return;
	/* Plain loads from the kernel's own pointer (no helper call per field). */
	struct pt_regs___co *r = (struct pt_regs___co *)bpf_task_pt_regs(t);
	if (!r)
		return;
	ts->sleep_ip = r->ip;
	ts->sleep_nr = r->orig_ax;
	ts->sleep_args[0] = r->di;
	ts->sleep_args[1] = r->si;
}
/* select/pselect6 (nfds first) or poll/ppoll (nfds second) watching no
 * file descriptor: a sleep (CPython before 3.11 sleeps in select). */
static __always_inline int sleep_only(struct thread_state *ts)
{
	switch (ts->sleep_nr) {
	case 23:  /* select */
	case 270: /* pselect6 */
		return ts->sleep_args[0] == 0;
	case 7:   /* poll */
	case 271: /* ppoll */
		return ts->sleep_args[1] == 0;
	}
	return 0;
}
#else
static __always_inline void sleeps_at(struct config *c, struct task_struct *t, struct thread_state *ts)
{
	ts->sleep_ip = 0;
}
#endif

/* An off-CPU episode outside calls ended: long enough, it waits for its
 * syscall's exit to ship with its site. */
static __always_inline void slept(struct config *c, struct thread_state *ts, __u64 now)
{
	if (!ts->sleep_ip || ts->in_call || !c->offcpu_site_us || now < ts->since_ns ||
	    now - ts->since_ns < (__u64)c->offcpu_site_us * 1000)
		return;
	if (!ts->site_end)
		pending_add(1);
	ts->site_start = ts->since_ns;
	ts->site_end = now;
}

/* Forgets an episode whose syscall never returned to user space. */
static __always_inline void site_dropped(struct thread_state *ts)
{
	if (ts && ts->site_end) {
		ts->site_end = 0;
		pending_add(-1);
	}
}

/* A switch the programs did not see (the counter the agent exports). */
static __always_inline void sched_missed(void)
{
	struct counters *cn = ctrs();
	if (cn)
		cn->sched_missed++;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u32 zero = 0;

	/* cgroup CPU accounting for every task: current is still prev here.
	 * The idle task (pid 0) is no cgroup's work. */
	__u64 *since = bpf_map_lookup_elem(&cpu_since, &zero);
	if (since) {
		if (*since && now > *since && prev->pid != 0) {
			__u64 cg = bpf_get_current_cgroup_id();
			struct cgroup_val cz = {};
			struct cgroup_val *cv = c->active ? cgcpu_b_get(&cg, &cz) : cgcpu_a_get(&cg, &cz);
			if (cv) {
				ADD(cv->on_ns, now - *since);
				ADD(cv->switches, 1);
			}
		}
		*since = now;
	}

	__u32 ptgid = 0, ptid = 0;
	if (task_ids_trusted(c, prev, &ptgid, &ptid) && ptid && is_tracked(c, ptgid)) {
		struct thread_state *ts = bpf_map_lookup_elem(&threads, &ptid);
		struct thread_call *tc = bpf_map_lookup_elem(&thread_calls, &ptid);
		/* From its first traced call on, a thread feeds the GPU for life.
		 * The compat object drops a thread's slot after each call: every
		 * thread counts with the rest there (README, Kernels). */
		__u32 feeds = 0;
#ifndef INGERO_COMPAT
		feeds = tc || (ts && ts->feeds);
#endif
		struct sched_val *v = sched_agg(c, ptgid, feeds);
		/* on-CPU time since it was switched in */
		if (v && ts && ts->state == 0 && ts->since_ns && now > ts->since_ns)
			ADD(v->on_ns, now - ts->since_ns);
		int runnable = preempt || task_state(prev) == TASK_RUNNING;
		struct thread_state st = { .since_ns = now, .state = runnable ? ST_RUNQ : ST_OFF, .feeds = feeds };
#ifndef INGERO_COMPAT
		/* A held thread yields at every step of its wait: the agent's doing,
		 * not a CPU the workload lacked (a report would call it contention). */
		__u64 hid = ((__u64)ptgid << 32) | ptid;
		if (runnable && bpf_map_lookup_elem(&held, &hid))
			st.state = ST_HELD;
#endif
		st.in_call = tc && tc->depth > 0;
		/* In place: an LRU update per switch costs more than the rest. */
		if (ts) {
			/* Running, yet last seen going to sleep: the kernel ran neither
			 * program at its wakeup and switch-in (seen on 6.18 under load,
			 * every program on those tracepoints at once, no recursion miss
			 * counted). That episode's end is unknown: counted, not guessed. */
			if (ts->state == ST_OFF)
				sched_missed();
			ts->since_ns = st.since_ns;
			ts->state = st.state;
			ts->in_call = st.in_call;
			ts->feeds = feeds;
			if (!runnable) {
				site_dropped(ts);
				sleeps_at(c, prev, ts);
			}
		} else {
			if (!runnable)
				sleeps_at(c, prev, &st);
			bpf_map_update_elem(&threads, &ptid, &st, BPF_ANY);
		}
		if (v) {
			if (runnable)
				ADD(v->involuntary, 1);
			else
				ADD(v->voluntary, 1);
		}
	}

	__u32 ntgid = 0, ntid = 0;
	if (task_ids_trusted(c, next, &ntgid, &ntid) && ntid && is_tracked(c, ntgid)) {
		struct thread_state *ts = bpf_map_lookup_elem(&threads, &ntid);
		struct sched_val *v = sched_agg(c, ntgid, ts && ts->feeds);
		if (ts && v && ts->since_ns && now > ts->since_ns) {
			__u64 d = now - ts->since_ns;
			if (ts->state == ST_RUNQ) {
				ADD(v->runq_ns, d);
				atomic_max(&v->runq_max_ns, d);
				if (ts->in_call)
					ADD(v->runq_call_ns, d);
			} else if (ts->state == ST_OFF) {
				ADD(v->off_ns, d);
				if (ts->in_call)
					ADD(v->off_call_ns, d);
			}
		}
		/* Switched in while running: its switch-out went unseen. */
		if (ts && ts->state == 0)
			sched_missed();
		if (ts && ts->state == ST_OFF)
			slept(c, ts, now);
		if (ts) {
			ts->since_ns = now;
			ts->state = 0;
		} else {
			struct thread_state st = { .since_ns = now, .state = 0 };
			bpf_map_update_elem(&threads, &ntid, &st, BPF_ANY);
		}
	}
	return 0;
}

/* A blocked thread became runnable: off-CPU ends, run-queue wait begins. */
static __always_inline void woken(struct task_struct *p, int fresh)
{
	struct config *c = cfg();
	if (!c)
		return;
	__u32 tgid = 0, tid = 0;
	if (!task_ids_trusted(c, p, &tgid, &tid) || !tid || !is_tracked(c, tgid))
		return;
	__u64 now = bpf_ktime_get_ns();
	struct thread_state *ts = fresh ? 0 : bpf_map_lookup_elem(&threads, &tid);
	struct sched_val *v = sched_agg(c, tgid, ts && ts->feeds);
	if (v)
		ADD(v->wakeups, 1);
	if (ts && ts->state == ST_OFF) {
		if (v && now > ts->since_ns) {
			ADD(v->off_ns, now - ts->since_ns);
			if (ts->in_call)
				ADD(v->off_call_ns, now - ts->since_ns);
		}
		slept(c, ts, now);
		ts->since_ns = now;
		ts->state = ST_RUNQ;
	} else if (!ts) {
		/* A new thread starts its life runnable: whatever an earlier
		 * thread with this tid left in the map is not its history. */
		struct thread_state st = { .since_ns = now, .state = ST_RUNQ };
		bpf_map_update_elem(&threads, &tid, &st, BPF_ANY);
	}
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	woken(p, 0);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *p)
{
	woken(p, 1);
	return 0;
}

#ifdef OFFCPU_SITES
/* A syscall returns to user space. Where its thread slept long outside any
 * call in it, the thread's user stack and Python frames are still those it
 * slept with: the episode ships with them (the outlier's event layout, op
 * OP_OFFCPU, reason = the syscall). Every syscall on the node runs this;
 * with no episode pending it is one array lookup. */
SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	__u32 zero = 0;
	__s64 *pending = bpf_map_lookup_elem(&offcpu_pending, &zero);
	if (!pending || *pending <= 0)
		return 0;
	struct config *c = cfg();
	if (!c)
		return 0;
	__u64 id = current_ids(c);
	__u32 tid = (__u32)id;
	struct thread_state *ts = id ? bpf_map_lookup_elem(&threads, &tid) : 0;
	if (!ts || !ts->site_end)
		return 0;
	struct pt_regs___co *r = (struct pt_regs___co *)regs;
	__u64 ip = r->ip;
	__s64 nr = r->orig_ax;
	__u64 start = ts->site_start, end = ts->site_end;
	/* The first exit after the episode is its syscall's, or it was no
	 * syscall (a fault): either way the episode is settled here. */
	site_dropped(ts);
	if (ip != ts->sleep_ip || nr != ts->sleep_nr || end < start)
		return 0;
	struct stall_record *rec = bpf_map_lookup_elem(&stall_scratch, &zero);
	if (!rec)
		return 0;
	struct stall_event *e = &rec->e;
	e->ts_ns = start;
	e->duration_ns = end - start;
	e->threshold_ns = (__u64)c->offcpu_site_us * 1000;
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->tgid = id >> 32;
	e->tid = tid;
	e->op = OP_OFFCPU;
	e->reason = ((__u32)nr & OFFCPU_NR_MASK) | (sleep_only(ts) ? OFFCPU_NO_FDS : 0) | (ts->feeds ? OFFCPU_FEEDS : 0);
	e->ustack_bytes = bpf_get_stack(ctx, e->ustack, sizeof(e->ustack), BPF_F_USER_STACK);
	e->py_frames = py_stack(e->tgid, rec);
	/* Wakes the stacks worker, as an outlier call does. */
	if (bpf_ringbuf_output(&offcpu, rec, record_len(rec), 0)) {
		struct counters *cn = ctrs();
		if (cn)
			cn->ringbuf_drops++;
	}
	return 0;
}
#endif
