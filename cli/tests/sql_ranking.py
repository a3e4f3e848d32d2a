# SPDX-License-Identifier: Apache-2.0
"""Runs analysis/sql/stragglers.sql unchanged in DuckDB over the live files
delta-rs lists for the 10-second signal tier and progress_windows; prints the rows as JSON
(timestamps as µs). Assertions are the Rust test's (cli/tests/it/sql_ranking.rs).

usage: sql_ranking.py STORE_DIR SQL_FILE
"""
import json
import os
import sys

import duckdb
from deltalake import DeltaTable

root, sql_file = sys.argv[1], sys.argv[2]
sql = open(sql_file).read()
con = duckdb.connect()
files = 0
# A store whose agents never shipped a progress row has no progress table:
# the same columns, empty.
EMPTY = {
    "progress_windows": "SELECT NULL::VARCHAR AS job, NULL::VARCHAR AS node, NULL::TIMESTAMPTZ AS window_start, "
    "NULL::UINTEGER AS pid, NULL::VARCHAR AS oldest_op, NULL::UBIGINT AS oldest_age_ns WHERE FALSE"
}
for table in ["signal_windows_10s", "progress_windows"]:
    uris = DeltaTable(f"{root}/{table}").file_uris() if os.path.isdir(f"{root}/{table}/_delta_log") else []
    files += len(uris)
    if not uris and table in EMPTY:
        con.execute(f"CREATE VIEW {table} AS {EMPTY[table]}")
        continue
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in uris)
    con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{listed}], hive_partitioning = false)")
con.execute("CREATE TABLE ranked AS " + sql)
cur = con.execute(
    "SELECT job, node, epoch_us(since) AS since_us, epoch_us(\"until\") AS until_us, peak_score, cause, "
    "flagged_now, score_now FROM ranked"
)
cols = [d[0] for d in cur.description]
print(json.dumps({"files": files, "rows": [dict(zip(cols, r)) for r in cur.fetchall()]}))
