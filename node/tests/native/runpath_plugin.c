/* SPDX-License-Identifier: Apache-2.0 */
/* An ordinary plugin, found through its loader's RUNPATH. */
int plugin_hello(long x)
{
	return (int)x + 1;
}
