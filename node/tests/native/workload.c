/* SPDX-License-Identifier: Apache-2.0 */
/* Calls CUDA-named functions in a pattern given on the command line:
 *   workload LIB [wait] [sleep:MS] [call:SYMBOL:N:US] [spin:MS]
 *                [work:MS] (MS of CPU time: takes longer when the CPU is shared)
 *                [repeat:N]   (the steps after it run N times)
 *                [nccl:PATH]  (nccl* symbols come from this library from now on)
 *                [driver:PATH] (cu* symbols other than cuda* likewise: the
 *                             program calling the driver itself)
 *                [threads:N:SYMBOL] (N threads, one after another, each calls
 *                             SYMBOL once and exits: tids come and go)
 *                [kill:SIG]   (the process kills itself with signal SIG)
 *                [chroot:DIR] (changes root: every path it mapped then names
 *                             whatever DIR holds there, as a hostile pod's would)
 *                [name:NAME]  (renames itself: prctl(PR_SET_NAME))
 *                [tcall:NAME:SYMBOL:US] (one thread named NAME calls
 *                             SYMBOL(US) once, lives 300 ms more, is joined)
 *                [fork]       (the steps after it run in a child; the parent
 *                             prints "step fork 1 <child pid>" and waits)
 *                [gate]       (hangs for good, asleep in host code, once the
 *                             file $FAKE_HANG_DIR/<pid> exists: a rank that
 *                             stops making progress)
 * `wait` blocks until a byte arrives on stdin (the test moves us into a
 * cgroup first). The library is dlopen'd when the first call needs it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*fn_t)(long);

static double clock_ms(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double now_ms(void)
{
	return clock_ms(CLOCK_MONOTONIC);
}

static void *call_once(void *f)
{
	((fn_t)f)(0);
	return NULL;
}

struct named_call {
	char name[16];
	fn_t f;
	long us;
};

static void *call_named(void *p)
{
	struct named_call *c = p;
	pthread_setname_np(pthread_self(), c->name);
	c->f(c->us);
	usleep(300 * 1000);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: workload LIB [steps...]\n");
		return 2;
	}
	void *lib = NULL, *nccl = NULL, *driver = NULL;
	int loop_start = -1;
	long loops = 0;
	for (int i = 2; i < argc; i++) {
		char *a = argv[i];
		if (!strncmp(a, "repeat:", 7)) {
			loop_start = i + 1;
			loops = atol(a + 7);
			if (loops <= 0)
				break;
		} else if (!strcmp(a, "wait")) {
			/* What ran so far is readable while we wait. */
			fflush(stdout);
			char c;
			if (read(0, &c, 1) < 0)
				return 3;
		} else if (!strcmp(a, "open")) {
			lib = dlopen(argv[1], RTLD_NOW);
			if (!lib) {
				fprintf(stderr, "dlopen: %s\n", dlerror());
				return 4;
			}
		} else if (!strncmp(a, "sleep:", 6)) {
			usleep(atol(a + 6) * 1000);
		} else if (!strncmp(a, "spin:", 5)) {
			double end = now_ms() + atol(a + 5);
			volatile unsigned long x = 0;
			while (now_ms() < end)
				x++;
		} else if (!strncmp(a, "nccl:", 5) || !strncmp(a, "driver:", 7)) {
			int is_nccl = a[0] == 'n';
			void *h = dlopen(strchr(a, ':') + 1, RTLD_NOW);
			if (!h) {
				fprintf(stderr, "dlopen: %s\n", dlerror());
				return 4;
			}
			if (is_nccl)
				nccl = h;
			else
				driver = h;
		} else if (!strncmp(a, "work:", 5)) {
			double end = clock_ms(CLOCK_THREAD_CPUTIME_ID) + atol(a + 5);
			volatile unsigned long x = 0;
			while (clock_ms(CLOCK_THREAD_CPUTIME_ID) < end)
				x++;
		} else if (!strncmp(a, "unlink:", 7)) {
			/* A loaded library deleted before its first lookup (a temp copy). */
			if (unlink(a + 7)) {
				perror("unlink");
				return 8;
			}
		} else if (!strncmp(a, "chroot:", 7)) {
			if (chroot(a + 7) || chdir("/")) {
				perror("chroot");
				return 7;
			}
		} else if (!strcmp(a, "gate")) {
			const char *dir = getenv("FAKE_HANG_DIR");
			char path[4096];
			if (dir && snprintf(path, sizeof(path), "%s/%d", dir, (int)getpid()) > 0 && access(path, F_OK) == 0)
				for (;;)
					pause();
		} else if (!strncmp(a, "name:", 5)) {
			prctl(PR_SET_NAME, a + 5, 0, 0, 0);
		} else if (!strcmp(a, "fork")) {
			fflush(stdout);
			pid_t child = fork();
			if (child < 0)
				return 8;
			if (child > 0) {
				int st = 0;
				printf("step fork 1 %d\n", (int)child);
				fflush(stdout);
				waitpid(child, &st, 0);
				return WIFEXITED(st) ? WEXITSTATUS(st) : 9;
			}
		} else if (!strncmp(a, "kill:", 5)) {
			fflush(stdout);
			kill(getpid(), atoi(a + 5));
		} else if (!strncmp(a, "tcall:", 6)) {
			struct named_call c = { { 0 }, NULL, 0 };
			char sym[128];
			if (sscanf(a + 6, "%15[^:]:%127[^:]:%ld", c.name, sym, &c.us) < 3) {
				fprintf(stderr, "bad step %s\n", a);
				return 2;
			}
			if (!lib)
				lib = dlopen(argv[1], RTLD_NOW);
			c.f = lib ? (fn_t)dlsym(lib, sym) : NULL;
			if (!c.f) {
				fprintf(stderr, "no symbol %s\n", sym);
				return 5;
			}
			pthread_t t;
			if (pthread_create(&t, NULL, call_named, &c) || pthread_join(t, NULL))
				return 6;
		} else if (!strncmp(a, "threads:", 8)) {
			char sym[128];
			long n = 0;
			if (sscanf(a + 8, "%ld:%127s", &n, sym) < 2) {
				fprintf(stderr, "bad step %s\n", a);
				return 2;
			}
			if (!lib)
				lib = dlopen(argv[1], RTLD_NOW);
			void *f = lib ? dlsym(lib, sym) : NULL;
			if (!f) {
				fprintf(stderr, "no symbol %s\n", sym);
				return 5;
			}
			for (long k = 0; k < n; k++) {
				pthread_t t;
				if (pthread_create(&t, NULL, call_once, f) || pthread_join(t, NULL))
					return 6;
			}
		} else if (!strncmp(a, "call:", 5)) {
			char sym[128];
			long n = 0, us = 0;
			if (sscanf(a + 5, "%127[^:]:%ld:%ld", sym, &n, &us) < 2) {
				fprintf(stderr, "bad step %s\n", a);
				return 2;
			}
			if (!lib)
				lib = dlopen(argv[1], RTLD_NOW);
			void *from = nccl && !strncmp(sym, "nccl", 4) ? nccl : lib;
			if (driver && !strncmp(sym, "cu", 2) && strncmp(sym, "cuda", 4))
				from = driver;
			fn_t f = from ? (fn_t)dlsym(from, sym) : NULL;
			if (!f) {
				fprintf(stderr, "no symbol %s\n", sym);
				return 5;
			}
			double t0 = now_ms();
			for (long k = 0; k < n; k++)
				f(us);
			/* What really happened, for the test to compare against
			 * (not per iteration of a repeat: nobody reads those). */
			/* ... and when the last call returned (wall clock, µs),
			 * which the windows' starts are in. */
			if (loop_start < 0)
				printf("step %s %ld %.0f %.0f\n", sym, n, (now_ms() - t0) * 1e6,
				       clock_ms(CLOCK_REALTIME) * 1e3);
		} else {
			fprintf(stderr, "unknown step %s\n", a);
			return 2;
		}
		if (i == argc - 1 && loop_start > 0 && --loops > 0)
			i = loop_start - 1;
	}
	printf("done\n");
	fflush(stdout);
	return 0;
}
