/* SPDX-License-Identifier: GPL-2.0-only */
/* The few kernel types the programs read, with CO-RE relocation: field
 * offsets are resolved against the running kernel's BTF at load time, so
 * this header need not match any kernel's layout (no generated vmlinux.h). */
#ifndef __VMLINUX_H__
#define __VMLINUX_H__

#include <linux/types.h>
#include <linux/bpf.h>

typedef _Bool bool;
typedef __u32 u32;
typedef __u64 u64;
typedef int pid_t;
typedef unsigned int uid_t;

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

#if defined(__TARGET_ARCH_x86)
/* x86-64 register file as uprobes see it (struct pt_regs, UAPI order). */
struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};
#elif defined(__TARGET_ARCH_arm64)
/* arm64: libbpf's PT_REGS_* read struct user_pt_regs, the head of the
 * kernel's struct pt_regs. */
struct user_pt_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
};
struct pt_regs {
	struct user_pt_regs user_regs;
};
#else
#error "set __TARGET_ARCH_x86 or __TARGET_ARCH_arm64 (agent/build.rs does)"
#endif

struct ns_common {
	unsigned int inum;
};

struct pid_namespace {
	struct ns_common ns;
};

/* One level of a pid: its number in one namespace. */
struct upid {
	int nr;
	struct pid_namespace *ns;
};

struct pid {
	unsigned int level;
	struct upid numbers[1];
};

struct kernfs_node {
	__u64 id;
};

struct cgroup {
	struct kernfs_node *kn;
};

struct css_set {
	struct cgroup *dfl_cgrp;
};

#if defined(__TARGET_ARCH_x86)
struct thread_struct {
	unsigned long fsbase; /* the thread pointer: pthread_self() in glibc and musl */
};
#endif

struct task_struct {
#if defined(__TARGET_ARCH_x86)
	struct thread_struct thread;
#endif
	unsigned int __state;
	pid_t pid;
	pid_t tgid;
	char comm[16];
	int exit_code;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	struct pid *thread_pid;
	struct css_set *cgroups;
};

/* Linux < 5.14 names the task state `state` (a long): read through this
 * flavor when `__state` does not exist (CO-RE picks one at load). */
struct task_struct___pre514 {
	long state;
};

struct super_block {
	__u32 s_dev;
};

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
};

struct file {
	struct inode *f_inode;
};

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	struct file *vm_file;
};

struct block_device {
	__u32 bd_dev;
};

/* Linux < 5.11: a request's `part` is the partition's hd_struct, whose
 * embedded device carries the number (read through flavors: CO-RE). */
struct device___pre511 {
	__u32 devt;
};

struct hd_struct {
	struct device___pre511 __dev;
};

struct request {
	struct block_device *part;
	unsigned int cmd_flags;
	unsigned int __data_len;
};

#pragma clang attribute pop

#endif
