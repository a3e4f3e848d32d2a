// SPDX-License-Identifier: Apache-2.0
//! Which GPUs the nodes of a history ranking had, so its episodes are priced
//! as the live ranking prices them. Read from `node_windows` around each
//! episode's start only (two minutes each, at most [`MAX_RANGES`]): a
//! week's node windows are hundreds of millions of rows, an episode's
//! nodes all report in its first minutes.

use std::collections::{BTreeSet, HashMap};

use arrow::array::Array;
use arrow::datatypes::UInt32Type;

use super::detector::Detector;
use super::signals::Host;
use crate::query::columns::Columns;
use crate::query::{QueryEngine, time_predicate};
use ingero_model::table::names::NODE_WINDOWS;

/// Episode starts looked at; later ones fall back to `--gpus-per-node`.
const MAX_RANGES: usize = 64;
const SPAN_US: i64 = 120_000_000;

/// Tells `det` the GPUs of the nodes around its episodes. A store without
/// `node_windows` (or an engine error) leaves the defaults: a ranking is
/// not refused for want of a price.
pub(crate) async fn learn(engine: &QueryEngine, det: &mut Detector) {
    let starts: BTreeSet<i64> =
        det.episodes().iter().map(|e| e.start_us.div_euclid(60_000_000) * 60_000_000).take(MAX_RANGES).collect();
    if starts.is_empty() {
        return;
    }
    let ranges: Vec<String> =
        starts.iter().map(|&s| format!("({})", time_predicate("window_start", s, s + SPAN_US))).collect();
    let sql = format!(
        "SELECT node, MAX(gpu_model) AS gpu_model, MAX(gpu_count) AS gpu_count FROM {NODE_WINDOWS} \
         WHERE ({}) AND (gpu_model IS NOT NULL OR gpu_count IS NOT NULL) GROUP BY node",
        ranges.join(" OR ")
    );
    match engine.sql(&sql).await {
        Ok(batches) => det.set_hosts(read(&batches)),
        Err(e) => tracing::debug!(error = %e, "no GPU facts for pricing; --gpus-per-node assumed"),
    }
}

fn read(batches: &[arrow::array::RecordBatch]) -> HashMap<String, Host> {
    let mut out = HashMap::new();
    for b in batches {
        let (Ok(node), Ok(model), Ok(count)) =
            (b.strings("node"), b.strings("gpu_model"), b.primitives::<UInt32Type>("gpu_count"))
        else {
            continue;
        };
        for i in 0..b.num_rows() {
            let gpu_model = model.is_valid(i).then(|| model.value(i).to_string());
            let gpus = count.is_valid(i).then(|| count.value(i));
            out.insert(node.value(i).to_string(), Host { gpu_model, gpus });
        }
    }
    out
}
