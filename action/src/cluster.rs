// SPDX-License-Identifier: Apache-2.0
//! The Kubernetes side of remediation: the node condition, the taint, the
//! Events, and which nodes are marked. Least privilege: nodes get/list/patch,
//! nodes/status patch, pods list, events create (the chart's ClusterRole).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::{Error, Result};
use ingero_model::job::{Owner, job_of};

/// The node condition remediation sets and clears.
pub const CONDITION: &str = "IngeroStraggler";
/// The taint it adds (effect NoSchedule) and removes.
pub const TAINT_KEY: &str = "ingero.io/straggler";
const COMPONENT: &str = "ingero";

/// A node this or another replica marked: the condition is True.
#[derive(Debug, Clone, PartialEq)]
pub struct MarkedNode {
    pub node: String,
    /// The job named in the condition's message (`job <job>: …`).
    pub job: String,
}

#[derive(Clone)]
pub struct Cluster {
    client: Client,
    instance: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("instance", &self.instance).finish_non_exhaustive()
    }
}

impl Cluster {
    pub fn new(client: Client, instance: &str) -> Cluster {
        Cluster { client, instance: instance.to_string() }
    }

    /// From a kubeconfig file, or the pod's service account (then `KUBECONFIG`).
    pub async fn connect(kubeconfig: Option<&Path>, instance: &str) -> Result<Cluster> {
        let client = match kubeconfig {
            Some(path) => {
                let bad = |e: &dyn std::fmt::Display| Error::Config(format!("--kubeconfig {}: {e}", path.display()));
                let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
                let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.map_err(|e| bad(&e))?;
                Client::try_from(cfg)?
            }
            None => Client::try_default().await.map_err(|e| {
                Error::Config(format!("no Kubernetes API for remediation (in-cluster or KUBECONFIG): {e}"))
            })?,
        };
        Ok(Cluster::new(client, instance))
    }

    /// Every node whose `IngeroStraggler` condition is True.
    pub async fn marked(&self) -> Result<Vec<MarkedNode>> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let list = nodes.list(&ListParams::default()).await?;
        Ok(list
            .items
            .iter()
            .filter_map(|n| {
                let c = n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == CONDITION)?;
                (c.status == "True").then(|| MarkedNode { node: n.name_any(), job: job_in(c.message.as_deref()) })
            })
            .collect())
    }

    /// Sets the condition True (cause and report in its message).
    pub async fn set_condition(&self, node: &str, job: &str, message: &str, on: bool) -> Result<()> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let (status, reason) = if on { ("True", "PerformanceStraggler") } else { ("False", "Recovered") };
        let patch = json!({"status": {"conditions": [{
            "type": CONDITION, "status": status, "reason": reason,
            "message": format!("job {job}: {message}"),
            "lastTransitionTime": now, "lastHeartbeatTime": now,
        }]}});
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes.patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch)).await?;
        Ok(())
    }

    /// Adds or removes our NoSchedule taint, keeping every other taint.
    /// Optimistic: the patch carries the resourceVersion read, and a
    /// conflict (someone else changed the node) reads again.
    pub async fn set_taint(&self, node: &str, on: bool) -> Result<bool> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        for _ in 0..5 {
            let n = nodes.get(node).await?;
            let mut taints: Vec<Taint> = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            let had = taints.iter().any(|t| t.key == TAINT_KEY);
            if had == on {
                return Ok(false);
            }
            taints.retain(|t| t.key != TAINT_KEY);
            if on {
                taints.push(Taint {
                    key: TAINT_KEY.into(),
                    value: Some("true".into()),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                });
            }
            let patch = json!({"metadata": {"resourceVersion": n.resource_version()}, "spec": {"taints": taints}});
            match nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Config(format!("node {node} kept changing under the taint update (5 conflicts)")))
    }

    /// Pods of `job` running on `node` (the same job rule as the agent's).
    pub async fn job_pods(&self, node: &str, job: &str) -> Result<Vec<Pod>> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await?;
        Ok(list.items.into_iter().filter(|p| pod_job(p) == job).collect())
    }

    /// One Event on the node (in `default`, where `kubectl describe node` finds it).
    pub async fn node_event(&self, node: &str, warning: bool, reason: &str, message: &str) -> Result<()> {
        let about = ObjectReference { kind: Some("Node".into()), name: Some(node.into()), ..Default::default() };
        self.event("default", about, warning, reason, message).await
    }

    /// One Event on a pod.
    pub async fn pod_event(&self, pod: &Pod, warning: bool, reason: &str, message: &str) -> Result<()> {
        let ns = pod.namespace().unwrap_or_else(|| "default".into());
        let about = ObjectReference {
            kind: Some("Pod".into()),
            api_version: Some("v1".into()),
            name: Some(pod.name_any()),
            namespace: Some(ns.clone()),
            uid: pod.uid(),
            ..Default::default()
        };
        self.event(&ns, about, warning, reason, message).await
    }

    async fn event(&self, ns: &str, about: ObjectReference, warning: bool, reason: &str, message: &str) -> Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = format!("{}.{:x}", about.name.as_deref().unwrap_or("object"), rand::random::<u64>());
        let ev = Event {
            metadata: ObjectMeta { name: Some(name), namespace: Some(ns.into()), ..Default::default() },
            involved_object: about,
            reason: Some(reason.into()),
            message: Some(message.chars().take(1024).collect()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            source: Some(EventSource { component: Some(COMPONENT.into()), host: None }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            action: Some(reason.into()),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), ns);
        events.create(&PostParams::default(), &ev).await?;
        Ok(())
    }
}

fn pod_job(p: &Pod) -> String {
    let ns = p.namespace().unwrap_or_else(|| "default".into());
    let owners: Vec<Owner<'_>> = p
        .owner_references()
        .iter()
        .map(|o| Owner { kind: &o.kind, name: &o.name, controller: o.controller == Some(true) })
        .collect();
    let labels: &BTreeMap<String, String> = p.labels();
    job_of(&ns, labels, &owners).unwrap_or_else(|| ingero_model::job::bare_pod_job(&ns, &p.name_any()))
}

/// The job a condition message names (`job <job>: …`); empty when absent.
fn job_in(message: Option<&str>) -> String {
    message
        .and_then(|m| m.strip_prefix("job "))
        .and_then(|m| m.split_once(": "))
        .map(|(j, _)| j.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn job_is_read_back_from_the_condition_message() {
        assert_eq!(super::job_in(Some("job pytorchjob:ml/ft: device wait 5x; report at x")), "pytorchjob:ml/ft");
        assert_eq!(super::job_in(Some("something else")), "");
        assert_eq!(super::job_in(None), "");
    }
}
