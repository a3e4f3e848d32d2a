/* SPDX-License-Identifier: Apache-2.0 */
/* Per-call cost and paced throughput of a CUDA-named function:
 *   callbench LIB SYMBOL N            -> ns per call (tight loop)
 *   callbench LIB SYMBOL N WORK_US    -> seconds for N steps of (WORK_US spin + 1 call) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*fn_t)(long);

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	void *lib = dlopen(argv[1], RTLD_NOW);
	fn_t f = lib ? (fn_t)dlsym(lib, argv[2]) : NULL;
	if (!f)
		return 3;
	long n = atol(argv[3]);
	double work = argc > 4 ? atof(argv[4]) / 1e6 : 0;
	double t0 = now_s();
	for (long i = 0; i < n; i++) {
		if (work > 0) {
			double end = now_s() + work;
			while (now_s() < end)
				;
		}
		f(0);
	}
	double dt = now_s() - t0;
	if (work > 0)
		printf("%.6f\n", dt);
	else
		printf("%.1f\n", dt * 1e9 / n);
	return 0;
}
