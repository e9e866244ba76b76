//! Answering one request: authenticate the caller, route, check that the pod is the caller's, forward to
//! the backend, filter what comes back, and splice upgraded streams.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use crds::TenantIdentity;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use rustls_pki_types::{CertificateDer, UnixTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument;

use crate::{
    backend::Backend,
    caches::Caches,
    identity::AuthFailure,
    metrics::{AuthFailureLabels, Metrics, RequestLabels, StreamLabels, VerbLabels},
    response::{self, BoxError, ProxyBody, Refusal},
    route::{self, Action, KubeletRequest, PodTarget, RouteError},
    translate::{self, TenantPod, TenantPods},
};

/// Largest request body accepted (kubelet requests carry none worth mentioning).
const MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Largest `/pods`, stats or resource-metrics answer read for filtering.
const MAX_FILTERED_BODY: usize = 64 * 1024 * 1024;
/// How long an authentication result is reused on one connection while the trust set is unchanged (a
/// certificate may expire meanwhile).
const AUTH_CACHE_TTL: Duration = Duration::from_secs(60);

/// What request handling needs.
pub struct Context {
    /// Pods and trust.
    pub caches: Arc<Caches>,
    /// Where requests go.
    pub backend: Backend,
    /// Metrics.
    pub metrics: Metrics,
    /// Open upgraded streams, so shutdown can wait for them.
    pub streams: TaskTracker,
    /// Cuts open streams when the shutdown grace period is over.
    pub cut_streams: CancellationToken,
    /// Connections and streams held, against the caps.
    pub gate: Arc<crate::limits::Gate>,
}

struct CachedAuth {
    generation: u64,
    checked: Instant,
    result: Result<Arc<TenantIdentity>, AuthFailure>,
}

/// The client of one connection: its address and the certificate chain it presented.
pub struct Peer {
    addr: SocketAddr,
    chain: Vec<CertificateDer<'static>>,
    cached: Mutex<Option<CachedAuth>>,
    /// The connection's slot ([`crate::limits`]): held while the connection, or a stream upgraded from it,
    /// is open. hyper's connection future ends when a request upgrades, while the stream goes on holding
    /// the socket (and this peer).
    _slot: Option<crate::limits::ConnectionSlot>,
}

impl Peer {
    /// A peer at `addr` that presented `chain` (end entity first; empty without a certificate).
    pub fn new(addr: SocketAddr, chain: Vec<CertificateDer<'static>>) -> Self {
        Self {
            addr,
            chain,
            cached: Mutex::new(None),
            _slot: None,
        }
    }

    /// This peer's connection holds `slot` for as long as the peer lives.
    pub fn holding(mut self, slot: crate::limits::ConnectionSlot) -> Self {
        self._slot = Some(slot);
        self
    }

    fn authenticate(&self, caches: &Caches) -> Result<Arc<TenantIdentity>, AuthFailure> {
        let trust = caches.trust();
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = cached.as_ref()
            && hit.generation == trust.generation()
            && hit.checked.elapsed() < AUTH_CACHE_TTL
        {
            return hit.result.clone();
        }
        let result = trust.authenticate(&self.chain, UnixTime::now());
        *cached = Some(CachedAuth {
            generation: trust.generation(),
            checked: Instant::now(),
            result: result.clone(),
        });
        result
    }
}

/// Handles one request and records its metrics. Everything logged while serving it (and by the streams
/// it opens) is in one `request` span: verb, method, path, peer, and the tenant once authenticated.
pub async fn handle(ctx: Arc<Context>, peer: Arc<Peer>, request: Request<Incoming>) -> Response<ProxyBody> {
    let started = Instant::now();
    let parsed = route::parse(request.method(), request.uri().path());
    let verb = parsed
        .as_ref()
        .map(KubeletRequest::verb)
        .unwrap_or(route::UNKNOWN_VERB);
    let in_flight = ctx.metrics.in_flight.get_or_create(&VerbLabels { verb }).clone();
    in_flight.inc();
    let span = tracing::info_span!(
        "request",
        verb,
        method = %request.method(),
        path = request.uri().path(),
        peer = %peer.addr,
        tenant = tracing::field::Empty,
    );

    let (tenant, response) = serve(&ctx, &peer, parsed, request).instrument(span.clone()).await;

    in_flight.dec();
    let code = response.status().as_u16();
    ctx.metrics
        .requests
        .get_or_create(&RequestLabels {
            verb,
            tenant: tenant.clone().unwrap_or_default(),
            code,
        })
        .inc();
    ctx.metrics
        .latency
        .get_or_create(&VerbLabels { verb })
        .observe(started.elapsed().as_secs_f64());
    span.in_scope(|| tracing::debug!(code, elapsed_ms = started.elapsed().as_millis() as u64, "request"));
    response
}

async fn serve(
    ctx: &Context,
    peer: &Arc<Peer>,
    parsed: Result<KubeletRequest, RouteError>,
    request: Request<Incoming>,
) -> (Option<String>, Response<ProxyBody>) {
    if !ctx.caches.is_ready() {
        let refusal = Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "vn-agent is starting: caches are not synced yet",
        );
        return (None, refusal.into_response());
    }
    let tenant = match peer.authenticate(&ctx.caches) {
        Ok(tenant) => tenant,
        Err(failure) => {
            ctx.metrics
                .auth_failures
                .get_or_create(&AuthFailureLabels {
                    reason: failure.kind.as_str(),
                })
                .inc();
            tracing::warn!(
                reason = failure.kind.as_str(),
                detail = %failure.detail,
                "refused client"
            );
            let status = failure.kind.status();
            let message = format!(
                "{}: {}",
                status.canonical_reason().unwrap_or("refused"),
                failure.detail
            );
            return (None, Refusal::new(status, message).into_response());
        }
    };
    tracing::Span::current().record("tenant", tenant.cluster_key.as_str());
    let key = Some(tenant.cluster_key.clone());
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(error) => {
            let status = match error {
                RouteError::NotFound => StatusCode::NOT_FOUND,
                RouteError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
                RouteError::InvalidSegment { .. } => StatusCode::BAD_REQUEST,
            };
            tracing::info!(%error, "request not served");
            return (key, Refusal::new(status, error.to_string()).into_response());
        }
    };
    let result = match parsed {
        KubeletRequest::Pod {
            action,
            pod,
            container,
        } => pod_request(ctx, peer, &tenant, action, &pod, container.as_deref(), request).await,
        KubeletRequest::Pods => pods(ctx, &tenant).await,
        KubeletRequest::StatsSummary => stats_summary(ctx, &tenant, request.uri().query()).await,
        KubeletRequest::MetricsResource => resource_metrics(ctx, &tenant, request.uri().query()).await,
    };
    let response = match result {
        Ok(response) => response,
        Err(Failure::Refused(refusal)) => {
            tracing::warn!(
                status = refusal.status.as_u16(),
                reason = %refusal.message,
                "request refused"
            );
            refusal.into_response()
        }
        Err(Failure::Backend(error)) => {
            tracing::error!(error = &error as &dyn std::error::Error, "backend request failed");
            Refusal::new(StatusCode::BAD_GATEWAY, vc_runtime::error::chain(&error)).into_response()
        }
    };
    (key, response)
}

enum Failure {
    Refused(Refusal),
    Backend(crate::Error),
}

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Self {
        Self::Refused(refusal)
    }
}

type Handled = Result<Response<ProxyBody>, Failure>;

/// Finds the super pod for `target` (the cache first, the apiserver for a pod created a moment ago) and
/// checks it is the tenant's.
async fn resolve_pod(
    ctx: &Context,
    tenant: &TenantIdentity,
    target: &PodTarget,
) -> Result<TenantPod, Failure> {
    let (super_namespace, name) = translate::super_location(&tenant.cluster_key, target);
    let pod = match ctx.caches.pod(&super_namespace, &name) {
        Some(pod) => pod,
        None => match ctx.caches.fetch_pod(&super_namespace, &name).await {
            Ok(Some(pod)) => Arc::new(pod),
            Ok(None) => {
                return Err(Refusal::not_found(format!(
                    "pod {}/{} not found on this node",
                    target.namespace, target.name
                ))
                .into());
            }
            Err(error) => return Err(Failure::Backend(error)),
        },
    };
    Ok(translate::check_target(&pod, &tenant.cluster_key, target)?)
}

async fn pod_request<B: RequestBody>(
    ctx: &Context,
    peer: &Arc<Peer>,
    tenant: &TenantIdentity,
    action: Action,
    target: &PodTarget,
    container: Option<&str>,
    request: Request<B>,
) -> Handled {
    let pod = resolve_pod(ctx, tenant, target).await?;
    let query = request.uri().query().map(str::to_owned);
    let path_and_query = match &ctx.backend {
        Backend::Kubelet(_) => {
            let path = translate::kubelet_path(action, &pod, target.uid.is_some(), container);
            match &query {
                Some(query) => format!("{path}?{query}"),
                None => path,
            }
        }
        Backend::SuperApiserver(apiserver) => {
            let Some(subresource) = translate::apiserver_subresource(action) else {
                // run: no subresource of its own; exec the command and return its output.
                let command: Vec<String> = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                    .find(|(k, _)| k == "cmd")
                    .map(|(_, v)| v.split_whitespace().map(str::to_owned).collect())
                    .unwrap_or_default();
                if command.is_empty() {
                    return Err(Refusal::new(StatusCode::BAD_REQUEST, "run needs a cmd parameter").into());
                }
                let output = apiserver
                    .run(
                        &pod.super_namespace,
                        &pod.name,
                        container.unwrap_or_default(),
                        command,
                    )
                    .await
                    .map_err(Failure::Backend)?;
                return Ok(response::with_body(
                    StatusCode::OK,
                    "text/plain; charset=utf-8",
                    output,
                ));
            };
            let query = translate::apiserver_query(action, container, query.as_deref());
            format!(
                "/api/v1/namespaces/{}/pods/{}/{subresource}?{query}",
                pod.super_namespace, pod.name
            )
        }
    };
    forward(ctx, peer, tenant, action.as_str(), request, path_and_query).await
}

/// Request headers passed to the backend. Credentials, impersonation and proxy headers never are.
const FORWARDED_REQUEST_HEADERS: &[HeaderName] = &[
    header::ACCEPT,
    header::ACCEPT_ENCODING,
    header::CONTENT_TYPE,
    header::USER_AGENT,
    header::UPGRADE,
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_PROTOCOL,
    header::SEC_WEBSOCKET_EXTENSIONS,
];

/// The streaming protocol negotiation header of SPDY streams.
const STREAM_PROTOCOL_VERSION: &str = "x-stream-protocol-version";

/// Response headers that belong to one hop.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHENTICATE,
];

fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

fn forwarded_headers(incoming: &HeaderMap, upgrade: bool) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for name in FORWARDED_REQUEST_HEADERS {
        if *name == header::UPGRADE && !upgrade {
            continue;
        }
        for value in incoming.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    for value in incoming.get_all(STREAM_PROTOCOL_VERSION) {
        headers.append(HeaderName::from_static(STREAM_PROTOCOL_VERSION), value.clone());
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    }
    headers
}

/// Reads a whole body of at most `limit` bytes.
async fn collect_limited(mut body: ProxyBody, limit: usize) -> Result<Bytes, BoxError> {
    let mut collected = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if collected.len() + data.len() > limit {
                return Err(format!("longer than {limit} bytes").into());
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(collected.freeze())
}

/// What a request body must be to be forwarded (hyper's, or a fixed one in tests).
trait RequestBody:
    hyper::body::Body<Data = Bytes, Error: std::error::Error + Send + Sync + 'static> + Send + 'static
{
}

impl<B> RequestBody for B where
    B: hyper::body::Body<Data = Bytes, Error: std::error::Error + Send + Sync + 'static> + Send + 'static
{
}

async fn read_body<B: RequestBody>(body: B, limit: usize) -> Result<Bytes, Failure> {
    let body = body.map_err(|e| -> BoxError { Box::new(e) }).boxed_unsync();
    collect_limited(body, limit)
        .await
        .map_err(|error| Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body: {error}")).into())
}

/// Sends the request on to the backend and streams the answer back; an upgrade is spliced, for as long as
/// the caller's certificate stays trusted.
async fn forward<B: RequestBody>(
    ctx: &Context,
    peer: &Arc<Peer>,
    tenant: &TenantIdentity,
    verb: &'static str,
    mut request: Request<B>,
    path_and_query: String,
) -> Handled {
    let upgrade = wants_upgrade(request.headers());
    // A tenant holds at most its share of open streams: the rest of the node's tenants keep theirs.
    let stream_slot = match upgrade {
        true => Some(ctx.gate.stream(&tenant.cluster_key).ok_or_else(|| {
            ctx.metrics
                .limited
                .get_or_create(&crate::metrics::LimitLabels {
                    limit: "streams_per_tenant",
                })
                .inc();
            Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "tenant {} has {} streams (exec, attach, port-forward) open on this node, the most vn-agent keeps for one tenant (--max-streams-per-tenant)",
                    tenant.vc_ref(),
                    ctx.gate.limits().streams_per_tenant
                ),
            )
        })?),
        false => None,
    };
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let body = read_body(body, MAX_REQUEST_BODY).await?;
    let mut outgoing = Request::new(body);
    *outgoing.method_mut() = parts.method.clone();
    *outgoing.uri_mut() = path_and_query
        .parse()
        .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, format!("unusable request: {e}")))?;
    *outgoing.headers_mut() = forwarded_headers(&parts.headers, upgrade);

    let mut backend_response = ctx.backend.send(outgoing).await.map_err(Failure::Backend)?;
    let status = backend_response.status();
    if let Some(client_upgrade) = client_upgrade
        && status == StatusCode::SWITCHING_PROTOCOLS
    {
        let backend_upgrade = hyper::upgrade::on(&mut backend_response);
        let mut response = Response::new(response::full(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        for (name, value) in backend_response.headers() {
            response.headers_mut().append(name.clone(), value.clone());
        }
        let metrics = ctx.metrics.clone();
        let cut = ctx.cut_streams.child_token();
        let (caches, peer, tenant_key) = (ctx.caches.clone(), peer.clone(), tenant.cluster_key.clone());
        // The stream outlives the request; its lines keep the request's span.
        let span = tracing::Span::current();
        ctx.streams.spawn(
            async move {
            let _slot = stream_slot;
            let (client, backend) = match tokio::try_join!(client_upgrade, backend_upgrade) {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(%error, "upgrade did not complete");
                    return;
                }
            };
            let spliced = splice(TokioIo::new(client), TokioIo::new(backend), verb, &metrics, cut.clone());
            tokio::pin!(spliced);
            tokio::select! {
                () = &mut spliced => {}
                () = revoked(&caches, &peer, &tenant_key) => {
                    tracing::info!("the caller's certificate is no longer trusted (its VirtualCluster is gone or its kubelet-client CA was replaced); cutting its open stream");
                    metrics.streams_revoked.get_or_create(&VerbLabels { verb }).inc();
                    cut.cancel();
                    spliced.await;
                }
            }
            }
            .instrument(span),
        );
        return Ok(response);
    }

    let mut response = Response::new(response::full(Bytes::new()));
    *response.status_mut() = status;
    for (name, value) in backend_response.headers() {
        if !HOP_BY_HOP.contains(name) {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    *response.body_mut() = backend_response.into_body();
    Ok(response)
}

/// Resolves once `peer`'s certificate no longer authenticates tenant `tenant_key`: checked again on every
/// rebuild of the trust set (a VirtualCluster deleted, a kubelet-client CA replaced or removed).
async fn revoked(caches: &Caches, peer: &Peer, tenant_key: &str) {
    let mut changes = caches.trust_changes();
    loop {
        match peer.authenticate(caches) {
            Ok(tenant) if tenant.cluster_key == tenant_key => {}
            _ => return,
        }
        if changes.changed().await.is_err() {
            // The trust set is never rebuilt again (shutdown): the stream ends with the agent.
            std::future::pending::<()>().await;
        }
    }
}

/// Copies bytes as they come, flushing every chunk, and counts them.
async fn pump(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    counter: &Counter,
) -> std::io::Result<()> {
    let mut buffer = vec![0u8; 32 * 1024];
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        to.write_all(&buffer[..read]).await?;
        to.flush().await?;
        counter.inc_by(read as u64);
    }
}

/// Copies both ways until either side closes (or errs), then closes both: an exec ends for the tenant
/// when the kubelet ends it, and the kubelet stops the session when the tenant goes away.
pub async fn splice(
    client: impl AsyncRead + AsyncWrite + Send + 'static,
    backend: impl AsyncRead + AsyncWrite + Send + 'static,
    verb: &'static str,
    metrics: &Metrics,
    cut: CancellationToken,
) {
    let open = metrics.streams_open.get_or_create(&VerbLabels { verb }).clone();
    open.inc();
    let to_backend = metrics
        .stream_bytes
        .get_or_create(&StreamLabels {
            verb,
            direction: "to_backend",
        })
        .clone();
    let to_client = metrics
        .stream_bytes
        .get_or_create(&StreamLabels {
            verb,
            direction: "to_client",
        })
        .clone();
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut backend_read, mut backend_write) = tokio::io::split(backend);
    let ended = tokio::select! {
        result = pump(&mut client_read, &mut backend_write, &to_backend) => ("client", result),
        result = pump(&mut backend_read, &mut client_write, &to_client) => ("backend", result),
        _ = cut.cancelled() => ("shutdown", Ok(())),
    };
    let close = Duration::from_secs(2);
    let _ = tokio::time::timeout(close, backend_write.shutdown()).await;
    let _ = tokio::time::timeout(close, client_write.shutdown()).await;
    open.dec();
    match ended {
        (side, Ok(())) => tracing::debug!(verb, closed_by = side, "stream closed"),
        (side, Err(error)) => tracing::debug!(verb, side, %error, "stream ended with an error"),
    }
}

async fn read_backend_body(response: Response<ProxyBody>, what: &'static str) -> Result<Bytes, Failure> {
    collect_limited(response.into_body(), MAX_FILTERED_BODY)
        .await
        .map_err(|source| Failure::Backend(crate::Error::Rewrite { what, source }))
}

fn tenant_pods(
    ctx: &Context,
    tenant: &TenantIdentity,
) -> (Vec<Arc<k8s_openapi::api::core::v1::Pod>>, TenantPods) {
    let pods = ctx.caches.pods();
    let index = TenantPods::new(&tenant.cluster_key, pods.iter().map(AsRef::as_ref));
    (pods, index)
}

/// Sends a GET to the backend and returns the body of a 200, or the backend's answer as it is.
async fn get_backend(
    ctx: &Context,
    path_and_query: String,
    what: &'static str,
) -> Result<Result<Bytes, Response<ProxyBody>>, Failure> {
    let mut request = Request::new(Bytes::new());
    *request.method_mut() = Method::GET;
    *request.uri_mut() = path_and_query
        .parse()
        .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, format!("unusable request: {e}")))?;
    let response = ctx.backend.send(request).await.map_err(Failure::Backend)?;
    if response.status() != StatusCode::OK {
        let mut passed = Response::new(response::full(Bytes::new()));
        *passed.status_mut() = response.status();
        if let Some(content_type) = response.headers().get(header::CONTENT_TYPE) {
            passed
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type.clone());
        }
        *passed.body_mut() = response.into_body();
        return Ok(Err(passed));
    }
    Ok(Ok(read_backend_body(response, what).await?))
}

fn with_query(path: String, query: Option<&str>) -> String {
    match query {
        Some(query) if !query.is_empty() => format!("{path}?{query}"),
        _ => path,
    }
}

/// Nodes to ask through the super apiserver: the tenant's pods' nodes, or the served nodes when it has
/// none there.
fn nodes_to_ask(ctx: &Context, index: &TenantPods) -> Vec<String> {
    let nodes = index.nodes();
    if !nodes.is_empty() {
        return nodes;
    }
    match ctx.caches.nodes() {
        crate::settings::NodeScope::Named(names) => names.iter().take(1).cloned().collect(),
        crate::settings::NodeScope::All => Vec::new(),
    }
}

fn parse_json(bytes: &[u8], what: &'static str) -> Result<serde_json::Value, Failure> {
    serde_json::from_slice(bytes).map_err(|source| {
        Failure::Backend(crate::Error::Rewrite {
            what,
            source: Box::new(source),
        })
    })
}

async fn pods(ctx: &Context, tenant: &TenantIdentity) -> Handled {
    let (pods, index) = tenant_pods(ctx, tenant);
    match &ctx.backend {
        Backend::Kubelet(_) => {
            let body = match get_backend(ctx, "/pods".into(), "pods").await? {
                Ok(body) => body,
                Err(passed) => return Ok(passed),
            };
            let mut list = parse_json(&body, "pods")?;
            translate::filter_pod_list(&mut list, &index);
            Ok(response::json(&list))
        }
        Backend::SuperApiserver(_) => Ok(response::json(&translate::pod_list_from(&pods, &index))),
    }
}

async fn stats_summary(ctx: &Context, tenant: &TenantIdentity, query: Option<&str>) -> Handled {
    let (_, index) = tenant_pods(ctx, tenant);
    let mut summaries = Vec::new();
    match &ctx.backend {
        Backend::Kubelet(_) => {
            match get_backend(ctx, with_query("/stats/summary".into(), query), "stats summary").await? {
                Ok(body) => summaries.push(parse_json(&body, "stats summary")?),
                Err(passed) => return Ok(passed),
            }
        }
        Backend::SuperApiserver(_) => {
            for node in nodes_to_ask(ctx, &index) {
                let path = with_query(format!("/api/v1/nodes/{node}/proxy/stats/summary"), query);
                match get_backend(ctx, path, "stats summary").await? {
                    Ok(body) => summaries.push(parse_json(&body, "stats summary")?),
                    Err(passed) => return Ok(passed),
                }
            }
        }
    }
    let mut summary = translate::merge_summaries(summaries);
    translate::filter_summary(&mut summary, &index);
    Ok(response::json(&summary))
}

async fn resource_metrics(ctx: &Context, tenant: &TenantIdentity, query: Option<&str>) -> Handled {
    let (_, index) = tenant_pods(ctx, tenant);
    let mut text = String::new();
    let paths: Vec<String> = match &ctx.backend {
        Backend::Kubelet(_) => vec![with_query("/metrics/resource".into(), query)],
        Backend::SuperApiserver(_) => nodes_to_ask(ctx, &index)
            .into_iter()
            .map(|node| with_query(format!("/api/v1/nodes/{node}/proxy/metrics/resource"), query))
            .collect(),
    };
    for path in paths {
        match get_backend(ctx, path, "resource metrics").await? {
            Ok(body) => text.push_str(&String::from_utf8_lossy(&body)),
            Err(passed) => return Ok(passed),
        }
    }
    Ok(response::with_body(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        translate::filter_resource_metrics(&text, &index),
    ))
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;
    use k8s_openapi::api::core::v1::Pod;
    use mock_apiserver::ApiServer;

    use super::*;
    use crate::{
        identity::{
            TrustSet,
            tests::{TestCa, bundle_entry, provider, virtual_cluster},
        },
        settings::NodeScope,
        translate::tests::super_pod,
    };

    const A: &str = "team-a-1a2b3c-dev";
    const B: &str = "team-b-4d5e6f-dev";

    fn tenant(key: &str) -> TenantIdentity {
        TenantIdentity {
            cluster_key: key.into(),
            vc_namespace: "team".into(),
            vc_name: "dev".into(),
            vc_uid: "uid".into(),
        }
    }

    /// A context whose super-apiserver backend and caches' client are a mocked apiserver.
    fn context(pods: Vec<Pod>, nodes: NodeScope) -> (Context, ApiServer) {
        let (client, api) = mock_apiserver::pair();
        let caches = Caches::filled(client.clone(), nodes, pods, TrustSet::empty());
        let ctx = Context {
            caches,
            backend: Backend::new(
                &crate::settings::BackendSettings::SuperApiserver,
                client,
                provider(),
                &CancellationToken::new(),
            )
            .expect("backend"),
            metrics: Metrics::default(),
            streams: TaskTracker::new(),
            cut_streams: CancellationToken::new(),
            gate: crate::limits::Gate::new(Default::default()),
        };
        (ctx, api)
    }

    async fn within_a_second<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(1), future)
            .await
            .expect("finished within a second")
    }

    fn handled(result: Handled) -> Response<ProxyBody> {
        match result {
            Ok(response) => response,
            Err(Failure::Refused(refusal)) => panic!("refused: {refusal:?}"),
            Err(Failure::Backend(error)) => panic!("backend: {error}"),
        }
    }

    async fn body_json(response: Response<ProxyBody>) -> serde_json::Value {
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        serde_json::from_slice(&bytes).expect("json")
    }

    fn stats(namespace: &str, name: &str, uid: &str, cpu: u64) -> serde_json::Value {
        serde_json::json!({
            "podRef": {"namespace": namespace, "name": name, "uid": uid},
            "cpu": {"time": "t", "usageNanoCores": cpu},
            "memory": {"time": "t", "workingSetBytes": cpu * 2}
        })
    }

    #[tokio::test]
    async fn super_apiserver_stats_come_from_the_nodes_proxy_and_are_cut_to_the_tenant() {
        let pods = vec![
            super_pod(A, "web", "nginx", "a-1", "node-1"),
            super_pod(B, "web", "nginx", "b-1", "node-1"),
        ];
        let (ctx, mut api) = context(pods, NodeScope::Named(vec!["node-1".into()]));
        let verifier = tokio::spawn(async move {
            api.expect(
                "GET",
                "/api/v1/nodes/node-1/proxy/stats/summary?only_cpu_and_memory=true",
            )
            .await
            .respond(
                200,
                &serde_json::json!({
                    "node": {"nodeName": "node-1", "cpu": {"time": "t", "usageNanoCores": 1000}},
                    "pods": [
                        stats(&format!("{A}-web"), "nginx", "super-a-1", 10),
                        stats(&format!("{B}-web"), "nginx", "super-b-1", 20),
                        stats("kube-system", "coredns", "c", 30),
                    ]
                }),
            );
        });
        let response =
            handled(within_a_second(stats_summary(&ctx, &tenant(A), Some("only_cpu_and_memory=true"))).await);
        within_a_second(verifier).await.expect("verifier");
        let summary = body_json(response).await;
        assert_eq!(summary["pods"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            summary["pods"][0]["podRef"],
            serde_json::json!({"namespace": "web", "name": "nginx", "uid": "a-1"})
        );
        assert_eq!(summary["node"]["cpu"]["usageNanoCores"], 10);
    }

    #[tokio::test]
    async fn super_apiserver_pod_lists_come_from_the_cache() {
        let pods = vec![
            super_pod(A, "web", "nginx", "a-1", "node-1"),
            super_pod(B, "web", "nginx", "b-1", "node-1"),
        ];
        let (ctx, _api) = context(pods, NodeScope::Named(vec!["node-1".into()]));
        // No request reaches the mocked apiserver: it would never answer, and this would time out.
        let list = body_json(handled(within_a_second(super::pods(&ctx, &tenant(B))).await)).await;
        assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(list["items"][0]["metadata"]["uid"], "b-1");
    }

    #[tokio::test]
    async fn super_apiserver_exec_is_a_pods_exec_request_with_translated_parameters() {
        let pods = vec![super_pod(A, "web", "nginx", "a-1", "node-1")];
        let (ctx, mut api) = context(pods, NodeScope::All);
        let verifier = tokio::spawn(async move {
            let call = api.expect(
                "POST",
                &format!(
                    "/api/v1/namespaces/{A}-web/pods/nginx/exec?container=app&command=sh&command=-c&command=echo+hi&stdin=true&stdout=true&stderr=false&tty=true"
                ),
            )
            .await;
            let headers = &call.headers;
            assert_eq!(
                headers.get(header::UPGRADE).map(|v| v.as_bytes()),
                Some(&b"SPDY/3.1"[..])
            );
            assert_eq!(
                headers.get(header::CONNECTION).map(|v| v.as_bytes()),
                Some(&b"Upgrade"[..])
            );
            assert_eq!(headers.get_all(STREAM_PROTOCOL_VERSION).iter().count(), 2);
            assert!(
                headers.get(header::AUTHORIZATION).is_none(),
                "the tenant's credentials stay behind"
            );
            assert!(headers.get("impersonate-user").is_none());
            call.respond(
                403,
                &serde_json::json!({"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}),
            );
        });
        let request =
            Request::post("/exec/web/nginx/app?command=sh&command=-c&command=echo+hi&input=1&output=1&tty=1")
                .header(header::CONNECTION, "Upgrade")
                .header(header::UPGRADE, "SPDY/3.1")
                .header(STREAM_PROTOCOL_VERSION, "v4.channel.k8s.io")
                .header(STREAM_PROTOCOL_VERSION, "v3.channel.k8s.io")
                .header(header::AUTHORIZATION, "Bearer tenant-token")
                .header("impersonate-user", "system:admin")
                .body(Full::new(Bytes::new()))
                .expect("request");
        let target = PodTarget {
            namespace: "web".into(),
            name: "nginx".into(),
            uid: None,
        };
        let response = handled(
            within_a_second(pod_request(
                &ctx,
                &Arc::new(Peer::new("127.0.0.1:1".parse().expect("addr"), Vec::new())),
                &tenant(A),
                Action::Exec,
                &target,
                Some("app"),
                request,
            ))
            .await,
        );
        within_a_second(verifier).await.expect("verifier");
        // The apiserver's refusal is passed through as it is.
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(body_json(response).await["reason"], "Forbidden");
    }

    #[tokio::test]
    async fn a_pod_missing_from_the_cache_is_read_and_must_be_on_a_served_node() {
        let (ctx, mut api) = context(Vec::new(), NodeScope::Named(vec!["node-1".into()]));
        let target = PodTarget {
            namespace: "web".into(),
            name: "nginx".into(),
            uid: Some("a-1".into()),
        };
        let verifier = tokio::spawn(async move {
            for (node, status) in [("node-2", 200), ("node-1", 200), ("node-1", 404)] {
                let call = api
                    .expect("GET", &format!("/api/v1/namespaces/{A}-web/pods/nginx"))
                    .await;
                let body = match status {
                    200 => serde_json::to_value(super_pod(A, "web", "nginx", "a-1", node)).expect("pod"),
                    _ => {
                        serde_json::json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})
                    }
                };
                call.respond(status, &body);
            }
        });
        let tenant = tenant(A);
        match within_a_second(resolve_pod(&ctx, &tenant, &target)).await {
            Err(Failure::Refused(refusal)) => assert_eq!(refusal.status, StatusCode::NOT_FOUND),
            _ => panic!("a pod on another node is not found"),
        }
        match within_a_second(resolve_pod(&ctx, &tenant, &target)).await {
            Ok(pod) => assert_eq!(pod.super_uid, "super-a-1"),
            _ => panic!("a pod on a served node is found"),
        }
        match within_a_second(resolve_pod(&ctx, &tenant, &target)).await {
            Err(Failure::Refused(refusal)) => assert_eq!(refusal.status, StatusCode::NOT_FOUND),
            _ => panic!("a missing pod is not found"),
        }
        within_a_second(verifier).await.expect("verifier");
    }

    #[tokio::test]
    async fn an_open_connection_is_checked_again_when_the_trust_set_changes() {
        let (vc_a, vc_b) = (
            virtual_cluster("team-a", "dev", "uid-a"),
            virtual_cluster("team-b", "dev", "uid-b"),
        );
        let (ca_a, ca_b) = (TestCa::new("a"), TestCa::new("b"));
        let secrets = [bundle_entry(&vc_a, &ca_a.pem), bundle_entry(&vc_b, &ca_b.pem)];
        let key_b = crds::naming::cluster_key_of(&vc_b).expect("key");
        let (both, _) = TrustSet::build(1, [&vc_a, &vc_b], &secrets, &provider());
        let (only_a, _) = TrustSet::build(2, [&vc_a], &secrets, &provider());
        let (client, _api) = mock_apiserver::pair();
        let caches = Caches::filled(client, NodeScope::All, Vec::new(), both);
        let peer = Peer::new("127.0.0.1:1".parse().expect("addr"), vec![ca_b.client(&key_b)]);
        assert_eq!(peer.authenticate(&caches).expect("B").cluster_key, key_b);
        assert!(peer.authenticate(&caches).is_ok(), "cached");
        caches.set_trust(only_a);
        assert!(peer.authenticate(&caches).is_err(), "B was deleted");
    }

    /// An open stream's caller is checked again on every rebuild: a rebuild that still trusts it changes
    /// nothing; a replaced CA, or a deleted VirtualCluster, ends it.
    #[tokio::test]
    async fn an_open_stream_ends_when_its_tenant_is_deleted_or_its_ca_replaced() {
        let vc = virtual_cluster("team-a", "dev", "uid-a");
        let key = crds::naming::cluster_key_of(&vc).expect("key");
        let (old_ca, new_ca) = (TestCa::new("a"), TestCa::new("a"));
        let trusting = |generation, ca: &TestCa| {
            TrustSet::build(generation, [&vc], &[bundle_entry(&vc, &ca.pem)], &provider()).0
        };
        let (client, _api) = mock_apiserver::pair();
        let caches = Caches::filled(client, NodeScope::All, Vec::new(), trusting(1, &old_ca));
        let open = Duration::from_millis(100);
        let old_peer = Peer::new("127.0.0.1:1".parse().expect("addr"), vec![old_ca.client(&key)]);
        let mut stream = std::pin::pin!(revoked(&caches, &old_peer, &key));
        assert!(
            tokio::time::timeout(open, stream.as_mut()).await.is_err(),
            "trusted: open"
        );
        caches.set_trust(trusting(2, &old_ca));
        assert!(
            tokio::time::timeout(open, stream.as_mut()).await.is_err(),
            "a rebuild with the same CA: open"
        );
        caches.set_trust(trusting(3, &new_ca));
        within_a_second(stream).await;

        let new_peer = Peer::new("127.0.0.1:2".parse().expect("addr"), vec![new_ca.client(&key)]);
        let mut stream = std::pin::pin!(revoked(&caches, &new_peer, &key));
        assert!(
            tokio::time::timeout(open, stream.as_mut()).await.is_err(),
            "the new CA's certificate: open"
        );
        let (nobody, _) = TrustSet::build(4, [], &[bundle_entry(&vc, &new_ca.pem)], &provider());
        caches.set_trust(nobody);
        within_a_second(stream).await;
    }

    #[test]
    fn only_safe_headers_are_forwarded() {
        let mut incoming = HeaderMap::new();
        incoming.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer tenant"));
        incoming.insert("impersonate-user", HeaderValue::from_static("system:admin"));
        incoming.insert("x-remote-user", HeaderValue::from_static("admin"));
        incoming.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        incoming.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        incoming.append(
            STREAM_PROTOCOL_VERSION,
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        incoming.append(
            STREAM_PROTOCOL_VERSION,
            HeaderValue::from_static("v3.channel.k8s.io"),
        );
        incoming.insert(header::USER_AGENT, HeaderValue::from_static("kube-apiserver"));
        assert!(wants_upgrade(&incoming));
        let forwarded = forwarded_headers(&incoming, true);
        assert!(forwarded.get(header::AUTHORIZATION).is_none());
        assert!(forwarded.get("impersonate-user").is_none());
        assert!(forwarded.get("x-remote-user").is_none());
        assert_eq!(
            forwarded.get(header::UPGRADE).map(|v| v.as_bytes()),
            Some(&b"SPDY/3.1"[..])
        );
        assert_eq!(
            forwarded.get(header::CONNECTION).map(|v| v.as_bytes()),
            Some(&b"Upgrade"[..])
        );
        assert_eq!(forwarded.get_all(STREAM_PROTOCOL_VERSION).iter().count(), 2);

        let mut plain = HeaderMap::new();
        plain.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        plain.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        assert!(!wants_upgrade(&plain));
        let forwarded = forwarded_headers(&plain, false);
        assert!(forwarded.get(header::UPGRADE).is_none() && forwarded.get(header::CONNECTION).is_none());

        let mut listed = HeaderMap::new();
        listed.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        listed.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert!(wants_upgrade(&listed));
    }

    #[tokio::test]
    async fn splice_copies_both_ways_and_closing_one_side_closes_the_other() {
        let (client, mut client_far) = tokio::io::duplex(64);
        let (backend, mut backend_far) = tokio::io::duplex(64);
        let metrics = Metrics::default();
        let task_metrics = metrics.clone();
        let cut = CancellationToken::new();
        let task = tokio::spawn(async move { splice(client, backend, "exec", &task_metrics, cut).await });

        client_far.write_all(b"stdin bytes").await.expect("write");
        let mut buffer = [0u8; 11];
        backend_far.read_exact(&mut buffer).await.expect("read");
        assert_eq!(&buffer, b"stdin bytes");
        // More than the duplex buffer: bytes flow as they come, not after the end.
        let big = vec![7u8; 100_000];
        let writer = tokio::spawn(async move {
            backend_far.write_all(&big).await.expect("write");
            backend_far
        });
        let mut received = vec![0u8; 100_000];
        client_far.read_exact(&mut received).await.expect("read");
        assert!(received.iter().all(|b| *b == 7));
        let backend_far = writer.await.expect("writer");

        // The backend goes away: the client side is closed too.
        drop(backend_far);
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(2), client_far.read_to_end(&mut rest))
            .await
            .expect("client side closed")
            .expect("read");
        assert!(rest.is_empty());
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("splice ended")
            .expect("join");
        let to_client = metrics
            .stream_bytes
            .get_or_create(&StreamLabels {
                verb: "exec",
                direction: "to_client",
            })
            .get();
        assert_eq!(to_client, 100_000);
        assert_eq!(
            metrics
                .streams_open
                .get_or_create(&VerbLabels { verb: "exec" })
                .get(),
            0
        );
    }

    #[tokio::test]
    async fn a_client_closing_ends_the_backend_side_and_shutdown_cuts_streams() {
        let (client, client_far) = tokio::io::duplex(64);
        let (backend, mut backend_far) = tokio::io::duplex(64);
        let metrics = Metrics::default();
        let task = tokio::spawn(async move {
            splice(client, backend, "attach", &metrics, CancellationToken::new()).await
        });
        drop(client_far);
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(2), backend_far.read_to_end(&mut rest))
            .await
            .expect("backend side closed")
            .expect("read");
        task.await.expect("join");

        let (client, mut client_far) = tokio::io::duplex(64);
        let (backend, _backend_far) = tokio::io::duplex(64);
        let cut = CancellationToken::new();
        let metrics = Metrics::default();
        let task = tokio::spawn({
            let cut = cut.clone();
            async move { splice(client, backend, "portForward", &metrics, cut).await }
        });
        cut.cancel();
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("cut")
            .expect("join");
        let mut rest = Vec::new();
        client_far.read_to_end(&mut rest).await.expect("closed");
    }
}
