/* Calls CUDA-named functions in a pattern given on the command line:
 *   workload LIB [wait] [sleep:MS] [call:SYMBOL:N:US] [fail:SYMBOL:N:US] [spin:MS]
 * `wait` blocks until a byte arrives on stdin (the test moves us into a
 * cgroup first). The library is dlopen'd when the first call needs it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*fn_t)(long);

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: workload LIB [steps...]\n");
		return 2;
	}
	void *lib = NULL;
	for (int i = 2; i < argc; i++) {
		char *a = argv[i];
		if (!strcmp(a, "wait")) {
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
		} else if (!strncmp(a, "call:", 5)) {
			char sym[128];
			long n = 0, us = 0;
			if (sscanf(a + 5, "%127[^:]:%ld:%ld", sym, &n, &us) < 2) {
				fprintf(stderr, "bad step %s\n", a);
				return 2;
			}
			if (!lib)
				lib = dlopen(argv[1], RTLD_NOW);
			fn_t f = lib ? (fn_t)dlsym(lib, sym) : NULL;
			if (!f) {
				fprintf(stderr, "no symbol %s\n", sym);
				return 5;
			}
			double t0 = now_ms();
			for (long k = 0; k < n; k++)
				f(us);
			/* What really happened, for the test to compare against. */
			printf("step %s %ld %.0f\n", sym, n, (now_ms() - t0) * 1e6);
		}
	}
	printf("done\n");
	fflush(stdout);
	return 0;
}
