// SPDX-License-Identifier: Apache-2.0
//! The tools `ingero mcp` offers an assistant: each maps onto a command that
//! exists (stragglers, report, sql) or onto what the store already knows
//! (targets seen, table schemas). Failures are tool errors the assistant can
//! read and correct, never protocol errors or crashes.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::rows;
use crate::commands::{Failure, Since, SourceArgs, report, sql, stragglers};
use ingero_model::table::names::{CALL_WINDOWS, SCHED_WINDOWS};
use ingero_server::rank::detector::DetectorConfig;

/// What the server knows: where data comes from and the detector's tuning.
#[derive(Debug, Clone)]
pub(crate) struct Ingero {
    source: Arc<SourceArgs>,
    detector: DetectorConfig,
    max_rows: usize,
    tool_router: ToolRouter<Self>,
}

type ToolResult = Result<CallToolResult, String>;

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct StragglersParams {
    /// Only this job (as listed by list_targets kind=jobs). Omit for every job.
    pub job: Option<String>,
    /// History to rank over: a duration back from now (`10m`, `24h`) or an
    /// RFC 3339 time (`2026-11-21T06:00:00Z`). Omit for the live ranking
    /// (with --server; over a store it means the last hour).
    pub since: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ReportParams {
    /// The pod as NAMESPACE/NAME. Give exactly one of pod, node, pid.
    pub pod: Option<String>,
    /// A node name.
    pub node: Option<String>,
    /// A process id, as NODE:PID when several nodes are in the store.
    pub pid: Option<String>,
    /// How far back: `10m`, `24h` or an RFC 3339 time. Default `1h`.
    pub since: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SqlParams {
    /// One read-only statement (SELECT, WITH, EXPLAIN, SHOW, DESCRIBE) in
    /// DataFusion SQL. Filter on `window_start` (a UTC timestamp) to stay fast.
    pub query: String,
    /// Rows to return at most (default 200, at most the server's --max-rows).
    pub max_rows: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TargetKind {
    Jobs,
    Nodes,
    Pods,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ListParams {
    /// What to list: `jobs`, `nodes` or `pods`.
    pub kind: TargetKind,
    /// Seen since: `10m`, `24h` or an RFC 3339 time. Default `24h`.
    pub since: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SchemaParams {
    /// One table's columns; omit for every table.
    pub table: Option<String>,
}

fn since(arg: &Option<String>, default: &str) -> Result<Since, String> {
    Since::parse(arg.as_deref().unwrap_or(default)).map_err(|e| format!("since: {e}"))
}

fn failure(f: Failure) -> String {
    match f {
        Failure::Usage(m) => m,
        Failure::Run(e) => format!("{e:#}"),
        Failure::Interrupted => "interrupted".into(),
    }
}

#[tool_router]
impl Ingero {
    pub(crate) fn new(source: SourceArgs, detector: DetectorConfig, max_rows: usize) -> Ingero {
        Ingero { source: Arc::new(source), detector, max_rows, tool_router: Self::tool_router() }
    }

    #[tool(description = "Rank the nodes that slow their training job down (stragglers), most deviant first, \
        with each node's score, whether it is flagged, since when, and the signals that set it apart (run-queue \
        wait, off-CPU time, NCCL wait, copy time …) in words. Use this first for 'which node is slow', 'why is \
        job X slow', or to find what to report on next. A flagged node carries `cost`: GPU-hours its job has \
        lost to it (and USD where GPU-hour prices are set); with `since`, `episodes` lists every straggler \
        episode of the range with its cause and cost ('what did stragglers cost us this week'). Without \
        `since` it is the live ranking.")]
    async fn stragglers(&self, Parameters(p): Parameters<StragglersParams>) -> ToolResult {
        let since = p.since.as_deref().map(Since::parse).transpose().map_err(|e| format!("since: {e}"))?;
        let r = stragglers::fetch(&self.source, p.job, since, false, self.detector.clone()).await.map_err(failure)?;
        Ok(CallToolResult::structured(r))
    }

    #[tool(description = "Explain one pod's, node's or process's stalls as cause → effect → fix chains, with \
        severity, how much of the time each cause explains, the evidence, the call sites (file:line of the \
        Python/native code that stalled), the calls made per op (`ops`: count, `kind` such as launch or sync, \
        p50/p99; `seen_share` where the agent's trap budget estimated part of the count), the node's \
        straggler standing, noisy neighbours and events. Use it \
        after `stragglers` names a node, or when asked why a given pod/process is slow.")]
    async fn stall_report(&self, Parameters(p): Parameters<ReportParams>) -> ToolResult {
        let (kind, target) = match (&p.pod, &p.node, &p.pid) {
            (Some(t), None, None) => ("pod", t),
            (None, Some(t), None) => ("node", t),
            (None, None, Some(t)) => ("pid", t),
            _ => return Err("give exactly one of `pod` (NAMESPACE/NAME), `node` or `pid`".into()),
        };
        let since = since(&p.since, "1h")?;
        let rep = report::fetch(&self.source, kind, target, since, self.detector.clone()).await.map_err(failure)?;
        Ok(CallToolResult::structured(serde_json::to_value(rep).map_err(|e| e.to_string())?))
    }

    #[tool(description = "Run one read-only SQL query (DataFusion dialect) over the stored tables and get the \
        rows as JSON objects. Use it for questions the other tools do not answer; call `table_schema` first \
        for table and column names and units. Writes and DDL are refused; queries have a time and memory limit.")]
    async fn sql(&self, Parameters(p): Parameters<SqlParams>) -> ToolResult {
        let limit = p.max_rows.unwrap_or(200).clamp(1, self.max_rows);
        let batches = sql::batches(&self.source, &p.query).await.map_err(failure)?;
        Ok(CallToolResult::structured(rows::to_json(&batches, limit).map_err(|e| e.to_string())?))
    }

    #[tool(description = "List the jobs, nodes or pods seen in a time range, with how many nodes/pods each \
        has and when it was last seen. Use it to find the exact names the other tools take.")]
    async fn list_targets(&self, Parameters(p): Parameters<ListParams>) -> ToolResult {
        let start = since(&p.since, "24h")?.start_us();
        // Up to the ingest's clock-skew allowance ahead: a node whose clock runs
        // fast is still listed.
        let end = chrono::Utc::now().timestamp_micros() + 600_000_000;
        let t = ingero_analysis::query::time_predicate("window_start", start, end);
        let q = match p.kind {
            TargetKind::Jobs => format!(
                "SELECT job, count(DISTINCT node) AS nodes, count(DISTINCT namespace || '/' || pod) AS pods, \
                 max(window_start) AS last_seen FROM {CALL_WINDOWS} WHERE job IS NOT NULL AND {t} \
                 GROUP BY job ORDER BY job"
            ),
            TargetKind::Nodes => format!(
                "SELECT node, count(DISTINCT job) AS jobs, count(DISTINCT namespace || '/' || pod) AS pods, \
                 max(window_start) AS last_seen FROM (SELECT node, job, namespace, pod, window_start \
                 FROM {CALL_WINDOWS} WHERE {t} UNION ALL SELECT node, job, namespace, pod, window_start \
                 FROM {SCHED_WINDOWS} WHERE {t}) GROUP BY node ORDER BY node"
            ),
            TargetKind::Pods => format!(
                "SELECT namespace || '/' || pod AS pod, min(node) AS node, min(job) AS job, \
                 max(window_start) AS last_seen FROM (SELECT node, job, namespace, pod, window_start \
                 FROM {CALL_WINDOWS} WHERE pod IS NOT NULL AND {t} UNION ALL SELECT node, job, namespace, pod, \
                 window_start FROM {SCHED_WINDOWS} WHERE pod IS NOT NULL AND {t}) GROUP BY namespace, pod \
                 ORDER BY pod"
            ),
        };
        let batches = sql::batches(&self.source, &q).await.map_err(failure)?;
        Ok(CallToolResult::structured(rows::to_json(&batches, self.max_rows).map_err(|e| e.to_string())?))
    }

    #[tool(description = "The tables `sql` can query: every column's name, Arrow type, nullability, unit and \
        meaning. Call it before writing SQL.")]
    async fn table_schema(&self, Parameters(p): Parameters<SchemaParams>) -> ToolResult {
        let all = super::schema::tables();
        match p.table {
            None => Ok(CallToolResult::structured(json!({ "tables": all }))),
            Some(name) => {
                let found: Vec<&Value> = all.iter().filter(|t| t["name"] == name.as_str()).collect();
                match found.first() {
                    Some(t) => Ok(CallToolResult::structured((*t).clone())),
                    None => {
                        let names: Vec<&str> = all.iter().filter_map(|t| t["name"].as_str()).collect();
                        Err(format!("no table `{name}`; the tables are: {}", names.join(", ")))
                    }
                }
            }
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Ingero {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "Ingero traces CUDA/NCCL calls and the Linux scheduler on GPU nodes and finds where paid GPU time \
             leaks. Start with `stragglers` (which nodes slow their job), then `stall_report` on a node or pod \
             (cause → effect → fix). `list_targets` gives exact names; `table_schema` and `sql` answer the rest.",
        )
    }
}
