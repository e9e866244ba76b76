//! The port-forward of `kubectl vc connect`: a listener on 127.0.0.1 whose every connection is carried to
//! the tenant apiserver pod through the super cluster's `pods/portforward` (kube's WebSocket
//! port-forward), the way `kubectl port-forward svc/...` does it: the Service's selector picks a running,
//! ready pod and its target port.

use std::{net::SocketAddr, sync::Arc};

use k8s_openapi::{
    api::core::v1::{Pod, Service},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{Api, Client, ResourceExt, api::ListParams};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Mutex, mpsc, oneshot},
    task::JoinHandle,
};

use crate::{Error, Result, kubeconfig::InClusterEndpoint};

/// The pod and port a port-forward goes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The pod's namespace (the tenant's root namespace).
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// The container port.
    pub port: u16,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pod {}/{} port {}", self.namespace, self.pod, self.port)
    }
}

fn is_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod to forward to: a running, ready pod that is not being deleted, the first by name.
pub fn choose_pod(pods: &[Pod]) -> Option<&Pod> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
        .min_by_key(|p| p.name_any())
}

/// The container port behind `service_port` of `service` on `pod`: the target port by number, or by
/// name among the pod's container ports; the service port itself without a target port.
pub fn target_port(service: &Service, service_port: i32, pod: &Pod) -> Option<u16> {
    let ports = service.spec.as_ref()?.ports.as_ref()?;
    let port = ports
        .iter()
        .find(|p| p.port == service_port)
        .or_else(|| ports.first())?;
    let number = match &port.target_port {
        None => port.port,
        Some(IntOrString::Int(number)) => *number,
        Some(IntOrString::String(name)) => {
            pod.spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(name.as_str()))?
                .container_port
        }
    };
    u16::try_from(number).ok().filter(|p| *p > 0)
}

/// Finds the pod and port behind the apiserver Service of `endpoint`.
pub async fn find_target(client: &Client, endpoint: &InClusterEndpoint) -> Result<Target> {
    let failed = |message: String| Error::PortForward(message);
    let service = Api::<Service>::namespaced(client.clone(), &endpoint.namespace)
        .get(&endpoint.service)
        .await
        .map_err(|e| Error::reading("Service", &endpoint.namespace, &endpoint.service, e))?;
    let selector = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            failed(format!(
                "Service {}/{} has no selector, so no pod to forward to",
                endpoint.namespace, endpoint.service
            ))
        })?;
    let selector = selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods = Api::<Pod>::namespaced(client.clone(), &endpoint.namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| {
            Error::api(
                format!(
                    "listing the pods of Service {}/{} ({selector})",
                    endpoint.namespace, endpoint.service
                ),
                e,
            )
        })?
        .items;
    let pod = choose_pod(&pods).ok_or_else(|| {
        failed(format!(
            "no running and ready pod matches Service {}/{} ({selector}); {} found — is the tenant control plane up? (`kubectl vc describe`)",
            endpoint.namespace,
            endpoint.service,
            pods.len()
        ))
    })?;
    let port = target_port(&service, endpoint.port, pod).ok_or_else(|| {
        failed(format!(
            "Service {}/{} port {} has no target port on pod {}",
            endpoint.namespace,
            endpoint.service,
            endpoint.port,
            pod.name_any()
        ))
    })?;
    Ok(Target {
        namespace: endpoint.namespace.clone(),
        pod: pod.name_any(),
        port,
    })
}

/// Binds the local end on 127.0.0.1: `port`, else `fallback` when it is free, else any free port.
pub async fn bind(port: Option<u16>, fallback: Option<u16>) -> Result<TcpListener> {
    if let Some(port) = port {
        return TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| Error::PortForward(format!("listening on 127.0.0.1:{port} (--local-port): {e}")));
    }
    if let Some(port) = fallback
        && let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await
    {
        return Ok(listener);
    }
    TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| Error::PortForward(format!("listening on 127.0.0.1: {e}")))
}

/// A running port-forward; stopped by [`Forward::stop`].
pub struct Forward {
    /// Where it listens.
    pub local: SocketAddr,
    /// Problems of single connections, as they happen (for the user to see).
    pub problems: mpsc::UnboundedReceiver<String>,
    target: Arc<Mutex<Target>>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Forward {
    /// The pod it currently forwards to.
    pub async fn target(&self) -> Target {
        self.target.lock().await.clone()
    }

    /// Stops accepting and waits for the accept loop to end (open connections end with the process).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Carries one connection to `target` (looked up again once, when the pod is gone).
async fn carry(
    client: Client,
    endpoint: InClusterEndpoint,
    target: Arc<Mutex<Target>>,
    mut connection: TcpStream,
    problems: mpsc::UnboundedSender<String>,
) {
    for attempt in 0..2 {
        let current = target.lock().await.clone();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &current.namespace);
        let mut forwarder = match pods.portforward(&current.pod, &[current.port]).await {
            Ok(forwarder) => forwarder,
            Err(error) => {
                let message = crate::error::api_message(&error);
                if attempt == 0
                    && let Ok(found) = find_target(&client, &endpoint).await
                    && found != current
                {
                    let _ = problems.send(format!("{current}: {message}; now forwarding to {found}"));
                    *target.lock().await = found;
                    continue;
                }
                let _ = problems.send(format!("{current}: {message}"));
                return;
            }
        };
        let Some(mut upstream) = forwarder.take_stream(current.port) else {
            let _ = problems.send(format!("{current}: the port-forward has no stream for the port"));
            return;
        };
        if let Err(error) = tokio::io::copy_bidirectional(&mut connection, &mut upstream).await {
            // A client closing its side early is normal; report only what the pod side says.
            if error.kind() != std::io::ErrorKind::ConnectionReset {
                let _ = problems.send(format!("{current}: {error}"));
            }
        }
        drop(upstream);
        if let Err(error) = forwarder.join().await {
            let _ = problems.send(format!("{current}: {error}"));
        }
        return;
    }
}

/// Starts forwarding connections to `listener` to `target`, the pod behind `endpoint`.
pub fn start(
    client: Client,
    endpoint: InClusterEndpoint,
    target: Target,
    listener: TcpListener,
) -> Result<Forward> {
    let local = listener
        .local_addr()
        .map_err(|e| Error::PortForward(format!("the local listener: {e}")))?;
    let target = Arc::new(Mutex::new(target));
    let (stop, mut stopped) = oneshot::channel();
    let (report, problems) = mpsc::unbounded_channel();
    let shared = target.clone();
    let task = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = &mut stopped => return,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((connection, _)) => {
                    tokio::spawn(carry(
                        client.clone(),
                        endpoint.clone(),
                        shared.clone(),
                        connection,
                        report.clone(),
                    ));
                }
                Err(error) => {
                    let _ = report.send(format!("accepting a connection: {error}"));
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(Forward {
        local,
        problems,
        target,
        stop,
        task,
    })
}
