// SPDX-License-Identifier: Apache-2.0
//! Argument types shared by the `ingero` subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use ingero_analysis::query::QueryLimits;
use ingero_analysis::query::service::with_query;
use ingero_server::ServeConfig;
use ingero_server::ingest::Limits;
use ingero_server::rank::cost::{PriceRule, Prices};
use ingero_server::rank::detector::DetectorConfig;
use ingero_server::replicas::ReplicaConfig;
use ingero_store::commit::CommitConfig;
use ingero_store::url::DEFAULT_STORE;
use ingero_store::{StoreOptions, StoreUrl};

/// The shortest `--vacuum-retention` accepted: files a reader may still be
/// reading are never deleted sooner.
const MIN_VACUUM_RETENTION: Duration = Duration::from_secs(3600);

/// Parses sizes such as `64MiB`, `512k`, `1000000`.
pub(crate) fn parse_bytes(s: &str) -> Result<usize, String> {
    ingero_model::units::parse_bytes(s)
}

fn parse_store(s: &str) -> Result<StoreUrl, String> {
    StoreUrl::parse(s).map_err(|e| e.to_string())
}

/// Where data lives: shared by every command that reads or writes the dataset.
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreArgs {
    /// Dataset location: file:///path (or a plain path), s3://bucket/prefix, gs://bucket/prefix, az://container/prefix.
    /// S3 credentials come from the standard AWS_* environment variables.
    #[arg(long, env = "INGERO_STORE", default_value = DEFAULT_STORE, value_parser = parse_store)]
    pub store: StoreUrl,
    /// Endpoint of an S3-compatible server (MinIO, SeaweedFS, Ceph), e.g. http://127.0.0.1:8333.
    #[arg(long, env = "INGERO_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
}

impl StoreArgs {
    pub(crate) fn options(&self) -> StoreOptions {
        StoreOptions { s3_endpoint: self.s3_endpoint.clone() }
    }
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// gRPC address for the ingest and query services.
    #[arg(long, env = "INGERO_LISTEN", default_value = "0.0.0.0:7070")]
    pub listen: SocketAddr,
    /// HTTP address for /metrics, /healthz, /readyz and /api/v1/*.
    #[arg(long, env = "INGERO_HTTP_LISTEN", default_value = "0.0.0.0:7071")]
    pub http_listen: SocketAddr,
    /// Write-ahead log directory (local disk): batches are acknowledged once fsynced here.
    #[arg(long, env = "INGERO_WAL_DIR", default_value = "./ingero-wal")]
    pub wal_dir: PathBuf,
    /// Flush buffered rows to Parquet when this many are buffered.
    #[arg(long, env = "INGERO_FLUSH_ROWS", default_value_t = 500_000)]
    pub flush_rows: usize,
    /// Flush buffered rows when the oldest is this old (e.g. 30s, 2m).
    #[arg(long, env = "INGERO_FLUSH_AGE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub flush_age: Duration,
    /// Largest accepted ingest message (e.g. 64MiB); larger ones get RESOURCE_EXHAUSTED.
    #[arg(long, env = "INGERO_MAX_MESSAGE_SIZE", default_value = "64MiB", value_parser = parse_bytes)]
    pub max_message_size: usize,
    /// Largest accepted row count of one batch after decompression.
    #[arg(long, env = "INGERO_MAX_BATCH_ROWS", default_value_t = 4_000_000)]
    pub max_batch_rows: usize,
    /// Refuse windows that start further in the past (spooled data arrives late).
    #[arg(long, env = "INGERO_MAX_AGE", default_value = "7days", value_parser = humantime::parse_duration)]
    pub max_age: Duration,
    /// Refuse windows that start further in the future (clock skew allowance).
    #[arg(long, env = "INGERO_MAX_FUTURE", default_value = "10m", value_parser = humantime::parse_duration)]
    pub max_future: Duration,
    /// Rows per second one node may push (0 = unlimited); over it a batch is
    /// answered UNAVAILABLE and the agent retries it from its spool.
    #[arg(long, env = "INGERO_NODE_ROWS_PER_SEC", default_value_t = 1_000_000)]
    pub node_rows_per_sec: u64,
    /// Seconds of --node-rows-per-sec a node may send at once (spool drains).
    #[arg(long, env = "INGERO_NODE_BURST_SECS", default_value_t = 60)]
    pub node_burst_secs: u64,
    #[command(flatten)]
    pub query: QueryArgs,
    /// Require this bearer token (read from the file, e.g. a mounted Secret) on
    /// every gRPC call and on /api/v1/*. Without it the server is open.
    #[arg(long, env = "INGERO_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve gRPC over TLS with this certificate chain (PEM), with --tls-key.
    #[arg(long, env = "INGERO_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) for --tls-cert.
    #[arg(long, env = "INGERO_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by this CA (PEM).
    #[arg(long, env = "INGERO_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Several `ingero serve` as one aggregator: every replica's gRPC URL, the
    /// same list in the same order on each replica and agent. Agents send each
    /// node to one replica (rendezvous hash of the node name); each job's live
    /// ranking runs on one replica; a live straggler query on any replica asks
    /// all and names those that do not answer. All share --store, which must
    /// honour put-if-absent (checked at start; refused with exit 2 if not).
    #[arg(long, env = "INGERO_REPLICAS", value_delimiter = ',', requires = "replica_self")]
    pub replicas: Vec<String>,
    /// This replica's own URL as written in --replicas.
    #[arg(long, env = "INGERO_REPLICA_SELF", requires = "replicas")]
    pub replica_self: Option<String>,
    /// CA bundle (PEM) of the other replicas' TLS certificates (https:// URLs).
    #[arg(long, env = "INGERO_REPLICA_TLS_CA")]
    pub replica_tls_ca: Option<PathBuf>,
    /// Compact small files of settled hours and vacuum this often (0s: never).
    /// With replicas, each table is looked after by one of them.
    #[arg(long, env = "INGERO_MAINTAIN_EVERY", default_value = "10m", value_parser = humantime::parse_duration)]
    pub maintain_every: Duration,
    /// Vacuum deletes files compacted away (or never committed) longer ago than
    /// this; a query running longer than it could miss files. At least 1h.
    #[arg(long, env = "INGERO_VACUUM_RETENTION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub vacuum_retention: Duration,
    /// Rows of the raw tables (every window, the ingest bookkeeping, the
    /// per-window signals) are kept this long, by whole hours; maintenance
    /// removes older ones (0s: for ever).
    #[arg(long, env = "INGERO_RETENTION_RAW", default_value = "30days", value_parser = humantime::parse_duration)]
    pub retention_raw: Duration,
    /// Rows of the 10 s and 60 s signal tiers (what `ingero stragglers` ranks
    /// long ranges from) are kept this long (0s: for ever).
    #[arg(long, env = "INGERO_RETENTION_TIERS", default_value = "400days", value_parser = humantime::parse_duration)]
    pub retention_tiers: Duration,
    #[command(flatten)]
    pub rank: RankArgs,
    #[command(flatten)]
    pub remediate: RemediateArgs,
}

/// Limits on every query (SQL, history, reports).
#[derive(Debug, Clone, Args)]
pub(crate) struct QueryArgs {
    /// Abort a query after this long.
    #[arg(long, env = "INGERO_QUERY_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub query_timeout: Duration,
    /// Memory a query may use for sorts, joins and aggregations (e.g. 2GiB).
    #[arg(long, env = "INGERO_QUERY_MEMORY", default_value = "2GiB", value_parser = parse_bytes)]
    pub query_memory: usize,
}

impl QueryArgs {
    pub(crate) fn limits(&self) -> QueryLimits {
        QueryLimits { timeout: self.query_timeout, memory_bytes: self.query_memory }
    }
}

/// Straggler detector tuning.
#[derive(Debug, Clone, Args)]
pub(crate) struct RankArgs {
    /// Robust z-score (MAD units) above which a node's signal deviates from its job.
    #[arg(long, env = "INGERO_Z_THRESHOLD", default_value_t = 4.0)]
    pub z_threshold: f64,
    /// Consecutive deviant windows before a node is flagged (4: a data-loader
    /// hiccup of up to 3 s is not a straggler; `ingero evaluate` measures the
    /// trade-off of false flags against fault→flag latency).
    #[arg(long, env = "INGERO_FLAG_AFTER", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub flag_after: u32,
    /// Consecutive normal windows before a flag clears (hysteresis).
    #[arg(long, env = "INGERO_CLEAR_AFTER", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub clear_after: u32,
    /// A job whose ranks have waited this long inside one CUDA/NCCL call has
    /// stopped progressing: the node holding the rank they wait for is
    /// flagged `stuck` within a window (30s is shorter than any NCCL watchdog).
    #[arg(long, env = "INGERO_STUCK_AFTER", default_value = "30s", value_parser = humantime::parse_duration)]
    pub stuck_after: Duration,
    /// A job's own z threshold, JOB=Z (repeatable, first match wins; JOB may end
    /// in `*`: `pytorchjob:research/*=6` is laxer, `jobset:prod/llama=3` stricter).
    #[arg(long, env = "INGERO_JOB_Z_THRESHOLD", value_delimiter = ',', value_parser = DetectorConfig::parse_job_z)]
    pub job_z_threshold: Vec<(String, f64)>,
    /// GPU-hour price rules in USD, turning each straggler episode into dollars
    /// lost (repeatable or comma-separated; node rules first, then models, then
    /// the default): `model:H100=4.10` (GPU model text, as the agent reads it
    /// from the NVIDIA driver), `node:gke-prod-spot-*=1.60` (node name or
    /// prefix: the node pool), `default=2.50`. Without rules costs are in
    /// GPU-hours only.
    #[arg(long, env = "INGERO_GPU_PRICE", value_delimiter = ',', value_parser = Prices::parse_rule)]
    pub gpu_price: Vec<(PriceRule, f64)>,
    /// GPUs assumed on a node whose agent found no NVIDIA driver to count them.
    #[arg(long, env = "INGERO_GPUS_PER_NODE", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub gpus_per_node: u32,
    /// How long a window waits for late nodes before it is judged without them.
    #[arg(long, env = "INGERO_RANK_GRACE", default_value = "1500ms", value_parser = humantime::parse_duration)]
    pub grace: Duration,
}

impl RankArgs {
    pub(crate) fn detector(&self) -> DetectorConfig {
        DetectorConfig {
            z_threshold: self.z_threshold,
            flag_after: self.flag_after,
            clear_after: self.clear_after,
            stuck_after: self.stuck_after,
            job_z: self.job_z_threshold.clone(),
            prices: Prices { rules: self.gpu_price.clone(), gpus_per_node: self.gpus_per_node },
            ..Default::default()
        }
    }
}

/// Remediation: off unless asked. Marks confirmed stragglers in Kubernetes
/// (node condition IngeroStraggler with cause and report, Events on the node
/// and the job's pods; a NoSchedule taint only with --remediate-taint), within
/// budgets, and undoes it when the node is healthy again. Never evicts.
#[derive(Debug, Clone, Args)]
pub(crate) struct RemediateArgs {
    /// off, dry-run (decide, journal and log what it would do; change nothing) or on.
    #[arg(long, env = "INGERO_REMEDIATE", default_value = "off")]
    pub remediate: ingero_action::Mode,
    /// Also taint a marked node NoSchedule (new pods go elsewhere; running ones stay).
    #[arg(long, env = "INGERO_REMEDIATE_TAINT")]
    pub remediate_taint: bool,
    /// At most this many nodes marked at once, fleet-wide (read from the API
    /// server, so replicas share it).
    #[arg(long, env = "INGERO_REMEDIATE_MAX_NODES", default_value_t = 2)]
    pub remediate_max_nodes: usize,
    /// At most this share of a job's nodes marked at once (`25%` or `0.25`),
    /// rounded down: a job too small for one node is reported, never acted on.
    #[arg(long, env = "INGERO_REMEDIATE_MAX_JOB_SHARE", default_value = "50%", value_parser = parse_share)]
    pub remediate_max_job_share: f64,
    /// At most this many new marks per rolling hour (per replica).
    #[arg(long, env = "INGERO_REMEDIATE_MAX_PER_HOUR", default_value_t = 6)]
    pub remediate_max_per_hour: usize,
    /// A node must stay flagged this long, continuously, before it is marked.
    #[arg(long, env = "INGERO_REMEDIATE_AFTER", default_value = "5m", value_parser = humantime::parse_duration)]
    pub remediate_after: Duration,
    /// A marked node is cleared (condition False, taint removed) once healthy this long.
    #[arg(long, env = "INGERO_REMEDIATE_CLEAR_AFTER", default_value = "15m", value_parser = humantime::parse_duration)]
    pub remediate_clear_after: Duration,
    /// How often remediation looks at the live ranking.
    #[arg(long, env = "INGERO_REMEDIATE_EVERY", default_value = "10s", value_parser = humantime::parse_duration)]
    pub remediate_every: Duration,
    /// Where the condition sends a reader, `{node}` and `{job}` replaced
    /// (e.g. https://grafana.example/d/ingero?var-node={node}). Default: the
    /// `ingero report --node` command.
    #[arg(long, env = "INGERO_REPORT_URL")]
    pub report_url: Option<String>,
    /// Kubeconfig for remediation; default: the pod's service account, then KUBECONFIG.
    #[arg(long, env = "INGERO_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

fn parse_share(s: &str) -> Result<f64, String> {
    let (num, scale) = match s.strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (s, 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a share (25% or 0.25)"))?;
    let v = v / scale;
    if (0.0..=1.0).contains(&v) { Ok(v) } else { Err(format!("`{s}` is not between 0% and 100%")) }
}

impl RemediateArgs {
    pub(crate) fn config(&self) -> Result<ingero_action::Config, String> {
        let cfg = ingero_action::Config {
            mode: self.remediate,
            taint: self.remediate_taint,
            max_nodes: self.remediate_max_nodes,
            max_job_share: self.remediate_max_job_share,
            max_per_hour: self.remediate_max_per_hour,
            min_evidence: self.remediate_after,
            clear_after: self.remediate_clear_after,
            report_url: self.report_url.clone(),
            every: self.remediate_every,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

impl ServeArgs {
    pub(crate) fn config(&self) -> Result<ServeConfig, String> {
        if self.flush_rows == 0 {
            return Err("--flush-rows must be > 0".into());
        }
        if self.flush_age.is_zero() {
            return Err("--flush-age must be > 0".into());
        }
        if self.rank.stuck_after.is_zero() {
            return Err("--stuck-after must be > 0".into());
        }
        if self.max_batch_rows == 0 {
            return Err("--max-batch-rows must be > 0".into());
        }
        for (flag, ttl) in [("--retention-raw", self.retention_raw), ("--retention-tiers", self.retention_tiers)] {
            if !ttl.is_zero() && ttl < Duration::from_secs(2 * 3600) {
                return Err(format!(
                    "{flag} {} would remove the hour being written: at least 2h, or 0s to keep everything",
                    humantime::format_duration(ttl)
                ));
            }
        }
        if self.vacuum_retention < MIN_VACUUM_RETENTION {
            return Err(format!(
                "--vacuum-retention {} is below the floor of 1h: a query or an outside engine reading an older \
                 snapshot would lose files it is reading (Delta's own default: 7 days)",
                humantime::format_duration(self.vacuum_retention)
            ));
        }
        let cfg = ServeConfig {
            store: self.store.store.clone(),
            store_options: self.store.options(),
            listen: self.listen,
            http_listen: self.http_listen,
            commit: CommitConfig {
                wal_dir: self.wal_dir.clone(),
                flush_rows: self.flush_rows,
                flush_age: self.flush_age,
            },
            limits: Limits {
                max_message_bytes: self.max_message_size,
                max_rows: self.max_batch_rows,
                max_future: self.max_future,
                max_age: self.max_age,
                node_rows_per_sec: self.node_rows_per_sec,
                node_burst_secs: self.node_burst_secs,
            },
            detector: self.rank.detector(),
            grace: self.rank.grace,
            auth: ingero_server::auth::ServerAuth::from_files(
                self.token_file.as_deref(),
                self.tls_cert.as_deref(),
                self.tls_key.as_deref(),
                self.tls_client_ca.as_deref(),
            )
            .map_err(|e| e.to_string())?,
            replicas: self.replica_config()?,
            maintain_every: (!self.maintain_every.is_zero()).then_some(self.maintain_every),
            vacuum_retention: self.vacuum_retention,
            data_retention: ingero_store::retention::Retention {
                raw: (!self.retention_raw.is_zero()).then_some(self.retention_raw),
                tiers: (!self.retention_tiers.is_zero()).then_some(self.retention_tiers),
            },
            extra_routes: None,
            extra_metrics: None,
        };
        Ok(with_query(cfg, self.query.limits()))
    }

    fn replica_config(&self) -> Result<Option<ReplicaConfig>, String> {
        let Some(me) = &self.replica_self else { return Ok(None) };
        let auth = ingero_proto::auth::ClientAuth::from_files(
            self.token_file.as_deref(),
            self.replica_tls_ca.as_deref(),
            None,
            None,
        )
        .map_err(|e| e.to_string())?;
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = self.replicas.iter().find(|u| !seen.insert(u.as_str())) {
            return Err(format!("--replicas names {dup} twice"));
        }
        ReplicaConfig::new(self.replicas.clone(), me, auth).map(Some).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares() {
        assert_eq!(parse_share("25%"), Ok(0.25));
        assert_eq!(parse_share("0.5"), Ok(0.5));
        assert!(parse_share("150%").is_err());
        assert!(parse_share("half").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("512k"), Ok(512 << 10));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("12parsecs").unwrap_err().contains("unknown size unit"));
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("0").is_err());
    }
}
