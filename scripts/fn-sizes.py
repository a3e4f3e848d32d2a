#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Lists functions longer than a limit in non-test Rust code (CONTRIBUTING.md).

Usage: scripts/fn-sizes.py [LIMIT]   (default 80 lines)
Brace matching on lines, skipping `#[cfg(test)]` modules, tests/ and benches/.
"""
import pathlib
import re
import sys

LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 80
FN = re.compile(r"^\s*(pub(\([a-z]+\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")


def functions(path):
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "#[cfg(test)]":
            break  # test modules sit at the end of a file
        m = FN.match(line)
        if m and not line.rstrip().endswith(";"):
            depth, start, opened = 0, i, False
            j = i
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                opened |= "{" in lines[j]
                if opened and depth <= 0:
                    break
                j += 1
            yield m.group(6), start + 1, j - start + 1
            i = j
        i += 1


root = pathlib.Path(__file__).resolve().parent.parent
bad = 0
for f in sorted(root.glob("*/src/**/*.rs")):
    if "target" in f.parts:
        continue
    for name, line, n in functions(f):
        if n > LIMIT:
            bad += 1
            print(f"{n:4} {f.relative_to(root)}:{line} {name}")
sys.exit(1 if bad else 0)
