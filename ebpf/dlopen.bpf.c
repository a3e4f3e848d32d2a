/* SPDX-License-Identifier: GPL-2.0-only */
/* A CUDA/NCCL library dlopen'd and called at once (vLLM's pynccl: dlopen,
 * then ncclCommInitRank within milliseconds) would run its first calls
 * before userspace has found and probed it. The loader's `dlopen` in libc is
 * probed: when it returns a CUDA or NCCL library, the calling thread is held
 * in the kernel (bpf_loop) until the agent has attached and releases it, or
 * for at most HOLD_MAX_NS. The deadline bounds the hold whatever happens to
 * the agent; nothing is signalled, so no parent sees a stopped child. */
#include "common.bpf.h"

#define HOLD_MAX_NS (1000ull * 1000 * 1000)
#define NAME_MAX_SCAN 160

/* A dlopen of a traced library in progress: one per call frame, so a
 * library whose constructor dlopens another (a runtime loading the driver)
 * holds the thread at both returns. */
struct dlopen_frame {
	__u64 ids;
	__u64 sp; /* stack pointer at entry */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct dlopen_frame);
	__type(value, __u8);
} dlopen_pending SEC(".maps");

/* The stack pointer the call had at entry, seen from its return probe:
 * x86-64's `ret` pops the return address; arm64 returns through the link
 * register and leaves SP as it was. */
static __always_inline __u64 entry_sp(struct pt_regs *ctx)
{
#if defined(__TARGET_ARCH_arm64)
	return PT_REGS_SP(ctx);
#else
	return PT_REGS_SP(ctx) - 8;
#endif
}

/* Processes held until the agent releases them: tgid → deadline (ns). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} held SEC(".maps");

/* Per CPU: the path dlopen was given (too big for the stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, char[NAME_MAX_SCAN + 16]);
} dlopen_name SEC(".maps");

/* True when the path names libnccl*, libcudart* or libcuda.*. */
static __always_inline int traced_name(const char *s)
{
	for (int i = 0; i < NAME_MAX_SCAN; i++) {
		if (s[i] == 0)
			return 0;
		if (s[i] != 'l' || s[i + 1] != 'i' || s[i + 2] != 'b')
			continue;
		const char *t = s + i + 3;
		if (t[0] == 'n' && t[1] == 'c' && t[2] == 'c' && t[3] == 'l')
			return 1;
		if (t[0] == 'c' && t[1] == 'u' && t[2] == 'd' && t[3] == 'a' && (t[4] == 'r' || t[4] == '.'))
			return 1;
	}
	return 0;
}

SEC("uprobe")
int dlopen_entry(struct pt_regs *ctx)
{
	struct config *c = cfg();
	if (!c || !c->hold_dlopen || !in_scope(c))
		return 0;
	__u32 zero = 0;
	char *buf = bpf_map_lookup_elem(&dlopen_name, &zero);
	const char *path = (const char *)PT_REGS_PARM1(ctx);
	if (!buf || !path)
		return 0;
	__builtin_memset(buf, 0, NAME_MAX_SCAN + 16);
	if (bpf_probe_read_user_str(buf, NAME_MAX_SCAN, path) <= 0 || !traced_name(buf))
		return 0;
	struct dlopen_frame f = { .ids = current_ids(c), .sp = PT_REGS_SP(ctx) };
	__u8 one = 1;
	if (f.ids)
		bpf_map_update_elem(&dlopen_pending, &f, &one, BPF_ANY);
	return 0;
}

static long still_held(__u64 i, void *ctx)
{
	__u64 *deadline = bpf_map_lookup_elem(&held, ctx);
	return !deadline || bpf_ktime_get_ns() > *deadline;
}

/* Sleepable: a non-sleepable program runs under rcu_read_lock, and placing
 * the new library's uprobes waits for an RCU grace period (dup_mmap_sem),
 * so the agent could not attach while the thread is held. */
SEC("uretprobe.s")
int dlopen_return(struct pt_regs *ctx)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	__u64 ids = current_ids(c);
	struct dlopen_frame f = { .ids = ids, .sp = entry_sp(ctx) };
	if (!ids || !bpf_map_lookup_elem(&dlopen_pending, &f))
		return 0;
	bpf_map_delete_elem(&dlopen_pending, &f);
	if (!PT_REGS_RC(ctx))
		return 0; /* dlopen failed: nothing was loaded */
	__u32 tgid = ids >> 32;
	__u64 deadline = bpf_ktime_get_ns() + HOLD_MAX_NS;
	if (bpf_map_update_elem(&held, &tgid, &deadline, BPF_ANY))
		return 0;
	struct proc_event *e = bpf_ringbuf_reserve(&procs, sizeof(*e), 0);
	if (!e) {
		bpf_map_delete_elem(&held, &tgid);
		struct counters *cn = ctrs();
		if (cn)
			cn->ringbuf_drops++;
		return 0;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->kind = PROC_DLOPEN;
	e->tgid = tgid;
	e->other = (__u32)ids;
	e->value = 0;
	e->extra = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	/* Wake the agent now: the thread waits for it. */
	bpf_ringbuf_submit(e, 0);
	bpf_loop(1 << 23, still_held, &tgid, 0);
	bpf_map_delete_elem(&held, &tgid);
	return 0;
}
