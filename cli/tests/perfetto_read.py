# SPDX-License-Identifier: Apache-2.0
"""Reads a trace with Perfetto's own published protos (PyPI `perfetto`:
perfetto_trace_pb2) and prints what a viewer would show, as JSON: every
track with its path from the root, its slices (begin/end paired per track,
as trace_processor does), its instants and its counter values. Fails on a slice end
without a begin, an event on an undeclared track, or a packet of another kind.
Assertions are the Rust test's (cli/tests/it/export.rs).

usage: perfetto_read.py TRACE_FILE
"""

import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

trace = pb.Trace()
trace.ParseFromString(open(sys.argv[1], "rb").read())
tracks, open_slices = {}, {}
for packet in trace.packet:
    if packet.HasField("track_descriptor"):
        d = packet.track_descriptor
        assert d.uuid not in tracks, f"track {d.uuid} declared twice"
        assert not d.HasField("parent_uuid") or d.parent_uuid in tracks, f"parent of {d.name} not declared first"
        tracks[d.uuid] = {
            "name": d.name,
            "parent": d.parent_uuid if d.HasField("parent_uuid") else None,
            "description": d.description,
            "counter_unit": d.counter.unit_name if d.HasField("counter") else None,
            "slices": [],
            "instants": [],
            "counters": [],
        }
    elif packet.HasField("track_event"):
        e = packet.track_event
        t = tracks[e.track_uuid]
        ts = packet.timestamp
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            args = {}
            for a in e.debug_annotations:
                kind = a.WhichOneof("value")
                args[a.name] = getattr(a, kind) if kind else None
            open_slices.setdefault(e.track_uuid, []).append((ts, e.name, list(e.categories), args))
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            begin, name, cats, args = open_slices[e.track_uuid].pop()
            assert ts >= begin, f"slice {name} ends before it begins"
            depth = len(open_slices[e.track_uuid])
            t["slices"].append({"name": name, "ts": begin, "dur": ts - begin, "depth": depth,
                                "categories": cats, "args": args})
        elif e.type == pb.TrackEvent.TYPE_INSTANT:
            args = {a.name: getattr(a, a.WhichOneof("value")) for a in e.debug_annotations if a.WhichOneof("value")}
            t["instants"].append({"name": e.name, "ts": ts, "categories": list(e.categories), "args": args})
        elif e.type == pb.TrackEvent.TYPE_COUNTER:
            assert t["counter_unit"] is not None, f"counter value on a slice track {t['name']}"
            t["counters"].append([ts, e.double_counter_value])
        else:
            raise AssertionError(f"unexpected event type {e.type}")
    else:
        raise AssertionError(f"unexpected packet {packet}")
assert all(not s for s in open_slices.values()), "slices left open"


def path(uuid):
    names = []
    while uuid is not None:
        names.append(tracks[uuid]["name"])
        uuid = tracks[uuid]["parent"]
    return list(reversed(names))


print(json.dumps([{"path": path(u), **{k: v for k, v in t.items() if k != "parent"}} for u, t in tracks.items()]))
