/* SPDX-License-Identifier: GPL-2.0-only */
/* One tiny program per kernel feature the agent's programs may use: the
 * agent loads each (never attaches) to learn what this kernel has, instead
 * of guessing from its version (distributions backport BPF features).
 * agent/src/probes/features.rs names each feature and what is lost without. */
#include "common.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} feature_slot SEC(".maps");

/* Attach cookies (5.15): one call program serves every op. */
SEC("uprobe")
int has_attach_cookie(struct pt_regs *ctx)
{
	return bpf_get_attach_cookie(ctx) != 0;
}

static long loop_step(__u64 i, void *ctx)
{
	return 1;
}

/* bpf_loop (5.17): Python frames walked in the kernel. */
SEC("uprobe")
int has_loop(struct pt_regs *ctx)
{
	return bpf_loop(1, loop_step, 0, 0);
}

/* Compare-and-exchange (5.12): exact maxima under concurrent writers. */
SEC("uprobe")
int has_cmpxchg(struct pt_regs *ctx)
{
	__u32 zero = 0;
	__u64 *v = bpf_map_lookup_elem(&feature_slot, &zero);
	if (v)
		__sync_val_compare_and_swap(v, 0, 1);
	return 0;
}

/* Sleepable uprobes (5.19): the library hold may read user memory that
 * faults. */
SEC("uprobe.s")
int has_sleepable_uprobe(struct pt_regs *ctx)
{
	return 0;
}

static long vma_seen(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	return 0;
}

/* bpf_find_vma (5.17): the file behind a library's address. */
SEC("uprobe")
int has_find_vma(struct pt_regs *ctx)
{
	return bpf_find_vma(bpf_get_current_task_btf(), 0, vma_seen, 0, 0);
}

/* uprobe_multi links (6.6): the agent loads it for that attach type and
 * asks for a link on "/" (probes/multi.rs); nothing is ever attached. */
SEC("uprobe")
int has_uprobe_multi(struct pt_regs *ctx)
{
	return 0;
}
