/* SPDX-License-Identifier: GPL-2.0-only */
/* Block IO latency (issue → complete) per process, device and op. */
#include "common.bpf.h"

struct io_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2048);
	__type(key, struct io_key);
	__type(value, struct io_val);
};
struct io_map io_a SEC(".maps");
struct io_map io_b SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct io_val);
} zero_io SEC(".maps");

struct io_start {
	__u64 ts_ns;
	__u32 tgid;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct io_start);
} io_inflight SEC(".maps");

static __always_inline int rq_issue(struct request *rq)
{
	struct config *c = cfg();
	if (!c || !in_scope(c))
		return 0;
	__u64 key = (__u64)rq;
	/* Issued from a task outside the agent's pid namespace: tgid 0. */
	struct io_start s = { .ts_ns = bpf_ktime_get_ns(), .tgid = current_ids(c) >> 32 };
	bpf_map_update_elem(&io_inflight, &key, &s, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(on_rq_issue, struct request *rq)
{
	return rq_issue(rq);
}

/* Linux < 5.11 passes the queue first. The agent loads this one first: the
 * verifier refuses it where the tracepoint has a single argument. */
SEC("tp_btf/block_rq_issue")
int BPF_PROG(on_rq_issue_q, void *q, struct request *rq)
{
	return rq_issue(rq);
}

/* The device number of a request's partition, on every kernel. */
static __always_inline __u32 rq_dev(struct request *rq)
{
	void *part = BPF_CORE_READ(rq, part);
	if (!part)
		return 0;
	if (bpf_core_type_exists(struct hd_struct))
		return BPF_CORE_READ((struct hd_struct *)part, __dev.devt);
	return BPF_CORE_READ((struct block_device *)part, bd_dev);
}

AGG_FN(io_a_get, io_a, struct io_key, struct io_val)
AGG_FN(io_b_get, io_b, struct io_key, struct io_val)

SEC("tp_btf/block_rq_complete")
int BPF_PROG(on_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	__u64 key = (__u64)rq;
	struct io_start *s = bpf_map_lookup_elem(&io_inflight, &key);
	if (!s)
		return 0;
	__u64 d = bpf_ktime_get_ns() - s->ts_ns;
	struct io_key k = { .tgid = s->tgid, .op = BPF_CORE_READ(rq, cmd_flags) & 0xff };
	k.dev = rq_dev(rq);
	bpf_map_delete_elem(&io_inflight, &key);
	__u32 zero = 0;
	struct io_val *z = bpf_map_lookup_elem(&zero_io, &zero);
	if (!z)
		return 0;
	struct io_val *v = c->active ? io_b_get(&k, z) : io_a_get(&k, z);
	if (!v)
		return 0;
	ADD(v->count, 1);
	ADD(v->bytes, nr_bytes);
	ADD(v->total_ns, d);
	atomic_max(&v->max_ns, d);
	__u32 b = hist_bucket(d);
	/* Kept: the compiler knows b is in range and would drop the check the
	 * verifier needs (it may reload b's source unbounded from the stack). */
	barrier_var(b);
	if (b < INGERO_HIST_BUCKETS)
		ADD(v->hist[b], 1);
	return 0;
}
