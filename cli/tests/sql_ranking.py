# SPDX-License-Identifier: Apache-2.0
"""Runs analysis/sql/stragglers.sql unchanged in DuckDB over the live files
delta-rs lists for the 10-second signal tier; prints the rows as JSON
(timestamps as µs). Assertions are the Rust test's (cli/tests/it/sql_ranking.rs).

usage: sql_ranking.py STORE_DIR SQL_FILE
"""
import json
import sys

import duckdb
from deltalake import DeltaTable

root, sql_file = sys.argv[1], sys.argv[2]
sql = open(sql_file).read()
files = DeltaTable(f"{root}/signal_windows_10s").file_uris()
con = duckdb.connect()
listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
con.execute(f"CREATE VIEW signal_windows_10s AS SELECT * FROM read_parquet([{listed}], hive_partitioning = false)")
con.execute("CREATE TABLE ranked AS " + sql)
cur = con.execute(
    "SELECT job, node, epoch_us(since) AS since_us, epoch_us(\"until\") AS until_us, peak_score, cause, "
    "flagged_now, score_now FROM ranked"
)
cols = [d[0] for d in cur.description]
print(json.dumps({"files": len(files), "rows": [dict(zip(cols, r)) for r in cur.fetchall()]}))
