#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when source files of a crate import each other in a circle (CONTRIBUTING.md).

Usage: scripts/check-cycles.py   (exit 1 and the circles found)

Builds each crate's module graph from its `crate::` and `super::` paths
(comments and `#[cfg(test)] mod tests` left out; a module's use of its own
parent is not an edge) and prints every strongly connected component of more
than one module. Data flows one way; a circle means two files that cannot be
read, moved or tested apart.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRATES = ["model/src", "proto/src", "store/src", "server/src", "action/src", "agent/src", "node/src", "analysis/src", "cli/src", "sim/src"]


def modules(src):
    mods = {}
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[0] == "bin":
            continue  # binaries are crates of their own
        if parts[-1] == "mod":
            parts = parts[:-1]
        if parts in (["lib"], ["main"]):
            parts = []
        mods[tuple(parts)] = f
    return mods


def edges(mods):
    graph = {}
    for m, f in mods.items():
        text = re.sub(r"//[^\n]*", "", f.read_text())
        cut = text.find("#[cfg(test)]\nmod tests")
        text = text if cut < 0 else text[:cut]
        deps = set()
        for path in re.findall(r"\b((?:crate|super)(?:::\w+)+)", text):
            segs = path.split("::")
            base, rest = ([], segs[1:]) if segs[0] == "crate" else (list(m), segs)
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
            target = base + rest
            for k in range(len(target), 0, -1):
                t = tuple(target[:k])
                if t in mods:
                    if t != m and m[: len(t)] != t:
                        deps.add(t)
                    break
        graph[m] = deps
    return graph


def circles(graph):
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted("::".join(x) for x in comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


bad = 0
for crate in CRATES:
    for c in circles(edges(modules(ROOT / crate))):
        bad += 1
        print(f"import circle in {crate}: {' <-> '.join(c)}")
if not bad:
    print(f"no import circles in {', '.join(CRATES)}")
sys.exit(1 if bad else 0)
