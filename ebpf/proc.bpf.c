/* Process lifecycle (exec, exit, fork) and OOM victims: rare events, sent
 * individually so userspace rescans new processes at once. */
#include "common.bpf.h"

static __always_inline void emit(__u32 kind, struct task_struct *t, __u32 other, __s32 value)
{
	struct proc_event *e = bpf_ringbuf_reserve(&procs, sizeof(*e), 0);
	if (!e) {
		struct counters *cn = ctrs();
		if (cn)
			cn->ringbuf_drops++;
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->kind = kind;
	e->tgid = BPF_CORE_READ(t, tgid);
	e->other = other;
	e->value = value;
	e->extra = 0;
	BPF_CORE_READ_STR_INTO(&e->comm, t, comm);
	bpf_ringbuf_submit(e, 0);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p)
{
	struct config *c = cfg();
	if (c && in_scope(c))
		emit(PROC_EXEC, p, 0, 0);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	/* Only the whole process (leader) leaving matters. */
	__u32 tgid = BPF_CORE_READ(p, tgid);
	if (BPF_CORE_READ(p, pid) != tgid)
		return 0;
	if (bpf_map_lookup_elem(&tracked, &tgid)) {
		bpf_map_delete_elem(&tracked, &tgid);
		emit(PROC_EXIT, p, 0, BPF_CORE_READ(p, exit_code) >> 8);
	}
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	struct config *c = cfg();
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	/* Children of traced processes (DataLoader workers) are worth a rescan. */
	if (c && bpf_map_lookup_elem(&tracked, &ptgid))
		emit(PROC_FORK, parent, BPF_CORE_READ(child, tgid), 0);
	return 0;
}

SEC("tp_btf/mark_victim")
int BPF_PROG(on_oom_victim, struct task_struct *p)
{
	emit(PROC_OOM, p, 0, 0);
	return 0;
}
