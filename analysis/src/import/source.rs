// SPDX-License-Identifier: Apache-2.0
//! Reading a trace recorded by the Go reference product (an SQLite file,
//! schema_info version ≤ 0.10), validated before anything is written.
//!
//! From 0.9 on, rows carry the node they were recorded on (`events.node`,
//! ids `{node}:{seq}`), and `ingero merge` puts several nodes in one file
//! (its process names and stacks shared, its minute aggregates dropped):
//! such a file is read as one part per node.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use crate::error::{Error, Result};

/// Newest schema this importer understands.
pub(crate) const MAX_VERSION: (u32, u32) = (0, 10);
const REQUIRED: [&str; 5] = ["events", "event_aggregates", "sources", "ops", "schema_info"];

/// Source ids of the reference product.
pub(crate) const CUDA: i64 = 1;
pub(crate) const HOST: i64 = 3;
pub(crate) const DRIVER: i64 = 4;
pub(crate) const IO: i64 = 5;

#[derive(Debug, Clone, Default)]
pub(crate) struct Session {
    pub started_ns: i64,
    pub stopped_ns: i64,
    pub gpu_model: String,
    pub gpu_driver: String,
    pub cpu_model: String,
    pub cpu_cores: u32,
    pub kernel: String,
    pub cuda_version: String,
    pub node: String,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct CgroupMeta {
    pub container_id: String,
    pub path: String,
    pub pod: String,
    pub namespace: String,
}

/// One minute bucket of the source's own counters.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Aggregate {
    pub bucket_ns: i64,
    pub source: i64,
    pub op: i64,
    pub pid: u32,
    pub count: u64,
    pub stored: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
    pub sum_arg0: u64,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Event {
    pub ts_ns: i64,
    pub pid: u32,
    pub tid: u32,
    pub source: i64,
    pub op: i64,
    pub dur_ns: u64,
    pub arg0: i64,
    /// process_fork: the child's pid.
    pub arg1: i64,
    pub ret: i64,
    pub cgroup_id: u64,
    /// 0.9+: the rank and world size the recorder knew.
    pub rank: Option<i32>,
    pub world_size: Option<i32>,
}

/// 0.10+ (`annotations`): a label set the user's job wrote (a training
/// step, an epoch), at an instant or over a span, for one process or
/// trace-wide (pid 0).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Annotation {
    /// The instant, or the span's start.
    pub ts_ns: i64,
    /// Span length; 0 for an instant.
    pub span_ns: i64,
    pub pid: u32,
    /// The labels as a JSON object of strings, keys sorted.
    pub labels: String,
}

/// Longest label set kept (the source caps labels at ingest; a file is still hostile input).
const MAX_LABELS_BYTES: usize = 4096;

/// The source product's own diagnosis.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub(crate) struct RefChain {
    pub id: String,
    pub detected_ns: i64,
    pub severity: String,
    pub summary: String,
    pub root_cause: String,
    pub explanation: String,
    pub recommendations: Vec<String>,
    pub cuda_op: String,
    pub p99_us: i64,
    pub p50_us: i64,
    pub tail_ratio: f64,
    /// 0.9+: the node that detected it ('' before).
    #[serde(default)]
    pub node: String,
}

#[derive(Debug)]
pub(crate) struct Trace {
    conn: Connection,
    pub path: String,
    pub version: String,
    pub session: Option<Session>,
    pub ops: HashMap<(i64, i64), String>,
    pub names: HashMap<u32, String>,
    pub cgroups: HashMap<u64, CgroupMeta>,
    pub aggregates: Vec<Aggregate>,
    pub chains: Vec<RefChain>,
    pub annotations: Vec<Annotation>,
    /// Annotation rows left out: labels not a JSON object of strings, or too long.
    pub bad_annotations: u64,
    pub events: u64,
    /// 0.9+: the nodes named in `events.node`, sorted; empty before.
    pub nodes: Vec<String>,
    columns: Columns,
}

/// Optional columns, by schema version.
#[derive(Debug, Default)]
struct Columns {
    node: bool,
    rank: bool,
    comm: bool,
}

/// What one node recorded: a whole pre-0.9 file, or one node of a 0.9+ file.
#[derive(Debug, Clone, Default)]
pub(crate) struct Part {
    /// The node the file names (None: the caller's --node).
    pub node: Option<String>,
    pub names: HashMap<u32, String>,
    pub aggregates: Vec<Aggregate>,
    pub chains: Vec<RefChain>,
    /// Trace-wide: a merged file's annotations name no node, so every node carries them.
    pub annotations: Vec<Annotation>,
    pub session: Option<Session>,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Import { path: path.display().to_string(), reason: reason.into() }
}

impl Trace {
    /// Opens read-only and checks integrity, tables and schema version.
    pub(crate) fn open(path: &Path) -> Result<Trace> {
        if !path.is_file() {
            return Err(bad(path, "no such file"));
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| bad(path, e.to_string()))?;
        let sq = |e: rusqlite::Error| {
            let m = e.to_string();
            if m.contains("not a database") {
                bad(path, "not an SQLite file (is it an Ingero trace?)")
            } else if m.contains("malformed") {
                bad(path, format!("corrupt or truncated SQLite file ({m})"))
            } else {
                bad(path, format!("unreadable: {m}"))
            }
        };
        let check: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(sq)?;
        if check != "ok" {
            return Err(bad(path, format!("corrupt or truncated SQLite file ({check})")));
        }
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(sq)?;
        let missing: Vec<&str> = REQUIRED.iter().copied().filter(|t| !tables.iter().any(|x| x == t)).collect();
        if !missing.is_empty() {
            return Err(bad(path, format!("not an Ingero trace: no table(s) {}", missing.join(", "))));
        }
        let version: String = conn
            .query_row("SELECT value FROM schema_info WHERE key = 'version'", [], |r| r.get(0))
            .map_err(|_| bad(path, "not an Ingero trace: schema_info has no version"))?;
        let parsed = version
            .split_once('.')
            .and_then(|(a, b)| Some((a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?)))
            .ok_or_else(|| bad(path, format!("unrecognised schema version `{version}`")))?;
        if parsed > MAX_VERSION {
            return Err(bad(
                path,
                format!(
                    "schema version {version} is newer than this importer understands ({}.{}); upgrade ingero",
                    MAX_VERSION.0, MAX_VERSION.1
                ),
            ));
        }
        let mut t = Trace {
            conn,
            path: path.display().to_string(),
            version,
            session: None,
            ops: HashMap::new(),
            names: HashMap::new(),
            cgroups: HashMap::new(),
            aggregates: Vec::new(),
            chains: Vec::new(),
            annotations: Vec::new(),
            bad_annotations: 0,
            events: 0,
            nodes: Vec::new(),
            columns: Columns::default(),
        };
        t.read_small(&tables).map_err(sq)?;
        Ok(t)
    }

    fn read_small(&mut self, tables: &[String]) -> rusqlite::Result<()> {
        let has = |n: &str| tables.iter().any(|t| t == n);
        let c = &self.conn;
        let cols = |t: &str| -> rusqlite::Result<Vec<String>> {
            c.prepare(&format!("PRAGMA table_info({t})"))?.query_map([], |r| r.get::<_, String>(1))?.collect()
        };
        let ev = cols("events")?;
        self.columns = Columns {
            node: ev.iter().any(|c| c == "node"),
            rank: ev.iter().any(|c| c == "rank") && ev.iter().any(|c| c == "world_size"),
            comm: ev.iter().any(|c| c == "comm"),
        };
        if self.columns.node {
            self.nodes = c
                .prepare("SELECT DISTINCT node FROM events WHERE node != '' ORDER BY node")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
        }
        self.ops = c
            .prepare("SELECT source_id, op_id, name FROM ops")?
            .query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        if has("process_names") {
            self.names = c
                .prepare("SELECT pid, name FROM process_names")?
                .query_map([], |r| Ok((r.get::<_, i64>(0)? as u32, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
        }
        if has("cgroup_metadata") {
            self.cgroups = c
                .prepare("SELECT cgroup_id, container_id, cgroup_path, pod_name, namespace FROM cgroup_metadata")?
                .query_map([], |r| {
                    Ok((
                        r.get::<_, i64>(0)? as u64,
                        CgroupMeta { container_id: r.get(1)?, path: r.get(2)?, pod: r.get(3)?, namespace: r.get(4)? },
                    ))
                })?
                .collect::<rusqlite::Result<_>>()?;
        }
        if has("sessions") {
            self.session = read_session(c, cols("sessions")?.iter().any(|c| c == "node"));
        }
        self.aggregates = read_aggregates(c)?;
        if has("causal_chains") {
            self.chains = read_chains(c, cols("causal_chains")?.iter().any(|c| c == "node"))?;
        }
        if has("annotations") {
            (self.annotations, self.bad_annotations) = read_annotations(c)?;
        }
        self.events = c.query_row("SELECT COUNT(*) FROM events", [], |r| r.get::<_, i64>(0))? as u64;
        Ok(())
    }

    /// 0.9+: rows carry their node.
    pub(crate) fn names_nodes(&self) -> bool {
        self.columns.node
    }

    /// One part per node the file names, or the whole file as one part.
    /// Minute aggregates carry no node: they are used only where the file
    /// holds one node (`ingero merge` drops them anyway).
    pub(crate) fn parts(&self) -> Result<Vec<Part>> {
        if self.nodes.is_empty() {
            let p = Part {
                node: None,
                names: self.names.clone(),
                aggregates: self.aggregates.clone(),
                chains: self.chains.clone(),
                annotations: self.annotations.clone(),
                session: self.session.clone(),
            };
            return Ok(vec![p]);
        }
        let single = self.nodes.len() == 1;
        let mut out = Vec::new();
        for n in &self.nodes {
            let mut names = self.names.clone();
            names.extend(self.comms(n)?);
            out.push(Part {
                node: Some(n.clone()),
                names,
                aggregates: if single { self.aggregates.clone() } else { Vec::new() },
                chains: self.chains.iter().filter(|c| c.node == *n || (single && c.node.is_empty())).cloned().collect(),
                annotations: self.annotations.clone(),
                session: self.session.clone().filter(|s| single || s.node == *n),
            });
        }
        Ok(out)
    }

    /// 0.10+: process names captured with the events (a merged file keeps
    /// one `process_names` row per pid for all its nodes).
    fn comms(&self, node: &str) -> Result<HashMap<u32, String>> {
        if !self.columns.comm {
            return Ok(HashMap::new());
        }
        let err = |e: rusqlite::Error| Error::Import { path: self.path.clone(), reason: e.to_string() };
        let mut stmt = self
            .conn
            .prepare("SELECT pid, MAX(comm) FROM events WHERE node = ?1 AND comm != '' GROUP BY pid")
            .map_err(err)?;
        let rows = stmt.query_map([node], |r| Ok((r.get::<_, i64>(0)? as u32, r.get(1)?))).map_err(err)?;
        rows.collect::<rusqlite::Result<_>>().map_err(err)
    }

    /// The threads of each process of `node` (all nodes for None).
    pub(crate) fn threads(&self, node: Option<&str>) -> Result<HashMap<u32, HashSet<u32>>> {
        let err = |e: rusqlite::Error| Error::Import { path: self.path.clone(), reason: e.to_string() };
        let filter = if node.is_some() && self.columns.node { "WHERE node = ?1" } else { "" };
        let mut stmt = self.conn.prepare(&format!("SELECT DISTINCT pid, tid FROM events {filter}")).map_err(err)?;
        let params: Vec<&str> = if filter.is_empty() { vec![] } else { node.into_iter().collect() };
        let mut out: HashMap<u32, HashSet<u32>> = HashMap::new();
        let mut rows = stmt.query(rusqlite::params_from_iter(params)).map_err(err)?;
        while let Some(r) = rows.next().map_err(err)? {
            let (pid, tid) = (r.get::<_, i64>(0).map_err(err)?, r.get::<_, i64>(1).map_err(err)?);
            out.entry(pid as u32).or_default().insert(tid as u32);
        }
        Ok(out)
    }

    /// Streams the events of `node` (all of them for None) in time order;
    /// `progress` is called every 100k events.
    pub(crate) fn for_each_event(
        &self,
        node: Option<&str>,
        mut f: impl FnMut(Event),
        mut progress: impl FnMut(u64),
    ) -> Result<()> {
        let err = |e: rusqlite::Error| Error::Import { path: self.path.clone(), reason: e.to_string() };
        let rank = if self.columns.rank { "rank, world_size" } else { "NULL, NULL" };
        let filter = if node.is_some() && self.columns.node { "WHERE node = ?1" } else { "" };
        let sql = format!(
            "SELECT timestamp, pid, tid, source, op, duration, arg0, ret_code, cgroup_id, {rank}, arg1 FROM events {filter} ORDER BY timestamp"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(err)?;
        let params: Vec<&str> = if filter.is_empty() { vec![] } else { node.into_iter().collect() };
        let mut rows = stmt.query(rusqlite::params_from_iter(params)).map_err(err)?;
        let mut n = 0u64;
        while let Some(r) = rows.next().map_err(err)? {
            let g = |i: usize| r.get::<_, i64>(i);
            let ev = (|| {
                Ok::<_, rusqlite::Error>(Event {
                    ts_ns: g(0)?,
                    pid: g(1)? as u32,
                    tid: g(2)? as u32,
                    source: g(3)?,
                    op: g(4)?,
                    dur_ns: g(5)?.max(0) as u64,
                    arg0: g(6)?,
                    ret: g(7)?,
                    cgroup_id: g(8)? as u64,
                    rank: r.get::<_, Option<i64>>(9)?.map(|v| v as i32),
                    world_size: r.get::<_, Option<i64>>(10)?.map(|v| v as i32),
                    arg1: g(11)?,
                })
            })()
            .map_err(err)?;
            f(ev);
            n += 1;
            if n.is_multiple_of(100_000) {
                progress(n);
            }
        }
        Ok(())
    }
}

/// The first recording session: host facts.
fn read_session(c: &Connection, has_node: bool) -> Option<Session> {
    let node = if has_node { "node" } else { "''" };
    c.query_row(
        &format!(
            "SELECT started_at, stopped_at, gpu_model, gpu_driver, cpu_model, cpu_cores, kernel, cuda_ver, {node} \
             FROM sessions ORDER BY started_at LIMIT 1"
        ),
        [],
        |r| {
            Ok(Session {
                started_ns: r.get(0)?,
                stopped_ns: r.get(1)?,
                gpu_model: r.get(2)?,
                gpu_driver: r.get(3)?,
                cpu_model: r.get(4)?,
                cpu_cores: r.get::<_, i64>(5)?.max(0) as u32,
                kernel: r.get(6)?,
                cuda_version: r.get(7)?,
                node: r.get(8)?,
            })
        },
    )
    .ok()
}

fn read_aggregates(c: &Connection) -> rusqlite::Result<Vec<Aggregate>> {
    c.prepare("SELECT bucket, source, op, pid, count, stored, sum_dur, max_dur, sum_arg0 FROM event_aggregates")?
        .query_map([], |r| {
            let u = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
            Ok(Aggregate {
                bucket_ns: r.get(0)?,
                source: r.get(1)?,
                op: r.get(2)?,
                pid: r.get::<_, i64>(3)? as u32,
                count: u(4)?,
                stored: u(5)?,
                sum_ns: u(6)?,
                max_ns: u(7)?,
                sum_arg0: u(8)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()
}

/// The annotations, oldest first; rows whose labels are not a JSON object
/// of strings (or are longer than [`MAX_LABELS_BYTES`]) are counted and left out.
fn read_annotations(c: &Connection) -> rusqlite::Result<(Vec<Annotation>, u64)> {
    let mut stmt =
        c.prepare("SELECT timestamp, labels, pid, span_start, span_end FROM annotations ORDER BY timestamp")?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?, r.get::<_, i64>(4)?))
    })?;
    let (mut out, mut bad) = (Vec::new(), 0u64);
    for row in rows {
        let (ts, labels, pid, start, end) = row?;
        match canonical_labels(&labels) {
            Some(labels) if u32::try_from(pid).is_ok() => {
                let span = start > 0 && end >= start;
                out.push(Annotation {
                    ts_ns: if span { start } else { ts },
                    span_ns: if span { end - start } else { 0 },
                    pid: pid as u32,
                    labels,
                });
            }
            _ => bad += 1,
        }
    }
    Ok((out, bad))
}

/// `{"k": "v", …}` with keys sorted, or None for anything else.
fn canonical_labels(raw: &str) -> Option<String> {
    if raw.len() > MAX_LABELS_BYTES {
        return None;
    }
    let map: std::collections::BTreeMap<String, String> = serde_json::from_str(raw).ok()?;
    (!map.is_empty()).then(|| serde_json::to_string(&map).ok()).flatten()
}

/// The diagnoses the source product stored.
fn read_chains(c: &Connection, has_node: bool) -> rusqlite::Result<Vec<RefChain>> {
    let node = if has_node { "node" } else { "''" };
    c.prepare(&format!(
        "SELECT id, detected_at, severity, summary, root_cause, explanation, recommendations, cuda_op, \
         cuda_p99_us, cuda_p50_us, tail_ratio, {node} FROM causal_chains ORDER BY detected_at"
    ))?
    .query_map([], |r| {
        let recs: String = r.get(6)?;
        Ok(RefChain {
            id: r.get(0)?,
            detected_ns: r.get(1)?,
            severity: r.get(2)?,
            summary: r.get(3)?,
            root_cause: r.get(4)?,
            explanation: r.get(5)?,
            recommendations: serde_json::from_str(&recs).unwrap_or_default(),
            cuda_op: r.get(7)?,
            p99_us: r.get(8)?,
            p50_us: r.get(9)?,
            tail_ratio: r.get(10)?,
            node: r.get(11)?,
        })
    })?
    .collect::<rusqlite::Result<_>>()
}
