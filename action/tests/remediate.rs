// SPDX-License-Identifier: Apache-2.0
//! Remediation against an API server stand-in (real HTTP, real kube-rs):
//! dry-run changes nothing, marks carry cause and report, the budget holds
//! under a burst, conditions and taints clear after recovery, a restarted
//! controller undoes what an earlier one did, a step the API server refuses
//! after the mark is journaled beside it, nothing is ever evicted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingero_action::cluster::Cluster;
use ingero_action::journal;
use ingero_action::metrics::Metrics;
use ingero_action::testing::{ApiServer, pod};
use ingero_action::{Config, Controller, Mode};
use ingero_server::rank::standing::{Deviation, Standing};
use ingero_store::{Store, StoreOptions, StoreUrl};

const JOB: &str = "pytorchjob:ml/ft";

fn standing(node: &str, job: &str, flagged: bool) -> Standing {
    Standing {
        node: node.into(),
        job: job.into(),
        score: if flagged { 8.0 } else { 0.3 },
        flagged,
        since: None,
        since_us: None,
        signals: vec![Deviation {
            signal: "device_wait_share".into(),
            value: 0.42,
            job_median: 0.05,
            z: 8.0,
            text: "GPU waits on the host 42% of the window (job median 5%)".into(),
        }],
        windows: 30,
        stuck: false,
        lost_s: 0.0,
        cost: None,
        step: None,
    }
}

struct Rig {
    api: ApiServer,
    store: Store,
    _dir: tempfile::TempDir,
    ranking: Arc<Mutex<Vec<Standing>>>,
    metrics: Metrics,
}

impl Rig {
    async fn new(nodes: &[&str]) -> Rig {
        let pods = vec![pod("ft-worker-0", "ft", "n1"), pod("ft-worker-1", "ft", "n2"), pod("other-0", "other", "n1")];
        let api = ApiServer::start(nodes, pods).await;
        let dir = tempfile::tempdir().unwrap();
        let url = StoreUrl::parse(dir.path().to_str().unwrap()).unwrap();
        let store = Store::open(&url, &StoreOptions::default()).unwrap();
        Rig { api, store, _dir: dir, ranking: Default::default(), metrics: Metrics::default() }
    }

    fn controller(&self, cfg: Config) -> Controller {
        let r = self.ranking.clone();
        let cluster = Cluster::new(self.api.client(), "test-replica");
        Controller::new(
            cfg,
            cluster,
            self.store.clone(),
            self.metrics.clone(),
            Arc::new(move || r.lock().unwrap().clone()),
            false,
        )
    }

    fn set(&self, flagged: &[&str], all: &[&str]) {
        *self.ranking.lock().unwrap() = all.iter().map(|n| standing(n, JOB, flagged.contains(n))).collect();
    }

    async fn journal(&self) -> Vec<(String, String, String)> {
        journal::read(&self.store, 0).await.unwrap().into_iter().map(|r| (r.action, r.node, r.mode)).collect()
    }
}

fn cfg(mode: Mode) -> Config {
    Config {
        mode,
        min_evidence: Duration::from_secs(60),
        clear_after: Duration::from_secs(300),
        report_url: Some("https://ingero.example/report?node={node}&job={job}".into()),
        ..Config::default()
    }
}

fn at(t0: Instant, s: u64) -> Instant {
    t0 + Duration::from_secs(s)
}

#[tokio::test]
async fn dry_run_reads_and_journals_but_changes_nothing() {
    let rig = Rig::new(&["n1", "n2", "n3", "n4"]).await;
    let mut c = rig.controller(Config { taint: true, ..cfg(Mode::DryRun) });
    let t0 = Instant::now();
    rig.set(&["n1"], &["n1", "n2", "n3", "n4"]);
    c.step(t0).await.unwrap();
    let recs = c.step(at(t0, 60)).await.unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!((recs[0].action.as_str(), recs[0].mode.as_str()), ("mark", "dry-run"));
    assert!(recs[0].detail.contains("1 pod(s), taint NoSchedule"), "{}", recs[0].detail);
    rig.set(&[], &["n1", "n2", "n3", "n4"]);
    c.step(at(t0, 100)).await.unwrap();
    let recs = c.step(at(t0, 400)).await.unwrap();
    assert_eq!(recs[0].action, "clear");
    assert!(rig.api.writes().is_empty(), "dry-run wrote to the API server: {:?}", rig.api.writes());
    assert_eq!(rig.api.condition("n1"), None);
    assert_eq!(rig.api.taints("n1"), ["nvidia.com/gpu:NoSchedule"]);
    let mode = |a: &str| (a.to_string(), "n1".to_string(), "dry-run".to_string());
    assert_eq!(rig.journal().await, [mode("mark"), mode("clear")]);
}

#[tokio::test]
async fn a_confirmed_straggler_is_marked_with_cause_report_and_events_then_cleared() {
    let rig = Rig::new(&["n1", "n2", "n3", "n4"]).await;
    let mut c = rig.controller(Config { taint: true, ..cfg(Mode::On) });
    let t0 = Instant::now();
    let all = ["n1", "n2", "n3", "n4"];
    rig.set(&["n1"], &all);
    assert!(c.step(t0).await.unwrap().is_empty());
    assert!(c.step(at(t0, 30)).await.unwrap().is_empty(), "not enough evidence yet");
    assert!(rig.api.writes().is_empty());
    // Someone else changes the node's taints between our read and our write.
    rig.api.world.lock().unwrap().race_taint = Some("example.com/maintenance".into());
    let recs = c.step(at(t0, 61)).await.unwrap();
    let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["mark", "taint"]);
    let (status, reason, msg) = rig.api.condition("n1").expect("condition set");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "PerformanceStraggler"));
    assert!(msg.starts_with(&format!("job {JOB}: GPU waits on the host 42%")), "{msg}");
    assert!(msg.contains("Report: https://ingero.example/report?node=n1&job=pytorchjob:ml/ft"), "{msg}");
    assert!(msg.contains("Flagged for 1m01s"), "{msg}");
    // Our taint added, the GPU taint and the racing writer's kept.
    assert_eq!(
        rig.api.taints("n1"),
        ["nvidia.com/gpu:NoSchedule", "example.com/maintenance:NoSchedule", "ingero.io/straggler:NoSchedule"]
    );
    // Events: the node, and the job's pod on it (not the other job's pod, not n2's).
    let ev = rig.api.events();
    let who: Vec<(&str, &str, &str)> = ev.iter().map(|e| (e.0.as_str(), e.1.as_str(), e.2.as_str())).collect();
    assert_eq!(who, [("default", "Node", "n1"), ("ml", "Pod", "ft-worker-0")]);
    assert!(ev.iter().all(|e| e.3 == "Warning"));
    // The Ready condition is untouched by the merge.
    assert_eq!(rig.api.node("n1")["status"]["conditions"][0]["type"], "Ready");

    // Healthy: cleared after clear_after, taint removed, other taints kept.
    rig.set(&[], &all);
    assert!(c.step(at(t0, 100)).await.unwrap().is_empty());
    assert!(c.step(at(t0, 399)).await.unwrap().is_empty());
    let recs = c.step(at(t0, 400)).await.unwrap();
    let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["untaint", "clear"]);
    let (status, reason, _) = rig.api.condition("n1").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Recovered"));
    assert_eq!(rig.api.taints("n1"), ["nvidia.com/gpu:NoSchedule", "example.com/maintenance:NoSchedule"]);
    assert_eq!(rig.api.events().last().unwrap().4, "IngeroRecovered");
    assert_no_eviction(&rig.api);
    let m = encode(&rig.metrics);
    assert!(m.contains(r#"ingero_remediation_actions_total{action="mark",mode="on"} 1"#), "{m}");
    assert!(m.contains(r#"ingero_remediation_actions_total{action="clear",mode="on"} 1"#), "{m}");
    assert!(m.contains("ingero_remediation_marked_nodes 0"), "{m}");
}

#[tokio::test]
async fn the_budget_holds_under_a_burst_of_flags() {
    let nodes: Vec<String> = (0..20).map(|i| format!("g{i:02}")).collect();
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let rig = Rig::new(&names).await;
    let mut c = rig.controller(Config { max_nodes: 3, max_job_share: 0.5, ..cfg(Mode::On) });
    // Half the fleet flagged at once (a bad rollout, a noisy detector).
    let flagged: Vec<&str> = names[..10].to_vec();
    rig.set(&flagged, &names);
    let t0 = Instant::now();
    c.step(t0).await.unwrap();
    let recs = c.step(at(t0, 60)).await.unwrap();
    let count = |a: &str| recs.iter().filter(|r| r.action == a).count();
    assert_eq!((count("mark"), count("held")), (3, 7));
    assert!(recs.iter().filter(|r| r.action == "held").all(|r| r.detail.starts_with("fleet budget: 3 nodes marked")));
    let marked = names.iter().filter(|n| rig.api.condition(n).is_some_and(|c| c.0 == "True")).count();
    assert_eq!(marked, 3);
    // Held is said once; later looks change nothing.
    for s in [70, 80, 90] {
        assert!(c.step(at(t0, s)).await.unwrap().is_empty());
    }
    let m = encode(&rig.metrics);
    assert!(m.contains(r#"ingero_remediation_held_total{budget="fleet"} 7"#), "{m}");
    assert!(m.contains("ingero_remediation_marked_nodes 3"), "{m}");
    // A second replica sees the same three marks in the API server and spends no more.
    let mut other = Controller::new(
        Config { max_nodes: 3, ..cfg(Mode::On) },
        Cluster::new(rig.api.client(), "replica-2"),
        rig.store.clone(),
        Metrics::default(),
        {
            let r = rig.ranking.clone();
            Arc::new(move || r.lock().unwrap().iter().filter(|s| s.node.as_str() >= "g05").cloned().collect())
        },
        true,
    );
    other.step(t0).await.unwrap();
    let recs = other.step(at(t0, 60)).await.unwrap();
    assert!(recs.iter().all(|r| r.action == "held"), "{recs:?}");
    assert_no_eviction(&rig.api);
}

#[tokio::test]
async fn a_restarted_controller_undoes_marks_made_before_it() {
    let rig = Rig::new(&["n1", "n2", "n3", "n4"]).await;
    let all = ["n1", "n2", "n3", "n4"];
    let t0 = Instant::now();
    {
        let mut c = rig.controller(Config { taint: true, ..cfg(Mode::On) });
        rig.set(&["n2"], &all);
        c.step(t0).await.unwrap();
        assert_eq!(c.step(at(t0, 60)).await.unwrap()[0].action, "mark");
    }
    // The aggregator restarts (no memory) and this time runs without --remediate-taint.
    let mut c = rig.controller(cfg(Mode::On));
    rig.set(&[], &all);
    assert!(c.step(at(t0, 100)).await.unwrap().is_empty());
    let recs = c.step(at(t0, 400)).await.unwrap();
    let actions: Vec<(&str, &str)> = recs.iter().map(|r| (r.action.as_str(), r.node.as_str())).collect();
    assert_eq!(actions, [("untaint", "n2"), ("clear", "n2")]);
    assert_eq!(rig.api.condition("n2").unwrap().0, "False");
    assert_eq!(rig.api.taints("n2"), ["nvidia.com/gpu:NoSchedule"]);
    let journal: Vec<String> = rig.journal().await.into_iter().map(|(a, n, _)| format!("{a} {n}")).collect();
    assert_eq!(journal, ["mark n2", "taint n2", "untaint n2", "clear n2"]);
    assert_no_eviction(&rig.api);
}

#[tokio::test]
async fn an_api_error_is_journaled_and_retried() {
    let rig = Rig::new(&["n1", "n2"]).await;
    let mut c = rig.controller(cfg(Mode::On));
    // The ranking names a node the API server does not know (renamed, or gone).
    rig.set(&["ghost"], &["ghost", "n1", "n2", "n3"]);
    let t0 = Instant::now();
    c.step(t0).await.unwrap();
    let recs = c.step(at(t0, 60)).await.unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].action, "error");
    assert!(recs[0].detail.contains("not found"), "{}", recs[0].detail);
    // Not counted as marked: it is tried again next look.
    let recs = c.step(at(t0, 70)).await.unwrap();
    assert_eq!(recs[0].action, "error");
    assert!(encode(&rig.metrics).contains("ingero_remediation_errors_total 2"));
}

#[tokio::test]
async fn a_step_that_fails_after_the_mark_is_journaled_and_the_mark_stands() {
    let rig = Rig::new(&["n1", "n2", "n3", "n4"]).await;
    let all = ["n1", "n2", "n3", "n4"];
    let mut c = rig.controller(Config { taint: true, max_per_hour: 1, max_job_share: 1.0, ..cfg(Mode::On) });
    // RBAC without `events create`: the condition and the taint land, the events do not.
    rig.api.world.lock().unwrap().forbid = vec!["events"];
    rig.set(&["n1"], &all);
    let t0 = Instant::now();
    c.step(t0).await.unwrap();
    let recs = c.step(at(t0, 60)).await.unwrap();
    let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["mark", "error", "taint"]);
    assert!(recs[1].detail.starts_with("marked, but sending its events failed:"), "{}", recs[1].detail);
    assert!(recs[1].detail.contains("cannot create resource \"events\""), "{}", recs[1].detail);
    assert_eq!(recs[1].cause, recs[0].cause, "the failed step says which mark it belongs to");
    assert_eq!(rig.api.condition("n1").unwrap().0, "True");
    assert!(rig.api.taints("n1").contains(&"ingero.io/straggler:NoSchedule".to_string()));
    // The mark stands: later looks neither mark again nor send events again.
    for s in [70, 80, 90] {
        assert!(c.step(at(t0, s)).await.unwrap().is_empty(), "look at {s}s");
    }
    let m = encode(&rig.metrics);
    assert!(m.contains(r#"ingero_remediation_actions_total{action="mark",mode="on"} 1"#), "{m}");
    assert!(m.contains("ingero_remediation_errors_total 1"), "{m}");
    assert!(m.contains("ingero_remediation_marked_nodes 1"), "{m}");
    // And it spent the hour's budget: a second straggler is held back.
    rig.set(&["n1", "n2"], &all);
    c.step(at(t0, 100)).await.unwrap();
    let recs = c.step(at(t0, 160)).await.unwrap();
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!((recs[0].action.as_str(), recs[0].node.as_str()), ("held", "n2"));
    assert!(recs[0].detail.starts_with("hour budget"), "{}", recs[0].detail);

    // Healthy, but RBAC refuses the taint's removal: nothing is cleared, and
    // the next clear tries again rather than leave a taint on a healthy node.
    rig.api.world.lock().unwrap().forbid = vec!["nodes"];
    rig.set(&[], &all);
    c.step(at(t0, 200)).await.unwrap();
    let recs = c.step(at(t0, 500)).await.unwrap();
    let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["error"]);
    assert_eq!(rig.api.condition("n1").unwrap().0, "True", "a node still tainted is not shown as recovered");
    rig.api.world.lock().unwrap().forbid.clear();
    c.step(at(t0, 510)).await.unwrap();
    let recs = c.step(at(t0, 810)).await.unwrap();
    let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["untaint", "clear"]);
    assert_eq!(rig.api.condition("n1").unwrap().0, "False");
    assert_eq!(rig.api.taints("n1"), ["nvidia.com/gpu:NoSchedule"]);
    let journal: Vec<String> = rig.journal().await.into_iter().map(|(a, n, _)| format!("{a} {n}")).collect();
    assert_eq!(journal, ["mark n1", "error n1", "taint n1", "held n2", "error n1", "untaint n1", "clear n1"]);
    let m = encode(&rig.metrics);
    assert!(m.contains("ingero_remediation_errors_total 2"), "{m}");
    assert!(m.contains("ingero_remediation_marked_nodes 0"), "{m}");
    assert_no_eviction(&rig.api);
}

fn assert_no_eviction(api: &ApiServer) {
    for (method, path) in api.writes() {
        assert!(
            method == "PATCH" && path.starts_with("/api/v1/nodes/") || method == "POST" && path.contains("/events"),
            "remediation may only patch nodes and create events; it sent {method} {path}"
        );
    }
}

fn encode(m: &Metrics) -> String {
    let mut r = prometheus_client::registry::Registry::with_prefix("ingero");
    m.register(&mut r);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
    out
}
