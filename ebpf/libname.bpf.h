/* SPDX-License-Identifier: GPL-2.0-only */
/* What the library-lookup programs read of a dlsym handle: the public head
 * of glibc's link_map and whether the library it names is a CUDA/NCCL one
 * (shared by libload.bpf.c's hold and libnotify.bpf.c's notice). */
#ifndef INGERO_LIBNAME_BPF_H
#define INGERO_LIBNAME_BPF_H

#include "common.bpf.h"

#define NAME_MAX_SCAN 160

/* Per CPU: the library's path (too big for the stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, char[NAME_MAX_SCAN + 16]);
} lib_name SEC(".maps");

/* True when a component of the path starts libnccl*, libcudart* or libcuda.*
 * (one pass, no state carried between characters: cheap to verify). */
static __always_inline int traced_name(const char *s)
{
	for (int i = 0; i < NAME_MAX_SCAN; i++) {
		if (s[i] == 0)
			return 0;
		if (s[i] != 'l' || s[i + 1] != 'i' || s[i + 2] != 'b' || (i > 0 && s[i - 1] != '/'))
			continue;
		const char *t = s + i + 3;
		if (t[0] == 'n' && t[1] == 'c' && t[2] == 'c' && t[3] == 'l')
			return 1;
		if (t[0] == 'c' && t[1] == 'u' && t[2] == 'd' && t[3] == 'a' && (t[4] == 'r' || t[4] == '.'))
			return 1;
	}
	return 0;
}

/* The public head of glibc's struct link_map (<link.h>). */
struct link_map_head {
	__u64 l_addr;
	__u64 l_name;
	__u64 l_ld;
};

/* Reads the link_map head behind a dlsym handle and whether it names a
 * CUDA/NCCL library; 0 for RTLD_DEFAULT/RTLD_NEXT and unreadable handles. */
static __always_inline int traced_link_map(__u64 handle, struct link_map_head *lm)
{
	/* RTLD_DEFAULT (0) and RTLD_NEXT (-1) name no library. */
	if (handle == 0 || handle == (__u64)-1)
		return 0;
	if (bpf_probe_read_user(lm, sizeof(*lm), (void *)handle) || !lm->l_name || !lm->l_ld)
		return 0;
	__u32 zero = 0;
	char *buf = bpf_map_lookup_elem(&lib_name, &zero);
	if (!buf)
		return 0;
	__builtin_memset(buf, 0, NAME_MAX_SCAN + 16);
	return bpf_probe_read_user_str(buf, NAME_MAX_SCAN, (void *)lm->l_name) > 0 && traced_name(buf);
}

/* pid_in_ns() in a frame of its own. */
static __noinline __u32 lookup_pid(struct pid *p, struct config *c)
{
	return pid_in_ns(p, c);
}

/* current_ids(), each step in a small frame. */
static __noinline __u64 lookup_ids(struct config *c)
{
	if (!c->pidns_ino)
		return bpf_get_current_pid_tgid();
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	__u32 tid = lookup_pid(BPF_CORE_READ(t, thread_pid), c);
	__u32 tgid = lookup_pid(BPF_CORE_READ(t, group_leader, thread_pid), c);
	return tid && tgid ? ((__u64)tgid << 32) | tid : 0;
}

#endif
