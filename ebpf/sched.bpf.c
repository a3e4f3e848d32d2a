/* SPDX-License-Identifier: GPL-2.0-only */
/* Scheduler: per-thread off-CPU and run-queue time of tracked processes,
 * summed per process (tgid), split by whether the thread was inside a
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
	__type(value, struct sched_val);
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

AGG_FN(sched_a_get, sched_a, __u32, struct sched_val)
AGG_FN(sched_b_get, sched_b, __u32, struct sched_val)
AGG_FN(cgcpu_a_get, cgcpu_a, __u64, struct cgroup_val)
AGG_FN(cgcpu_b_get, cgcpu_b, __u64, struct cgroup_val)

static __always_inline struct sched_val *sched_agg(struct config *c, __u32 tgid)
{
	struct sched_val zero = {};
	return c->active ? sched_b_get(&tgid, &zero) : sched_a_get(&tgid, &zero);
}

static __always_inline int is_tracked(struct config *c, __u32 tgid)
{
	return c->track_all || bpf_map_lookup_elem(&tracked, &tgid) != 0;
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
		struct sched_val *v = sched_agg(c, ptgid);
		struct thread_state *ts = bpf_map_lookup_elem(&threads, &ptid);
		/* on-CPU time since it was switched in */
		if (v && ts && ts->state == 0 && ts->since_ns && now > ts->since_ns)
			ADD(v->on_ns, now - ts->since_ns);
		int runnable = preempt || task_state(prev) == TASK_RUNNING;
		struct thread_state st = { .since_ns = now, .state = runnable ? ST_RUNQ : ST_OFF };
#ifndef INGERO_COMPAT
		/* A held thread yields at every step of its wait: the agent's doing,
		 * not a CPU the workload lacked (a report would call it contention). */
		__u64 hid = ((__u64)ptgid << 32) | ptid;
		if (runnable && bpf_map_lookup_elem(&held, &hid))
			st.state = ST_HELD;
#endif
		struct thread_call *tc = bpf_map_lookup_elem(&thread_calls, &ptid);
		st.in_call = tc && tc->depth > 0;
		/* In place: an LRU update per switch costs more than the rest. */
		if (ts) {
			ts->since_ns = st.since_ns;
			ts->state = st.state;
			ts->in_call = st.in_call;
		} else {
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
		struct sched_val *v = sched_agg(c, ntgid);
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
	struct sched_val *v = sched_agg(c, tgid);
	if (v)
		ADD(v->wakeups, 1);
	if (ts && ts->state == ST_OFF) {
		if (v && now > ts->since_ns) {
			ADD(v->off_ns, now - ts->since_ns);
			if (ts->in_call)
				ADD(v->off_call_ns, now - ts->since_ns);
		}
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
