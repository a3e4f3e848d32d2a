/* SPDX-License-Identifier: Apache-2.0 */
/* A stand-in for the CUDA driver (libcuda.so.1) with the real symbol names:
 * the agent probes it exactly as it would the real driver. Built with the
 * soname libcuda.so.1 by the tests; the stand-in runtime (fakecuda.c)
 * calls into it as libcudart calls the real driver.
 *
 * The device is modelled as real jobs see it from the host: work is
 * enqueued and the host waits for it only in a synchronizing call (stream,
 * context or event sync, a blocking copy). NCCL collectives enqueue a
 * kernel that completes once every rank of the job has enqueued the same
 * collective; with FAKE_NCCL_BARRIER=FILE and FAKE_NCCL_WORLD=N the ranks
 * (processes sharing FILE) count their collectives in a shared mapping, and
 * a sync waits until all N ranks have enqueued as many as this one has. So a
 * healthy rank waits for a straggler inside its sync, never inside the
 * collective, as on a real GPU node. Waiters sleep on a process-shared futex:
 * waiting costs no CPU, as a blocking sync (cudaDeviceScheduleBlockingSync)
 * does not.
 *
 * Durations: the last argument, in microseconds, is device time (what a
 * sync waits for) or, for host-side calls, the call's own duration. */
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void sleep_us(long us)
{
	if (us <= 0)
		return;
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
	nanosleep(&ts, NULL);
}

/* Collectives enqueued by all ranks together. */
struct world {
	int arrived;
};

static struct world *shared_world(int *ranks)
{
	static struct world *w;
	static int n = -1;
	if (n < 0) {
		const char *path = getenv("FAKE_NCCL_BARRIER"), *r = getenv("FAKE_NCCL_WORLD");
		n = 0;
		if (path && r && atoi(r) > 1) {
			int fd = open(path, O_RDWR | O_CREAT, 0600);
			if (fd >= 0 && ftruncate(fd, sizeof(*w)) == 0) {
				void *m = mmap(NULL, sizeof(*w), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
				if (m != MAP_FAILED) {
					w = m;
					n = atoi(r);
				}
			}
			if (fd >= 0)
				close(fd);
		}
	}
	*ranks = n;
	return w;
}

static long enqueued;  /* collectives this process enqueued */
static long pending_us; /* device time enqueued and not yet waited for */

/* Not a CUDA symbol: what the stand-in NCCL calls to enqueue a collective. */
void fakecuda_enqueue_collective(long us)
{
	int ranks;
	struct world *w = shared_world(&ranks);
	__atomic_add_fetch(&enqueued, 1, __ATOMIC_ACQ_REL);
	__atomic_add_fetch(&pending_us, us, __ATOMIC_ACQ_REL);
	if (w) {
		__atomic_add_fetch(&w->arrived, 1, __ATOMIC_ACQ_REL);
		syscall(SYS_futex, &w->arrived, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	}
}

/* The host waits for the device: every collective this rank enqueued
 * completes once all ranks have enqueued as many (each rank syncs before
 * its next collective, so no rank is ever more than one ahead), then the
 * device time queued so far, then `us` more. */
static void device_wait(long us)
{
	int ranks;
	struct world *w = shared_world(&ranks);
	long mine = __atomic_load_n(&enqueued, __ATOMIC_ACQUIRE);
	if (w && mine) {
		long need = mine * ranks;
		for (;;) {
			int a = __atomic_load_n(&w->arrived, __ATOMIC_ACQUIRE);
			if (a >= need)
				break;
			syscall(SYS_futex, &w->arrived, FUTEX_WAIT, a, NULL, NULL, 0);
		}
	}
	sleep_us(us + __atomic_exchange_n(&pending_us, 0, __ATOMIC_ACQ_REL));
}

#define ENQUEUE(name) int name(const void *f) { (void)f; return 0; }
#define HOST(name) int name(long us) { sleep_us(us); return 0; }
#define WAIT(name) int name(long us) { device_wait(us); return 0; }

ENQUEUE(cuLaunchKernel)
ENQUEUE(cuLaunchKernel_ptsz)
ENQUEUE(cuLaunchKernelEx)
ENQUEUE(cuLaunchKernelEx_ptsz)
ENQUEUE(cuLaunchCooperativeKernel)
ENQUEUE(cuGraphLaunch)
ENQUEUE(cuStreamWaitEvent)
ENQUEUE(cuMemAllocAsync)
ENQUEUE(cuEventRecord)
ENQUEUE(cuEventRecordWithFlags)
ENQUEUE(cuMemsetD8Async)
ENQUEUE(cuMemsetD32Async_ptsz)
WAIT(cuCtxSynchronize)
WAIT(cuStreamSynchronize)
WAIT(cuStreamSynchronize_ptsz)
WAIT(cuEventSynchronize)
/* Blocking copies wait for the work queued before them. */
WAIT(cuMemcpy)
WAIT(cuMemcpy_ptds)
WAIT(cuMemcpyDtoH_v2)
WAIT(cuMemcpyDtoH_v2_ptds)
WAIT(cuMemcpyHtoD_v2)
WAIT(cuMemcpyHtoD_v2_ptds)
HOST(cuMemcpyAsync)
HOST(cuMemAlloc_v2)
HOST(cuMemFree_v2)
