// SPDX-License-Identifier: Apache-2.0
//! The job a Kubernetes pod belongs to, from its labels and owner references
//! alone (no API types here: the agent names jobs with it, and remediation
//! finds a job's pods on a node with the same rule, so the two cannot drift).

use std::collections::BTreeMap;

const JOBSET: &str = "jobset.sigs.k8s.io/jobset-name";
const KUBEFLOW: &str = "training.kubeflow.org/job-name";
const LWS: &str = "leaderworkerset.sigs.k8s.io/name";
const VOLCANO: &str = "volcano.sh/job-name";

/// One owner reference of a pod.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub kind: &'a str,
    pub name: &'a str,
    pub controller: bool,
}

/// `kind:namespace/name` (`pytorchjob:ml/llama-ft`, `deployment:serve/vllm`);
/// None for a pod nothing owns. Needs no RBAC beyond pods: ReplicaSet →
/// Deployment by the pod-template-hash suffix, the way kubectl names them.
pub fn job_of(ns: &str, labels: &BTreeMap<String, String>, owners: &[Owner<'_>]) -> Option<String> {
    let controller = owners.iter().find(|o| o.controller).or_else(|| owners.first());
    // Multi-pod training jobs first: their pods are owned by intermediate Jobs.
    if let Some(n) = labels.get(JOBSET) {
        return Some(format!("jobset:{ns}/{n}"));
    }
    if let Some(n) = labels.get(KUBEFLOW) {
        let kind = controller
            .filter(|o| o.kind != "Job" && o.name == n)
            .map_or_else(|| "kubeflow".to_string(), |o| o.kind.to_ascii_lowercase());
        return Some(format!("{kind}:{ns}/{n}"));
    }
    if let Some(n) = labels.get(LWS) {
        return Some(format!("leaderworkerset:{ns}/{n}"));
    }
    if let Some(n) = labels.get(VOLCANO) {
        return Some(format!("vcjob:{ns}/{n}"));
    }
    let o = controller?;
    if o.kind == "ReplicaSet"
        && let Some(dep) = labels.get("pod-template-hash").and_then(|h| o.name.strip_suffix(&format!("-{h}")))
    {
        return Some(format!("deployment:{ns}/{dep}"));
    }
    Some(format!("{}:{ns}/{}", o.kind.to_ascii_lowercase(), o.name))
}

/// The job of a pod nothing owns.
pub fn bare_pod_job(ns: &str, name: &str) -> String {
    format!("pod:{ns}/{name}")
}
