/* SPDX-License-Identifier: GPL-2.0-only */
/* A CUDA/NCCL library loaded at run time and called at once (vLLM's pynccl:
 * dlopen, dlsym, ncclCommInitRank within milliseconds) would run its first
 * calls before userspace has found and probed it.
 *
 * Nothing here changes what the loader sees. glibc's dlopen, dlsym and
 * dlvsym read their own return address to choose the caller's RUNPATH and
 * namespace; a return probe rewrites that address, and every library that
 * finds a plugin through its own RUNPATH ($ORIGIN/...: PyTorch's
 * libtorch_cuda_linalg, XLA's CUDA libraries) then fails to load. So only
 * entries are probed, and only dlsym's and dlvsym's: a program looks a
 * loaded library's functions up before it calls them, and the handle it
 * passes is that library's link_map, whose public head (l_addr, l_name,
 * l_ld: the <link.h> ABI) names the file and an address inside its mapping.
 *
 * The looking-up thread (that thread only) is held while the file is a
 * CUDA/NCCL library not yet probed, or its process has not been scanned
 * since it mapped one (once per process): until the agent has attached
 * and releases it, or the process has been held config.hold_max_ms (1 s by
 * default) in all (hold_spent). A file the agent probed is remembered here by
 * its inode, so later lookups (any process mapping that file) go on at once.
 * Nothing is signalled, so no parent sees a stopped child. The wait polls
 * (bpf_loop) and yields the CPU at every step (still_held): BPF offers no
 * way to sleep a task, and stopping it with a signal would stop its whole
 * process and show in its parent's wait(). */
#include "common.bpf.h"
#include "libname.bpf.h"

#define HOLD_MAX_MS_DEFAULT 1000
/* bpf_loop runs at most 2^23 steps a call (BPF_MAX_LOOPS), each step
 * about a microsecond; the deadline ends the wait, this only bounds it. */
#define HOLD_LOOPS 64

/* The file behind a mapping, as the kernel places uprobes on it (the real
 * inode, below any overlay). */
struct file_id {
	__u64 ino;
	__u32 dev;
	__u32 pad;
};

/* Library files the agent has probed. A plain hash (a sleepable program may
 * not use an LRU one): when it is full, a file not in it costs one more
 * round trip to the agent, never a lost call. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct file_id);
	__type(value, __u8);
} probed_files SEC(".maps");

/* Processes the agent has scanned since they mapped a CUDA/NCCL library
 * (their interpreter found, so their first outlier calls carry Python
 * frames): tgid → 1, written by the agent, removed at exit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u8);
} known_procs SEC(".maps");

/* Threads held until the agent releases them: (tgid << 32 | tid) →
 * deadline (ns); the agent writes 0 when the thread's libraries are probed. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} held SEC(".maps");

/* Time each process has spent held since its exec (ns). A process is held
 * at most config.hold_max_ms in all, however many libraries it looks up and
 * however slow the agent is to probe them (a process that looks up symbols
 * one by one while the agent still probes would otherwise wait the whole
 * bound at each lookup); threads held at the same time each wait at most
 * what was left when they began. Removed at exec and exit (proc.bpf.c). A
 * plain hash (sleepable programs): when it is full, nobody is held. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} hold_spent SEC(".maps");

/* Set by the agent while it closes the probes of unused files (detacher.rs):
 * each close waits for every sleepable program in flight (an RCU tasks
 * trace grace period) while holding the kernel's trace event lock, which the
 * agent's next attach needs. A held thread would then wait for an attach
 * that waits for it: so no thread is held, and none stays held, meanwhile. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} holds_paused SEC(".maps");

static __always_inline int paused(void)
{
	__u32 zero = 0;
	__u32 *p = bpf_map_lookup_elem(&holds_paused, &zero);
	return p && *p;
}

static long file_of_vma(struct task_struct *task, struct vm_area_struct *vma, void *ctx)
{
	struct file_id *id = ctx;
	id->ino = BPF_CORE_READ(vma, vm_file, f_inode, i_ino);
	id->dev = BPF_CORE_READ(vma, vm_file, f_inode, i_sb, s_dev);
	return 0;
}

/* Everything a held thread keeps while it waits, in the one frame that
 * is live across the wait. Linux 6.13+ runs a program whose frame is 64
 * bytes or more on a per-CPU private stack; the wait yields its CPU, and a
 * second lookup on that CPU would then run on the same stack and overwrite
 * the held thread's frame (seen: an oops in dlsym_entry, the workload
 * killed). So every function here keeps its frame under 64 bytes
 * (probes/object_check.rs checks the built object) and the wait's
 * variables live in this struct, not in registers spilled anywhere. */
struct hold_wait {
	__u64 ids;
	__u64 sp;
	struct file_id id;
};

/* One step of the wait. The wait is not a bare spin: each step reads a
 * byte of the thread's own stack through bpf_copy_from_user_task, whose
 * page walk (get_user_pages) calls cond_resched. The held thread thus gives
 * its CPU to anything runnable at once (on a kernel without preemption a
 * bare spin kept the agent, which is to release it, off a 2-CPU node's
 * CPUs for the whole hold), and on kernels without preemptible RCU it
 * reports the quiescent state that registering the new library's uprobes
 * waits for (dup_mmap_sem's grace period; Debian's 6.1 waited out every
 * hold). The agent still turns holds off if probing a held process takes
 * the whole hold (probe_loop.rs, hold_outlasted). */
static long still_held(__u64 i, void *ctx)
{
	struct hold_wait *w = ctx;
	char byte;
	bpf_copy_from_user_task(&byte, 1, (void *)w->sp, bpf_get_current_task_btf(), 0);
	__u64 *deadline = bpf_map_lookup_elem(&held, &w->ids);
	return !deadline || !*deadline || bpf_ktime_get_ns() > *deadline || paused();
}

/* Wakes the agent and waits for it, at most `left` ns, charging the time to
 * the process's budget; returns whether it probed the file. A function of
 * its own (not inlined) so that its frame stays small. */
static __noinline int hold(struct hold_wait *w, __u64 left, __u64 *spent)
{
	__u64 t0 = bpf_ktime_get_ns();
	__u64 deadline = t0 + left;
	if (bpf_map_update_elem(&held, &w->ids, &deadline, BPF_ANY))
		return 0;
	struct proc_event *e = bpf_ringbuf_reserve(&procs, sizeof(*e), 0);
	if (!e) {
		bpf_map_delete_elem(&held, &w->ids);
		struct counters *cn = ctrs();
		if (cn)
			cn->ringbuf_drops++;
		return 0;
	}
	e->ts_ns = t0;
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->kind = PROC_DLOPEN;
	e->tgid = w->ids >> 32;
	e->other = (__u32)w->ids;
	e->value = 0;
	e->extra = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	/* Wake the agent now: the thread waits for it. */
	bpf_ringbuf_submit(e, 0);
	for (int i = 0; i < HOLD_LOOPS; i++) {
		bpf_loop(1 << 23, still_held, w, 0);
		__u64 *d = bpf_map_lookup_elem(&held, &w->ids);
		if (!d || !*d || bpf_ktime_get_ns() > *d || paused())
			break;
	}
	__u64 *end = bpf_map_lookup_elem(&held, &w->ids);
	int probed = end && *end == 0;
	__u64 took = bpf_ktime_get_ns() - t0;
	__sync_fetch_and_add(spent, took);
	struct counters *cn = ctrs();
	if (cn) {
		cn->lib_holds++;
		cn->lib_hold_ns += took;
		if (end && *end)
			cn->lib_hold_timeouts++;
	}
	bpf_map_delete_elem(&held, &w->ids);
	return probed;
}

/* Whether the library behind a dlsym handle is a CUDA/NCCL one, and the
 * file it is mapped from. Nothing here waits; its own small frame. */
static __noinline int traced_handle(__u64 handle, struct file_id *id)
{
	struct link_map_head lm;
	if (!traced_link_map(handle, &lm))
		return 0;
	bpf_find_vma(bpf_get_current_task_btf(), lm.l_ld, file_of_vma, id, 0);
	return 1;
}

/* Sleepable: a non-sleepable program runs under rcu_read_lock, and placing
 * the new library's uprobes waits for an RCU grace period (dup_mmap_sem),
 * so the agent could not attach while the thread is held. */
SEC("uprobe.s")
int dlsym_entry(struct pt_regs *ctx)
{
	/* A sleepable program may not read the cgroup array in_scope() uses:
	 * the scope is compared by cgroup id at its depth instead. */
	struct config *c = cfg();
	if (!c || !c->hold_dlopen || paused())
		return 0;
	if (c->scoped && bpf_get_current_ancestor_cgroup_id(c->scope_level) != c->scope_cgroup_id)
		return 0;
	__u64 handle = PT_REGS_PARM1(ctx);
	/* RTLD_DEFAULT (0) and RTLD_NEXT (-1) name no library. */
	if (handle == 0 || handle == (__u64)-1)
		return 0;
	struct hold_wait w = {};
	if (!traced_handle(handle, &w.id))
		return 0;
	w.ids = lookup_ids(c);
	if (!w.ids)
		return 0;
	__u32 tgid = w.ids >> 32;
	/* Held only for a file never probed, or once per process that the
	 * agent has not scanned yet (a process's first calls are the ones
	 * whose call sites a Python script's start needs). */
	if (w.id.ino && bpf_map_lookup_elem(&probed_files, &w.id) && bpf_map_lookup_elem(&known_procs, &tgid))
		return 0;
	/* What is left of the process's budget; no budget, no hold (w.sp is
	 * still 0: the new process's first value). */
	__u64 budget = (__u64)(c->hold_max_ms ? c->hold_max_ms : HOLD_MAX_MS_DEFAULT) * 1000000;
	bpf_map_update_elem(&hold_spent, &tgid, &w.sp, BPF_NOEXIST);
	__u64 *spent = bpf_map_lookup_elem(&hold_spent, &tgid);
	if (!spent || *spent >= budget)
		return 0;
	w.sp = PT_REGS_SP(ctx);
	if (hold(&w, budget - *spent, spent) && w.id.ino) {
		__u8 one = 1;
		bpf_map_update_elem(&probed_files, &w.id, &one, BPF_ANY);
	}
	return 0;
}
