# SPDX-License-Identifier: Apache-2.0
"""delta-rs (PyPI `deltalake`) as a second owner of a live ingero table:
while ingero commits, this compacts, vacuums, appends rows of its own and
writes checkpoints, round after round. Prints one JSON object: what it did,
the rows it appended, and each operation that failed (with why).

Usage: coowner.py TABLE_PATH ROUNDS DONE_FILE
The rows appended are copies of a live file's rows under node names
`outside-<round>`, so the caller can count them apart."""
import duckdb  # noqa: F401  (deltalake + pyarrow abort at exit unless duckdb is loaded first)
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

path, rounds, done_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = {"compactions": 0, "files_compacted": 0, "vacuumed": 0, "appended_rows": 0,
       "checkpoints": 0, "failed": []}


def attempt(what, f):
    """One operation; a conflict with ingero's concurrent commit is retried."""
    for _ in range(20):
        try:
            return f()
        except Exception as e:  # noqa: BLE001 (reported to the caller)
            err = f"{type(e).__name__}: {e}"
            if "onflict" in err or "ommitFailed" in err or "version" in err.lower():
                time.sleep(0.05)
                continue
            out["failed"].append([what, err[:300]])
            return None
    out["failed"].append([what, "still conflicting after 20 tries"])
    return None


def append(r):
    dt = DeltaTable(path)
    a = pa.table(dt.get_add_actions(flatten=True)).to_pylist()[0]
    rows = pq.read_table(os.path.join(path, a["path"])).slice(0, 3)
    rows = rows.set_column(rows.schema.get_field_index("node"), "node",
                           pa.array([f"outside-{r}"] * rows.num_rows, pa.string()))
    schema = pa.schema(dt.schema().to_arrow())
    for p in ("date", "hour"):  # typed (date, integer) or, in older tables, strings
        ty = schema.field(p).type
        rows = rows.append_column(p, pa.array([a[f"partition.{p}"]] * rows.num_rows).cast(ty))
    write_deltalake(path, rows, mode="append")
    out["appended_rows"] += rows.num_rows


for r in range(rounds):
    m = attempt("compact", lambda: DeltaTable(path).optimize.compact())
    if m:
        out["compactions"] += 1
        out["files_compacted"] += m.get("numFilesRemoved", 0)
    v = attempt("vacuum", lambda: DeltaTable(path).vacuum(
        retention_hours=0, dry_run=False, enforce_retention_duration=False))
    out["vacuumed"] += len(v or [])
    attempt("append", lambda: append(r))
    if r % 2 == 1:
        if attempt("checkpoint", lambda: DeltaTable(path).create_checkpoint() or True):
            out["checkpoints"] += 1
    time.sleep(0.2)
open(done_file, "w").close()
print(json.dumps(out))
