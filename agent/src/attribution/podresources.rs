// SPDX-License-Identifier: Apache-2.0
//! GPU → pod from the kubelet PodResources API (gRPC v1 `List` on a unix
//! socket). Polled: the kubelet has no watch for it, and allocations change
//! only when pods start or stop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use ingero_proto::podresources::ListPodResourcesRequest;
use ingero_proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use tonic::transport::{Channel, Endpoint, Uri};

/// (namespace, pod, container) → device ids of extended GPU resources.
pub(crate) type GpuMap = HashMap<(String, String, String), Vec<String>>;

/// Resource names counted as GPUs (NVIDIA's plugin, MIG slices, AMD's).
fn is_gpu(resource: &str) -> bool {
    resource == "nvidia.com/gpu" || resource.starts_with("nvidia.com/mig-") || resource == "amd.com/gpu"
}

async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    // The URI is required by the API but unused: every connection goes to the socket.
    Endpoint::from_static("http://kubelet.sock")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
}

/// One `List` call.
pub(crate) async fn list(socket: &Path) -> Result<GpuMap, String> {
    let ch = connect(socket).await.map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let resp = PodResourcesListerClient::new(ch)
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|s| format!("List on {}: {}", socket.display(), s.message()))?;
    let mut out = GpuMap::new();
    for p in resp.into_inner().pod_resources {
        for c in p.containers {
            let ids: Vec<String> =
                c.devices.into_iter().filter(|d| is_gpu(&d.resource_name)).flat_map(|d| d.device_ids).collect();
            if !ids.is_empty() {
                out.insert((p.namespace.clone(), p.name.clone(), c.name), ids);
            }
        }
    }
    Ok(out)
}

/// The latest GPU allocations, refreshed in the background.
#[derive(Debug, Clone, Default)]
pub struct Gpus(Arc<RwLock<GpuMap>>);

impl Gpus {
    /// Polls `socket` every `every`. A missing socket (no kubelet, no device
    /// plugin) is said once; the poller keeps looking so a late kubelet works.
    pub fn start(socket: PathBuf, every: Duration) -> Gpus {
        let g = Gpus::default();
        let map = g.0.clone();
        tokio::spawn(async move {
            let mut said: Option<bool> = None;
            loop {
                let res =
                    if socket.exists() { list(&socket).await } else { Err(format!("{} not found", socket.display())) };
                match res {
                    Ok(m) => {
                        if said != Some(true) {
                            tracing::info!(
                                "GPU allocations from the kubelet PodResources API ({} containers)",
                                m.len()
                            );
                            said = Some(true);
                        }
                        *map.write().unwrap_or_else(|e| e.into_inner()) = m;
                    }
                    Err(e) if said != Some(false) => {
                        tracing::info!("no kubelet PodResources ({e}); carrying on without GPU → pod mapping");
                        said = Some(false);
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(every).await;
            }
        });
        g
    }

    pub fn of(&self, namespace: &str, pod: &str, container: &str) -> Option<String> {
        let m = self.0.read().unwrap_or_else(|e| e.into_inner());
        m.get(&(namespace.to_string(), pod.to_string(), container.to_string())).map(|v| v.join(","))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gpu_resources() {
        assert!(super::is_gpu("nvidia.com/gpu"));
        assert!(super::is_gpu("nvidia.com/mig-1g.10gb"));
        assert!(!super::is_gpu("example.com/nic"));
    }
}
