//! A minimal metrics-server for a tenant: serves `metrics.k8s.io/v1beta1` as an aggregated API, computed
//! from each vNode's kubelet `/stats/summary`, scraped the way metrics-server scrapes kubelets: at the
//! vNode's InternalIP and kubelet port (vn-agent), with the tenant's kubelet-client certificate
//! (metrics-server's `--kubelet-client-certificate`). That is the path `kubectl top pod` takes in a
//! tenant. (The apiserver's `nodes/proxy` refuses loopback node addresses, which every node here has.) The
//! figures become PodMetrics and NodeMetrics as in the tenant-extensions server of the real-node tests.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::ListParams};
use local_cluster::tenant_extensions;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::{Value, json};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_rustls::TlsAcceptor;

#[derive(Clone)]
struct Scraper {
    tenant: Client,
    kubelets: local_cluster::http_client::HttpsClient,
}

/// The aggregated API server; stops when dropped.
pub struct MetricsApi {
    port: u16,
    task: JoinHandle<()>,
}

impl Drop for MetricsApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MetricsApi {
    /// Serves on a loopback port; finds vNodes through `tenant` and scrapes them trusting `kubelet_ca`
    /// with the client certificate `identity`.
    pub async fn start(
        tenant: Client,
        kubelet_ca: &str,
        identity: &local_cluster::pki::CertifiedKey,
    ) -> anyhow::Result<Self> {
        let scraper = Scraper {
            tenant,
            kubelets: local_cluster::http_client::HttpsClient::new(kubelet_ca, Some(identity))?,
        };
        let ca = local_cluster::pki::CertificateAuthority::new("metrics-api")?;
        let serving = ca.issue(
            "metrics-server",
            &[],
            &["localhost", "127.0.0.1"],
            local_cluster::pki::Usage::Server,
        )?;
        let certs =
            CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())?;
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(certs, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let router = Router::new()
            .route("/apis/metrics.k8s.io/v1beta1", get(resources))
            .route("/apis/metrics.k8s.io/v1beta1/pods", get(all_pods))
            .route(
                "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
                get(namespace_pods),
            )
            .route("/apis/metrics.k8s.io/v1beta1/nodes", get(nodes))
            .with_state(scraper);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let router = router.clone();
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let _ = auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                            .await;
                    }
                });
            }
        });
        Ok(Self { port, task })
    }

    /// Registers the API in the tenant (an ExternalName Service to `localhost` and an APIService) and waits
    /// until the tenant apiserver finds it available.
    pub async fn register(&self, tenant: &Client) -> anyhow::Result<()> {
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "metrics-server", "namespace": "kube-system"},
            "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"port": self.port}]}
        });
        local_cluster::apply::apply_yaml(tenant, &serde_json::to_string(&service)?, "kube-system").await?;
        let api_service = json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {
                "group": "metrics.k8s.io", "version": "v1beta1",
                "service": {"namespace": "kube-system", "name": "metrics-server", "port": self.port},
                "insecureSkipTLSVerify": true,
                "groupPriorityMinimum": 100, "versionPriority": 100
            }
        });
        local_cluster::apply::apply_yaml(tenant, &serde_json::to_string(&api_service)?, "").await?;
        local_cluster::wait::until_true(Duration::from_secs(60), "metrics API available", || {
            let tenant = tenant.clone();
            async move {
                // kubectl top looks for the group in discovery (`/apis`), which the aggregator updates
                // after it starts proxying the group version: wait for both.
                let proxied = match http::Request::get("/apis/metrics.k8s.io/v1beta1").body(Vec::new()) {
                    Ok(request) => tenant.request_text(request).await.is_ok(),
                    Err(_) => false,
                };
                let discovered = match http::Request::get("/apis").body(Vec::new()) {
                    Ok(request) => tenant
                        .request_text(request)
                        .await
                        .is_ok_and(|groups| groups.contains("\"metrics.k8s.io\"")),
                    Err(_) => false,
                };
                proxied && discovered
            }
        })
        .await
        .context("the tenant apiserver never served metrics.k8s.io")?;
        Ok(())
    }
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

/// Every vNode's summary, from its kubelet endpoint.
async fn summaries(scraper: &Scraper) -> anyhow::Result<Vec<Value>> {
    let nodes = Api::<Node>::all(scraper.tenant.clone())
        .list(&ListParams::default())
        .await?;
    let mut summaries = Vec::new();
    for node in nodes.items {
        let status = node.status.unwrap_or_default();
        let address = status
            .addresses
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .context("vNode without an InternalIP")?;
        let port = status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port)
            .context("vNode without a kubelet port")?;
        let url = format!("https://{address}:{port}/stats/summary?only_cpu_and_memory=true");
        let (code, body) = scraper.kubelets.get(&url).await?;
        anyhow::ensure!(code == 200, "GET {url}: {code} {body}");
        summaries.push(serde_json::from_str(&body)?);
    }
    Ok(summaries)
}

async fn pod_metrics(scraper: &Scraper, namespace: Option<&str>) -> Response {
    match summaries(scraper).await {
        // One agent serves every simulated node here, so each vNode's summary lists the same pods; the
        // shared conversion lists each once.
        Ok(summaries) => list(
            "PodMetricsList",
            tenant_extensions::pod_metrics(&summaries, namespace, None),
        ),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

fn list(kind: &str, items: Vec<Value>) -> Response {
    Json(json!({"kind": kind, "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {}, "items": items}))
        .into_response()
}

async fn all_pods(State(scraper): State<Scraper>) -> Response {
    pod_metrics(&scraper, None).await
}

async fn namespace_pods(State(scraper): State<Scraper>, Path(namespace): Path<String>) -> Response {
    pod_metrics(&scraper, Some(&namespace)).await
}

async fn nodes(State(scraper): State<Scraper>) -> Response {
    match summaries(&scraper).await {
        Ok(summaries) => list(
            "NodeMetricsList",
            tenant_extensions::node_metrics(&summaries, None),
        ),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}
