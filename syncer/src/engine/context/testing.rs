//! Test support: a [`Context`] and tenants on scripted apiservers ([`mock_apiserver`], shared by every
//! crate), with caches the test fills by hand. A test answers each request it expects, in order; an
//! unexpected request finds no answer and times the test out, and [`ApiServer::idle`] checks that nothing
//! more was asked.

use std::{sync::Arc, time::Duration};

use kube::{
    Client,
    runtime::{reflector::store::Writer, watcher},
};
pub use mock_apiserver::ApiServer;
use serde_json::Value;

use super::Context;
use crate::{
    accounting::quota::Quota,
    cache::super_stores::{self, SuperStores},
    engine::{
        config::SyncerConfig,
        items::{DownItem, UpItem},
        queue::FairQueue,
    },
    metrics::Metrics,
    resources::Outcome,
    tenancy::{
        identity::TenantIdentity,
        settings::TenantSettings,
        tenant::{self, Queues, Tenant, Tenants},
    },
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

/// A client of a scripted apiserver (the shared [`mock_apiserver`]), whose scripts name URIs by prefix
/// and which panics after five seconds without an expected request.
pub fn mock() -> (Client, ApiServer) {
    let (client, apiserver) = mock_apiserver::pair();
    (
        client,
        apiserver
            .matching_uri_prefixes()
            .with_patience(Duration::from_secs(5)),
    )
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
        config: SyncerConfig::for_tests(),
        tenants: Arc::new(Tenants::default()),
        supers,
        tokens: Default::default(),
        virtual_clusters: kube::runtime::reflector::store().0,
        quota: Arc::new(Quota::new(queues.down.clone(), metrics.quota.clone())),
        queues,
        metrics,
        events: Default::default(),
        shards: None,
        journal: None,
    };
    (ctx, writers)
}

/// An attached, ready tenant on a scripted tenant apiserver.
pub fn tenant(ctx: &Context, client: Client, settings: TenantSettings) -> (Arc<Tenant>, tenant::Writers) {
    let (tenant, writers) = Tenant::for_tests(identity(), client, settings, &ctx.queues);
    ctx.tenants.insert(tenant.clone());
    (tenant, writers)
}

/// A cache's writing side: kube's `Writer`, or a slim store's.
pub trait Fill<K> {
    /// Applies a watch event.
    fn fill(&mut self, event: &watcher::Event<K>);
}

impl<K> Fill<K> for Writer<K>
where
    K: kube::runtime::reflector::Lookup + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn fill(&mut self, event: &watcher::Event<K>) {
        self.apply_watcher_event(event);
    }
}

impl<K> Fill<K> for crate::cache::slim_store::SlimWriter<K>
where
    K: kube::runtime::reflector::Lookup + Clone,
{
    fn fill(&mut self, event: &watcher::Event<K>) {
        self.apply_watcher_event(event);
    }
}

/// Puts an object into a cache.
pub fn put<K>(writer: &mut impl Fill<K>, object: K) {
    writer.fill(&watcher::Event::Apply(object));
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

/// Runs `sync` of a tenant object in `shop` that the syncer must refuse: it asserts a Warning event with
/// `reason` whose note says `says`, and that the sync waits.
pub async fn refused_with_event(
    sync: impl std::future::Future<Output = crate::Result<Outcome>>,
    tenants: &mut ApiServer,
    reason: &str,
    says: &str,
) {
    let (outcome, ()) = tokio::join!(sync, async {
        let event = tenants
            .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
            .await;
        assert_eq!(event.body["reason"], reason);
        let note = event.body["note"].as_str().unwrap_or_default().to_owned();
        assert!(note.contains(says), "{note}");
        event.echo();
    });
    assert!(
        matches!(outcome.expect("synced"), Outcome::Waiting { .. }),
        "not refused"
    );
}
