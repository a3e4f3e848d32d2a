#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Step time of two real training loops, for the agent's overhead
(scripts/overhead.sh runs it with and without the agent, interleaved):

  mlp          launch-bound: a small MLP, ~30 kernel launches per step, no sync
               but the step's own (the CPU launch path is the critical path)
  transformer  a 12-layer bf16 encoder with AdamW (mid-size, ~40 ms steps)

    gpu_steps.py MODEL [--steps N] [--warmup N]

Prints one JSON line: model, steps, median and mean step time (ms), launches/s.
"""
import argparse
import json
import statistics
import time

import torch


def mlp():
    dev = torch.device("cuda")
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(4)],
                            torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=dev)
    y = torch.randint(0, 10, (64,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return step


def transformer():
    dev = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, device=dev, dtype=torch.bfloat16)
    m = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    x = torch.randn(32, 256, 512, device=dev, dtype=torch.bfloat16)

    def step():
        opt.zero_grad(set_to_none=True)
        m(x).float().pow(2).mean().backward()
        opt.step()
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["mlp", "transformer"])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=50)
    a = ap.parse_args()
    step = {"mlp": mlp, "transformer": transformer}[a.model]()
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    # Launches per step, counted once by the profiler outside the timed run.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
        torch.cuda.synchronize()
    launches = sum(e.count for e in prof.key_averages() if "LaunchKernel" in e.key)
    times = []
    # Timed in groups of 10 steps, each ended by a sync: the step time a user sees.
    group = 10
    for _ in range(a.steps // group):
        t = time.perf_counter()
        for _ in range(group):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / group * 1e3)
    med = statistics.median(times)
    print(json.dumps({"model": a.model, "steps": a.steps, "median_ms": med, "mean_ms": statistics.mean(times),
                      "launches_per_step": launches, "launches_per_s": launches / (med / 1e3)}))


if __name__ == "__main__":
    main()
