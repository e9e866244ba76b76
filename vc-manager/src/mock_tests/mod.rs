//! Reconciles against a scripted apiserver (the shared [`mock_apiserver`]): each test lists the requests the reconcile
//! must make, in order, with method, full URI and body, and what the apiserver answers. A missing request
//! times the script out; an extra one finds the mock closed and fails the reconcile.

mod adopt;
mod cleanup;
mod cluster_version;
mod native;
mod pause;
mod restore;

use std::{collections::BTreeMap, future::Future, sync::Arc, time::Duration};

use crds::{ClusterVersion, VirtualCluster, VirtualClusterStatus};
use k8s_openapi::{
    api::{apps::v1::StatefulSet, core::v1::Secret},
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    ResourceExt,
    runtime::{
        reflector::{self, store::Writer},
        watcher,
    },
};
use serde_json::{Value, json};

use crate::{
    Context, Settings,
    cached::CachedClusterVersion,
    identity::TenantIdentity,
    leader::LeaderFlag,
    metrics::Metrics,
    probe::{ProbeReport, TenantProbe},
};
use tenant_pki::secrets::{Lifetimes, PkiInput};

pub use crate::fixtures::*;

/// A probe answering from a closure.
pub struct FakeProbe(pub Box<dyn Fn(String, String) -> crate::Result<ProbeReport> + Send + Sync>);

impl TenantProbe for FakeProbe {
    fn version(
        &self,
        origin: String,
        kubeconfig: String,
    ) -> futures::future::BoxFuture<'static, crate::Result<ProbeReport>> {
        let answer = (self.0)(origin, kubeconfig);
        Box::pin(async move { answer })
    }
}

/// Caches the test fills before reconciling.
pub struct Caches {
    /// VirtualClusters.
    pub virtual_clusters: Writer<VirtualCluster>,
    /// ClusterVersions (reconciles read them live; the cache only has to be synced).
    pub _cluster_versions: Writer<CachedClusterVersion>,
    /// StatefulSets.
    pub statefulsets: Writer<StatefulSet>,
}

fn ready<K: kube::Resource + Clone>(writer: &mut Writer<K>)
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// A context on a mocked apiserver, with synced empty caches, and the apiserver's handle.
pub fn context(probe: Arc<dyn TenantProbe>) -> (Arc<Context>, Caches, ApiServer) {
    let (client, apiserver) = mock_apiserver::pair();
    let (vcs, mut vc_writer) = reflector::store::<VirtualCluster>();
    let (cvs, mut cv_writer) = reflector::store::<CachedClusterVersion>();
    let (sts, mut sts_writer) = reflector::store::<StatefulSet>();
    ready(&mut vc_writer);
    ready(&mut cv_writer);
    ready(&mut sts_writer);
    let settings = Settings {
        deletion_poll_interval: Duration::from_secs(2),
        // The mocked apiserver serves no tenant apiserver to ask.
        native_readiness: crate::context::NativeReadiness::StatefulSetsReady,
        ..Settings::default()
    };
    let ctx = Context::new(
        client,
        settings,
        vcs,
        cvs,
        sts,
        LeaderFlag::always(),
        probe,
        Metrics::new(),
    );
    (
        Arc::new(ctx),
        Caches {
            virtual_clusters: vc_writer,
            _cluster_versions: cv_writer,
            statefulsets: sts_writer,
        },
        apiserver,
    )
}

/// A probe that must not be called.
pub fn no_probe() -> Arc<dyn TenantProbe> {
    Arc::new(FakeProbe(Box::new(|_, _| {
        panic!("the tenant apiserver must not be probed")
    })))
}

impl Caches {
    /// Puts a VirtualCluster into the cache.
    pub fn add_virtual_cluster(&mut self, vc: VirtualCluster) {
        self.virtual_clusters
            .apply_watcher_event(&watcher::Event::Apply(vc));
    }

    /// Puts a StatefulSet into the cache.
    pub fn add_statefulset(&mut self, sts: StatefulSet) {
        self.statefulsets.apply_watcher_event(&watcher::Event::Apply(sts));
    }
}

pub use mock_apiserver::{ApiServer, Call, run};

/// `?&force=true&fieldManager=vc-manager`: server-side apply under vc-manager's manager.
pub const APPLY: &str = "?&force=true&fieldManager=vc-manager";
/// `?&fieldManager=vc-manager`: a merge patch attributed to vc-manager.
pub const MERGE: &str = "?&fieldManager=vc-manager";

/// Requests only vc-manager makes, scripted on the shared [`ApiServer`].
pub trait Script {
    /// `names.len()` concurrent PATCHes of objects under `collection` (a path ending in `/`), in any order;
    /// checks they are exactly `names` and returns them by name, unanswered.
    fn concurrent(
        &mut self,
        collection: &str,
        names: &[&str],
    ) -> impl Future<Output = BTreeMap<String, Call>>;
    /// An event about the test VirtualCluster with `reason`; answers 201. Returns the note.
    fn event(&mut self, reason: &str) -> impl Future<Output = String>;
    /// An event in `namespace` with `reason`.
    fn event_in(&mut self, namespace: &str, reason: &str) -> impl Future<Output = String>;
    /// The status of the test VirtualCluster is applied; answers with it and returns the status.
    fn vc_status(&mut self) -> impl Future<Output = Value>;
}

impl Script for ApiServer {
    async fn concurrent(&mut self, collection: &str, names: &[&str]) -> BTreeMap<String, Call> {
        let mut calls = BTreeMap::new();
        for _ in names {
            let call = self.next().await;
            assert_eq!(call.method, "PATCH", "{}", call.uri);
            let name = call
                .uri
                .strip_prefix(collection)
                .and_then(|rest| rest.strip_suffix(APPLY))
                .unwrap_or_else(|| panic!("{} is not an apply under {collection}", call.uri))
                .to_owned();
            calls.insert(name, call);
        }
        let mut expected: Vec<&str> = names.to_vec();
        expected.sort_unstable();
        assert_eq!(calls.keys().map(String::as_str).collect::<Vec<_>>(), expected);
        calls
    }

    async fn event(&mut self, reason: &str) -> String {
        self.event_in(VC_NAMESPACE, reason).await
    }

    async fn event_in(&mut self, namespace: &str, reason: &str) -> String {
        let call = self
            .expect(
                "POST",
                &format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events?"),
            )
            .await;
        assert_eq!(call.body["reason"], reason, "event {}", call.body);
        let note = call.body["note"].as_str().unwrap_or_default().to_owned();
        let body = call.body.clone();
        call.respond(201, &body);
        note
    }

    async fn vc_status(&mut self) -> Value {
        let call = self
            .expect(
                "PATCH",
                &format!("/apis/tenancy.x-k8s.io/v1alpha1/namespaces/{VC_NAMESPACE}/virtualclusters/{VC_NAME}/status{APPLY}"),
            )
            .await;
        let status = call.body["status"].clone();
        // The apiserver answers with the whole object.
        let mut object = serde_json::to_value(native_vc()).expect("json");
        object["status"] = status.clone();
        call.ok(object);
        status
    }
}

/// A condition of a status JSON.
pub fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("condition {type_} in {status}"))
}

/// A StatefulSet with its status, as the apiserver returns it.
pub fn with_status(mut sts: Value, replicas: i64, ready: i64) -> Value {
    if sts["metadata"]["generation"].is_null() {
        sts["metadata"]["generation"] = json!(1);
    }
    sts["status"] = json!({
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": replicas,
        "observedGeneration": 1,
        "currentRevision": "r1",
        "updateRevision": "r1",
    });
    sts
}

/// Secrets as a list response.
pub fn secret_list(secrets: &[Secret]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "SecretList",
        "metadata": {"resourceVersion": "300"},
        "items": secrets,
    })
}

/// A StatefulSet of the test tenant as the cache would hold it (ready).
pub fn cached_statefulset(component: crate::component::Component, ready: bool) -> StatefulSet {
    let cv = cluster_version();
    let identity = TenantIdentity::of(&native_vc()).expect("identity");
    let mut sts =
        crate::render::render_statefulset(component, &cv, &identity, &crate::render::RenderInputs::default());
    sts.metadata.generation = Some(1);
    let value = with_status(serde_json::to_value(&sts).expect("json"), 1, i64::from(ready));
    let sts: StatefulSet = serde_json::from_value(value).expect("sts");
    assert!(!sts.name_any().is_empty());
    sts
}

#[tokio::test]
async fn queued_events_do_not_hold_up_the_reconcile() {
    use kube::{Resource, runtime::events::EventType};
    let (client, mut api) = mock_apiserver::pair();
    let (vcs, _vc_writer) = reflector::store::<VirtualCluster>();
    let (cvs, _cv_writer) = reflector::store::<CachedClusterVersion>();
    let (sts, _sts_writer) = reflector::store::<StatefulSet>();
    let ctx = Context::new(
        client,
        Settings::default(),
        vcs,
        cvs,
        sts,
        LeaderFlag::always(),
        no_probe(),
        Metrics::new(),
    )
    .with_queued_events();
    let vc = native_vc();
    // Returns before the apiserver has answered (nobody answers yet).
    tokio::time::timeout(
        Duration::from_millis(200),
        ctx.publish(
            &vc.object_ref(&()),
            EventType::Normal,
            "Queued",
            "Test",
            "in the background".into(),
        ),
    )
    .await
    .expect("publishing does not wait for the apiserver");
    let note = tokio::time::timeout(Duration::from_secs(1), api.event("Queued"))
        .await
        .expect("the event is published");
    assert_eq!(note, "in the background");
}
