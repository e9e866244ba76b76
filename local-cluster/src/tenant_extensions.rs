//! A tenant's own API extensions, served from a pod in the tenant: a validating admission webhook and the
//! `metrics.k8s.io/v1beta1` aggregated API (PodMetrics, NodeMetrics), over TLS. The e2e tests run it as a
//! Deployment in native tenants (image [`IMAGE`], binary `tenant-extensions` of the e2e crate) to prove that
//! a tenant apiserver reaches webhooks and aggregated APIs that run as the tenant's pods.
//!
//! The webhook refuses any object labelled `deny=true` ([`DENY_LABEL`]) with a message naming it, and admits
//! everything else. The metrics are real: each vNode's `/stats/summary` is read through the tenant
//! apiserver's node proxy (`/api/v1/nodes/{node}/proxy/stats/summary`), which reaches vn-agent on that node
//! and shows only the tenant's own pods, as metrics-server reads kubelets. Aggregated requests are served
//! only to the tenant apiserver's front proxy: a client certificate signed by the request-header CA that
//! the apiserver publishes in `kube-system/extension-apiserver-authentication`, with one of its allowed
//! names.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use axum::{
    Extension, Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{Api, Client, api::ListParams};
use rustls::{ServerConfig, server::WebPkiClientVerifier};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::{Error, Result};

/// The image the e2e harness builds from the `tenant-extensions` binary, under a registry name the real
/// nodes' containerd mirrors to the harness's registry (nothing is pulled from the network).
pub const IMAGE: &str = "ghcr.io/virtualcluster-rs/e2e-tenant-extensions:local";
/// Objects with this label set to `true` are refused by the webhook.
pub const DENY_LABEL: &str = "deny";
/// The webhook's path.
pub const WEBHOOK_PATH: &str = "/validate";
/// Where the tenant apiserver publishes its front proxy's client CA.
const AUTHENTICATION_CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// What to serve, and with which certificate.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Serving certificate (PEM; the chain) for the Service's name `<name>.<namespace>.svc`.
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
}

/// The front proxy's client certificate as the connection presented it.
#[derive(Clone, Debug)]
struct Peer {
    /// Whether a certificate from the request-header CA with an allowed common name was presented.
    front_proxy: bool,
}

/// Serves until the listener fails. `tenant` is the tenant apiserver (in-cluster configuration).
pub async fn serve(settings: Settings, tenant: Client) -> Result<()> {
    let (client_ca, allowed_names) = front_proxy_ca(&tenant).await?;
    let tls = TlsAcceptor::from(Arc::new(server_tls(&settings, &client_ca)?));
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(Error::io(format!("listening on {}", settings.listen)))?;
    tracing::info!(address = %settings.listen, "serving the webhook and metrics.k8s.io");
    let router = router(tenant);
    loop {
        let (stream, remote) = listener
            .accept()
            .await
            .map_err(Error::io("accepting a connection"))?;
        let tls = tls.clone();
        let router = router.clone();
        let allowed_names = allowed_names.clone();
        tokio::spawn(async move {
            let stream = match tls.accept(stream).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%remote, %error, "TLS handshake failed");
                    return;
                }
            };
            let peer = Peer {
                front_proxy: stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .is_some_and(|leaf| allowed_common_name(leaf, &allowed_names)),
            };
            let service = TowerToHyperService::new(router.layer(Extension(peer)));
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%remote, %error, "connection ended");
            }
        });
    }
}

/// The request-header CA (PEM) and allowed common names the tenant apiserver publishes.
async fn front_proxy_ca(tenant: &Client) -> Result<(String, Vec<String>)> {
    let (namespace, name) = AUTHENTICATION_CONFIGMAP;
    let configmap = Api::<ConfigMap>::namespaced(tenant.clone(), namespace)
        .get(name)
        .await
        .map_err(Error::kube(format!("reading ConfigMap {namespace}/{name}")))?;
    let data = configmap.data.unwrap_or_default();
    let ca = data
        .get("requestheader-client-ca-file")
        .cloned()
        .ok_or_else(|| Error::Io {
            context: format!("ConfigMap {namespace}/{name}"),
            source: std::io::Error::other(
                "no requestheader-client-ca-file: the apiserver has no front proxy",
            ),
        })?;
    let allowed: Vec<String> = data
        .get("requestheader-allowed-names")
        .and_then(|names| serde_json::from_str(names).ok())
        .unwrap_or_default();
    Ok((ca, allowed))
}

/// Whether a verified client certificate's common name is allowed (any, when the list is empty, as the
/// apiserver's `--requestheader-allowed-names` says).
fn allowed_common_name(leaf: &CertificateDer<'_>, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let Ok((_, certificate)) = x509_parser::parse_x509_certificate(leaf) else {
        return false;
    };
    certificate
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .any(|cn| allowed.iter().any(|name| name == cn))
}

/// TLS with the serving certificate; client certificates are asked for and verified against the front
/// proxy's CA, but optional, since the apiserver calls webhooks without one.
fn server_tls(settings: &Settings, client_ca: &str) -> Result<ServerConfig> {
    let read = |path: &PathBuf| std::fs::read(path).map_err(Error::io(format!("reading {}", path.display())));
    let pem = |what: &str| {
        let what = what.to_owned();
        move |source: rustls_pki_types::pem::Error| Error::Http {
            context: format!("parsing {what}"),
            source: Box::new(source),
        }
    };
    let certs = CertificateDer::pem_slice_iter(&read(&settings.cert_file)?)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(pem("the serving certificate"))?;
    let key = PrivateKeyDer::from_pem_slice(&read(&settings.key_file)?).map_err(pem("the serving key"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(client_ca.as_bytes()) {
        roots
            .add(cert.map_err(pem("the front proxy's CA"))?)
            .map_err(|source| Error::Tls {
                context: "adding the front proxy's CA".into(),
                source,
            })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| Error::Http {
            context: "building the client verifier".into(),
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
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn router(tenant: Client) -> Router {
    let metrics = Router::new()
        .route("/apis/metrics.k8s.io/v1beta1", get(resources))
        .route("/apis/metrics.k8s.io/v1beta1/nodes", get(all_nodes))
        .route("/apis/metrics.k8s.io/v1beta1/nodes/{name}", get(one_node))
        .route("/apis/metrics.k8s.io/v1beta1/pods", get(all_pods))
        .route(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
            get(namespace_pods),
        )
        .route(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{name}",
            get(one_pod),
        )
        .route_layer(axum::middleware::from_fn(front_proxy_only))
        .with_state(tenant);
    Router::new()
        .route(WEBHOOK_PATH, post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .merge(metrics)
}

/// Aggregated requests come from the front proxy only: anyone else could read the tenant's figures.
async fn front_proxy_only(
    Extension(peer): Extension<Peer>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match peer.front_proxy {
        true => next.run(request).await,
        false => status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "aggregated requests need the front proxy's client certificate",
        ),
    }
}

/// An AdmissionReview answered: objects labelled `deny=true` are refused, with a message; the rest admitted.
pub fn review(request: &Value) -> Value {
    let admission = &request["request"];
    let object = &admission["object"];
    let denied = object["metadata"]["labels"][DENY_LABEL].as_str() == Some("true");
    let mut response = json!({"uid": admission["uid"], "allowed": !denied});
    if denied {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .or(admission["namespace"].as_str());
        let name = object["metadata"]["name"].as_str().or(admission["name"].as_str());
        let named = match (namespace, name) {
            (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
            (None, Some(name)) => name.to_owned(),
            _ => "this object".to_owned(),
        };
        let kind = admission["kind"]["kind"].as_str().unwrap_or("object");
        response["status"] = json!({
            "code": 403,
            "reason": "Forbidden",
            "message": format!("{kind} {named} is labelled {DENY_LABEL}=true: refused by the tenant's own webhook"),
        });
    }
    json!({
        "apiVersion": request["apiVersion"].as_str().unwrap_or("admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    })
}

async fn validate(Json(request): Json<Value>) -> Json<Value> {
    let answer = review(&request);
    tracing::info!(
        uid = %request["request"]["uid"],
        allowed = %answer["response"]["allowed"],
        "admission review"
    );
    Json(answer)
}

async fn resources() -> Json<Value> {
    Json(json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "metrics.k8s.io/v1beta1",
        "resources": [
            {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics", "verbs": ["get", "list"]},
            {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics", "verbs": ["get", "list"]}
        ]
    }))
}

/// A Kubernetes Status answer.
fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, Json(body)).into_response()
}

/// Every vNode's stats summary, through the tenant apiserver's node proxy (vn-agent on that node).
async fn summaries(tenant: &Client) -> std::result::Result<Vec<Value>, Response> {
    let unavailable = |what: String| status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", &what);
    let nodes = Api::<Node>::all(tenant.clone())
        .list(&ListParams::default())
        .await
        .map_err(|error| unavailable(format!("listing nodes: {error}")))?;
    let mut summaries = Vec::new();
    for node in nodes.items {
        let name = node.metadata.name.unwrap_or_default();
        let path = format!("/api/v1/nodes/{name}/proxy/stats/summary?only_cpu_and_memory=true");
        let request = http::Request::get(&path)
            .body(Vec::new())
            .map_err(|error| unavailable(format!("GET {path}: {error}")))?;
        match tenant.request::<Value>(request).await {
            Ok(summary) => summaries.push(summary),
            // One node that cannot answer leaves its figures out, as metrics-server does.
            Err(error) => tracing::warn!(node = %name, %error, "no stats from node"),
        }
    }
    Ok(summaries)
}

/// CPU (nanocores) and memory (working set bytes) of one stats entry; `None` until the kubelet has both.
fn usage(stats: &Value) -> Option<Value> {
    let cpu = stats["cpu"]["usageNanoCores"].as_u64()?;
    let memory = stats["memory"]["workingSetBytes"].as_u64()?;
    Some(json!({"cpu": format!("{cpu}n"), "memory": format!("{}Ki", memory / 1024)}))
}

/// PodMetrics of the pods in `summaries` (in `namespace`, named `name`, when given), once each, by
/// namespace and name. A pod some of whose containers have no figures yet is left out, as metrics-server
/// does.
pub fn pod_metrics(summaries: &[Value], namespace: Option<&str>, name: Option<&str>) -> Vec<Value> {
    let pods: std::collections::BTreeMap<(String, String), Value> = summaries
        .iter()
        .flat_map(|summary| summary["pods"].as_array().cloned().unwrap_or_default())
        .filter(|pod| namespace.is_none_or(|ns| pod["podRef"]["namespace"] == ns))
        .filter(|pod| name.is_none_or(|n| pod["podRef"]["name"] == n))
        .map(|pod| {
            let key = |field: &str| pod["podRef"][field].as_str().unwrap_or_default().to_owned();
            ((key("namespace"), key("name")), pod)
        })
        .collect();
    pods.into_values()
        .filter_map(|pod| {
            let containers = pod["containers"]
                .as_array()?
                .iter()
                .map(|c| Some(json!({"name": c["name"], "usage": usage(c)?})))
                .collect::<Option<Vec<_>>>()?;
            (!containers.is_empty()).then(|| {
                json!({
                    "kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                    "metadata": {"name": pod["podRef"]["name"], "namespace": pod["podRef"]["namespace"]},
                    "timestamp": pod["cpu"]["time"], "window": "10s",
                    "containers": containers,
                })
            })
        })
        .collect()
}

/// NodeMetrics of the vNodes in `summaries` (named `name`, when given): the figures vn-agent gives, which
/// are the sums over the tenant's own pods there.
pub fn node_metrics(summaries: &[Value], name: Option<&str>) -> Vec<Value> {
    summaries
        .iter()
        .filter(|summary| name.is_none_or(|n| summary["node"]["nodeName"] == n))
        .filter_map(|summary| {
            Some(json!({
                "kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": summary["node"]["nodeName"]},
                "timestamp": summary["node"]["cpu"]["time"], "window": "10s",
                "usage": usage(&summary["node"])?,
            }))
        })
        .collect()
}

fn list(kind: &str, items: Vec<Value>) -> Response {
    Json(json!({"kind": kind, "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {}, "items": items}))
        .into_response()
}

fn one(resource: &str, name: &str, mut items: Vec<Value>) -> Response {
    match items.pop() {
        Some(item) => Json(item).into_response(),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{resource} \"{name}\" not found"),
        ),
    }
}

async fn all_pods(State(tenant): State<Client>) -> Response {
    match summaries(&tenant).await {
        Ok(summaries) => list("PodMetricsList", pod_metrics(&summaries, None, None)),
        Err(response) => response,
    }
}

async fn namespace_pods(State(tenant): State<Client>, Path(namespace): Path<String>) -> Response {
    match summaries(&tenant).await {
        Ok(summaries) => list("PodMetricsList", pod_metrics(&summaries, Some(&namespace), None)),
        Err(response) => response,
    }
}

async fn one_pod(State(tenant): State<Client>, Path((namespace, name)): Path<(String, String)>) -> Response {
    match summaries(&tenant).await {
        Ok(summaries) => one(
            "podmetrics.metrics.k8s.io",
            &name,
            pod_metrics(&summaries, Some(&namespace), Some(&name)),
        ),
        Err(response) => response,
    }
}

async fn all_nodes(State(tenant): State<Client>) -> Response {
    match summaries(&tenant).await {
        Ok(summaries) => list("NodeMetricsList", node_metrics(&summaries, None)),
        Err(response) => response,
    }
}

async fn one_node(State(tenant): State<Client>, Path(name): Path<String>) -> Response {
    match summaries(&tenant).await {
        Ok(summaries) => one(
            "nodemetrics.metrics.k8s.io",
            &name,
            node_metrics(&summaries, Some(&name)),
        ),
        Err(response) => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(labels: Value) -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                "namespace": "shop", "name": "settings", "operation": "CREATE",
                "object": {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "settings", "namespace": "shop", "labels": labels}}
            }
        })
    }

    #[test]
    fn objects_labelled_deny_are_refused_with_a_message_and_others_admitted() {
        let refused = review(&admission(json!({"deny": "true", "app": "web"})));
        assert_eq!(refused["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(refused["kind"], "AdmissionReview");
        assert_eq!(refused["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(refused["response"]["allowed"], false);
        assert_eq!(refused["response"]["status"]["code"], 403);
        assert_eq!(
            refused["response"]["status"]["message"],
            "ConfigMap shop/settings is labelled deny=true: refused by the tenant's own webhook"
        );

        for labels in [json!({"deny": "false"}), json!({"app": "web"}), Value::Null] {
            let admitted = review(&admission(labels));
            assert_eq!(admitted["response"]["allowed"], true);
            assert!(admitted["response"].get("status").is_none());
        }
        // A DELETE has no object: admitted.
        let mut delete = admission(json!({}));
        delete["request"]["object"] = Value::Null;
        assert_eq!(review(&delete)["response"]["allowed"], true);
    }

    fn summary() -> Value {
        json!({
            "node": {"nodeName": "node-0", "cpu": {"time": "2025-01-01T00:00:00Z", "usageNanoCores": 3_000_000},
                "memory": {"workingSetBytes": 4_194_304}},
            "pods": [
                {"podRef": {"name": "web", "namespace": "shop", "uid": "u1"},
                 "cpu": {"time": "2025-01-01T00:00:00Z"},
                 "containers": [{"name": "main", "cpu": {"usageNanoCores": 2_000_000},
                    "memory": {"workingSetBytes": 2_097_152}}]},
                {"podRef": {"name": "db", "namespace": "data", "uid": "u2"},
                 "containers": [{"name": "main", "cpu": {"usageNanoCores": 1_000_000},
                    "memory": {"workingSetBytes": 1_048_576}}]},
                {"podRef": {"name": "fresh", "namespace": "shop", "uid": "u3"},
                 "containers": [{"name": "main", "memory": {"workingSetBytes": 1_048_576}}]}
            ]
        })
    }

    #[test]
    fn pod_and_node_metrics_come_from_the_summaries() {
        let summaries = [summary()];
        let shop = pod_metrics(&summaries, Some("shop"), None);
        // `fresh` has no CPU figure yet: left out.
        assert_eq!(shop.len(), 1);
        assert_eq!(shop[0]["metadata"], json!({"name": "web", "namespace": "shop"}));
        assert_eq!(
            shop[0]["containers"],
            json!([{"name": "main", "usage": {"cpu": "2000000n", "memory": "2048Ki"}}])
        );
        assert_eq!(pod_metrics(&summaries, None, None).len(), 2);
        // Two vNodes served by one agent list the same pods: each once.
        assert_eq!(pod_metrics(&[summary(), summary()], None, None).len(), 2);
        assert_eq!(pod_metrics(&summaries, Some("data"), Some("db")).len(), 1);
        assert!(pod_metrics(&summaries, Some("shop"), Some("db")).is_empty());

        let nodes = node_metrics(&summaries, None);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0]["metadata"]["name"], "node-0");
        assert_eq!(nodes[0]["usage"], json!({"cpu": "3000000n", "memory": "4096Ki"}));
        assert!(node_metrics(&summaries, Some("node-1")).is_empty());
    }
}
