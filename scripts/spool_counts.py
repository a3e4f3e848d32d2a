#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-op call counts from an ingero-agent spool, with nothing but pyarrow.

The agent writes every window to its spool (`SPOOL/batches/*.pb`) before it
sends it: a protobuf `PushRequest` (proto/ingero.proto) whose `tables` carry
Arrow IPC streams. Where no aggregator runs (a GPU test machine with no
network), the spool is the dataset. This decodes the two protobuf messages by
hand (three fields; no protobuf package needed) and sums `call_windows`.

    spool_counts.py SPOOL_DIR [--pid PID] [--json]
"""
import argparse
import collections
import glob
import json
import os
import sys

import pyarrow.ipc as ipc


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def fields(buf):
    """(field number, wire type, value) of one protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, v


def tables(path):
    """(table name, pyarrow.Table) of one spooled PushRequest."""
    with open(path, "rb") as f:
        data = f.read()
    for num, _, tb in fields(data):
        if num != 3:  # PushRequest.tables
            continue
        name, stream = None, None
        for n, _, v in fields(tb):
            if n == 1:
                name = bytes(v).decode()
            elif n == 2:
                stream = bytes(v)
        if name and stream:
            yield name, ipc.open_stream(stream).read_all()


def counts(spool, pid=None):
    """{(pid, library, op): (count, errors, total_ns)} over every window."""
    out = collections.defaultdict(lambda: [0, 0, 0])
    files = sorted(glob.glob(os.path.join(spool, "batches", "*.pb")) + glob.glob(os.path.join(spool, "*.pb")))
    for path in files:
        for name, t in tables(path):
            if name != "call_windows":
                continue
            cols = t.to_pydict()
            for p, lib, op, n, e, tot in zip(cols["pid"], cols["library"], cols["op"], cols["count"],
                                             cols["errors"], cols["total_ns"]):
                if pid is not None and p != pid:
                    continue
                x = out[(p, lib, op)]
                x[0] += n
                x[1] += e
                x[2] += tot
    return out, len(files)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spool")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    c, n = counts(a.spool, a.pid)
    if n == 0:
        sys.exit(f"no spooled batches under {a.spool}")
    if a.json:
        print(json.dumps([{"pid": p, "library": l, "op": o, "count": v[0], "errors": v[1], "total_ns": v[2]}
                          for (p, l, o), v in sorted(c.items())]))
        return
    print(f"{'pid':>8} {'library':<8} {'op':<32} {'count':>10} {'errors':>8}")
    for (p, l, o), v in sorted(c.items()):
        print(f"{p:>8} {l:<8} {o:<32} {v[0]:>10} {v[1]:>8}")


if __name__ == "__main__":
    main()
