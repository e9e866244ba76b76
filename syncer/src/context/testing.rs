//! Test support: a [`Context`] and tenants on scripted apiservers (`tower_test`), with caches the test
//! fills by hand. A test answers each request it expects, in order; an unexpected request finds no answer
//! and times the test out, and [`ApiServer::idle`] checks that nothing more was asked.

use std::{sync::Arc, time::Duration};

use http::{Request, Response};
use http_body_util::BodyExt;
use kube::{
    Client, Resource,
    client::Body,
    runtime::{reflector::store::Writer, watcher},
};
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};

use super::Context;
use crate::{
    config::SyncerConfig,
    identity::TenantIdentity,
    items::{DownItem, UpItem},
    metrics::Metrics,
    queue::FairQueue,
    quota::Quota,
    settings::TenantSettings,
    super_stores::{self, SuperStores},
    tenant::{self, Queues, Tenant, Tenants},
};

/// The test tenant's identity.
pub fn identity() -> TenantIdentity {
    TenantIdentity {
        cluster_key: "team-abc123-vc".into(),
        vc_name: "vc".into(),
        vc_namespace: "team".into(),
        vc_uid: "vc-uid".into(),
    }
}

/// A scripted apiserver.
pub struct ApiServer(Handle<Request<Body>, Response<Body>>);

/// A client of a scripted apiserver.
pub fn mock() -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServer(handle))
}

/// One request, waiting for its answer.
pub struct Call {
    /// Method.
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// Body as JSON (`Null` when empty).
    pub body: Value,
    send: SendResponse<Response<Body>>,
}

impl Call {
    /// Answers with `status` and a JSON body.
    pub fn respond(self, status: u16, body: &Value) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response");
        self.send.send_response(response);
    }

    /// Answers with the request body, completed as the apiserver would.
    pub fn echo(self) -> Value {
        let mut body = self.body.clone();
        if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.entry("uid").or_insert(json!("uid-of-object"));
            meta.insert("resourceVersion".into(), json!("200"));
        }
        self.respond(200, &body);
        body
    }

    /// Answers with a Kubernetes `Status` error.
    pub fn fail(self, code: u16, reason: &str, message: &str) {
        self.respond(
            code,
            &json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason, "code": code}),
        );
    }
}

impl ApiServer {
    /// The next request (panics after a few seconds without one).
    pub async fn next(&mut self) -> Call {
        let (request, send) = tokio::time::timeout(Duration::from_secs(5), self.0.next_request())
            .await
            .expect("another request was expected")
            .expect("the client is gone");
        let method = request.method().to_string();
        let uri = request.uri().to_string();
        let bytes = request.into_body().collect().await.expect("body").to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        Call {
            method,
            uri,
            body,
            send,
        }
    }

    /// The next request, which must be `method` on a URI starting with `uri`.
    pub async fn expect(&mut self, method: &str, uri: &str) -> Call {
        let call = self.next().await;
        assert_eq!(
            (call.method.as_str(), call.uri.starts_with(uri)),
            (method, true),
            "expected {method} {uri}, got {} {}",
            call.method,
            call.uri
        );
        call
    }

    /// Checks that no request is made for a while.
    pub async fn idle(&mut self) {
        if let Ok(Some((request, _))) =
            tokio::time::timeout(Duration::from_millis(200), self.0.next_request()).await
        {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

/// A syncer context on a scripted super apiserver, with empty caches.
pub fn context(super_client: Client) -> (Context, super_stores::Writers) {
    let queues = Queues {
        down: Arc::new(FairQueue::new()),
        up: Arc::new(FairQueue::new()),
    };
    let metrics = Arc::new(Metrics::default());
    let (supers, writers) = SuperStores::for_tests();
    let ctx = Context {
        super_client,
        config: SyncerConfig::default(),
        tenants: Arc::new(Tenants::default()),
        supers,
        virtual_clusters: kube::runtime::reflector::store().0,
        quota: Arc::new(Quota::new(queues.down.clone(), metrics.clone())),
        queues,
        metrics,
        events: Default::default(),
    };
    (ctx, writers)
}

/// An attached, ready tenant on a scripted tenant apiserver.
pub fn tenant(ctx: &Context, client: Client, settings: TenantSettings) -> (Arc<Tenant>, tenant::Writers) {
    let (tenant, writers) = Tenant::for_tests(identity(), client, settings, &ctx.queues);
    ctx.tenants.insert(tenant.clone());
    (tenant, writers)
}

/// Puts an object into a cache.
pub fn put<K>(writer: &mut Writer<K>, object: K)
where
    K: Resource + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Apply(object));
}

/// An object from JSON.
pub fn from_json<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("object")
}

/// Every item the downward queue hands out now.
pub async fn drain_down(ctx: &Context) -> Vec<DownItem> {
    let mut items = Vec::new();
    while let Ok(Some(work)) = tokio::time::timeout(Duration::from_millis(50), ctx.queues.down.next()).await {
        ctx.queues.down.done(&work);
        items.push(work.item);
    }
    items
}

/// Every item the upward queue hands out now.
pub async fn drain_up(ctx: &Context) -> Vec<UpItem> {
    let mut items = Vec::new();
    while let Ok(Some(work)) = tokio::time::timeout(Duration::from_millis(50), ctx.queues.up.next()).await {
        ctx.queues.up.done(&work);
        items.push(work.item);
    }
    items
}
