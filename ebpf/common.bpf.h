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

/* Adds to a per-CPU aggregate, creating it when absent; a full map is counted. */
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

#endif
