/* SPDX-License-Identifier: Apache-2.0 */
/* usage: dlsym_repeat LIB SYMBOL N
 * Waits for a byte on stdin (the test moves it into a cgroup first), loads
 * LIB, then looks SYMBOL up N times and prints how long each lookup took in
 * microseconds, one per line. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long long now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000LL + t.tv_nsec / 1000;
}

int main(int argc, char **argv)
{
	char b;
	if (argc != 4 || read(0, &b, 1) != 1)
		return 2;
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 3;
	}
	for (long i = 0; i < atol(argv[3]); i++) {
		long long t0 = now_us();
		if (!dlsym(h, argv[2]))
			return 4;
		printf("%lld\n", now_us() - t0);
	}
	return 0;
}
