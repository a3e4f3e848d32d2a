# SPDX-License-Identifier: Apache-2.0
"""Reads an ingero store's Delta tables with engines ingero does not contain:
delta-rs (PyPI `deltalake`), Polars (`scan_delta`) and DuckDB (over the files
delta-rs says are live). Prints one JSON object: per table, each engine's row
count, a column sum, the table version, whether a checkpoint was read, and
how delta-rs's reading of each file's min/max/null statistics compares with
the file's own values."""
import json
import os
import sys

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import polars as pl
from deltalake import DeltaTable


def check_stats(path, dt):
    """Each file's statistics as delta-rs parses them against the file's
    values: integers exact, every bound a true bound, null counts exact."""
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    done = {"files": 0, "checked": 0, "wrong": []}
    for a in actions:
        data = pq.read_table(os.path.join(path, a["path"]))
        done["files"] += 1 if any(k.startswith("min.") for k in a) else 0
        for c in data.column_names:
            col, lo, hi = data.column(c), a.get(f"min.{c}"), a.get(f"max.{c}")
            if a.get(f"null_count.{c}") is not None:
                done["checked"] += 1
                if a[f"null_count.{c}"] != col.null_count:
                    done["wrong"].append([a["path"], c, "nulls", a[f"null_count.{c}"], col.null_count])
            if pa.types.is_list(col.type) or pa.types.is_boolean(col.type):
                continue
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            mm = pc.min_max(col).as_py()
            for kind, stat, real, ok in (("min", lo, mm["min"], lambda s, r: s <= r),
                                         ("max", hi, mm["max"], lambda s, r: s >= r)):
                if stat is None or real is None:
                    continue
                done["checked"] += 1
                exact = pa.types.is_integer(col.type)
                if not (stat == real if exact else ok(stat, real)):
                    done["wrong"].append([a["path"], c, kind, str(stat), str(real)])
    done["wrong"] = done["wrong"][:5]
    return done


root, tables, col = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
out = {}
for t in tables:
    path = os.path.join(root, t)
    dt = DeltaTable(path)
    arrow = dt.to_pyarrow_table()
    files = dt.file_uris()
    lf = pl.scan_delta(path)
    row = {
        "version": dt.version(),
        "deltalake": arrow.num_rows,
        "polars": lf.select(pl.len()).collect().item(),
        "files": len(files),
    }
    if col in arrow.column_names:
        row["deltalake_sum"] = int(pc.sum(arrow.column(col)).as_py() or 0)
        row["polars_sum"] = int(lf.select(pl.col(col).sum()).collect().item() or 0)
    if files:
        q = f"select count(*), sum({col}) from read_parquet({files!r})" if col in arrow.column_names \
            else f"select count(*), 0 from read_parquet({files!r})"
        n, s = duckdb.sql(q).fetchall()[0]
        row["duckdb"], row["duckdb_sum"] = n, int(s or 0)
    else:
        row["duckdb"] = 0
    row["stats"] = check_stats(path, dt)
    row["checkpoint"] = os.path.exists(os.path.join(path, "_delta_log", "_last_checkpoint"))
    out[t] = row
print(json.dumps(out))
