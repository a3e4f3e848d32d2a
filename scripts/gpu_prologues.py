#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The first bytes of every function the agent probes, in the CUDA runtime,
driver and NCCL that PyTorch has loaded. A uprobe's cost depends on the
instruction it replaces: the kernel emulates a few (push, nop, some jumps)
and single-steps the rest out of line, an order of magnitude dearer.

    gpu_prologues.py [OPS_RS]

Prints `lib symbol offset-in-file hex-bytes` per function found; disassemble
with `objdump -D -b binary -m i386:x86-64` on the hex.
"""
import ctypes
import re
import sys

import torch


def loaded(names):
    """Paths of the mapped libraries whose file names start with `names`."""
    found = {}
    for line in open("/proc/self/maps"):
        parts = line.split()
        if len(parts) >= 6:
            base = parts[5].rsplit("/", 1)[-1]
            for n in names:
                if base.startswith(n) and n not in found:
                    found[n] = parts[5]
    return found


def main():
    ops_rs = sys.argv[1] if len(sys.argv) > 1 else "agent/src/probes/ops.rs"
    table = re.findall(r'\((Cudart|Cuda|Nccl), "(\w+)"', open(ops_rs).read())
    torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    try:
        import torch.distributed as dist  # noqa: F401  (maps libnccl)
        torch.cuda.nccl.version()
    except Exception:
        pass
    libs = loaded({"Cudart": "libcudart.so", "Cuda": "libcuda.so", "Nccl": "libnccl.so"}.values())
    key = {"Cudart": "libcudart.so", "Cuda": "libcuda.so", "Nccl": "libnccl.so"}
    for lib, path in libs.items():
        print(f"# {lib} {path}")
    handles = {k: ctypes.CDLL(p) for k, p in libs.items()}
    for lib, sym in table:
        h = handles.get(key[lib])
        if h is None:
            print(f"{lib} {sym} no-library")
            continue
        try:
            addr = ctypes.cast(getattr(h, sym), ctypes.c_void_p).value
        except AttributeError:
            print(f"{lib} {sym} absent")
            continue
        print(f"{lib} {sym} {addr:#x} {ctypes.string_at(addr, 24).hex()}")


if __name__ == "__main__":
    main()
