/* SPDX-License-Identifier: GPL-2.0-only */
/* Process lifecycle (exec, exit, fork) and OOM victims: rare events, sent
 * individually so userspace rescans new processes at once and forgets
 * processes that are gone. Userspace polls the ring every few ms, so no
 * event asks for a wakeup. */
#include "common.bpf.h"

/* The cgroup (v2) a task is in: its id is the cgroup directory's inode. */
static __always_inline __u64 task_cgroup_id(struct task_struct *t)
{
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

static __always_inline void emit_ids(__u32 kind, __u32 tgid, __u64 cgroup_id, struct task_struct *t, __u32 other,
				     __s32 value)
{
	struct proc_event *e = bpf_ringbuf_reserve(&procs, sizeof(*e), 0);
	if (!e) {
		struct counters *cn = ctrs();
		if (cn)
			cn->ringbuf_drops++;
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->cgroup_id = cgroup_id;
	e->kind = kind;
	e->tgid = tgid;
	e->other = other;
	e->value = value;
	e->extra = 0;
	if (t)
		BPF_CORE_READ_STR_INTO(&e->comm, t, comm);
	else
		__builtin_memset(e->comm, 0, sizeof(e->comm));
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

static __always_inline void emit(struct config *c, __u32 kind, struct task_struct *t, __u32 other, __s32 value)
{
	__u32 tgid = 0, tid = 0;
	if (!task_ids(c, t, &tgid, &tid))
		return; /* not visible from the agent's pid namespace */
	emit_ids(kind, tgid, task_cgroup_id(t), t, other, value);
}

/* Thread slots removed at exit or exec with launches counted in them
 * or nested calls (calls.bpf.c): userspace ships what it has not yet seen of
 * them and deletes them. Keyed with the slot's birth, so a tid reused at
 * once cannot be mistaken for the thread that had it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct retired_key);
	__type(value, struct thread_call);
} retired SEC(".maps");

/* Removes a thread's slot, keeping its launch counts for userspace. */
static __always_inline void retire(__u32 tid)
{
	struct thread_call *tc = bpf_map_lookup_elem(&thread_calls, &tid);
	if (tc && (tc->counts[0].op || tc->nested)) {
		struct retired_key k = { .tid = tid, .born = tc->born };
		if (bpf_map_update_elem(&retired, &k, tc, BPF_NOEXIST))
			count_map_full();
	}
	bpf_map_delete_elem(&thread_calls, &tid);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	__u32 tgid = 0, tid = 0;
	if (task_ids(c, p, &tgid, &tid)) {
		/* The old image's runtime mapping is not the new one's: a driver
		 * call returning there must not pass for the runtime's own. */
		retire(tid);
#ifndef INGERO_COMPAT
		/* A new image is scanned anew before its first lookups go on. */
		bpf_map_delete_elem(&known_procs, &tgid);
		bpf_map_delete_elem(&hold_spent, &tgid);
#endif
	}
	if (in_scope(c))
		emit(c, PROC_EXEC, p, 0, 0);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	__u32 tgid = 0, tid = 0;
	if (!task_ids(c, p, &tgid, &tid))
		return 0;
	/* Every thread: its tid may be reused, and must not inherit this
	 * thread's scheduler state. */
	struct thread_state *ts = bpf_map_lookup_elem(&threads, &tid);
	/* Exiting, so running: last seen asleep, its wakeup went unseen. */
	if (ts && ts->state == ST_OFF)
		sched_missed();
	site_dropped(ts);
	bpf_map_delete_elem(&threads, &tid);
	retire(tid);
	if (BPF_CORE_READ(p, pid) != BPF_CORE_READ(p, tgid))
		return 0;
	/* The whole process leaving: every traced one, and every one in scope
	 * (userspace caches what it learnt of them on exec). exit_code keeps
	 * the signal in its low 7 bits: (status << 8) | signal. */
#ifndef INGERO_COMPAT
	bpf_map_delete_elem(&known_procs, &tgid);
	bpf_map_delete_elem(&hold_spent, &tgid);
#endif
	int was_tracked = bpf_map_delete_elem(&tracked, &tgid) == 0;
	if (was_tracked || in_scope(c))
		emit(c, PROC_EXIT, p, was_tracked, BPF_CORE_READ(p, exit_code));
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	__u32 ptgid = 0, ptid = 0, ctgid = 0, ctid = 0;
	if (!task_ids(c, parent, &ptgid, &ptid) || !task_ids(c, child, &ctgid, &ctid))
		return 0;
	/* A new thread shares its parent's tgid: not a fork. Children of traced
	 * processes (DataLoader workers) are worth a rescan. */
	if (ctgid != ptgid && bpf_map_lookup_elem(&tracked, &ptgid))
		emit(c, PROC_FORK, parent, ctgid, 0);
	return 0;
}

/* mark_victim's first argument is the victim task since Linux 6.8 and its
 * (initial-namespace) pid before: told apart by value, a kernel pointer is
 * never below PID_MAX_LIMIT (4M), so one program serves both prototypes. */
SEC("tp_btf/mark_victim")
int BPF_PROG(on_oom_victim, __u64 arg0)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	if (arg0 > (4u << 20)) {
		emit(c, PROC_OOM, (struct task_struct *)arg0, 0, 0);
	} else if (!c->pidns_ino) {
		/* Old prototype: the killer runs in the victim's memcg context. */
		emit_ids(PROC_OOM, (__u32)arg0, bpf_get_current_cgroup_id(), 0, 0, 0);
	}
	return 0;
}
