/* A stand-in for libcudart/libcuda/libnccl with the real symbol names and
 * controllable durations: the agent probes it exactly as it would the real
 * libraries. Built as libcudart.so.12 / libnccl.so.2 by the tests.
 * Durations: the last argument that is a duration is in microseconds. */
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void spin_us(long us)
{
	if (us <= 0)
		return;
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
	nanosleep(&ts, NULL);
}

#define ENTRY_ONLY(name) int name(const void *f) { (void)f; return 0; }
#define TIMED(name) int name(long us) { spin_us(us); return 0; }

ENTRY_ONLY(cudaLaunchKernel)
ENTRY_ONLY(cudaLaunchKernel_ptsz)
ENTRY_ONLY(cudaLaunchKernelExC)
ENTRY_ONLY(cudaGraphLaunch)
ENTRY_ONLY(cudaFree)
TIMED(cudaMemcpy)
TIMED(cudaMemcpyAsync)
TIMED(cudaStreamSynchronize)
TIMED(cudaDeviceSynchronize)
TIMED(cudaEventSynchronize)
TIMED(cudaMalloc)
ENTRY_ONLY(cuLaunchKernel)
TIMED(cuCtxSynchronize)
TIMED(cuStreamSynchronize)
/* Data-parallel mode: with FAKE_NCCL_BARRIER=FILE and FAKE_NCCL_WORLD=N set,
 * ncclAllReduce also waits until all N ranks (processes sharing FILE) have
 * arrived, as real collectives do, so the healthy ranks wait for a straggler
 * inside the traced call. A sense-reversing barrier in a shared mapping;
 * waiters sleep on a (process-shared) futex, so waiting costs no CPU. */
struct barrier { int count; int sense; };

static struct barrier *shared_barrier(int *world)
{
	static struct barrier *b;
	static int n = -1;
	if (n < 0) {
		const char *path = getenv("FAKE_NCCL_BARRIER"), *w = getenv("FAKE_NCCL_WORLD");
		n = 0;
		if (path && w && atoi(w) > 1) {
			int fd = open(path, O_RDWR | O_CREAT, 0600);
			if (fd >= 0 && ftruncate(fd, sizeof(*b)) == 0) {
				void *m = mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
				if (m != MAP_FAILED) {
					b = m;
					n = atoi(w);
				}
			}
			if (fd >= 0)
				close(fd);
		}
	}
	*world = n;
	return b;
}

int ncclAllReduce(long us)
{
	int world;
	struct barrier *b = shared_barrier(&world);
	if (b) {
		int sense = __atomic_load_n(&b->sense, __ATOMIC_ACQUIRE);
		if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == world) {
			__atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
			__atomic_store_n(&b->sense, !sense, __ATOMIC_RELEASE);
			syscall(SYS_futex, &b->sense, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
		} else {
			while (__atomic_load_n(&b->sense, __ATOMIC_ACQUIRE) == sense)
				syscall(SYS_futex, &b->sense, FUTEX_WAIT, sense, NULL, NULL, 0);
		}
	}
	spin_us(us);
	return 0;
}
TIMED(ncclAllGather)
TIMED(ncclReduceScatter)
TIMED(ncclBroadcast)
TIMED(ncclSend)
TIMED(ncclRecv)
ENTRY_ONLY(ncclGroupStart)
TIMED(ncclGroupEnd)
/* A failing call: counted as an error by the return probe. */
int cudaGetLastErrorFail(long us) { spin_us(us); return 35; }

/* The rest of what current PyTorch / vLLM / JAX stacks call. */
ENTRY_ONLY(cudaMallocAsync)
ENTRY_ONLY(cudaFreeAsync)
ENTRY_ONLY(cudaEventRecord)
ENTRY_ONLY(cudaEventQuery)
ENTRY_ONLY(cudaStreamWaitEvent)
ENTRY_ONLY(cudaMemsetAsync)
ENTRY_ONLY(cudaLaunchCooperativeKernel)
TIMED(cudaMemcpyPeer)
TIMED(cudaMemcpyPeerAsync)
TIMED(cuStreamSynchronize_ptsz)
TIMED(cuMemcpy_ptds)
TIMED(cuMemcpyHtoD_v2_ptds)
TIMED(cuMemcpyDtoH_v2_ptds)
TIMED(cuEventSynchronize)
ENTRY_ONLY(cuStreamWaitEvent)
TIMED(cuMemFree_v2)
ENTRY_ONLY(cuMemAllocAsync)
ENTRY_ONLY(cuGraphLaunch)
ENTRY_ONLY(cuLaunchCooperativeKernel)
TIMED(ncclCommSplit)
TIMED(ncclReduce)
TIMED(ncclAlltoAll)
TIMED(ncclCommAbort)
TIMED(ncclCommDestroy)
