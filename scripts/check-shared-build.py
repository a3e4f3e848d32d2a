#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when the quick start's build (`cargo run -p ingero -- demo`) and the
test build (`cargo nextest run --workspace --features ingero/mcp`) would compile a third-party
dependency with different features: the tests would then rebuild it, and
everything above it, instead of reusing the demo's artifacts.

Cargo resolves features per command: `-p ingero` sees only the binary's
dependency tree, the workspace build the union over every member and its
dev-dependencies. The fix for a reported crate is to name it, with the
workspace's features, in the root Cargo.toml's "Shared build" block and in
cli/Cargo.toml.
"""
import subprocess
import sys


def features(args):
    out = subprocess.run(
        ["cargo", "tree", *args, "--prefix", "none", "-f", "{p}|{f}"],
        check=True, capture_output=True, text=True,
    ).stdout
    seen = {}
    for line in out.splitlines():
        line = line.replace(" (*)", "").strip()
        if "|" not in line:
            continue
        pkg, feats = line.split("|", 1)
        if "(/" in pkg:  # our own crates are rebuilt for tests anyway
            continue
        seen.setdefault(pkg, set()).update(f for f in feats.split(",") if f)
    return seen


def main():
    demo = features(["-p", "ingero", "-e", "normal,build"])
    tests = features(["--workspace", "--features", "ingero/mcp", "-e", "normal,build,dev"])
    drift = {p: (demo[p], tests.get(p, set())) for p in demo if demo[p] != tests.get(p, set())}
    for pkg, (d, t) in sorted(drift.items()):
        print(f"{pkg}: the test build adds {sorted(t - d)}" + (f", lacks {sorted(d - t)}" if d - t else ""))
    if drift:
        print(f"{len(drift)} dependencies would be compiled twice (see this script's docstring)")
        return 1
    print(f"shared build: the {len(demo)} third-party dependencies of `ingero` have the test build's features")
    return 0


if __name__ == "__main__":
    sys.exit(main())
