// SPDX-License-Identifier: Apache-2.0
/* What closing uprobes costs, by how they were made: N perf-event uprobes
 * (closed from T threads at once) or one uprobe_multi link of N offsets
 * (Linux 6.6+) holding a do-nothing BPF program. Offsets are read from
 * stdin (hex file offsets of functions in PATH).
 *
 *   uprobe_close perf PATH N THREADS < offsets
 *   uprobe_close multi PATH N < offsets
 *
 * Prints the milliseconds to place and to close them. Needs root. */
#define _GNU_SOURCE
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX 4096
#define UPROBE_MULTI 48 /* BPF_TRACE_UPROBE_MULTI */

static unsigned long offs[MAX];
static int fds[MAX], n, threads;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void *closer(void *arg)
{
	for (long i = (long)arg; i < n; i += threads)
		close(fds[i]);
	return 0;
}

static int perf(const char *path)
{
	int type;
	FILE *f = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
	if (!f || fscanf(f, "%d", &type) != 1)
		return perror("uprobe PMU"), 1;
	fclose(f);
	double t0 = now();
	for (int i = 0; i < n; i++) {
		struct perf_event_attr a = {.size = sizeof a, .type = type};
		a.uprobe_path = (unsigned long)path;
		a.probe_offset = offs[i];
		fds[i] = syscall(SYS_perf_event_open, &a, -1, 0, -1, PERF_FLAG_FD_CLOEXEC);
		if (fds[i] < 0)
			return perror("perf_event_open"), 1;
		ioctl(fds[i], PERF_EVENT_IOC_ENABLE, 0);
	}
	double t1 = now();
	pthread_t th[64];
	for (long k = 0; k < threads; k++)
		pthread_create(&th[k], 0, closer, (void *)k);
	for (int k = 0; k < threads; k++)
		pthread_join(th[k], 0);
	printf("perf events: %d probes placed in %.1f ms, closed from %d threads in %.1f ms (%.1f ms a probe)\n", n,
	       (t1 - t0) * 1e3, threads, (now() - t1) * 1e3, (now() - t1) * 1e3 / n);
	return 0;
}

static int multi(const char *path)
{
	struct bpf_insn insns[] = {{.code = BPF_ALU64 | BPF_MOV | BPF_K}, {.code = BPF_JMP | BPF_EXIT}};
	union bpf_attr a;
	memset(&a, 0, sizeof a);
	a.prog_type = BPF_PROG_TYPE_KPROBE;
	a.expected_attach_type = UPROBE_MULTI;
	a.insns = (unsigned long)insns;
	a.insn_cnt = 2;
	a.license = (unsigned long)"GPL";
	int prog = syscall(SYS_bpf, BPF_PROG_LOAD, &a, sizeof a);
	if (prog < 0)
		return perror("BPF_PROG_LOAD"), 1;
	/* link_create's uprobe_multi member (uapi bpf.h, 6.6): older headers lack it. */
	struct {
		__u32 prog_fd, target_fd, attach_type, flags;
		__u64 path, offsets, ref_ctr_offsets, cookies;
		__u32 cnt, multi_flags, pid, pad;
	} l = {.prog_fd = prog, .attach_type = UPROBE_MULTI, .path = (unsigned long)path,
	       .offsets = (unsigned long)offs, .cnt = n};
	double t0 = now();
	int link = syscall(SYS_bpf, BPF_LINK_CREATE, &l, sizeof l);
	if (link < 0)
		return perror("BPF_LINK_CREATE"), 1;
	double t1 = now();
	close(link);
	printf("uprobe_multi: %d probes placed in %.1f ms, closed in %.1f ms\n", n, (t1 - t0) * 1e3, (now() - t1) * 1e3);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return fprintf(stderr, "usage: %s perf|multi PATH N [THREADS] < offsets\n", argv[0]), 2;
	n = atoi(argv[3]);
	threads = argc > 4 ? atoi(argv[4]) : 1;
	if (n < 1 || n > MAX || threads < 1 || threads > 64)
		return fprintf(stderr, "N 1..%d, THREADS 1..64\n", MAX), 2;
	for (int i = 0; i < n; i++)
		if (scanf("%lx", &offs[i]) != 1)
			return fprintf(stderr, "fewer than %d offsets on stdin\n", n), 2;
	return strcmp(argv[1], "multi") ? perf(argv[2]) : multi(argv[2]);
}
