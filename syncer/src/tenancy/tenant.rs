//! An attached tenant: its client, settings and watch-fed caches.

use std::sync::{
    Arc, RwLock,
    atomic::{AtomicUsize, Ordering},
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        events::{Recorder, Reporter},
        reflector::Store,
        watcher,
    },
};
use serde::{Serialize, de::DeserializeOwned};
use tokio::{sync::Notify, task::JoinHandle};

use crate::{
    cache::{
        meta::PackedMeta,
        slim_store::SlimStore,
        stores::{Cache, Change, reflect_budgeted, reflect_budgeted_slim},
    },
    engine::{
        budget::{CacheBudget, CacheLimits},
        items::{DownItem, Kind, UpItem, kinds, with_kinds},
        queue::{FairQueue, TenantId},
    },
    tenancy::{identity::TenantIdentity, settings::TenantSettings},
};

/// Objects per page when a tenant cache lists.
const LIST_PAGE_SIZE: u32 = 100;

pub use crds::wellknown::LABEL_SYNCED_FROM_SUPER;

/// What a kind caches of every tenant, and how the cache's changes reach the queues. Implemented by each
/// kind's module in [`crate::resources`].
pub trait TenantCache {
    /// The cache: a store, `Option` of one for a kind synced by flag, `()` for none.
    type Cache: Cache;
    /// What the kind keeps of each tenant besides its cache (`()` for nothing): it lives as long as the
    /// tenant is attached, in [`Tenant::state`].
    type State: Default + Send + Sync + 'static;
    /// Starts the watch that fills the cache.
    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache;
}

macro_rules! tenant_stores {
    ($( $(#[$doc:meta])* $kind:ident = $label:literal => $module:ident, $caches:ident; )*) => {
        /// The tenant's caches, one per kind.
        pub struct TenantStores {
            $( $(#[$doc])* pub $caches: <kinds::$kind as TenantCache>::Cache, )*
        }

        impl TenantStores {
            fn watch(tenant: &mut TenantWatch<'_>) -> Self {
                Self {
                    $( $caches: <kinds::$kind as TenantCache>::watch(tenant), )*
                }
            }

            /// Waits until every cache has listed the tenant once.
            async fn wait_ready(&self) {
                $( self.$caches.wait_ready().await; )*
            }

            #[cfg(test)]
            fn empty() -> Self {
                Self {
                    $( $caches: Cache::empty(), )*
                }
            }
        }
    };
}
with_kinds!(tenant_stores);

macro_rules! tenant_state {
    ($( $(#[$doc:meta])* $kind:ident = $label:literal => $module:ident, $caches:ident; )*) => {
        /// What each kind keeps of the tenant besides its cache ([`TenantCache::State`]).
        #[derive(Default)]
        pub struct TenantState {
            $( $(#[$doc])* pub $caches: <kinds::$kind as TenantCache>::State, )*
        }
    };
}
with_kinds!(tenant_state);

/// What a kind's watch of a tenant is started with.
pub struct TenantWatch<'a> {
    /// Client of the tenant apiserver.
    pub client: &'a Client,
    /// The queues the watch feeds.
    pub queues: &'a Queues,
    /// The tenant's queue key.
    pub id: &'a TenantId,
    /// The uid of the tenant's `kube-system` namespace when it was attached.
    pub kube_system_uid: &'a str,
    /// Whether Ingresses are synced.
    pub sync_ingresses: bool,
    /// The custom resource kinds synced.
    pub custom_resources: &'a [crate::engine::config::custom_kinds::CustomKind],
    budget: &'a Arc<CacheBudget>,
    check: &'a Arc<IdentityCheck>,
    tasks: &'a mut Vec<JoinHandle<()>>,
}

/// How a tenant cache lists. A page of a list is held whole in memory: smaller pages bound what a tenant's
/// list of large objects takes before the budget sees it.
fn listing() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE_SIZE)
}

impl TenantWatch<'_> {
    /// Watches the tenant's objects of `K` (those `labels` selects, when given) into a cache charged to
    /// the tenant's budget under `kind`'s name, and calls `on_change` with every change.
    pub fn watch<K, F>(&mut self, kind: Kind, labels: Option<&str>, on_change: F) -> Store<K>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        F: Fn(&K, Change) + Send + 'static,
    {
        let mut config = listing();
        if let Some(labels) = labels {
            config = config.labels(labels);
        }
        let (store, task) = reflect_budgeted(
            Api::all(self.client.clone()),
            config,
            Arc::new(self.doubt_identity()),
            self.budget.ledger(kind.as_str()),
            on_change,
        );
        self.tasks.push(task);
        store
    }

    /// Like [`TenantWatch::watch`] (every object of `W`, weighed as read), caching each as what `convert`
    /// makes of it; `on_change` also hears the record each change replaced.
    pub fn watch_converted<W, K, F>(&mut self, kind: Kind, convert: fn(W) -> K, on_change: F) -> SlimStore<K>
    where
        W: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug
            + Send
            + 'static,
        K: kube::runtime::reflector::Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
        F: Fn(&K, Change, Option<&K>) + Send + 'static,
    {
        let (store, task) = reflect_budgeted_slim(
            Api::all(self.client.clone()),
            listing(),
            Arc::new(self.doubt_identity()),
            self.budget.ledger(kind.as_str()),
            convert,
            on_change,
        );
        self.tasks.push(task);
        store
    }

    /// Watches every tenant object of `K` and queues each change down as an item of `kind`.
    pub fn down<K>(&mut self, kind: Kind) -> Store<K>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let (queue, id) = (self.queues.down.clone(), self.id.clone());
        self.watch(kind, None, move |o: &K, _| queue.add(&id, namespaced(o, kind)))
    }

    /// Watches the tenant's objects of `K` that `labels` selects (the syncer's own objects of a
    /// cluster-scoped kind) and queues each change up as an item of `kind`.
    pub fn up<K>(&mut self, kind: Kind, labels: &str) -> Store<K>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let (queue, id) = (self.queues.up.clone(), self.id.clone());
        self.watch(kind, Some(labels), move |o: &K, _| {
            queue.add(&id, UpItem::cluster(kind, &o.name_any()))
        })
    }

    /// The tenant's cache budget, for caches started later (custom resources, once published).
    pub fn budget(&self) -> &Arc<CacheBudget> {
        self.budget
    }

    /// Marks the caches unchecked: the tenant's work waits until its identity is confirmed again.
    pub fn doubt_identity(&self) -> impl Fn() + Send + Sync + 'static {
        let check = self.check.clone();
        move || check.doubt()
    }
}

/// A tenant the syncer is attached to.
pub struct Tenant {
    /// Which VirtualCluster.
    pub identity: TenantIdentity,
    /// Queue key: the cluster key.
    pub id: TenantId,
    /// Client of the tenant apiserver (admin).
    pub client: Client,
    /// CA of the tenant apiserver (PEM), from its kubeconfig, for the tokens given to pods.
    pub ca_pem: Option<String>,
    /// The address the syncer's connection reached the tenant apiserver at (not every address its
    /// kubeconfig's host name resolves to).
    pub apiserver_addresses: Vec<String>,
    /// Publishes Kubernetes events in the tenant.
    pub recorder: Recorder,
    /// Caches.
    pub stores: TenantStores,
    /// What each kind keeps of the tenant besides its cache (the vNodes' idle times, the pods' recent
    /// bindings).
    pub state: TenantState,
    /// The uid of the tenant's `kube-system` namespace when it was attached: which cluster it is (the
    /// VirtualCluster's `tenancy.x-k8s.io/tenant-kube-system-uid`).
    pub kube_system_uid: String,
    /// What the tenant's caches hold, against the syncer's per-tenant limits.
    pub budget: Arc<CacheBudget>,
    /// What its apiserver's responses hold at once, against the syncer's limits.
    pub responses: Arc<vc_runtime::limits::ResponseBudget>,
    /// Set when the tenant is attached again after a pause (see [`Tenant::paused_away`]).
    pub resumed: std::sync::OnceLock<Resumed>,
    /// Workers' reconciles of this tenant in progress (waited for before its Lease is handed over).
    pub in_flight: InFlight,
    settings: RwLock<Arc<TenantSettings>>,
    /// Whether every cache has listed once (set by [`Tenant::become_ready`], waited for by
    /// [`Tenant::listed`]).
    ready: tokio::sync::watch::Sender<bool>,
    check: Arc<IdentityCheck>,
    tasks: Vec<JoinHandle<()>>,
}

/// Work on a tenant in progress (a worker's reconcile): a tenant handed over is released only once none
/// is left, so the new owner never writes beside the old one.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

/// One piece of work in progress; dropping it ends it.
pub struct InFlightGuard<'a>(&'a InFlight);

impl InFlight {
    /// Marks work as started until the guard is dropped.
    pub fn enter(&self) -> InFlightGuard<'_> {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self)
    }

    /// Work in progress now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Resolves once no work is in progress.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A tenant attached again after a pause: the pods it had then lost their super copies to the pause, not to
/// a lost node, and get them back.
#[derive(Debug)]
pub struct Resumed {
    at: k8s_openapi::jiff::Timestamp,
    restored: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Resumed {
    /// Attached again at `at`.
    pub fn at(at: k8s_openapi::jiff::Timestamp) -> Self {
        Self {
            at,
            restored: Default::default(),
        }
    }

    /// Whether the pod was there before the tenant was attached again and its copy not recreated yet.
    pub fn removed(&self, pod: &PackedMeta) -> bool {
        let older = pod.creation_timestamp.as_ref().is_some_and(|t| t.0 < self.at);
        let restored = pod.uid.as_deref().is_some_and(|uid| {
            self.restored
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(uid)
        });
        older && !restored
    }

    /// Records that the pod's copy was recreated.
    pub fn restored(&self, pod: &PackedMeta) {
        if let Some(uid) = pod.uid.as_deref() {
            self.restored
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid.to_owned());
        }
    }
}

/// Whether the caches show the cluster the tenant was attached to.
///
/// A cache that lists anew (after the tenant apiserver restarted, or a watch expired) may show another
/// cluster behind the same address — its etcd was wiped or replaced — and an empty cache reads as "the
/// tenant deleted everything". So every relist, and a `kube-system` namespace with another uid, marks the
/// caches unchecked; the tenant's work waits (see [`Tenant::is_ready`]) until the apiserver shows the
/// attached `kube-system` again. If it shows another, the work keeps waiting and the supervisor detaches
/// the tenant with `TenantIdentityChanged`.
#[derive(Default)]
struct IdentityCheck {
    /// Bumped by every event that calls for a check.
    epoch: std::sync::atomic::AtomicU64,
    /// The epoch the last successful check began in.
    checked: std::sync::atomic::AtomicU64,
    /// Wakes the checker.
    wake: tokio::sync::Notify,
}

impl IdentityCheck {
    fn doubt(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.wake.notify_one();
    }

    fn holds(&self) -> bool {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
            == self.checked.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Confirms the tenant's identity whenever it is doubted: its `kube-system` must have the attached uid.
async fn confirm_identity(
    client: Client,
    check: Arc<IdentityCheck>,
    kube_system_uid: String,
    tenant: String,
) {
    let namespaces: Api<Namespace> = Api::all(client);
    loop {
        check.wake.notified().await;
        let mut delay = std::time::Duration::from_millis(200);
        loop {
            let epoch = check.epoch.load(std::sync::atomic::Ordering::Acquire);
            match namespaces.get_opt("kube-system").await {
                Ok(Some(found)) if found.uid().as_deref() == Some(kube_system_uid.as_str()) => {
                    check.checked.store(epoch, std::sync::atomic::Ordering::Release);
                    break;
                }
                Ok(Some(found)) => {
                    tracing::error!(
                        %tenant,
                        attached = %kube_system_uid,
                        found = %found.uid().unwrap_or_default(),
                        "the tenant apiserver now shows another cluster (kube-system has another uid); holding all of its work"
                    );
                    break;
                }
                Ok(None) => {
                    tracing::debug!(%tenant, "the tenant has no kube-system namespace; checking again")
                }
                Err(error) => {
                    tracing::debug!(%tenant, %error, "checking the tenant's identity; trying again")
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(std::time::Duration::from_secs(10));
        }
    }
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// The work queues a tenant's watches feed.
#[derive(Clone)]
pub struct Queues {
    /// Tenant to super.
    pub down: Arc<FairQueue<DownItem>>,
    /// Super to tenant.
    pub up: Arc<FairQueue<UpItem>>,
}

/// The item of a namespaced object.
pub fn namespaced<K: ResourceExt>(object: &K, kind: Kind) -> DownItem {
    DownItem::new(kind, &object.namespace().unwrap_or_default(), &object.name_any())
}

/// How the syncer reached a tenant apiserver when attaching it.
pub struct Connection {
    /// Client of the tenant apiserver (admin).
    pub client: Client,
    /// CA of the tenant apiserver (PEM), from its kubeconfig.
    pub ca_pem: Option<String>,
    /// The address the client's connection reached the apiserver at.
    pub apiserver_addresses: Vec<String>,
    /// The budget every response of the client is held to.
    pub responses: Arc<vc_runtime::limits::ResponseBudget>,
}

impl Tenant {
    /// Starts watching the tenant and feeding the queues. `kube_system_uid` is the uid of the tenant's
    /// `kube-system` namespace, as checked when attaching.
    // Each argument is one thing the watches need; bundling the flags would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        identity: TenantIdentity,
        connection: Connection,
        kube_system_uid: String,
        settings: TenantSettings,
        queues: &Queues,
        sync_ingresses: bool,
        custom_resources: &[crate::engine::config::custom_kinds::CustomKind],
        limits: CacheLimits,
    ) -> Arc<Self> {
        let id: TenantId = Arc::from(identity.cluster_key.as_str());
        let client = connection.client.clone();
        let _span = tracing::info_span!("tenant", vc = %identity.vc_ref()).entered();
        let check = Arc::new(IdentityCheck::default());
        let mut tasks = vec![tokio::spawn(confirm_identity(
            client.clone(),
            check.clone(),
            kube_system_uid.clone(),
            identity.vc_ref(),
        ))];
        let budget = CacheBudget::new(identity.vc_ref(), limits);
        let stores = TenantStores::watch(&mut TenantWatch {
            client: &client,
            queues,
            id: &id,
            kube_system_uid: &kube_system_uid,
            sync_ingresses,
            custom_resources,
            budget: &budget,
            check: &check,
            tasks: &mut tasks,
        });

        queues
            .down
            .configure_tenant(&id, settings.weight, settings.rate_limit);
        queues.up.configure_tenant(&id, settings.weight, None);

        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: crds::wellknown::FIELD_MANAGER_SYNCER.into(),
                instance: Some(vc_runtime::leader::identity()),
            },
        );
        Arc::new(Self {
            identity,
            id,
            client,
            ca_pem: connection.ca_pem,
            apiserver_addresses: connection.apiserver_addresses,
            recorder,
            stores,
            kube_system_uid,
            budget,
            responses: connection.responses,
            resumed: std::sync::OnceLock::new(),
            state: Default::default(),
            in_flight: Default::default(),
            settings: RwLock::new(Arc::new(settings)),
            ready: tokio::sync::watch::Sender::new(false),
            check,
            tasks,
        })
    }

    /// Whether every cache has listed the tenant once, the caches show the cluster the tenant was
    /// attached to (checked again after every relist), and the tenant fits its cache limits. Until then the
    /// tenant's items wait: an empty cache, one filled from another cluster, or one missing what did not
    /// fit, would read as "deleted in the tenant".
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow() && self.check.holds() && self.budget.exceeded().is_none()
    }

    /// Waits for the caches, then marks the tenant ready.
    pub async fn become_ready(&self) {
        self.wait_ready().await;
        self.ready.send_replace(true);
        tracing::info!(tenant = %self.identity.vc_ref(), "tenant caches synced");
    }

    /// Waits until [`Tenant::become_ready`] saw every cache listed. For anyone but `become_ready`: a cache
    /// wakes only the last of concurrent waiters on it, so a second waiter on the caches themselves could
    /// leave the tenant never ready.
    pub async fn listed(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|listed| *listed).await;
    }

    /// Whether the missing super pod of this scheduled tenant pod was removed by a pause, so that it is
    /// to be recreated rather than treated as lost (which deletes the tenant pod for its controller to
    /// replace): the tenant was attached again after a pause, the pod is older than that, and its super pod
    /// has not been recreated since (a copy lost after that is lost).
    pub fn paused_away(&self, pod: &PackedMeta) -> bool {
        self.resumed.get().is_some_and(|resumed| resumed.removed(pod))
    }

    /// Records that a pod's super copy was recreated after a pause.
    pub fn restored(&self, pod: &PackedMeta) {
        if let Some(resumed) = self.resumed.get() {
            resumed.restored(pod);
        }
    }

    /// The current settings.
    pub fn settings(&self) -> Arc<TenantSettings> {
        self.settings.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the settings (from an edited VirtualCluster); returns whether they changed.
    pub fn update_settings(&self, settings: TenantSettings, queues: &Queues) -> bool {
        let mut current = self.settings.write().unwrap_or_else(|e| e.into_inner());
        if **current == settings {
            return false;
        }
        queues
            .down
            .configure_tenant(&self.id, settings.weight, settings.rate_limit);
        queues.up.configure_tenant(&self.id, settings.weight, None);
        *current = Arc::new(settings);
        true
    }

    /// Waits until every cache has listed the tenant once. One waiter only ([`Tenant::become_ready`]);
    /// others wait with [`Tenant::listed`].
    pub async fn wait_ready(&self) {
        self.stores.wait_ready().await;
    }

    /// Stops the watches.
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The attached tenants, by cluster key.
#[derive(Default)]
pub struct Tenants {
    map: RwLock<std::collections::HashMap<TenantId, Arc<Tenant>>>,
}

impl Tenants {
    /// The tenant with this cluster key.
    pub fn get(&self, id: &str) -> Option<Arc<Tenant>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Every attached tenant.
    pub fn all(&self) -> Vec<Arc<Tenant>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Adds or replaces a tenant; returns the one it replaced.
    pub fn insert(&self, tenant: Arc<Tenant>) -> Option<Arc<Tenant>> {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tenant.id.clone(), tenant)
    }

    /// Removes a tenant.
    pub fn remove(&self, id: &str) -> Option<Arc<Tenant>> {
        self.map.write().unwrap_or_else(|e| e.into_inner()).remove(id)
    }
}

/// Writers of the tenant caches tests fill by hand.
#[cfg(test)]
pub(crate) struct Writers {
    /// Namespaces.
    pub namespaces: kube::runtime::reflector::store::Writer<Namespace>,
    /// Pods.
    pub pods: crate::cache::slim_store::SlimWriter<crate::cache::pods::TenantPod>,
    /// Services.
    pub services: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::Service>,
    /// vNodes.
    pub vnodes: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::Node>,
    /// PersistentVolumeClaims.
    pub claims: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    /// Endpoints.
    pub endpoints: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::Endpoints>,
}

#[cfg(test)]
impl Tenant {
    /// A ready tenant on `client` without watches; its caches are filled through the returned writers
    /// (the others stay empty).
    pub(crate) fn for_tests(
        identity: TenantIdentity,
        client: Client,
        settings: TenantSettings,
        queues: &Queues,
    ) -> (Arc<Self>, Writers) {
        use kube::runtime::reflector::store;
        let id: TenantId = Arc::from(identity.cluster_key.as_str());
        queues
            .down
            .configure_tenant(&id, settings.weight.max(1), settings.rate_limit);
        queues.up.configure_tenant(&id, settings.weight.max(1), None);
        let (namespaces, namespaces_writer) = store();
        let (pods, pods_writer) = crate::cache::slim_store::slim_store();
        let (services, services_writer) = store();
        let (vnodes, vnodes_writer) = store();
        let (claims, claims_writer) = store();
        let (endpoints, endpoints_writer) = store();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: crds::wellknown::FIELD_MANAGER_SYNCER.into(),
                instance: Some("test".into()),
            },
        );
        let tenant = Arc::new(Self {
            identity,
            id,
            client,
            ca_pem: None,
            apiserver_addresses: Vec::new(),
            recorder,
            stores: TenantStores {
                namespaces,
                pods,
                services,
                nodes: vnodes,
                claims,
                endpoints,
                ..TenantStores::empty()
            },
            kube_system_uid: "kube-system-uid".into(),
            budget: CacheBudget::new("test".into(), CacheLimits::default()),
            responses: vc_runtime::limits::ResponseBudget::new(Default::default()),
            resumed: std::sync::OnceLock::new(),
            state: Default::default(),
            in_flight: Default::default(),
            settings: RwLock::new(Arc::new(settings)),
            ready: tokio::sync::watch::Sender::new(true),
            check: Arc::new(IdentityCheck::default()),
            tasks: Vec::new(),
        });
        let writers = Writers {
            namespaces: namespaces_writer,
            pods: pods_writer,
            services: services_writer,
            vnodes: vnodes_writer,
            claims: claims_writer,
            endpoints: endpoints_writer,
        };
        (tenant, writers)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
    use serde_json::json;

    use super::*;
    use crate::engine::context::testing;

    fn kube_system(uid: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system", "uid": uid}})
    }

    /// After a relist the work waits until the apiserver shows the attached cluster again; if it shows
    /// another, the work keeps waiting.
    #[tokio::test]
    async fn a_relisted_tenant_is_held_until_its_identity_is_confirmed() {
        let (client, mut apiserver) = testing::mock();
        let check = Arc::new(IdentityCheck::default());
        assert!(check.holds());
        let task = tokio::spawn(confirm_identity(
            client,
            check.clone(),
            "uid-1".into(),
            "team/vc".into(),
        ));
        check.doubt();
        assert!(!check.holds());
        apiserver
            .expect("GET", "/api/v1/namespaces/kube-system")
            .await
            .respond(200, &kube_system("uid-1"));
        tokio::time::timeout(std::time::Duration::from_secs(2), async {
            while !check.holds() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("confirmed");

        check.doubt();
        apiserver
            .expect("GET", "/api/v1/namespaces/kube-system")
            .await
            .respond(200, &kube_system("uid-2"));
        apiserver.idle().await;
        assert!(!check.holds(), "another cluster: held");
        task.abort();
    }

    #[test]
    fn only_pods_older_than_the_resume_and_not_recreated_yet_were_paused_away() {
        let resumed = Resumed::at(Timestamp::from_second(1_800_000_000).expect("time"));
        let pod = |uid: &str, created: i64| PackedMeta {
            uid: Some(uid.into()),
            creation_timestamp: Some(Time(Timestamp::from_second(created).expect("time"))),
            ..Default::default()
        };
        let old = pod("old", 1_700_000_000);
        assert!(resumed.removed(&old));
        // Created during the pause or after: never had a copy the pause removed.
        assert!(!resumed.removed(&pod("new", 1_800_000_001)));
        // Recreated once: a copy lost after that is lost.
        resumed.restored(&old);
        assert!(!resumed.removed(&old));
        assert!(resumed.removed(&pod("other-old", 1_700_000_000)));
    }

    #[tokio::test]
    async fn in_flight_work_is_waited_for() {
        let in_flight = std::sync::Arc::new(super::InFlight::default());
        in_flight.idle().await;
        let guard = in_flight.enter();
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.idle().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "idle while work is in flight");
        drop(guard);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("idle once the work is done")
            .expect("task");
    }
}
