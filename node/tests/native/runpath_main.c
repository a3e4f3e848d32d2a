/* SPDX-License-Identifier: Apache-2.0 */
/* usage: runpath_main LOADER (NAME [SYMBOL N])...
 * Waits for a byte on stdin (the test moves it into a cgroup first), loads
 * LOADER by path, then asks it to load each NAME through its RUNPATH and
 * call SYMBOL N times ("-" for none). Exit 0 only if every load worked.
 * With RUNPATH_MAIN_LINGER set it keeps its libraries mapped until a
 * second byte (or end of input) on stdin. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char b;
	if (argc < 3 || read(0, &b, 1) != 1)
		return 2;
	void *l = dlopen(argv[1], RTLD_NOW);
	int (*load)(const char *, const char *, long) = l ? dlsym(l, "load_and_call") : NULL;
	if (!load) {
		fprintf(stderr, "loader: %s\n", dlerror());
		return 3;
	}
	for (int i = 2; i + 2 < argc + 1 && i < argc; i += 3) {
		const char *sym = i + 1 < argc && strcmp(argv[i + 1], "-") ? argv[i + 1] : NULL;
		long n = i + 2 < argc ? atol(argv[i + 2]) : 0;
		int rc = load(argv[i], sym, n);
		if (rc)
			return 10 + rc;
		printf("loaded %s\n", argv[i]);
	}
	if (getenv("RUNPATH_MAIN_LINGER")) {
		fflush(stdout);
		(void)read(0, &b, 1);
	}
	return 0;
}
