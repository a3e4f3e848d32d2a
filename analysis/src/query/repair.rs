// SPDX-License-Identifier: Apache-2.0
//! Physical-plan repairs for two wrong-result bugs of DataFusion 55.2 (the
//! newest release) that users' own SQL hits (`ingero sql`, the MCP server).
//! Each only removes a row limit that an operator above still applies, so it
//! can cost speed, never an answer. Remove them when a DataFusion release
//! carries the fixes (the tests below keep passing).
//!
//! 1. `SELECT DISTINCT node FROM … ORDER BY node LIMIT 10` returned fewer
//!    rows than exist: sort pushdown moves the final TopK's limit below the
//!    final stage of a two-stage aggregation (apache/datafusion#24927, fixed
//!    by #24932). Between the stages a key still appears once per partition,
//!    so a limit there counts rows, not groups, and duplicates push out keys
//!    of the answer. No correct plan limits rows between the two stages of
//!    one aggregation (a user's own inner `LIMIT` lies below the partial
//!    stage or above the final).
//! 2. `SELECT x, COUNT(*) OVER () FROM (SELECT DISTINCT x …) ORDER BY x
//!    LIMIT 3` counted 3: the TopK-aggregation rule walks from a TopK down
//!    through a window function (it keeps the row count) and limits the
//!    aggregation below it to 3 groups, so the window sees 3 rows. A window
//!    reads every row of its partition: no aggregation between a window and
//!    the nearest limiting operator below it may stop early.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};

/// Runs after DataFusion's own rules.
#[derive(Debug, Default)]
pub(crate) struct RepairLimits;

impl PhysicalOptimizerRule for RepairLimits {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            if node.downcast_ref::<WindowAggExec>().is_some() || node.downcast_ref::<BoundedWindowAggExec>().is_some() {
                return under_window(node);
            }
            let Some(agg) = node.downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            if !matches!(agg.mode(), AggregateMode::Final | AggregateMode::FinalPartitioned) {
                return Ok(Transformed::no(node));
            }
            if !reaches_partial(agg.input()) {
                return Ok(Transformed::no(node));
            }
            match unlimited(agg.input())? {
                Some(input) => Ok(Transformed::yes(node.clone().replace_children(vec![input], recompute())?)),
                None => Ok(Transformed::no(node)),
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "ingero_repair_limits"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A window's input with no aggregation stopping early above the nearest
/// limiting operator (repair 2); the window's children are visited next.
fn under_window(window: Arc<dyn ExecutionPlan>) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    let [input] = window.children()[..] else { return Ok(Transformed::no(window)) };
    let freed = input.clone().transform_down(|p| {
        let limits = p.fetch().is_some()
            || p.downcast_ref::<GlobalLimitExec>().is_some()
            || p.downcast_ref::<LocalLimitExec>().is_some();
        if limits {
            return Ok(Transformed::new(p, false, TreeNodeRecursion::Jump));
        }
        match p.downcast_ref::<AggregateExec>() {
            Some(a) if a.limit_options().is_some() => Ok(Transformed::yes(Arc::new(a.with_new_limit_options(None)))),
            _ => Ok(Transformed::no(p)),
        }
    })?;
    if !freed.transformed {
        return Ok(Transformed::no(window));
    }
    Ok(Transformed::yes(window.replace_children(vec![freed.data], recompute())?))
}

/// `plan`, which `reaches_partial`, without the limits of the operators
/// that only move or order rows down to the partial aggregation; None when
/// there is none to drop.
fn unlimited(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if !moves_rows(plan) {
        return Ok(None); // the partial aggregation
    }
    let [child] = plan.children()[..] else { return Ok(None) };
    let below = unlimited(child)?;
    if plan.fetch().is_none() && below.is_none() {
        return Ok(None);
    }
    let mut out = match below {
        Some(b) => plan.clone().replace_children(vec![b], recompute())?,
        None => plan.clone(),
    };
    if out.fetch().is_some() {
        // Each of these operators takes None (a plan that did not would stay as it was).
        out = out.with_fetch(None).unwrap_or(out);
    }
    Ok(Some(out))
}

fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

/// Whether `plan` is a partial aggregation, or leads to one through
/// operators that only move or order rows.
fn reaches_partial(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if let Some(a) = plan.downcast_ref::<AggregateExec>() {
        return *a.mode() == AggregateMode::Partial;
    }
    match plan.children()[..] {
        [child] if moves_rows(plan) => reaches_partial(child),
        _ => false,
    }
}

/// The operators found between two aggregation stages: they move or order
/// rows, each one row out per row in (unless limited).
fn moves_rows(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<SortExec>().is_some()
        || plan.downcast_ref::<SortPreservingMergeExec>().is_some()
        || plan.downcast_ref::<CoalescePartitionsExec>().is_some()
        || plan.downcast_ref::<RepartitionExec>().is_some()
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, RecordBatch};
    use arrow::datatypes::Int64Type;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::prelude::SessionConfig;

    /// apache/datafusion#24927's reproduction: three distinct values, each
    /// three times, over an input the planner knows is sorted.
    const DISTINCT_TOP: &str = "WITH s(x) AS (VALUES (0), (1), (2) ORDER BY 1 LIMIT 3), \
        t AS (SELECT * FROM s UNION ALL SELECT * FROM s UNION ALL SELECT * FROM s) \
        SELECT DISTINCT x FROM t ORDER BY x LIMIT 3";
    /// Eight values, 0 to 7, in no order.
    const EIGHT: &str = "WITH s(x) AS (VALUES (5), (1), (4), (2), (3), (0), (7), (6), (1), (5)) ";

    /// Each row's Int64 columns, through the engine's session.
    async fn run(partitions: usize, sql: &str) -> Vec<Vec<i64>> {
        let config = SessionConfig::new().with_target_partitions(partitions);
        let ctx = super::super::session(config, RuntimeEnvBuilder::new().build_arc().unwrap());
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().create_physical_plan().await.unwrap();
        let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string();
        let batches: Vec<RecordBatch> = df.collect().await.unwrap();
        let mut rows = Vec::new();
        for b in &batches {
            let int = |c| arrow::compute::cast(c, &arrow::datatypes::DataType::Int64).unwrap();
            let cols: Vec<_> = b.columns().iter().map(|c| int(c).as_primitive::<Int64Type>().clone()).collect();
            rows.extend((0..b.num_rows()).map(|i| cols.iter().map(|c| c.value(i)).collect()));
        }
        println!("{sql}\n{shown}{rows:?}");
        rows
    }

    fn firsts(rows: &[Vec<i64>]) -> Vec<i64> {
        rows.iter().map(|r| r[0]).collect()
    }

    #[tokio::test]
    async fn distinct_order_by_limit_returns_every_row() {
        for partitions in [2, 3, 4, 8] {
            assert_eq!(firsts(&run(partitions, DISTINCT_TOP).await), [0, 1, 2], "{partitions} partitions");
        }
    }

    #[tokio::test]
    async fn a_window_over_an_aggregation_sees_every_group() {
        for partitions in [1, 2, 4] {
            let count =
                format!("{EIGHT} SELECT x, COUNT(*) OVER () FROM (SELECT DISTINCT x FROM s) ORDER BY x LIMIT 3");
            assert_eq!(run(partitions, &count).await, [[0, 8], [1, 8], [2, 8]], "{partitions} partitions");
            let sum = format!("{EIGHT} SELECT x, SUM(x) OVER () FROM (SELECT x FROM s GROUP BY x) ORDER BY x LIMIT 2");
            assert_eq!(run(partitions, &sum).await, [[0, 28], [1, 28]], "{partitions} partitions");
            let rank = format!(
                "{EIGHT} SELECT x, ROW_NUMBER() OVER (ORDER BY x DESC) FROM (SELECT DISTINCT x FROM s) \
                 ORDER BY x LIMIT 3"
            );
            assert_eq!(run(partitions, &rank).await, [[0, 8], [1, 7], [2, 6]], "{partitions} partitions");
            let top = format!(
                "{EIGHT} SELECT m, COUNT(*) OVER () FROM (SELECT x % 4 AS g, MAX(x) AS m FROM s GROUP BY x % 4) \
                 ORDER BY m DESC LIMIT 2"
            );
            assert_eq!(run(partitions, &top).await, [[7, 4], [6, 4]], "{partitions} partitions");
        }
    }

    #[tokio::test]
    async fn a_users_own_limits_still_apply() {
        // An inner ORDER BY … LIMIT lies below the partial stage: kept.
        let sql = format!(
            "{EIGHT}, t AS (SELECT x FROM s ORDER BY x LIMIT 2) \
             SELECT DISTINCT x FROM (SELECT * FROM t UNION ALL SELECT * FROM t) ORDER BY x LIMIT 3"
        );
        assert_eq!(firsts(&run(2, &sql).await), [0, 1]);
        let grouped = format!("{EIGHT} SELECT x FROM s GROUP BY x ORDER BY x DESC LIMIT 2");
        assert_eq!(firsts(&run(2, &grouped).await), [7, 6]);
        // Below a window, a limit of the user's own is the window's input.
        let window = format!(
            "{EIGHT} SELECT x, COUNT(*) OVER () FROM (SELECT DISTINCT x FROM s ORDER BY x DESC LIMIT 3) ORDER BY x"
        );
        assert_eq!(run(2, &window).await, [[5, 3], [6, 3], [7, 3]]);
    }
}
