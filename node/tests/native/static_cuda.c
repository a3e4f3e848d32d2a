/* SPDX-License-Identifier: Apache-2.0 */
/* A CUDA program as nvcc builds it by default (-cudart static): the runtime's
 * functions are part of the executable, and only the driver (libcuda.so.1)
 * is loaded dynamically.
 *   static_cuda DRIVER_LIB wait DELAY_MS N
 * (waits for a byte on stdin, then N launches + N/10 syncs after DELAY_MS,
 * then N/100 launches through the driver, made by the program itself) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "fakecuda.c"

int main(int argc, char **argv)
{
	char c;
	if (argc < 5 || read(0, &c, 1) < 0)
		return 2;
	void *driver = dlopen(argv[1], RTLD_NOW);
	if (!driver) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 4;
	}
	usleep(atol(argv[3]) * 1000);
	long n = atol(argv[4]);
	/* Through volatile pointers: calls reach the functions' entry points. */
	int (*volatile launch)(const void *) = cudaLaunchKernel;
	int (*volatile sync)(long) = cudaStreamSynchronize;
	for (long i = 0; i < n; i++)
		launch(0);
	for (long i = 0; i < n / 10; i++)
		sync(0);
	int (*volatile own)(const void *) = (int (*)(const void *))dlsym(driver, "cuLaunchKernel");
	if (!own)
		return 5;
	for (long i = 0; i < n / 100; i++)
		own(0);
	printf("done\n");
	return 0;
}
