//! A kubelet's HTTPS API for simulated nodes: logs, run, pods, stats and resource metrics, and (in
//! [`super::streaming`]) exec, attach and port-forward.

use std::{collections::HashSet, convert::Infallible, net::IpAddr, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::Body,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use futures::StreamExt;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{ResourceExt, runtime::reflector::Store};
use rustls::{ServerConfig, server::WebPkiClientVerifier};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_rustls::TlsAcceptor;

use super::{pods_on, streaming};
use crate::{
    Error, Result,
    pki::{CertificateAuthority, Usage},
};

/// The kubelet API of a [`super::NodeSimulator`], shared by all its nodes, on a loopback port.
pub struct KubeletApi {
    address: IpAddr,
    port: u16,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for KubeletApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletApi").field("port", &self.port).finish()
    }
}

#[derive(Clone)]
struct KubeletState {
    pods: Store<Pod>,
    nodes: Arc<HashSet<String>>,
    started: Timestamp,
}

/// Builds a rustls server config from PEM, requiring client certificates signed by one of `client_cas`.
pub(crate) fn server_tls(cert_pem: &str, key_pem: &str, client_cas: &[String]) -> Result<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in client_cas {
        for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            let cert = cert.map_err(|e| Error::Http {
                context: "parsing a client CA".into(),
                source: Box::new(e),
            })?;
            roots.add(cert).map_err(|source| Error::Tls {
                context: "adding a client CA".into(),
                source,
            })?;
        }
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| Error::Http {
            context: "building the client verifier".into(),
            source: Box::new(e),
        })?;
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Http {
            context: "parsing the serving certificate".into(),
            source: Box::new(e),
        })?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| Error::Http {
        context: "parsing the serving key".into(),
        source: Box::new(e),
    })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls {
            context: "protocol versions".into(),
            source,
        })?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|source| Error::Tls {
            context: "serving certificate".into(),
            source,
        })?;
    // Streaming upgrades (exec, port-forward) need HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl KubeletApi {
    /// Serves the kubelet API on `address` with a certificate from `ca` for it and 127.0.0.1, accepting
    /// clients whose certificates any of `client_cas` signed.
    pub async fn start(
        ca: &CertificateAuthority,
        client_cas: &[String],
        pods: Store<Pod>,
        nodes: Vec<String>,
        address: IpAddr,
    ) -> Result<Self> {
        let address_name = address.to_string();
        let mut names = vec!["127.0.0.1", "localhost", address_name.as_str()];
        names.extend(nodes.iter().map(String::as_str));
        let serving = ca.issue("simulated-kubelet", &[], &names, Usage::Server)?;
        let acceptor = TlsAcceptor::from(Arc::new(server_tls(
            &serving.cert_pem,
            &serving.key_pem,
            client_cas,
        )?));
        let listener = TcpListener::bind((address, 0))
            .await
            .map_err(Error::io("binding the kubelet API"))?;
        let port = listener
            .local_addr()
            .map_err(Error::io("kubelet API address"))?
            .port();

        let state = KubeletState {
            pods,
            nodes: Arc::new(nodes.into_iter().collect()),
            started: Timestamp::now(),
        };
        let router = router(state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let router = router.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = TowerToHyperService::new(router);
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(Self { address, port, task })
    }

    /// The port all simulated nodes advertise as their kubelet port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://<address>:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", std::net::SocketAddr::new(self.address, self.port))
    }
}

impl Drop for KubeletApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn router(state: KubeletState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .route("/run/{namespace}/{pod}/{container}", post(run))
        .route("/run/{namespace}/{pod}/{uid}/{container}", post(run_with_uid))
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(metrics_resource))
        .merge(streaming::routes())
        .with_state(state)
}

impl KubeletState {
    fn local_pods(&self) -> Vec<Arc<Pod>> {
        pods_on(&self.pods, &self.nodes)
    }

    fn find(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.local_pods()
            .into_iter()
            .find(|p| p.namespace().as_deref() == Some(namespace) && p.name_any() == name)
    }

    fn find_container(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
    ) -> Result<Arc<Pod>, (StatusCode, String)> {
        let pod = self.find(namespace, name).ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("pod {namespace}/{name} is not on this node\n"),
            )
        })?;
        let has_container = pod
            .spec
            .as_ref()
            .is_some_and(|s| s.containers.iter().any(|c| c.name == container));
        if !has_container {
            return Err((
                StatusCode::NOT_FOUND,
                format!("container {container} not found in pod {namespace}/{name}\n"),
            ));
        }
        Ok(pod)
    }
}

impl streaming::PodCheck for KubeletState {
    fn check(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        container: Option<&str>,
    ) -> Result<(), (StatusCode, String)> {
        let found = match container {
            Some(container) => self.find_container(namespace, pod, container)?,
            None => self.find(namespace, pod).ok_or_else(|| {
                (
                    StatusCode::NOT_FOUND,
                    format!("pod {namespace}/{pod} is not on this node\n"),
                )
            })?,
        };
        match uid {
            Some(uid) if found.uid().as_deref() != Some(uid) => {
                Err((StatusCode::NOT_FOUND, "pod uid does not match\n".to_owned()))
            }
            _ => Ok(()),
        }
    }
}

async fn pods(State(state): State<KubeletState>) -> Json<serde_json::Value> {
    let local = state.local_pods();
    let items: Vec<&Pod> = local.iter().map(|p| p.as_ref()).collect();
    Json(serde_json::json!({ "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items }))
}

/// The log lines the simulated kubelet serves for a container, oldest first.
pub fn expected_log_lines(namespace: &str, pod: &str, container: &str) -> Vec<String> {
    (1..=10)
        .map(|i| format!("{namespace}/{pod}/{container} line {i}"))
        .collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    tail_lines: Option<usize>,
    follow: Option<bool>,
    limit_bytes: Option<usize>,
}

async fn container_logs(
    State(state): State<KubeletState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<LogQuery>,
) -> Response {
    if let Err(not_found) = state.find_container(&namespace, &pod, &container) {
        return not_found.into_response();
    }
    let lines = expected_log_lines(&namespace, &pod, &container);
    let start = lines
        .len()
        .saturating_sub(query.tail_lines.unwrap_or(lines.len()));
    let mut text: String = lines[start..].iter().map(|l| format!("{l}\n")).collect();
    if let Some(limit) = query.limit_bytes {
        text.truncate(limit);
    }
    if !query.follow.unwrap_or(false) {
        return text.into_response();
    }
    // Follow: the existing lines, then one more line every 200 ms until the client goes away.
    let prefix = format!("{namespace}/{pod}/{container}");
    let more = futures::stream::unfold(lines.len() + 1, move |i| {
        let prefix = prefix.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Some((Ok::<_, Infallible>(format!("{prefix} line {i}\n")), i + 1))
        }
    });
    let body = futures::stream::once(async move { Ok::<_, Infallible>(text) }).chain(more);
    Response::new(Body::from_stream(body))
}

#[derive(Deserialize)]
struct RunQuery {
    cmd: Option<String>,
}

async fn run(
    State(state): State<KubeletState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<RunQuery>,
) -> Response {
    run_in(&state, &namespace, &pod, None, &container, query.cmd.as_deref())
}

async fn run_with_uid(
    State(state): State<KubeletState>,
    Path((namespace, pod, uid, container)): Path<(String, String, String, String)>,
    Query(query): Query<RunQuery>,
) -> Response {
    run_in(
        &state,
        &namespace,
        &pod,
        Some(&uid),
        &container,
        query.cmd.as_deref(),
    )
}

fn run_in(
    state: &KubeletState,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
    container: &str,
    cmd: Option<&str>,
) -> Response {
    let found = match state.find_container(namespace, pod, container) {
        Ok(found) => found,
        Err(not_found) => return not_found.into_response(),
    };
    if uid.is_some_and(|uid| found.uid().as_deref() != Some(uid)) {
        return (StatusCode::NOT_FOUND, "pod uid does not match\n").into_response();
    }
    format!("ran `{}` in {namespace}/{pod}/{container}\n", cmd.unwrap_or("")).into_response()
}

/// The CPU (nanocores) and memory (bytes) the simulated kubelet reports for a pod: fixed per pod uid, so
/// tests can predict them.
pub fn pod_usage(uid: &str) -> (u64, u64) {
    let digest = Sha256::digest(uid.as_bytes());
    let cpu_millis = 1 + u64::from(digest[0]) % 100;
    let memory_mib = 1 + u64::from(digest[1]) % 64;
    (cpu_millis * 1_000_000, memory_mib * 1024 * 1024)
}

fn containers_of(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

async fn stats_summary(State(state): State<KubeletState>) -> Json<serde_json::Value> {
    let now = Timestamp::now();
    let elapsed = (now.as_second() - state.started.as_second()).max(1) as u64;
    let mut node_cpu = 0;
    let mut node_memory = 0;
    let pods: Vec<serde_json::Value> = state
        .local_pods()
        .iter()
        .map(|pod| {
            let uid = pod.uid().unwrap_or_default();
            let (cpu, memory) = pod_usage(&uid);
            node_cpu += cpu;
            node_memory += memory;
            let containers = containers_of(pod);
            let per_container = containers.len().max(1) as u64;
            let usage = |cpu: u64, memory: u64| {
                serde_json::json!({
                    "cpu": { "time": now.to_string(), "usageNanoCores": cpu, "usageCoreNanoSeconds": cpu * elapsed },
                    "memory": { "time": now.to_string(), "workingSetBytes": memory, "usageBytes": memory, "rssBytes": memory },
                })
            };
            let container_stats: Vec<serde_json::Value> = containers
                .iter()
                .map(|name| {
                    let mut stats = usage(cpu / per_container, memory / per_container);
                    stats["name"] = name.clone().into();
                    stats["startTime"] = state.started.to_string().into();
                    stats
                })
                .collect();
            let mut stats = usage(cpu, memory);
            stats["podRef"] = serde_json::json!({ "name": pod.name_any(), "namespace": pod.namespace(), "uid": uid });
            stats["startTime"] = state.started.to_string().into();
            stats["containers"] = container_stats.into();
            stats
        })
        .collect();
    let node_name = state.nodes.iter().next().cloned().unwrap_or_default();
    Json(serde_json::json!({
        "node": {
            "nodeName": node_name,
            "startTime": state.started.to_string(),
            "cpu": { "time": now.to_string(), "usageNanoCores": node_cpu, "usageCoreNanoSeconds": node_cpu * elapsed },
            "memory": { "time": now.to_string(), "workingSetBytes": node_memory, "usageBytes": node_memory },
        },
        "pods": pods,
    }))
}

async fn metrics_resource(State(state): State<KubeletState>) -> Response {
    let now = Timestamp::now();
    let millis = now.as_millisecond();
    let elapsed = (now.as_second() - state.started.as_second()).max(1) as f64;
    let mut out = String::new();
    let mut containers = String::new();
    let mut pods = String::new();
    let (mut node_cpu, mut node_memory) = (0u64, 0u64);
    for pod in state.local_pods() {
        let uid = pod.uid().unwrap_or_default();
        let (cpu, memory) = pod_usage(&uid);
        node_cpu += cpu;
        node_memory += memory;
        let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let names = containers_of(&pod);
        let share = names.len().max(1) as u64;
        for container in names {
            let cpu_seconds = (cpu / share) as f64 * elapsed / 1e9;
            containers.push_str(&format!(
                "container_cpu_usage_seconds_total{{container=\"{container}\",namespace=\"{namespace}\",pod=\"{name}\"}} {cpu_seconds} {millis}\n\
                 container_memory_working_set_bytes{{container=\"{container}\",namespace=\"{namespace}\",pod=\"{name}\"}} {} {millis}\n\
                 container_start_time_seconds{{container=\"{container}\",namespace=\"{namespace}\",pod=\"{name}\"}} {} {millis}\n",
                memory / share,
                state.started.as_second(),
            ));
        }
        pods.push_str(&format!(
            "pod_cpu_usage_seconds_total{{namespace=\"{namespace}\",pod=\"{name}\"}} {} {millis}\n\
             pod_memory_working_set_bytes{{namespace=\"{namespace}\",pod=\"{name}\"}} {memory} {millis}\n",
            cpu as f64 * elapsed / 1e9,
        ));
    }
    out.push_str("# TYPE container_cpu_usage_seconds_total counter\n# TYPE container_memory_working_set_bytes gauge\n# TYPE container_start_time_seconds gauge\n");
    out.push_str(&containers);
    out.push_str(&format!(
        "# TYPE node_cpu_usage_seconds_total counter\nnode_cpu_usage_seconds_total {} {millis}\n# TYPE node_memory_working_set_bytes gauge\nnode_memory_working_set_bytes {node_memory} {millis}\n",
        node_cpu as f64 * elapsed / 1e9
    ));
    out.push_str("# TYPE pod_cpu_usage_seconds_total counter\n# TYPE pod_memory_working_set_bytes gauge\n");
    out.push_str(&pods);
    out.push_str("# TYPE scrape_error gauge\nscrape_error 0\n");
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        out,
    )
        .into_response()
}
