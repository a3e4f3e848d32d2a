// SPDX-License-Identifier: Apache-2.0
//! Step times over history: for the jobs a ranking lists, each node's
//! median step time over the range from `progress_windows` (the steps the
//! agents found), and its job's median over its nodes, as the live
//! detector keeps them (`ingero_server::rank::steps`). Read only for the
//! jobs listed, so a ranking that lists none reads nothing.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::Array;
use arrow::datatypes::Float64Type;

use super::signals::DEFAULT_JOB;
use crate::error::Result;
use crate::query::columns::Columns;
use crate::query::{QueryEngine, quote, time_predicate};
use ingero_model::table::names::PROGRESS_WINDOWS;
use ingero_server::rank::Ranking;
use ingero_server::rank::steps::{StepTime, median};

/// Fills each listed standing's step time.
pub(super) async fn attach(engine: &QueryEngine, r: &mut Ranking, start_us: i64, end_us: i64) -> Result<()> {
    let jobs: BTreeSet<&str> = r.stragglers.iter().map(|s| s.job.as_str()).collect();
    if jobs.is_empty() {
        return Ok(());
    }
    let job = format!("COALESCE(job, {})", quote(DEFAULT_JOB));
    let list = jobs.iter().map(|j| quote(j)).collect::<Vec<_>>().join(", ");
    let sql = format!(
        "SELECT {job} AS job, node, CAST(median(step_p50_ns) AS DOUBLE) AS p50 FROM {PROGRESS_WINDOWS} \
         WHERE step_p50_ns IS NOT NULL AND {job} IN ({list}) AND {} GROUP BY 1, 2",
        time_predicate("window_start", start_us, end_us)
    );
    let mut by_job: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for b in engine.sql(&sql).await? {
        let (j, n, p) = (b.strings("job")?, b.strings("node")?, b.primitives::<Float64Type>("p50")?);
        for i in (0..b.num_rows()).filter(|&i| p.is_valid(i)) {
            by_job.entry(j.value(i).to_string()).or_default().insert(n.value(i).to_string(), p.value(i) as u64);
        }
    }
    for s in &mut r.stragglers {
        let Some(nodes) = by_job.get(&s.job) else { continue };
        let job_ns = median(nodes.values().copied().collect());
        s.step = nodes.get(&s.node).zip(job_ns).and_then(|(&n, j)| StepTime::new(n as f64, j as f64));
    }
    Ok(())
}
