// SPDX-License-Identifier: Apache-2.0
//! Pod metadata from the Kubernetes API: a kube-rs reflector over the pods of
//! this node only (`spec.nodeName=<node>`). The watcher owns re-listing after
//! 410 Gone and reconnecting after disconnects (with backoff); the store keeps
//! the last known pods while the API server is away, so windows keep flowing.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::StreamExt;
use ingero_model::job::Owner;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

/// What the agent needs to know about one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Job identity from the owner chain or well-known labels, e.g.
    /// `pytorchjob:ml/llama-ft`, `deployment:serve/vllm`; `pod:ns/name` for a bare pod.
    pub job: String,
    /// True when `job` comes from an owner or label (not the bare-pod fallback).
    pub owned: bool,
    /// Container runtime id (64 hex, no `containerd://` prefix) → container name.
    pub containers: HashMap<String, String>,
    /// Container names in spec order (for the single-container fallback).
    pub container_names: Vec<String>,
    /// Labels as a JSON object.
    pub labels_json: String,
}

impl PodMeta {
    pub fn from_pod(pod: &Pod) -> Option<PodMeta> {
        let uid = pod.metadata.uid.clone()?;
        let namespace = pod.namespace().unwrap_or_else(|| "default".into());
        let name = pod.name_any();
        let (job, owned) = match job_of(pod) {
            Some(j) => (j, true),
            None => (ingero_model::job::bare_pod_job(&namespace, &name), false),
        };
        let mut containers = HashMap::new();
        if let Some(st) = &pod.status {
            let all = st.container_statuses.iter().flatten().chain(st.init_container_statuses.iter().flatten());
            for c in all {
                if let Some(id) = c.container_id.as_deref().and_then(|i| i.split_once("://")).map(|(_, id)| id) {
                    containers.insert(id.to_string(), c.name.clone());
                }
            }
        }
        let container_names = pod.spec.iter().flat_map(|s| s.containers.iter().map(|c| c.name.clone())).collect();
        let labels_json = serde_json::to_string(pod.labels()).unwrap_or_else(|_| "{}".into());
        Some(PodMeta { namespace, name, uid, job, owned, containers, container_names, labels_json })
    }

    /// The container's name: by runtime id, else the only container of the pod.
    pub fn container(&self, container_id: Option<&str>) -> Option<&str> {
        container_id
            .and_then(|id| self.containers.get(id))
            .map(String::as_str)
            .or_else(|| (self.container_names.len() == 1).then(|| self.container_names[0].as_str()))
    }
}

/// The job a pod belongs to ([`ingero_model::job::job_of`]).
pub(crate) fn job_of(pod: &Pod) -> Option<String> {
    let ns = pod.namespace().unwrap_or_else(|| "default".into());
    let owners: Vec<Owner<'_>> = pod
        .owner_references()
        .iter()
        .map(|o| Owner { kind: &o.kind, name: &o.name, controller: o.controller == Some(true) })
        .collect();
    ingero_model::job::job_of(&ns, pod.labels(), &owners)
}

/// Watch health, shared with the metrics endpoint.
#[derive(Debug, Default)]
pub struct KubeStats {
    pub connected: AtomicBool,
    pub errors: AtomicU64,
    pub pods: AtomicU64,
}

/// A live view of this node's pods.
#[derive(Debug, Clone)]
pub struct PodWatch {
    store: Store<Pod>,
    pub stats: Arc<KubeStats>,
}

impl PodWatch {
    /// Connects with the usual inference (in-cluster service account, then
    /// KUBECONFIG / ~/.kube/config). `None` (after one log line) when neither
    /// exists: single-node mode, attribution by cgroup, container id and process.
    pub async fn start(node: &str) -> Option<PodWatch> {
        let client = match Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(
                    "no Kubernetes API ({e}); attributing by container id, cgroup path and process name only"
                );
                return None;
            }
        };
        Some(Self::with_client(client, node))
    }

    pub fn with_client(client: Client, node: &str) -> PodWatch {
        let api: Api<Pod> = Api::all(client);
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let stats = Arc::new(KubeStats::default());
        let st = stats.clone();
        let reader = store.clone();
        // `Init` is said before every (re)list, even one that then fails; it must not
        // reset the backoff or count as healthy, or an outage retries every second.
        let stream = reflector::reflector(writer, watcher(api, cfg))
            .filter(|e| std::future::ready(!matches!(e, Ok(watcher::Event::Init))))
            .default_backoff();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            // Log transitions only: an API server that stays away costs one line.
            let mut healthy: Option<bool> = None;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(_) => {
                        st.pods.store(reader.len() as u64, Ordering::Relaxed);
                        st.connected.store(true, Ordering::Relaxed);
                        if healthy != Some(true) {
                            tracing::info!(
                                "watching pods of this node on the Kubernetes API{}",
                                if healthy == Some(false) { " again" } else { "" }
                            );
                            healthy = Some(true);
                        }
                    }
                    Err(e) => {
                        st.errors.fetch_add(1, Ordering::Relaxed);
                        st.connected.store(false, Ordering::Relaxed);
                        if healthy != Some(false) {
                            tracing::warn!(
                                "Kubernetes API watch failed ({e}); keeping the last known pods, retrying with backoff"
                            );
                            healthy = Some(false);
                        }
                    }
                }
            }
        });
        PodWatch { store, stats }
    }

    /// Pods by UID, as of now.
    pub fn snapshot(&self) -> HashMap<String, Arc<PodMeta>> {
        self.store.state().iter().filter_map(|p| PodMeta::from_pod(p)).map(|m| (m.uid.clone(), Arc::new(m))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(labels: serde_json::Value, owner: Option<(&str, &str)>) -> Pod {
        let owners: Vec<serde_json::Value> = owner
            .map(|(k, n)| serde_json::json!({"apiVersion": "v1", "kind": k, "name": n, "uid": "u", "controller": true}))
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p-0", "namespace": "ml", "uid": "4f0c6a1e-1111-2222-3333-444455556666",
                         "labels": labels, "ownerReferences": owners},
            "spec": {"containers": [{"name": "trainer"}]},
            "status": {"containerStatuses": [{"name": "trainer", "ready": true, "restartCount": 0, "image": "i",
                        "imageID": "", "containerID": format!("containerd://{}", "ab".repeat(32))}]}
        }))
        .unwrap()
    }

    #[test]
    fn owner_chain_to_job() {
        let cases = [
            (serde_json::json!({}), None, None),
            (
                serde_json::json!({"pod-template-hash": "7d9f8"}),
                Some(("ReplicaSet", "vllm-7d9f8")),
                Some("deployment:ml/vllm"),
            ),
            (serde_json::json!({}), Some(("ReplicaSet", "orphan-rs")), Some("replicaset:ml/orphan-rs")),
            (serde_json::json!({}), Some(("StatefulSet", "db")), Some("statefulset:ml/db")),
            (
                serde_json::json!({"batch.kubernetes.io/job-name": "bench"}),
                Some(("Job", "bench")),
                Some("job:ml/bench"),
            ),
            (
                serde_json::json!({"jobset.sigs.k8s.io/jobset-name": "llama"}),
                Some(("Job", "llama-workers-0")),
                Some("jobset:ml/llama"),
            ),
            (
                serde_json::json!({"training.kubeflow.org/job-name": "ft"}),
                Some(("PyTorchJob", "ft")),
                Some("pytorchjob:ml/ft"),
            ),
            (
                serde_json::json!({"training.kubeflow.org/job-name": "mpi"}),
                Some(("Job", "mpi-launcher")),
                Some("kubeflow:ml/mpi"),
            ),
            (serde_json::json!({}), Some(("MPIJob", "mpi")), Some("mpijob:ml/mpi")),
        ];
        for (labels, owner, want) in cases {
            assert_eq!(job_of(&pod(labels.clone(), owner)).as_deref(), want, "{labels} {owner:?}");
        }
    }

    #[test]
    fn meta_maps_container_ids_to_names() {
        let m = PodMeta::from_pod(&pod(serde_json::json!({"app": "x"}), None)).unwrap();
        assert_eq!(m.job, "pod:ml/p-0");
        assert!(!m.owned);
        assert_eq!(m.container(Some(&"ab".repeat(32))), Some("trainer"));
        // Unknown id, but only one container: still named.
        assert_eq!(m.container(Some("ff")), Some("trainer"));
        assert_eq!(m.labels_json, r#"{"app":"x"}"#);
    }
}
