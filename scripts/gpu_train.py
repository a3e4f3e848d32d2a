#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A small real PyTorch training loop for scripts/gpu-check.sh: an MLP on the
GPU, a DataLoader with worker processes, a NCCL all-reduce (world size 1)
every step, a loss.item() device-to-host sync. The whole run is recorded by
torch.profiler, whose CUDA runtime events (CUPTI callbacks) are the
independent count the agent's uprobe counts are compared with.

    gpu_train.py OUT.json [--steps N]
"""
import argparse
import collections
import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(512, generator=g), torch.randint(0, 10, (), generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=3000)
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    t0 = time.time()
    with torch.profiler.profile(activities=acts) as prof:
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
        model = torch.nn.Sequential(
            torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
        ).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(Synthetic(), batch_size=64, num_workers=2, pin_memory=True)
        it = iter(loader)
        for step in range(a.steps):
            x, y = next(it)
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            if step % 10 == 0:
                loss.item()  # device-to-host copy: a sync
        torch.cuda.synchronize()
        dist.destroy_process_group()
    elapsed = time.time() - t0
    counts = collections.Counter()
    for e in prof.events():
        # CUDA runtime/driver API calls are CPU-side events named after the API.
        if e.name.startswith(("cuda", "cu", "nccl")) and e.device_type == torch.autograd.DeviceType.CPU:
            counts[e.name] += 1
    with open(a.out, "w") as f:
        json.dump({"pid": os.getpid(), "steps": a.steps, "seconds": elapsed,
                   "torch": torch.__version__, "cuda": torch.version.cuda,
                   "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                   "gpu": torch.cuda.get_device_name(0), "profiler": counts}, f)


if __name__ == "__main__":
    main()
