#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every CUDA library path PyTorch takes, each exercised once and checked for
a right answer: cuBLAS/cuBLASLt, cuDNN, linear algebra (libtorch_cuda_linalg,
dlopened lazily by bare name through libtorch_cuda's RUNPATH: a return probe
on dlopen once broke it), SDPA attention, NVRTC (jiterator), cuFFT, cuRAND,
NCCL (world size 1) and torch.compile (Triton). Prints one line per path and
exits non-zero if any failed. Run with and without the agent:

    gpu_paths.py [--skip-compile]
"""
import os
import sys
import traceback

import torch


def main():
    skip_compile = "--skip-compile" in sys.argv
    dev = torch.device("cuda")
    a = torch.randn(256, 256, device=dev, dtype=torch.float64) + 256 * torch.eye(256, device=dev, dtype=torch.float64)

    def cublas():
        x = torch.randn(512, 512, device=dev)
        assert torch.allclose(x @ torch.eye(512, device=dev), x, atol=1e-5)

    def cublaslt():
        x = torch.randn(512, 512, device=dev, dtype=torch.bfloat16)
        lin = torch.nn.Linear(512, 512, device=dev, dtype=torch.bfloat16)
        assert lin(x).isfinite().all()

    def cudnn():
        conv = torch.nn.Conv2d(3, 8, 3, padding=1, device=dev)
        y = conv(torch.randn(2, 3, 32, 32, device=dev))
        assert y.shape == (2, 8, 32, 32) and torch.backends.cudnn.is_available()

    def linalg():
        inv = torch.linalg.inv(a)
        assert torch.allclose(inv @ a, torch.eye(256, device=dev, dtype=torch.float64), atol=1e-8)
        torch.linalg.cholesky(a @ a.T)
        torch.linalg.svd(a[:64, :64])

    def sdpa():
        q = torch.randn(2, 4, 128, 64, device=dev, dtype=torch.float16)
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert o.isfinite().all()

    def nvrtc():
        f = torch.cuda.jiterator._create_jit_fn("template <typename T> T twice(T x) { return x + x; }")
        x = torch.randn(1000, device=dev)
        assert torch.allclose(f(x), 2 * x)

    def cufft():
        x = torch.randn(1024, device=dev)
        assert torch.allclose(torch.fft.ifft(torch.fft.fft(x)).real, x, atol=1e-5)

    def curand():
        x = torch.rand(1 << 20, device=dev)
        assert 0.45 < x.mean().item() < 0.55

    def nccl():
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        t = torch.ones(1024, device=dev)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        assert t.sum().item() == 1024
        dist.destroy_process_group()

    def compile_():
        f = torch.compile(lambda x: torch.sin(x) * 2 + x)
        x = torch.randn(4096, device=dev)
        assert torch.allclose(f(x), torch.sin(x) * 2 + x, atol=1e-5)

    paths = [("cuBLAS", cublas), ("cuBLASLt bf16", cublaslt), ("cuDNN conv", cudnn), ("linalg (inv, cholesky, svd)", linalg),
             ("SDPA attention", sdpa), ("NVRTC (jiterator)", nvrtc), ("cuFFT", cufft), ("cuRAND", curand),
             ("NCCL all_reduce", nccl)]
    if not skip_compile:
        paths.append(("torch.compile", compile_))
    failed = 0
    for name, f in paths:
        try:
            f()
            torch.cuda.synchronize()
            print(f"ok    {name}")
        except Exception as e:  # every path is reported, not just the first failure
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            traceback.print_exc(file=sys.stderr)
    print(f"{len(paths) - failed}/{len(paths)} CUDA library paths work")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
