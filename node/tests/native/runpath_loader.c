/* SPDX-License-Identifier: Apache-2.0 */
/* A library that loads plugins the way XLA's loader and PyTorch's lazy CUDA
 * libraries do: dlopen by bare name, found only through this library's own
 * RUNPATH ($ORIGIN/plugins). glibc picks the RUNPATH from dlopen's return
 * address, so anything that rewrites that address breaks this. */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*fn_t)(long);

/* Loads `name` and, when `sym` is given, calls it `n` times at once. 0 on success. */
int load_and_call(const char *name, const char *sym, long n)
{
	void *h = dlopen(name, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", name, dlerror());
		return 1;
	}
	if (!sym)
		return 0;
	fn_t f = (fn_t)dlsym(h, sym);
	if (!f) {
		fprintf(stderr, "dlsym %s: %s\n", sym, dlerror());
		return 2;
	}
	for (long k = 0; k < n; k++)
		f(0);
	return 0;
}
