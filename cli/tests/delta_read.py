# SPDX-License-Identifier: Apache-2.0
"""Reads an ingero store's Delta tables with engines ingero does not contain:
delta-rs (PyPI `deltalake`), Polars (`scan_delta`) and DuckDB (over the files
delta-rs says are live). Prints one JSON object: per table, each engine's row
count, a column sum, the table version and whether a checkpoint was read."""
import json
import os
import sys

import duckdb
import pyarrow.compute as pc
import polars as pl
from deltalake import DeltaTable

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
    row["checkpoint"] = os.path.exists(os.path.join(path, "_delta_log", "_last_checkpoint"))
    out[t] = row
print(json.dumps(out))
