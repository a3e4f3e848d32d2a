// SPDX-License-Identifier: Apache-2.0
//! DataFusion over the store's Delta tables (each at its snapshot): read-only SQL with a timeout and a
//! memory limit, and the time-pruned scans the history commands use.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::DataType;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SQLOptions, SessionConfig, SessionContext};
use futures::TryStreamExt;
use ingero_model::Table;
use object_store::local::LocalFileSystem;
use url::Url;

pub(crate) mod columns;
mod lazy;
mod repair;
pub mod service;
mod stored;

use crate::error::{Error, Result};
use ingero_store::Store;
use ingero_store::delta::visible::Visible;
use ingero_store::state::{BATCHES_TABLE, batches_schema};
use ingero_store::tiers::{self, Tier};

#[derive(Debug, Clone)]
pub struct QueryLimits {
    pub timeout: Duration,
    pub memory_bytes: usize,
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits { timeout: Duration::from_secs(60), memory_bytes: 2 << 30 }
    }
}

pub struct QueryEngine {
    ctx: SessionContext,
    limits: QueryLimits,
    store: Store,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").field("limits", &self.limits).finish_non_exhaustive()
    }
}

impl QueryEngine {
    /// Registers every table of the store; a table's snapshot is read when a
    /// query first scans it (a table with no files yet is empty).
    pub async fn open(store: &Store, limits: QueryLimits) -> Result<QueryEngine> {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(limits.memory_bytes, 1.0)
            .build_arc()
            .map_err(|e| Error::Engine(e.to_string()))?;
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_parquet_pruning(true)
            .with_collect_statistics(false);
        let ctx = session(config, runtime);
        // Each table lists its Delta snapshot's live files, nothing else,
        // read when a query first scans it.
        let (visible, base, key_of) = match &store.local_dir {
            Some(dir) => {
                let visible = Arc::new(Visible::new(Arc::new(LocalFileSystem::new())));
                ctx.register_object_store(&Url::parse("file://").expect("static URL"), visible.clone());
                let bad = || Error::Engine(format!("bad store dir {}", dir.display()));
                let root = object_store::path::Path::from_absolute_path(dir).map_err(|_| bad())?;
                let base = Url::from_directory_path(dir).map_err(|_| bad())?;
                let dir = dir.clone();
                let key_of: lazy::KeyOf = Arc::new(move |k: &str| {
                    // Plain keys (all this store writes) join as they are; others
                    // take the file system's encoding.
                    object_store::path::Path::parse(format!("{root}/{k}"))
                        .or_else(|_| object_store::path::Path::from_absolute_path(dir.join(k)))
                        .map_err(|e| e.to_string())
                });
                (visible, base, key_of)
            }
            None => {
                let u = Url::parse(store.url.as_str()).map_err(|e| Error::Engine(e.to_string()))?;
                let root = Url::parse(&format!("{}://{}", u.scheme(), u.host_str().unwrap_or_default()))
                    .map_err(|e| Error::Engine(e.to_string()))?;
                let visible = Arc::new(Visible::new(store.object_store.clone()));
                ctx.register_object_store(&root, visible.clone());
                let mut s = u.to_string();
                if !s.ends_with('/') {
                    s.push('/');
                }
                let st = store.clone();
                let key_of: lazy::KeyOf = Arc::new(move |k: &str| Ok(st.key(k)));
                (visible, Url::parse(&s).map_err(|e| Error::Engine(e.to_string()))?, key_of)
            }
        };
        let names = Table::ALL
            .iter()
            .map(|t| (t.name(), t.schema()))
            .chain(Tier::ALL.iter().map(|t| (t.name(), tiers::schema())))
            .chain([(BATCHES_TABLE, batches_schema())]);
        for (name, schema) in names {
            let listing = listing(&base, name, schema)?;
            let t = lazy::LazyTable::new(name, store, listing, visible.clone(), key_of.clone());
            ctx.register_table(name, Arc::new(t)).map_err(|e| Error::Engine(e.to_string()))?;
        }
        Ok(QueryEngine { ctx, limits, store: store.clone() })
    }

    /// The store the engine reads (history ranking reads the signal tiers directly).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Runs one read-only query; DDL, DML (INSERT, COPY … TO, …) and
    /// statements (SET, …) are refused before planning touches anything.
    pub async fn sql(&self, query: &str) -> Result<Vec<RecordBatch>> {
        check_read_only(query)?;
        let opts = SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(false);
        let run = async {
            let df =
                self.ctx.sql_with_options(query, opts).await.map_err(|e| Error::BadQuery(refusal(e.to_string())))?;
            df.execute_stream()
                .await
                .map_err(|e| Error::BadQuery(e.to_string()))?
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| Error::BadQuery(e.to_string()))
        };
        tokio::time::timeout(self.limits.timeout, run).await.map_err(|_| Error::QueryTimeout(self.limits.timeout))?
    }
}

/// A session with DataFusion's default rules and the repairs this product
/// adds to them (`repair.rs`).
fn session(config: SessionConfig, runtime: Arc<RuntimeEnv>) -> SessionContext {
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_default_features()
        .with_physical_optimizer_rule(Arc::new(repair::RepairLimits))
        .build();
    SessionContext::new_with_state(state)
}

/// One hive-partitioned table over its directory.
fn listing(base: &Url, name: &str, schema: arrow::datatypes::SchemaRef) -> Result<Arc<ListingTable>> {
    let eng = |e: datafusion::error::DataFusionError| Error::Engine(e.to_string());
    let url = base.join(&format!("{name}/")).map_err(|e| Error::Engine(e.to_string()))?;
    let url = ListingTableUrl::parse(url).map_err(eng)?;
    let opts = ListingOptions::new(Arc::new(ParquetFormat::default()))
        .with_file_extension(".parquet")
        .with_table_partition_cols(vec![("date".into(), DataType::Utf8), ("hour".into(), DataType::Utf8)]);
    let cfg = ListingTableConfig::new(url)
        .with_listing_options(opts)
        .with_schema(schema)
        .with_expr_adapter_factory(Arc::new(stored::StoredTypes));
    Ok(Arc::new(ListingTable::try_new(cfg).map_err(eng)?))
}

fn refusal(msg: String) -> String {
    if msg.contains("not supported") || msg.contains("DDL") || msg.contains("DML") {
        format!("refused: the store is read-only; only SELECT queries run ({msg})")
    } else {
        msg
    }
}

/// A clear refusal for anything that is not a query.
pub fn check_read_only(query: &str) -> Result<()> {
    let first =
        query.split(|c: char| c.is_whitespace() || c == '(').find(|w| !w.is_empty()).unwrap_or("").to_ascii_uppercase();
    match first.as_str() {
        "SELECT" | "WITH" | "VALUES" | "EXPLAIN" | "SHOW" | "DESCRIBE" => Ok(()),
        "" => Err(Error::BadQuery("empty query".into())),
        other => Err(Error::BadQuery(format!(
            "refused: `{other}` is not a query; ingero sql is read-only (SELECT, WITH, EXPLAIN, SHOW, DESCRIBE)"
        ))),
    }
}

/// A string as an SQL literal.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// SQL predicates over `call_windows` matching `signals::is_blocking_copy`
/// and `signals::is_device_wait`: (blocking copy, device wait).
pub(crate) fn wait_predicates() -> (String, String) {
    let copies: Vec<String> = crate::rank::signals::BLOCKING_COPIES.iter().map(|o| quote(o)).collect();
    let copy = format!("op IN ({})", copies.join(", "));
    let wait = format!(
        "op LIKE '%Synchronize%' OR {copy} OR (library = 'nccl' AND op NOT IN ('ncclGroupStart', 'ncclGroupEnd') AND op NOT LIKE 'ncclComm%')"
    );
    (copy, wait)
}

/// SQL predicate over `call_windows` matching `signals::is_launch`: every
/// launch entry point, runtime or driver (a launch reached only at the
/// driver, through a runtime linked into NCCL or cuBLAS, is a launch).
pub(crate) fn launch_predicate() -> String {
    let like: Vec<String> =
        crate::rank::signals::LAUNCH_PREFIXES.iter().map(|p| format!("op LIKE {}", quote(&format!("{p}%")))).collect();
    format!("({})", like.join(" OR "))
}

/// SQL predicate selecting rows whose `col` lies in [start, end), with the
/// hive partition columns constrained too so whole hours are pruned unread.
pub fn time_predicate(col: &str, start_us: i64, end_us: i64) -> String {
    let day = |us: i64| chrono::DateTime::from_timestamp_micros(us).unwrap_or_default();
    let (s, e) = (day(start_us), day(end_us));
    let (sd, sh) = (s.format("%Y-%m-%d").to_string(), s.format("%H").to_string());
    let (ed, eh) = (e.format("%Y-%m-%d").to_string(), e.format("%H").to_string());
    format!(
        "{col} >= to_timestamp_micros({start_us}) AND {col} < to_timestamp_micros({end_us}) \
         AND (date > '{sd}' OR (date = '{sd}' AND hour >= '{sh}')) \
         AND (date < '{ed}' OR (date = '{ed}' AND hour <= '{eh}'))"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::signals::{is_blocking_copy, is_device_wait, is_launch};
    use datafusion::arrow::array::AsArray;
    use datafusion::prelude::SessionContext;

    /// Every predicate, run by the query engine over every op the agent can
    /// ship, selects exactly what the live detector's classifier selects.
    #[tokio::test]
    async fn sql_predicates_select_what_the_classifiers_select() {
        let ops = [
            ("cudart", "cudaLaunchKernel"),
            ("cudart", "cudaLaunchKernel_ptsz"),
            ("cudart", "cudaLaunchKernelExC"),
            ("cudart", "cudaGraphLaunch_ptsz"),
            ("cudart", "cudaLaunchCooperativeKernel"),
            ("cuda", "cuLaunchKernel"),
            ("cuda", "cuLaunchKernelEx_ptsz"),
            ("cuda", "cuGraphLaunch"),
            ("cuda", "cuLaunchCooperativeKernel_ptsz"),
            ("cudart", "cudaMemcpy"),
            ("cudart", "cudaMemcpyAsync"),
            ("cuda", "cuMemcpyDtoH_v2_ptds"),
            ("cuda", "cuMemcpyDtoHAsync_v2"),
            ("cudart", "cudaStreamSynchronize"),
            ("cuda", "cuEventSynchronize"),
            ("cudart", "cudaEventRecord"),
            ("cudart", "cudaMemsetAsync"),
            ("nccl", "ncclAllReduce"),
            ("nccl", "ncclGroupEnd"),
            ("nccl", "ncclCommInitRankConfig"),
        ];
        let rows: Vec<String> = ops.iter().map(|(l, o)| format!("({}, {})", quote(l), quote(o))).collect();
        let ctx = SessionContext::new();
        let (copy, wait) = wait_predicates();
        for (name, pred, rust) in [
            ("launch", launch_predicate(), &(|_: &str, o: &str| is_launch(o)) as &dyn Fn(&str, &str) -> bool),
            ("copy", copy, &|_: &str, o: &str| is_blocking_copy(o)),
            ("wait", wait, &|l: &str, o: &str| is_device_wait(l, o)),
        ] {
            let sql = format!(
                "SELECT op FROM (VALUES {}) AS call_windows(library, op) WHERE {pred} ORDER BY op",
                rows.join(", ")
            );
            let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
            let got: Vec<String> = batches
                .iter()
                .flat_map(|b| b.column(0).as_string::<i32>().iter().flatten().map(String::from))
                .collect();
            let mut want: Vec<String> = ops.iter().filter(|(l, o)| rust(l, o)).map(|(_, o)| o.to_string()).collect();
            want.sort();
            assert_eq!(got, want, "{name}: {pred}");
            assert!(!want.is_empty(), "{name} selects something");
        }
    }

    #[test]
    fn only_queries_pass_the_read_only_check() {
        for ok in ["SELECT 1", "  with x as (select 1) select * from x", "EXPLAIN SELECT 1", "(SELECT 1)"] {
            assert!(check_read_only(ok).is_ok(), "{ok}");
        }
        for bad in [
            "DROP TABLE call_windows",
            "insert into t values (1)",
            "COPY call_windows TO '/tmp/x'",
            "CREATE EXTERNAL TABLE x",
            "SET x = 1",
            "",
        ] {
            let e = check_read_only(bad).unwrap_err().to_string();
            assert!(e.contains("refused") || e.contains("empty"), "{bad}: {e}");
        }
    }
}
