// SPDX-License-Identifier: Apache-2.0
//! Bulk writes that bypass the WAL (an import): whole tables written as
//! Parquet files and signal tiers under names no other writer uses, then
//! committed to each table's Delta log under one transaction, so writing
//! the same batch again (same `id`) adds nothing.

use ingero_model::Tables;

use crate::delta::action::Txn;
use crate::error::Result;
use crate::flush::{Encoded, EncodedFile, Logs};
use crate::layout::Partition;
use crate::{Store, parquet, tiers};

/// Writes and commits `tables` as the batch `id` (the transaction
/// `<writer>-<id:016x>`, e.g. `import-…`); `info` goes into each commit.
/// Returns the files committed (0 when this batch was committed before).
pub async fn commit_tables(
    store: &Store,
    logs: &mut Logs,
    tables: &Tables,
    id: u64,
    info: serde_json::Value,
) -> Result<usize> {
    let tag = format!("{}-{id:016x}", logs.writer);
    let guard = Txn { app_id: tag.clone(), version: 1, last_updated: None };
    let mut out = Vec::new();
    for (table, batch) in tables {
        let mut enc = Vec::new();
        for (part, b) in parquet::partition(*table, std::slice::from_ref(batch))? {
            let key = file_key(&part, &tag);
            enc.push(EncodedFile::new(key, parquet::encode(&b)?));
        }
        out.push(Encoded { name: table.name().to_string(), schema: table.schema(), files: enc });
    }
    let by_table: Vec<_> = tables.iter().map(|(t, b)| (*t, vec![b.clone()])).collect();
    let mut tier_files = Vec::new();
    for (tier, hour, b) in tiers::build_from_tables(by_table.iter().map(|(t, b)| (t, b)))? {
        let key = tiers::file_key(tier, hour, &format!("{tag}-{}", crate::layout::unique()));
        tier_files.push((tier, EncodedFile::new(key, tiers::encode(&b)?)));
    }
    out.extend(Encoded::tiers(tier_files));
    let mut files = 0;
    for t in out {
        files += logs.commit_files(store, t, &guard, info.clone()).await? as usize;
    }
    Ok(files)
}

fn file_key(p: &Partition, tag: &str) -> String {
    format!("{}/{tag}-{}.parquet", p.dir(), crate::layout::unique())
}
