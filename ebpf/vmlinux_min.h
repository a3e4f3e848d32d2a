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

/* x86-64 register file as uprobes see it (struct pt_regs, UAPI order). */
struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

struct task_struct {
	unsigned int __state;
	pid_t pid;
	pid_t tgid;
	char comm[16];
	int exit_code;
	struct task_struct *real_parent;
};

struct block_device {
	__u32 bd_dev;
};

struct request {
	struct block_device *part;
	unsigned int cmd_flags;
	unsigned int __data_len;
};

#pragma clang attribute pop

#endif
