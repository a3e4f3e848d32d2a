#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Step time of two real training loops, for the agent's overhead
(scripts/overhead.sh runs it with and without the agent, interleaved):

  mlp          launch-bound: a small MLP, ~30 kernel launches per step, no sync
               but the step's own (the CPU launch path is the critical path)
  transformer  a 12-layer bf16 encoder with AdamW (mid-size, ~40 ms steps)

    gpu_steps.py MODEL [--steps N] [--warmup N] [--agent BINARY --pairs K]

Prints one JSON line: model, steps, median and mean step time (ms), launches/s.
With --agent, one process alternates phases without and with the agent
(started and stopped between phases, the order alternating pair by pair):
the same CUDA context, clocks and memory placement on both sides, so the
per-pair ratios measure the agent and not process-to-process variance.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
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


CPU = {}  # the last timed phase's process CPU time per step, user and system (us)


def timed(step, steps):
    """Median step time (ms), in groups of 10 steps each ended by a sync.
    Also keeps the process's CPU time per step in CPU: a probe's trap and
    program are charged to the thread that traps (system time), so the
    difference between phases is the agent's CPU cost, whatever the VM's
    wall-clock noise."""
    times = []
    group = 10
    c0 = os.times()
    for _ in range(steps // group):
        t = time.perf_counter()
        for _ in range(group):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / group * 1e3)
    c1 = os.times()
    n = steps // group * group
    CPU.update(user_us=(c1.user - c0.user) / n * 1e6, sys_us=(c1.system - c0.system) / n * 1e6)
    return statistics.median(times)


class Agent:
    """The agent binary, started and stopped around a phase."""

    def __init__(self, binary, libdirs):
        self.binary, self.libdirs = binary, libdirs
        self.dir = tempfile.mkdtemp()
        self.said = set()

    def __enter__(self):
        log = open(os.path.join(self.dir, "agent.log"), "w")
        args = [self.binary, "run", "--aggregator", "http://127.0.0.1:9", "--spool-dir", os.path.join(self.dir, "spool"),
                "--window", "1s", "--kubernetes", "off"] + [f"--lib={d}" for d in self.libdirs]
        self.p = subprocess.Popen(args, stderr=log, env={**os.environ, "INGERO_LOG": "info"})
        # Default flags: the agent finds this process's CUDA libraries in its
        # first scan; the phase starts once it says it attached to us.
        mine = f"pid={os.getpid()} "
        for _ in range(300):
            text = open(log.name).read()
            if "probe loop ready" in text and (self.libdirs or any(mine in ln and "attached" in ln
                                                                   for ln in text.splitlines())):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("agent did not attach: " + open(log.name).read()[-2000:])
        time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=60)
        # What the agent says of its own cost (trap time, a process over 1%).
        for line in open(os.path.join(self.dir, "agent.log")):
            if any(k in line for k in ("trap", "of a CPU", "WARN", "ERROR")) and line not in self.said:
                self.said.add(line)
                print("  agent: " + line.rstrip()[-300:], flush=True)


def lib_dirs():
    import glob
    d = {os.path.join(os.path.dirname(torch.__file__), "lib")}
    try:
        import nvidia
        for p in nvidia.__path__:
            d.update(x for x in glob.glob(os.path.join(p, "*", "lib")) if os.path.isdir(x))
    except ImportError:
        pass
    return sorted(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["mlp", "transformer"])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--agent", help="agent binary: alternate phases without and with it")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--lib-dirs", action="store_true",
                    help="name PyTorch's library directories (--lib) instead of the default flags")
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
    if not a.agent:
        med = timed(step, a.steps)
        print(json.dumps({"model": a.model, "steps": a.steps, "median_ms": med, "cpu_us_per_step": CPU,
                          "launches_per_step": launches, "launches_per_s": launches / (med / 1e3)}))
        return
    agent = Agent(a.agent, lib_dirs() if a.lib_dirs else [])
    pairs = []
    for i in range(a.pairs):
        def on():
            with agent:
                return timed(step, a.steps)
        if i % 2 == 0:
            off_ms = timed(step, a.steps)
            off_cpu = dict(CPU)
            on_ms = on()
            on_cpu = dict(CPU)
        else:
            on_ms = on()
            on_cpu = dict(CPU)
            off_ms = timed(step, a.steps)
            off_cpu = dict(CPU)
        cpu_ratio = (on_cpu["user_us"] + on_cpu["sys_us"]) / max(off_cpu["user_us"] + off_cpu["sys_us"], 1e-9)
        pairs.append({"without_ms": off_ms, "with_ms": on_ms, "ratio": on_ms / off_ms, "cpu_ratio": cpu_ratio,
                      "without_cpu_us": off_cpu, "with_cpu_us": on_cpu})
        print(f"{a.model} pair {i + 1}: without {off_ms:.3f} ms, with {on_ms:.3f} ms, ratio {on_ms / off_ms:.4f}; "
              f"CPU per step user+sys without {off_cpu['user_us']:.0f}+{off_cpu['sys_us']:.0f} us, "
              f"with {on_cpu['user_us']:.0f}+{on_cpu['sys_us']:.0f} us, ratio {cpu_ratio:.4f}", flush=True)
    ratios = [p["ratio"] for p in pairs]
    print(json.dumps({"model": a.model, "steps_per_phase": a.steps, "pairs": len(pairs),
                      "median_ratio": statistics.median(ratios), "ratios": [round(r, 4) for r in ratios],
                      "median_cpu_ratio": statistics.median(p["cpu_ratio"] for p in pairs),
                      "median_without_ms": statistics.median(p["without_ms"] for p in pairs),
                      "launches_per_step": launches,
                      "launches_per_s": launches / (statistics.median(p["without_ms"] for p in pairs) / 1e3)}))


if __name__ == "__main__":
    main()
