/* SPDX-License-Identifier: GPL-2.0-only */
/* Where the kernel cannot hold a thread (libload.bpf.c needs sleepable
 * uprobes, bpf_loop and bpf_find_vma: Linux 5.19+), a CUDA/NCCL library's
 * first lookup in a process still wakes the agent at once, instead of at
 * its next rescan (--rescan, 2 s by default). The calls a program makes
 * before the agent has attached are still lost; those of the seconds after
 * no longer are. Entry only, nothing waits, nothing changes what the loader
 * sees (libload.bpf.c: no return probe on the loader's functions). */
#include "common.bpf.h"
#include "libname.bpf.h"

/* Notices per process at most: a process that forges handles (any file in
 * a pod is hostile input) costs the agent this many scans of its maps. */
#define NOTICES_PER_PROCESS 16

/* A library mapping as one process sees it: its dynamic section's address
 * (link_map l_ld) names that mapping within the process. */
struct lookup_key {
	__u32 tgid;
	__u32 pad;
	__u64 l_ld;
};

/* Lookups already seen (a notice each, the first time), so a program that
 * looks up hundreds of symbols of one library wakes the agent once. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct lookup_key);
	__type(value, __u8);
} lookups_seen SEC(".maps");

/* Notices sent per process (tgid → count). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} lookup_notices SEC(".maps");

/* Each step below in a frame of its own, all under 64 bytes: a program
 * with a bigger one runs on a per-CPU private stack on 6.13+, where a
 * preempted uprobe's frame can be overwritten (libload.bpf.c). */

/* Whether this is the process's first lookup in the library behind `handle`. */
static __noinline int first_lookup(__u32 tgid, __u64 handle)
{
	struct lookup_key k = { .tgid = tgid, .pad = 0, .l_ld = 0 };
	void *l_ld = (void *)handle + __builtin_offsetof(struct link_map_head, l_ld);
	if (bpf_probe_read_user(&k.l_ld, sizeof(k.l_ld), l_ld) || !k.l_ld)
		return 0;
	__u8 one = 1;
	return bpf_map_update_elem(&lookups_seen, &k, &one, BPF_NOEXIST) == 0;
}

static __noinline int traced_lookup(__u64 handle)
{
	struct link_map_head lm;
	return traced_link_map(handle, &lm);
}

/* Counts a notice against the process's allowance; false once it is spent. */
static __noinline int notice_allowed(__u32 tgid)
{
	__u32 zero = 0;
	bpf_map_update_elem(&lookup_notices, &tgid, &zero, BPF_NOEXIST);
	__u32 *sent = bpf_map_lookup_elem(&lookup_notices, &tgid);
	if (!sent || *sent >= NOTICES_PER_PROCESS)
		return 0;
	__sync_fetch_and_add(sent, 1);
	return 1;
}

SEC("uprobe")
int dlsym_notify(struct pt_regs *ctx)
{
	struct config *c = cfg();
	/* While the hold is on, dlsym_entry (on the same functions) wakes the
	 * agent; this takes over once the agent turns the hold off at run time
	 * (probe_loop.rs, hold_outlasted). */
	if (!c || c->hold_dlopen || !in_scope(c))
		return 0;
	__u64 handle = PT_REGS_PARM1(ctx);
	/* RTLD_DEFAULT (0) and RTLD_NEXT (-1) name no library. */
	if (handle == 0 || handle == (__u64)-1)
		return 0;
	__u64 ids = lookup_ids(c);
	__u32 tgid = ids >> 32;
	/* The cheap test first: most lookups are of libraries seen before. */
	if (!ids || !first_lookup(tgid, handle) || !traced_lookup(handle) || !notice_allowed(tgid))
		return 0;
	struct proc_event *e = bpf_ringbuf_reserve(&procs, sizeof(*e), 0);
	if (!e) {
		struct counters *cn = ctrs();
		if (cn)
			cn->ringbuf_drops++;
		return 0;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->kind = PROC_LIB_LOOKUP;
	e->tgid = tgid;
	e->other = (__u32)ids;
	e->value = 0;
	e->extra = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	/* Wake the agent now: the program is about to call the library. */
	bpf_ringbuf_submit(e, 0);
	return 0;
}
