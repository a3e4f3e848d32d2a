/* A stand-in for libcudart/libcuda/libnccl with the real symbol names and
 * controllable durations: the agent probes it exactly as it would the real
 * libraries. Built as libcudart.so.12 / libnccl.so.2 by the tests.
 * Durations: the last argument that is a duration is in microseconds. */
#include <stddef.h>
#include <time.h>

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
TIMED(ncclAllReduce)
TIMED(ncclAllGather)
TIMED(ncclReduceScatter)
TIMED(ncclBroadcast)
TIMED(ncclSend)
TIMED(ncclRecv)
ENTRY_ONLY(ncclGroupStart)
TIMED(ncclGroupEnd)
/* A failing call: counted as an error by the return probe. */
int cudaGetLastErrorFail(long us) { spin_us(us); return 35; }
