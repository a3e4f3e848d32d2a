// SPDX-License-Identifier: Apache-2.0
//! Hung ranks over history. Where a signal tier row says a call had been in
//! flight for at least `--stuck-after` (its `in_call_age_ns`), the
//! processes of that job's bin are read from `progress_windows`, each as it
//! stood at the end of the bin, so the replayed detector judges them as the
//! live one judged each window (`stuck`). Where no call waited that long,
//! nothing more is read.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use arrow::datatypes::{Int64Type, UInt32Type};

use super::signals::DEFAULT_JOB;
use super::stuck::ProcProgress;
use crate::error::Result;
use crate::query::columns::Columns;
use crate::query::{QueryEngine, quote, time_predicate};
use crate::report::hang::{PROC_COLUMNS, procs_of};
use ingero_model::table::names::PROGRESS_WINDOWS;

/// (job, node, bin start) → the node's processes at the end of that bin.
pub(super) type Procs = HashMap<(String, String, i64), Vec<ProcProgress>>;

/// The processes of every job-bin in `wanted` ((job, bin start) pairs).
pub(super) async fn procs(engine: &QueryEngine, wanted: &BTreeSet<(String, i64)>, bin_us: i64) -> Result<Procs> {
    let job = format!("COALESCE(job, {})", quote(DEFAULT_JOB));
    let ranges: Vec<String> = runs(wanted, bin_us)
        .into_iter()
        .map(|(j, lo, hi)| format!("({job} = {} AND {})", quote(&j), time_predicate("window_start", lo, hi)))
        .collect();
    if ranges.is_empty() {
        return Ok(Procs::new());
    }
    let sql = format!(
        "SELECT {job} AS job, node, CAST(window_start AS BIGINT) AS t, {PROC_COLUMNS} FROM {PROGRESS_WINDOWS} WHERE {}",
        ranges.join(" OR ")
    );
    // Per (job, node, bin, pid): the newest row of the bin.
    let mut latest: HashMap<(String, String, i64, u32), (i64, ProcProgress)> = HashMap::new();
    for b in engine.sql(&sql).await? {
        let (jobs, nodes, t) = (b.strings("job")?, b.strings("node")?, b.primitives::<Int64Type>("t")?);
        let pid = b.primitives::<UInt32Type>("pid")?;
        for (i, p) in procs_of(&b)?.into_iter().enumerate() {
            let (w, bin) = (t.value(i), t.value(i).div_euclid(bin_us) * bin_us);
            let key = (jobs.value(i).to_string(), nodes.value(i).to_string(), bin, pid.value(i));
            match latest.get_mut(&key) {
                Some(e) if e.0 >= w => {}
                Some(e) => *e = (w, p),
                None => {
                    latest.insert(key, (w, p));
                }
            }
        }
    }
    let mut out = Procs::new();
    for ((job, node, bin, _), (_, p)) in latest {
        out.entry((job, node, bin)).or_default().push(p);
    }
    for procs in out.values_mut() {
        procs.sort_by_key(|p| p.pid);
    }
    Ok(out)
}

/// Each job's wanted bins as runs of consecutive bins: (job, start, end).
fn runs(wanted: &BTreeSet<(String, i64)>, bin_us: i64) -> Vec<(String, i64, i64)> {
    let mut by_job: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for (job, bin) in wanted {
        let runs = by_job.entry(job).or_default();
        match runs.last_mut() {
            Some(r) if r.1 == *bin => r.1 = bin + bin_us,
            _ => runs.push((*bin, bin + bin_us)),
        }
    }
    by_job.into_iter().flat_map(|(j, rs)| rs.into_iter().map(move |(lo, hi)| (j.to_string(), lo, hi))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_bins_of_a_job_are_read_as_one_range() {
        let wanted: BTreeSet<(String, i64)> =
            [("a", 10), ("a", 20), ("a", 30), ("a", 60), ("b", 20)].map(|(j, b)| (j.to_string(), b)).into();
        assert_eq!(
            runs(&wanted, 10),
            [("a".to_string(), 10, 40), ("a".to_string(), 60, 70), ("b".to_string(), 20, 30)]
        );
    }
}
