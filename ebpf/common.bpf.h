/* SPDX-License-Identifier: GPL-2.0-only */
/* Shared helpers and maps of the Ingero eBPF programs. */
#ifndef INGERO_COMMON_BPF_H
#define INGERO_COMMON_BPF_H

#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "events.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct counters);
} counters SEC(".maps");

/* --cgroup-root: the subtree to trace (index 0). */
struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} scope_cgroup SEC(".maps");

/* Processes whose scheduling is tracked: CUDA users (added on their first
 * call) and --pid targets (added by userspace). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u8);
} tracked SEC(".maps");

/* --pid: the processes whose calls are traced (pid_filter = 1). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} targets SEC(".maps");

/* Per thread: the traced call it is inside (calls.bpf.c writes, sched.bpf.c
 * reads to split off-CPU time in and out of calls). LRU: a thread that dies
 * mid-call does not leak its entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct thread_call);
} thread_calls SEC(".maps");

static __always_inline struct config *cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

static __always_inline struct counters *ctrs(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&counters, &zero);
}

static __always_inline void count_map_full(void)
{
	struct counters *c = ctrs();
	if (c)
		c->map_full++;
}

/* True when the current task is in the traced cgroup subtree. */
static __always_inline int in_scope(struct config *c)
{
	if (!c || !c->scoped)
		return 1;
	return bpf_current_task_under_cgroup(&scope_cgroup, 0) == 1;
}

#define MAX_PIDNS_DEPTH 8

/* Number and namespace inode of one level of a struct pid. */
static __always_inline int upid_at(struct pid *p, __u32 level, __u32 *nr, __u64 *ino)
{
	void *up = (void *)p + bpf_core_field_offset(struct pid, numbers) + level * bpf_core_type_size(struct upid);
	struct pid_namespace *ns = 0;
	if (bpf_probe_read_kernel(nr, sizeof(*nr), up + bpf_core_field_offset(struct upid, nr)) ||
	    bpf_probe_read_kernel(&ns, sizeof(ns), up + bpf_core_field_offset(struct upid, ns)) || !ns)
		return 0;
	*ino = BPF_CORE_READ(ns, ns.inum);
	return 1;
}

/* A pid as the agent's pid namespace numbers it (what pid_nr_ns() does);
 * 0 when the task is not visible there (a host task seen from a kind node).
 * The namespace's depth is found once, by the first task that has it. */
static __always_inline __u32 pid_in_ns(struct pid *p, struct config *c)
{
	if (!p)
		return 0;
	__u32 top = BPF_CORE_READ(p, level);
	__u32 nr = 0;
	__u64 ino = 0;
	__u32 known = c->pidns_level;
	if (known) {
		if (known - 1 > top || known > MAX_PIDNS_DEPTH)
			return 0;
		if (!upid_at(p, known - 1, &nr, &ino) || ino != c->pidns_ino)
			return 0;
		return nr;
	}
	for (__u32 i = 0; i < MAX_PIDNS_DEPTH; i++) {
		if (i > top)
			break;
		if (upid_at(p, i, &nr, &ino) && ino == c->pidns_ino) {
			c->pidns_level = i + 1;
			return nr;
		}
	}
	return 0;
}

/* Process (tgid) and thread (tid) ids of a task in the agent's namespace;
 * false when it is not visible there. The initial namespace (every
 * hostPID DaemonSet) takes the plain fields. */
static __always_inline int task_ids(struct config *c, struct task_struct *t, __u32 *tgid, __u32 *tid)
{
	if (!c->pidns_ino) {
		*tgid = BPF_CORE_READ(t, tgid);
		*tid = BPF_CORE_READ(t, pid);
		return 1;
	}
	*tid = pid_in_ns(BPF_CORE_READ(t, thread_pid), c);
	*tgid = pid_in_ns(BPF_CORE_READ(t, group_leader, thread_pid), c);
	return *tid && *tgid;
}

/* task_ids for a task the kernel hands a tp_btf program (a trusted
 * pointer): plain loads, where each BPF_CORE_READ is a helper call (the
 * scheduler's programs run at every context switch). */
static __always_inline int task_ids_trusted(struct config *c, struct task_struct *t, __u32 *tgid, __u32 *tid)
{
	if (c->pidns_ino)
		return task_ids(c, t, tgid, tid);
	*tgid = t->tgid;
	*tid = t->pid;
	return 1;
}

/* The current task's ids as (tgid << 32 | tid), 0 when not visible. */
static __always_inline __u64 current_ids(struct config *c)
{
	if (!c->pidns_ino)
		return bpf_get_current_pid_tgid();
	__u32 tgid = 0, tid = 0;
	if (!task_ids(c, (struct task_struct *)bpf_get_current_task(), &tgid, &tid))
		return 0;
	return ((__u64)tgid << 32) | tid;
}

static __always_inline __u32 msb64(__u64 v)
{
	__u32 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

/* proto/src/hist.rs bucket(): 4 log-linear buckets per power of two. */
static __always_inline __u32 hist_bucket(__u64 v)
{
	if (v < 4)
		return (__u32)v;
	__u32 m = msb64(v);
	__u32 sub = (v >> (m - 2)) & 3;
	__u32 b = 4 * (m - 1) + sub;
	return b < INGERO_HIST_BUCKETS ? b : INGERO_HIST_BUCKETS - 1;
}

#define ADD(field, v) __sync_fetch_and_add(&(field), (v))

/* The task's scheduler state on every kernel (`__state` since 5.14). */
static __always_inline long task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return BPF_CORE_READ((struct task_struct___pre514 *)t, state);
}

/* Raises *slot to v: shared maps are written from every CPU at once. */
static __always_inline void atomic_max(__u64 *slot, __u64 v)
{
#ifdef INGERO_COMPAT
	/* Linux < 5.12 has no compare-and-exchange: a writer racing on
	 * another CPU may keep the smaller of two maxima (the loss the
	 * agent's `check` states for this object). */
	if (v > *(volatile __u64 *)slot)
		*slot = v;
	return;
#endif
	for (int i = 0; i < 4; i++) {
		__u64 old = *(volatile __u64 *)slot;
		if (v <= old || __sync_val_compare_and_swap(slot, old, v) == old)
			return;
	}
}

/* Finds an aggregate in a shared map, creating it when absent; a full map is
 * counted (and shipped in node rows). Values are updated with atomic adds,
 * so memory does not grow with the number of CPUs. */
#define AGG_GET(map, key, zero_val)                                              \
	({                                                                         \
		void *__v = bpf_map_lookup_elem(map, key);                          \
		if (!__v) {                                                         \
			if (bpf_map_update_elem(map, key, zero_val, BPF_NOEXIST) && \
			    bpf_map_lookup_elem(map, key) == 0)                     \
				count_map_full();                                   \
			__v = bpf_map_lookup_elem(map, key);                        \
		}                                                                   \
		__v;                                                                \
	})

/* Defines NAME(key, zero): MAP's aggregate for key, created when absent.
 * One function per map of an A/B pair: a lookup instruction reached with
 * either half (chosen at run time) makes the verifier call the map through
 * a pointer, a retpoline on most hosts (~40 ns a launch here), where a
 * lookup that only ever sees one map is inlined. Not inlined itself, so
 * the compiler cannot merge the two halves' lookups back into one. */
#define AGG_FN(name, map, K, V)                                \
	static __noinline V *name(K *key, V *zero)             \
	{                                                      \
		return AGG_GET(&map, key, zero);               \
	}

#endif
