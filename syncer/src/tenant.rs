//! An attached tenant: its client, settings and watch-fed caches.

use std::sync::{Arc, RwLock};

use k8s_openapi::api::{
    core::v1::{
        ConfigMap, Endpoints, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Secret, Service,
        ServiceAccount,
    },
    networking::v1::{Ingress, NetworkPolicy},
    scheduling::v1::PriorityClass,
    storage::v1::StorageClass,
};
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        events::{Recorder, Reporter},
        reflector::Store,
        watcher,
    },
};
use tokio::task::JoinHandle;

use crate::{
    budget::{CacheBudget, CacheLimits},
    cached::TenantPod,
    identity::TenantIdentity,
    items::{DownItem, Kind, UpItem},
    queue::{FairQueue, TenantId},
    settings::TenantSettings,
    stores::{Change, OnRelist, reflect_budgeted},
};

/// Objects per page when a tenant cache lists.
const LIST_PAGE_SIZE: u32 = 100;

/// Label on tenant objects the syncer creates from super objects (PersistentVolumes, StorageClasses,
/// PriorityClasses), so it only ever touches its own.
pub const LABEL_SYNCED_FROM_SUPER: &str = "tenancy.x-k8s.io/synced-from-super";

/// The tenant's caches.
pub struct TenantStores {
    /// Namespaces.
    pub namespaces: Store<Namespace>,
    /// Pods.
    pub pods: Store<TenantPod>,
    /// Services.
    pub services: Store<Service>,
    /// Endpoints.
    pub endpoints: Store<Endpoints>,
    /// ConfigMaps.
    pub config_maps: Store<ConfigMap>,
    /// Secrets.
    pub secrets: Store<Secret>,
    /// ServiceAccounts.
    pub service_accounts: Store<ServiceAccount>,
    /// PersistentVolumeClaims.
    pub claims: Store<PersistentVolumeClaim>,
    /// Ingresses, when synced.
    pub ingresses: Option<Store<Ingress>>,
    /// NetworkPolicies.
    pub network_policies: Store<NetworkPolicy>,
    /// vNodes.
    pub vnodes: Store<Node>,
    /// PersistentVolumes the syncer made.
    pub volumes: Store<PersistentVolume>,
    /// StorageClasses the syncer made.
    pub storage_classes: Store<StorageClass>,
    /// PriorityClasses the syncer made.
    pub priority_classes: Store<PriorityClass>,
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
    /// The addresses the syncer reaches the tenant apiserver at (its kubeconfig server, resolved).
    pub apiserver_addresses: Vec<String>,
    /// Publishes Kubernetes events in the tenant.
    pub recorder: Recorder,
    /// When each vNode last had none of this tenant's pods.
    pub vnode_idle_since: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Caches.
    pub stores: TenantStores,
    /// The uid of the tenant's `kube-system` namespace when it was attached: which cluster it is (the
    /// VirtualCluster's `tenancy.x-k8s.io/tenant-kube-system-uid`).
    pub kube_system_uid: String,
    /// What the tenant's caches hold, against the syncer's per-tenant limits.
    pub budget: Arc<CacheBudget>,
    settings: RwLock<Arc<TenantSettings>>,
    ready: std::sync::atomic::AtomicBool,
    check: Arc<IdentityCheck>,
    tasks: Vec<JoinHandle<()>>,
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

fn namespaced<K: ResourceExt>(object: &K, kind: Kind) -> DownItem {
    DownItem::new(kind, &object.namespace().unwrap_or_default(), &object.name_any())
}

/// How the syncer reached a tenant apiserver when attaching it.
pub struct Connection {
    /// Client of the tenant apiserver (admin).
    pub client: Client,
    /// CA of the tenant apiserver (PEM), from its kubeconfig.
    pub ca_pem: Option<String>,
    /// The addresses the client reaches the apiserver at.
    pub apiserver_addresses: Vec<String>,
}

impl Tenant {
    /// Starts watching the tenant and feeding the queues. `kube_system_uid` is the uid of the tenant's
    /// `kube-system` namespace, as checked when attaching.
    pub fn start(
        identity: TenantIdentity,
        connection: Connection,
        kube_system_uid: String,
        settings: TenantSettings,
        queues: &Queues,
        sync_ingresses: bool,
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
        let relisted: OnRelist = {
            let check = check.clone();
            Arc::new(move || check.doubt())
        };
        let all = watcher::Config::default();
        let budget = CacheBudget::new(identity.vc_ref(), limits);
        // A page of a list is held whole in memory: smaller pages bound what a tenant's list of large
        // objects takes before the budget sees it.
        let all = all.page_size(LIST_PAGE_SIZE);
        macro_rules! reflect {
            ($api:expr, $config:expr, $kind:expr, $on_change:expr) => {
                reflect_budgeted(
                    $api,
                    $config,
                    relisted.clone(),
                    budget.ledger($kind),
                    $on_change,
                )
            };
        }

        macro_rules! downward {
            ($kind:expr) => {{
                let (queue, id) = (queues.down.clone(), id.clone());
                let (store, task) = reflect!(
                    Api::all(client.clone()),
                    all.clone(),
                    $kind.as_str(),
                    move |o, _| { queue.add(&id, namespaced(o, $kind)) }
                );
                tasks.push(task);
                store
            }};
        }
        let namespaces = {
            let (queue, id, check, uid) = (
                queues.down.clone(),
                id.clone(),
                check.clone(),
                kube_system_uid.clone(),
            );
            let (store, task) = reflect!(
                Api::<Namespace>::all(client.clone()),
                all.clone(),
                "namespace",
                move |ns: &Namespace, change| {
                    // A watch that resumed on a replaced etcd may show another kube-system, or its
                    // deletion (which a real apiserver refuses), without relisting.
                    if ns.name_any() == "kube-system"
                        && (change == Change::Deleted || ns.uid().as_deref() != Some(uid.as_str()))
                    {
                        check.doubt();
                    }
                    queue.add(&id, DownItem::namespace(&ns.name_any()))
                }
            );
            tasks.push(task);
            store
        };
        let pods = {
            let (queue, id) = (queues.down.clone(), id.clone());
            let (store, task) = reflect!(
                Api::<TenantPod>::all(client.clone()),
                all.clone(),
                "pod",
                move |o: &TenantPod, _| queue.add(&id, namespaced(o, Kind::Pod))
            );
            tasks.push(task);
            store
        };
        // A tenant Service is synced down, and up too: the super cluster's node ports and IP go back onto
        // it, also after the tenant changed it.
        let services = {
            let (down, up, id) = (queues.down.clone(), queues.up.clone(), id.clone());
            let (store, task) = reflect!(
                Api::<Service>::all(client.clone()),
                all.clone(),
                "service",
                move |o: &Service, _| {
                    down.add(&id, namespaced(o, Kind::Service));
                    up.add(
                        &id,
                        UpItem::Service {
                            namespace: o.namespace().unwrap_or_default(),
                            name: o.name_any(),
                        },
                    );
                }
            );
            tasks.push(task);
            store
        };
        let endpoints = downward!(Kind::Endpoints);
        let config_maps = downward!(Kind::ConfigMap);
        let secrets = downward!(Kind::Secret);
        let service_accounts = downward!(Kind::ServiceAccount);
        let claims = downward!(Kind::PersistentVolumeClaim);
        let ingresses = sync_ingresses.then(|| downward!(Kind::Ingress));
        let network_policies = downward!(Kind::NetworkPolicy);

        macro_rules! upward {
            ($type:ty, $kind:expr, $selector:expr, $item:expr) => {{
                let (queue, id) = (queues.up.clone(), id.clone());
                let config = all.clone().labels($selector);
                let (store, task) = reflect!(
                    Api::<$type>::all(client.clone()),
                    config,
                    $kind,
                    move |o: &$type, _| { queue.add(&id, $item(o.name_any())) }
                );
                tasks.push(task);
                store
            }};
        }
        let vnode_selector = format!("{}=true", crds::wellknown::LABEL_VIRTUAL_NODE);
        let ours = format!("{LABEL_SYNCED_FROM_SUPER}=true");
        let vnodes = upward!(Node, "node", &vnode_selector, |name| UpItem::Node { name });
        let volumes = upward!(PersistentVolume, "persistentvolume", &ours, |name| {
            UpItem::PersistentVolume { name }
        });
        let storage_classes = upward!(StorageClass, "storageclass", &ours, |name| UpItem::StorageClass {
            name
        });
        let priority_classes = upward!(PriorityClass, "priorityclass", &ours, |name| {
            UpItem::PriorityClass { name }
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
            vnode_idle_since: Default::default(),
            stores: TenantStores {
                namespaces,
                pods,
                services,
                endpoints,
                config_maps,
                secrets,
                service_accounts,
                claims,
                ingresses,
                network_policies,
                vnodes,
                volumes,
                storage_classes,
                priority_classes,
            },
            kube_system_uid,
            budget,
            settings: RwLock::new(Arc::new(settings)),
            ready: std::sync::atomic::AtomicBool::new(false),
            check,
            tasks,
        })
    }

    /// Whether every cache has listed the tenant once, the caches show the cluster the tenant was
    /// attached to (checked again after every relist), and the tenant fits its cache limits. Until then the
    /// tenant's items wait: an empty cache, one filled from another cluster, or one missing what did not
    /// fit, would read as "deleted in the tenant".
    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Acquire)
            && self.check.holds()
            && self.budget.exceeded().is_none()
    }

    /// Waits for the caches, then marks the tenant ready.
    pub async fn become_ready(&self) {
        self.wait_ready().await;
        self.ready.store(true, std::sync::atomic::Ordering::Release);
        tracing::info!(tenant = %self.identity.vc_ref(), "tenant caches synced");
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

    /// Waits until every cache has listed the tenant once.
    pub async fn wait_ready(&self) {
        let s = &self.stores;
        let _ = tokio::join!(
            s.namespaces.wait_until_ready(),
            s.pods.wait_until_ready(),
            s.services.wait_until_ready(),
            s.endpoints.wait_until_ready(),
            s.config_maps.wait_until_ready(),
            s.secrets.wait_until_ready(),
            s.service_accounts.wait_until_ready(),
            s.claims.wait_until_ready(),
            s.network_policies.wait_until_ready(),
            s.vnodes.wait_until_ready(),
            s.volumes.wait_until_ready(),
            s.storage_classes.wait_until_ready(),
            s.priority_classes.wait_until_ready(),
        );
        if let Some(ingresses) = &s.ingresses {
            let _ = ingresses.wait_until_ready().await;
        }
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
    pub pods: kube::runtime::reflector::store::Writer<TenantPod>,
    /// Services.
    pub services: kube::runtime::reflector::store::Writer<Service>,
    /// vNodes.
    pub vnodes: kube::runtime::reflector::store::Writer<Node>,
    /// PersistentVolumeClaims.
    pub claims: kube::runtime::reflector::store::Writer<PersistentVolumeClaim>,
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
        let (pods, pods_writer) = store();
        let (services, services_writer) = store();
        let (vnodes, vnodes_writer) = store();
        let (claims, claims_writer) = store();
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
            vnode_idle_since: Default::default(),
            stores: TenantStores {
                namespaces,
                pods,
                services,
                endpoints: store().0,
                config_maps: store().0,
                secrets: store().0,
                service_accounts: store().0,
                claims,
                ingresses: None,
                network_policies: store().0,
                vnodes,
                volumes: store().0,
                storage_classes: store().0,
                priority_classes: store().0,
            },
            kube_system_uid: "kube-system-uid".into(),
            budget: CacheBudget::new("test".into(), CacheLimits::default()),
            settings: RwLock::new(Arc::new(settings)),
            ready: std::sync::atomic::AtomicBool::new(true),
            check: Arc::new(IdentityCheck::default()),
            tasks: Vec::new(),
        });
        let writers = Writers {
            namespaces: namespaces_writer,
            pods: pods_writer,
            services: services_writer,
            vnodes: vnodes_writer,
            claims: claims_writer,
        };
        (tenant, writers)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::context::testing;

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
}
