/* SPDX-License-Identifier: Apache-2.0 */
/* Context-switch load for the scheduler probe's cost (scripts/switch-cost.sh):
 * two threads hand a turn back and forth through a futex N times; pinned
 * to one CPU, every hand-over is a voluntary switch straight to the other
 * thread (no pipe or file in between: as many switches a second as the
 * kernel allows).
 *   pingpong N  -> ns per switch (2N switches), on stdout */
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic int turn;
static long n;

static void wait_for(int mine)
{
	int seen;
	while ((seen = atomic_load(&turn)) != mine)
		syscall(SYS_futex, &turn, FUTEX_WAIT_PRIVATE, seen, 0, 0, 0);
}

static void hand_to(int other)
{
	atomic_store(&turn, other);
	syscall(SYS_futex, &turn, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
}

static void *pong(void *arg)
{
	for (long i = 0; i < n; i++) {
		wait_for(1);
		hand_to(0);
	}
	return arg;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
	n = argc > 1 ? atol(argv[1]) : 200000;
	if (n <= 0)
		return 1;
	pthread_t t;
	if (pthread_create(&t, 0, pong, 0))
		return 1;
	double t0 = now();
	for (long i = 0; i < n; i++) {
		hand_to(1);
		wait_for(0);
	}
	double t1 = now();
	pthread_join(t, 0);
	printf("%.1f\n", (t1 - t0) / (2.0 * n));
	return 0;
}
