// SPDX-License-Identifier: Apache-2.0
//! The `ingest_batches` table — the audit trail of exactly-once — and the
//! transaction app ids the store's exactly-once state is kept under.

use std::sync::{Arc, OnceLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// The Delta table listing every stored batch range (one row per node per
/// segment): the audit trail of exactly-once, readable by any engine.
pub const BATCHES_TABLE: &str = "ingest_batches";

pub fn batches_schema() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        let u = |n: &str| Field::new(n, DataType::UInt64, false);
        Arc::new(Schema::new(vec![
            Field::new("writer", DataType::Utf8, false),
            u("segment"),
            Field::new("node", DataType::Utf8, false),
            u("first_sequence"),
            u("last_sequence"),
            u("batches"),
            u("rows"),
            Field::new("committed_at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
        ]))
    })
    .clone()
}

const WRITER_APP: &str = "ingero-writer-";
const NODE_APP: &str = "node:";

/// Transaction app id of a writer (its WAL's segments are its versions).
pub fn writer_app(writer: &str) -> String {
    format!("{WRITER_APP}{writer}")
}

/// The writer a transaction app id names, if it names one.
pub(crate) fn writer_of(app: &str) -> Option<&str> {
    app.strip_prefix(WRITER_APP)
}

/// Transaction app id of a node (its batch sequences are its versions).
pub fn node_app(node: &str) -> String {
    format!("{NODE_APP}{node}")
}

/// The nodes' versions among a table's transactions: (node, highest sequence).
pub(crate) fn node_versions(txns: &std::collections::HashMap<String, i64>) -> impl Iterator<Item = (&str, u64)> {
    txns.iter().filter_map(|(app, &v)| Some((app.strip_prefix(NODE_APP)?, v.max(0) as u64)))
}
