#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Lists functions longer than a limit in the workspace's Rust code (CONTRIBUTING.md).

Usage: scripts/fn-sizes.py [LIMIT]   (default 80 lines)

Every function in every .rs file of every crate (src/, tests/, benches/, build.rs,
fuzz/) is measured, nested ones included (vendor/ is other projects' code). Tests are left out by their attributes:
an item under `#[cfg(test)]` (a test module or a test-only helper) and a function
marked `#[test]` or `#[tokio::test]`. Braces are matched on code only: strings, raw
strings, char literals and comments are blanked first, so a `{` in a format string
does not end a function early.
"""
import pathlib
import re
import sys

LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 80
FN = re.compile(r"^\s*(pub(\([a-z:\s]+\))?\s+)?((const|async|unsafe|extern\s+\"C\")\s+)*fn\s+(\w+)")
TEST_ATTR = re.compile(r"^\s*#\[(cfg\(test\)|test|tokio::test[^\]]*|[\w:]*::test)\]\s*$")


def code_only(text):
    """The text with strings, chars and comments replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:i + 300])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']{0,9}|[^\\'])'", text[i:i + 12])):
            out.append(" " * m.end())
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def item_end(lines, start):
    """Index of the line that closes the item starting at `start` (a `;` item ends there)."""
    depth, opened = 0, False
    for j in range(start, len(lines)):
        line = lines[j]
        if not opened and line.rstrip().endswith(";"):
            return j
        depth += line.count("{") - line.count("}")
        opened |= "{" in line
        if opened and depth <= 0:
            return j
    return len(lines) - 1


def functions(path):
    lines = code_only(path.read_text()).splitlines()
    i, test_attr = 0, False
    while i < len(lines):
        line = lines[i]
        if TEST_ATTR.match(line):
            test_attr = True
        elif line.strip().startswith("#["):
            pass  # other attributes keep a pending test attribute for the item below
        elif line.strip():
            if test_attr:
                i = item_end(lines, i)  # a test, test module or test-only item: skipped whole
            elif (m := FN.match(line)) and not line.rstrip().endswith(";"):
                end = item_end(lines, i)
                yield m.group(5), i + 1, end - i + 1
            test_attr = False
        i += 1


root = pathlib.Path(__file__).resolve().parent.parent
files = [f for f in sorted(root.glob("**/*.rs")) if not {"target", ".git", "vendor"} & set(f.relative_to(root).parts)]
bad = 0
for f in files:
    for name, line, n in functions(f):
        if n > LIMIT:
            bad += 1
            print(f"{n:4} {f.relative_to(root)}:{line} {name}")
sys.exit(1 if bad else 0)
