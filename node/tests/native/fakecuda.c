/* SPDX-License-Identifier: Apache-2.0 */
/* A stand-in for libcudart/libnccl with the real symbol names: the agent
 * probes it exactly as it would the real libraries. Built as
 * libcudart.so.12 and libnccl.so.2 by the tests, next to the stand-in
 * driver (fakecuda_driver.c, libcuda.so.1) that it calls the way the real
 * runtime does: loaded with dlopen, its entry points looked up by name, so
 * a runtime call reaches the driver's exported (probed) functions. Where no
 * driver can be loaded (a copy of this library alone in another
 * directory), a call does the driver's part itself.
 *
 * NCCL's collectives enqueue a kernel on the device and return at once;
 * ranks wait for each other in their next device sync (see the driver).
 * Durations: the last argument that is a duration is in microseconds. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void spin_us(long us)
{
	if (us <= 0)
		return;
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
	nanosleep(&ts, NULL);
}

static void *drv;

/* The driver is loaded with the library, as the real runtime and NCCL load
 * it at initialisation (so no timed call pays for the dlopen): the
 * libcuda.so.1 next to this file, found from our own path (a constructor's
 * dlopen does not search the library's run path). */
__attribute__((constructor)) static void load_driver(void)
{
	Dl_info self;
	char path[4096];
	if (!dladdr((void *)load_driver, &self) || !self.dli_fname)
		return;
	const char *slash = strrchr(self.dli_fname, '/');
	int dir = slash ? (int)(slash - self.dli_fname) : 1;
	snprintf(path, sizeof(path), "%.*s/libcuda.so.1", dir, slash ? self.dli_fname : ".");
	if (access(path, R_OK) == 0)
		drv = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

/* The driver's function `sym`, or NULL. A runtime linked into an
 * executable finds the driver once the program has loaded it. */
static void *driver_fn(const char *sym)
{
	if (!drv)
		drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
	return drv ? dlsym(drv, sym) : NULL;
}

typedef int (*long_fn)(long);
typedef int (*ptr_fn)(const void *);

/* Runtime call made of one driver call, as in libcudart. */
#define ENQUEUE(name, drv)                                         \
	int name(const void *f)                                    \
	{                                                          \
		static ptr_fn d;                                   \
		if (!d)                                            \
			d = (ptr_fn)driver_fn(drv);                \
		return d ? d(f) : 0;                               \
	}
#define CALLS(name, drv)                                           \
	int name(long us)                                          \
	{                                                          \
		static long_fn d;                                  \
		if (!d)                                            \
			d = (long_fn)driver_fn(drv);               \
		if (!d) {                                          \
			spin_us(us);                               \
			return 0;                                  \
		}                                                  \
		return d(us);                                      \
	}
#define ENTRY_ONLY(name) int name(const void *f) { (void)f; return 0; }
#define TIMED(name) int name(long us) { spin_us(us); return 0; }

ENQUEUE(cudaLaunchKernel, "cuLaunchKernel")
ENQUEUE(cudaLaunchKernel_ptsz, "cuLaunchKernel_ptsz")
ENQUEUE(cudaLaunchKernelExC, "cuLaunchKernelEx")
ENQUEUE(cudaGraphLaunch, "cuGraphLaunch")
ENQUEUE(cudaFree, "cuMemFree_v2")
CALLS(cudaMemcpy, "cuMemcpy")
CALLS(cudaMemcpyAsync, "cuMemcpyAsync")
CALLS(cudaStreamSynchronize, "cuStreamSynchronize")
CALLS(cudaDeviceSynchronize, "cuCtxSynchronize")
CALLS(cudaEventSynchronize, "cuEventSynchronize")
CALLS(cudaMalloc, "cuMemAlloc_v2")

/* NCCL: a collective launches its kernel through the driver and enqueues
 * itself (the driver's barrier); the call returns at once. */
static void collective(long us)
{
	static ptr_fn launch;
	static long_fn enqueue;
	if (!launch) {
		launch = (ptr_fn)driver_fn("cuLaunchKernel");
		enqueue = (long_fn)driver_fn("fakecuda_enqueue_collective");
	}
	if (launch)
		launch(NULL);
	if (enqueue)
		enqueue(us);
	else
		spin_us(us);
}
#define COLLECTIVE(name) int name(long us) { collective(us); return 0; }

COLLECTIVE(ncclAllReduce)
COLLECTIVE(ncclAllGather)
COLLECTIVE(ncclReduceScatter)
COLLECTIVE(ncclBroadcast)
COLLECTIVE(ncclSend)
COLLECTIVE(ncclRecv)
COLLECTIVE(ncclReduce)
COLLECTIVE(ncclAlltoAll)
ENTRY_ONLY(ncclGroupStart)
TIMED(ncclGroupEnd)
TIMED(ncclCommSplit)
TIMED(ncclCommAbort)
TIMED(ncclCommDestroy)
/* A failing call: counted as an error by the return probe. */
int cudaGetLastErrorFail(long us) { spin_us(us); return 35; }

/* The rest of what current PyTorch / vLLM / JAX stacks call. */
ENQUEUE(cudaMallocAsync, "cuMemAllocAsync")
ENTRY_ONLY(cudaFreeAsync)
ENQUEUE(cudaEventRecord, "cuEventRecord")
ENQUEUE(cudaEventRecordWithFlags, "cuEventRecordWithFlags")
ENTRY_ONLY(cudaEventQuery)
ENQUEUE(cudaStreamWaitEvent, "cuStreamWaitEvent")
ENQUEUE(cudaMemsetAsync, "cuMemsetD8Async")
ENQUEUE(cudaLaunchCooperativeKernel, "cuLaunchCooperativeKernel")
CALLS(cudaMemcpyPeer, "cuMemcpy")
TIMED(cudaMemcpyPeerAsync)
