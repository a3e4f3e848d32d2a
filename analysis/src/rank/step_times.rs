// SPDX-License-Identifier: Apache-2.0
//! Step times over history: for the jobs a ranking lists, each node's
//! median step time over the range from `progress_windows` (the steps the
//! agents found), and its job's median over its nodes, as the live
//! detector keeps them (`ingero_server::rank::steps`). Read only for the
//! jobs listed, so a ranking that lists none reads nothing.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::Array;
use arrow::datatypes::{Float64Type, Int64Type};

use super::signals::DEFAULT_JOB;
use crate::error::Result;
use crate::query::columns::Columns;
use crate::query::{QueryEngine, quote, time_predicate};
use ingero_model::table::names::PROGRESS_WINDOWS;
use ingero_server::rank::Ranking;
use ingero_server::rank::steps::{SHIFT_LOOKBACK_US, StepTime, median, shift};

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
    let paces = paces(engine, &by_job, start_us, end_us).await?;
    for s in &mut r.stragglers {
        let Some(nodes) = by_job.get(&s.job) else { continue };
        let job_ns = median(nodes.values().copied().collect());
        let shift = s.since_us.zip(paces.get(&s.job)).and_then(|(t, p)| shift(p, t));
        s.step = nodes
            .get(&s.node)
            .zip(job_ns)
            .and_then(|(&n, j)| Some(StepTime::new(n as f64, j as f64)?.with_shift(shift)));
    }
    Ok(())
}

/// Each job's step time per window (the median of its nodes'), from the
/// lookback before the range on: what a deviation's start is compared with.
async fn paces(
    engine: &QueryEngine,
    jobs: &BTreeMap<String, BTreeMap<String, u64>>,
    start_us: i64,
    end_us: i64,
) -> Result<BTreeMap<String, Vec<(i64, u64)>>> {
    let mut out: BTreeMap<String, Vec<(i64, u64)>> = BTreeMap::new();
    if jobs.is_empty() {
        return Ok(out);
    }
    let job = format!("COALESCE(job, {})", quote(DEFAULT_JOB));
    let list = jobs.keys().map(|j| quote(j)).collect::<Vec<_>>().join(", ");
    let sql = format!(
        "SELECT job, t, CAST(median(p50) AS DOUBLE) AS p50 FROM (SELECT {job} AS job, node, \
         CAST(window_start AS BIGINT) AS t, median(step_p50_ns) AS p50 FROM {PROGRESS_WINDOWS} \
         WHERE step_p50_ns IS NOT NULL AND {job} IN ({list}) AND {} GROUP BY 1, 2, 3) GROUP BY 1, 2",
        time_predicate("window_start", start_us.saturating_sub(SHIFT_LOOKBACK_US), end_us)
    );
    for b in engine.sql(&sql).await? {
        let (j, t, p) = (b.strings("job")?, b.primitives::<Int64Type>("t")?, b.primitives::<Float64Type>("p50")?);
        for i in (0..b.num_rows()).filter(|&i| p.is_valid(i)) {
            out.entry(j.value(i).to_string()).or_default().push((t.value(i), p.value(i) as u64));
        }
    }
    Ok(out)
}
