//! Caches of the super cluster, shared by every tenant, and how their events reach the queues.

use std::{fmt::Debug, sync::Arc};

use crds::wellknown::LABEL_VC_NAME;
use k8s_openapi::api::{
    core::v1::{Namespace, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::ObjectMeta,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use crate::{
    accounting::quota::{ObjectUsage, Quota},
    cache::{
        meta::{HasTags, Tagged},
        slim_store::SlimStore,
        stores::{Cache, Change, reflect, reflect_slim, reflect_with, trim},
    },
    engine::items::{DownItem, Kind, UpItem, kinds, with_kinds},
    tenancy::{
        identity,
        tenant::{Queues, Tenants},
    },
};

/// What a kind caches of the super cluster, and how the cache's changes reach the queues. Implemented by
/// each kind's module in [`crate::resources`].
pub trait SuperCache {
    /// The cache: a store, `Option` of one for a kind synced by flag, `()` for none.
    type Cache: Cache;
    /// Starts the watch that fills the cache.
    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache;

    /// The cached super object `namespace/name` of this kind that a super-cluster event is about, for
    /// copying the event up to the object's tenant. A kind whose objects the syncer writes into super
    /// namespaces says where they are cached; the default is for kinds whose events are not copied
    /// (cluster-scoped, public, or not cached).
    fn event_subject(_cache: &Self::Cache, _namespace: &str, _name: &str) -> EventSubject {
        EventSubject::NotCopied
    }
}

/// What a kind's cache knows of the super object an event is about.
#[derive(Debug, PartialEq)]
pub enum EventSubject {
    /// The object, cached: its metadata says which tenant's object it copies.
    Found(Box<ObjectMeta>),
    /// The kind's events are copied, but no such object is cached (not the syncer's, or gone).
    Missing,
    /// Events about objects of this kind are not copied.
    NotCopied,
}

impl EventSubject {
    /// The subject of an event about `namespace/name`, looked up in `store`.
    pub fn in_store<K>(store: &Store<K>, namespace: &str, name: &str) -> Self
    where
        K: Resource<DynamicType = ()> + Clone,
    {
        store
            .get(&ObjectRef::new(name).within(namespace))
            .map_or(Self::Missing, |o| Self::Found(Box::new(o.meta().clone())))
    }
}

macro_rules! super_stores {
    ($( $(#[$doc:meta])* $kind:ident = $label:literal => $module:ident, $caches:ident; )*) => {
        /// The super cluster's caches: one per kind, and those several kinds consult.
        pub struct SuperStores {
            $( $(#[$doc])* pub $caches: <kinds::$kind as SuperCache>::Cache, )*
            /// The super cluster's own DNS, which tenants' pods may not reach (see [`PlatformDns`]).
            pub platform_dns: PlatformDns,
            tasks: Vec<JoinHandle<()>>,
        }

        impl SuperStores {
            fn watch_kinds(
                supers: &mut SuperWatch<'_>,
                platform_dns: PlatformDns,
            ) -> Self {
                let mut stores = Self {
                    $( $caches: <kinds::$kind as SuperCache>::watch(supers), )*
                    platform_dns,
                    tasks: Vec::new(),
                };
                stores.tasks = std::mem::take(&mut supers.tasks);
                stores
            }

            /// What the cache of `kind` knows of the super object `namespace/name` an event is about.
            pub fn event_subject(&self, kind: Kind, namespace: &str, name: &str) -> EventSubject {
                match kind {
                    $( Kind::$kind => <kinds::$kind as SuperCache>::event_subject(&self.$caches, namespace, name), )*
                }
            }

            /// Waits until every cache has listed the super cluster once.
            pub async fn wait_ready(&self) {
                $( self.$caches.wait_ready().await; )*
                self.platform_dns.wait_ready().await;
            }

            #[cfg(test)]
            fn empty() -> Self {
                Self {
                    $( $caches: Cache::empty(), )*
                    platform_dns: PlatformDns::none(),
                    tasks: Vec::new(),
                }
            }
        }
    };
}
with_kinds!(super_stores);

/// The super cluster's own DNS Service and its EndpointSlices (one-object watches, when
/// `--network-isolation-platform-dns` names it): the addresses the isolation keeps tenants' pods from.
pub struct PlatformDns {
    services: Option<Store<Service>>,
    slices: Option<Store<EndpointSlice>>,
}

impl PlatformDns {
    /// No platform DNS: nothing is watched.
    pub fn none() -> Self {
        Self {
            services: None,
            slices: None,
        }
    }

    /// Its cluster IPs and the addresses of its endpoints, sorted, as the caches have them.
    pub fn addresses(&self) -> Vec<std::net::IpAddr> {
        let mut addresses: Vec<std::net::IpAddr> = Vec::new();
        for service in self.services.iter().flat_map(|s| s.state()) {
            let spec = service.spec.as_ref();
            addresses.extend(
                spec.and_then(|s| s.cluster_ips.clone())
                    .into_iter()
                    .flatten()
                    .chain(spec.and_then(|s| s.cluster_ip.clone()))
                    .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok()),
            );
        }
        for slice in self.slices.iter().flat_map(|s| s.state()) {
            addresses.extend(
                slice
                    .endpoints
                    .iter()
                    .flat_map(|e| e.addresses.iter())
                    .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok()),
            );
        }
        addresses.sort();
        addresses.dedup();
        addresses
    }

    async fn wait_ready(&self) {
        if let Some(services) = &self.services {
            services.wait_ready().await;
        }
        if let Some(slices) = &self.slices {
            slices.wait_ready().await;
        }
    }
}

/// What a kind's watch of the super cluster is started with.
pub struct SuperWatch<'a> {
    /// Client of the super cluster.
    pub client: &'a Client,
    /// The queues the watch feeds.
    pub queues: &'a Queues,
    /// The attached tenants.
    pub tenants: &'a Arc<Tenants>,
    /// The quota ledger, which follows what counts against tenants' quotas.
    pub quota: &'a Arc<Quota>,
    /// The pods' tokens, which follow the token Secrets' watch.
    pub tokens: &'a Arc<crate::tokens::Tokens>,
    /// The tenant namespaces: which tenant namespace each super namespace serves.
    pub namespaces: &'a Store<Namespace>,
    /// Whether Ingresses are synced.
    pub sync_ingresses: bool,
    /// Whether the syncer grants vn-agent access to tenant pods namespace by namespace
    /// (`--vn-agent-service-account`).
    pub vn_agent_access: bool,
    /// Which super nodes tenants see.
    pub vnode_mode: &'a crate::resources::vnode::flags::VNodeMode,
    /// The custom resource kinds synced.
    pub custom_resources: &'a [crate::engine::config::custom_kinds::CustomKind],
    tasks: Vec<JoinHandle<()>>,
}

impl SuperWatch<'_> {
    /// Watches the super objects of `K` that `config` selects, each trimmed by `trim`, and calls
    /// `on_change` with every change.
    pub fn watch_with<K, T, F>(&mut self, config: watcher::Config, trim: T, on_change: F) -> Store<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        T: FnMut(&mut K) + Send + 'static,
        F: Fn(&K, Change) + Send + 'static,
    {
        let (store, task) = reflect_with(
            Api::all(self.client.clone()),
            from_watch_cache(config),
            trim,
            on_change,
        );
        self.tasks.push(task);
        store
    }

    /// Watches the super objects of `W` that `config` selects, each cached as what `convert` makes of it, and
    /// calls `on_change` with every change and the record it replaced.
    pub fn watch_converted<W, K, F>(
        &mut self,
        config: watcher::Config,
        convert: fn(W) -> K,
        on_change: F,
    ) -> SlimStore<K>
    where
        W: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
        K: kube::runtime::reflector::Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
        F: Fn(&K, Change, Option<&K>) + Send + 'static,
    {
        let (store, task) = reflect_slim(
            Api::all(self.client.clone()),
            from_watch_cache(config),
            convert,
            on_change,
        );
        self.tasks.push(task);
        store
    }

    /// Watches the objects of `K` in one namespace of the super cluster that `config` selects, and calls
    /// `on_change` with every change: for what the syncer is granted in that namespace alone.
    pub fn watch_in<K, F>(&mut self, namespace: &str, config: watcher::Config, on_change: F) -> Store<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
        F: Fn(&K) + Send + 'static,
    {
        let (store, task) = reflect(
            Api::namespaced(self.client.clone(), namespace),
            from_watch_cache(config),
            on_change,
        );
        self.tasks.push(task);
        store
    }

    /// Watches the super objects of `K` that `config` selects and calls `on_change` with every change.
    pub fn watch<K, F>(&mut self, config: watcher::Config, on_change: F) -> Store<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        F: Fn(&K) + Send + 'static,
    {
        let (store, task) = reflect(Api::all(self.client.clone()), from_watch_cache(config), on_change);
        self.tasks.push(task);
        store
    }

    /// Watches the tenants' copies of `K` and queues each change down, as an item of `kind`, to the
    /// tenant it belongs to.
    pub fn down<K>(&mut self, kind: Kind) -> Store<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let queue = self.queues.down.clone();
        self.watch(ours(), move |o: &K| {
            if let Some((tenant, namespace, name)) = tenant_key(o) {
                queue.add(&tenant, DownItem::new(kind, &namespace, &name));
            }
        })
    }

    /// Like [`SuperWatch::down`] for a kind whose copies count against the tenant's object quotas (the
    /// ledger follows them, by `usage`) and whose state also flows up.
    pub fn counted<K>(&mut self, kind: Kind, usage: fn(&K) -> ObjectUsage) -> Store<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let (down, up, quota) = (
            self.queues.down.clone(),
            self.queues.up.clone(),
            self.quota.clone(),
        );
        self.watch_with(ours(), trim::<K>, move |o, change| {
            let usage = match change {
                Change::Applied => Some(usage(o)),
                _ => None,
            };
            quota.observe_object(o.meta(), kind, usage);
            if let Some((tenant, namespace, name)) = tenant_key(o) {
                down.add(&tenant, DownItem::new(kind, &namespace, &name));
                up.add(&tenant, UpItem::new(kind, &namespace, &name));
            }
        })
    }

    /// Watches the public super objects of `K` (labelled `tenancy.x-k8s.io/super.public=true`) and queues
    /// each change up, as an item of `kind`, to every tenant.
    pub fn public<K>(&mut self, kind: Kind) -> Store<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let (queue, tenants) = (self.queues.up.clone(), self.tenants.clone());
        let public =
            watcher::Config::default().labels(&format!("{}=true", crds::wellknown::LABEL_SUPER_PUBLIC));
        self.watch(public, move |o: &K| {
            for tenant in tenants.all() {
                queue.add(&tenant.id, UpItem::cluster(kind, &o.name_any()));
            }
        })
    }
}

/// Lists `config`'s objects from the super apiserver's watch cache in one response (resourceVersion 0, as
/// client-go's informers do) instead of in pages read from etcd: a restarted syncer is ready once the super
/// caches have listed (with 10,000 pods: 4.3 s, 5.0 s in pages). The watch that follows starts at the
/// list's version, so a list a moment behind etcd is caught up like any other change.
fn from_watch_cache(config: watcher::Config) -> watcher::Config {
    watcher::Config {
        page_size: None,
        ..config.any_semantic()
    }
}

/// The super objects the syncer made for tenants: those labelled with a VirtualCluster's name.
pub fn ours() -> watcher::Config {
    watcher::Config::default().labels(LABEL_VC_NAME)
}

/// Where a super object's changes go: its tenant, tenant namespace and name.
pub fn tenant_key<K: HasTags>(object: &K) -> Option<(Arc<str>, String, String)> {
    let tags = object.tags();
    let cluster = identity::owner_cluster(tags)?;
    let namespace = identity::tenant_namespace(tags)?.to_owned();
    Some((Arc::from(cluster), namespace, tags.object_name()?.to_owned()))
}

impl SuperStores {
    /// Starts every super-cluster watch.
    pub fn start(
        client: &Client,
        queues: &Queues,
        tenants: Arc<Tenants>,
        quota: Arc<Quota>,
        tokens: &Arc<crate::tokens::Tokens>,
        config: &crate::engine::config::SyncerConfig,
    ) -> Self {
        let sync_ingresses = config.sync_ingresses;
        let vnode_mode = config.vnode_mode.clone();
        let custom_resources = &config.custom_resources[..];
        let isolation = &config.network_isolation;
        let platform_dns = isolation.platform_dns.as_ref().filter(|_| isolation.enabled);
        let _span = tracing::info_span!("super").entered();
        // The tenant namespaces come first: other kinds' watches consult them.
        let (namespaces, namespaces_task) = {
            let queue = queues.down.clone();
            reflect(
                Api::<Namespace>::all(client.clone()),
                from_watch_cache(ours()),
                move |ns| {
                    if let (Some(tenant), Some(tenant_ns)) = (
                        identity::owner_cluster(ns.meta()),
                        identity::tenant_namespace(ns.meta()),
                    ) {
                        queue.add(&Arc::from(tenant), DownItem::namespace(tenant_ns));
                    }
                },
            )
        };
        let mut supers = SuperWatch {
            client,
            queues,
            tenants: &tenants,
            quota: &quota,
            tokens,
            namespaces: &namespaces,
            sync_ingresses,
            vn_agent_access: config.vn_agent_access.is_some(),
            vnode_mode: &vnode_mode,
            custom_resources,
            tasks: vec![namespaces_task],
        };
        let platform_dns = match platform_dns {
            None => PlatformDns::none(),
            Some((namespace, name)) => {
                // Its addresses are part of every tenant namespace's isolation: a change is repaired in
                // each of them.
                let requeue = {
                    let (queue, namespaces) = (queues.down.clone(), namespaces.clone());
                    move || {
                        for ns in namespaces.state() {
                            if let (Some(tenant), Some(tenant_ns)) = (
                                identity::owner_cluster(ns.meta()),
                                identity::tenant_namespace(ns.meta()),
                            ) {
                                queue.add(&Arc::from(tenant), DownItem::namespace(tenant_ns));
                            }
                        }
                    }
                };
                // In its namespace only, where the chart grants the syncer these reads (a Role).
                let services = {
                    let requeue = requeue.clone();
                    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
                    supers.watch_in(namespace, config, move |_: &Service| requeue())
                };
                let slices = {
                    let config =
                        watcher::Config::default().labels(&format!("kubernetes.io/service-name={name}"));
                    supers.watch_in(namespace, config, move |_: &EndpointSlice| requeue())
                };
                PlatformDns {
                    services: Some(services),
                    slices: Some(slices),
                }
            }
        };
        Self::watch_kinds(&mut supers, platform_dns)
    }
}

impl Drop for SuperStores {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Writers of the caches tests fill by hand.
#[cfg(test)]
pub(crate) struct Writers {
    /// Tenant namespaces.
    pub namespaces: kube::runtime::reflector::store::Writer<Namespace>,
    /// Tenant services.
    pub services: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::Service>,
    /// Tenant pods.
    pub pods: crate::cache::slim_store::SlimWriter<crate::cache::pods::SuperPod>,
    /// Tenant claims.
    pub claims: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    /// Public StorageClasses.
    pub storage_classes: kube::runtime::reflector::store::Writer<k8s_openapi::api::storage::v1::StorageClass>,
    /// NetworkPolicies.
    pub network_policies:
        kube::runtime::reflector::store::Writer<k8s_openapi::api::networking::v1::NetworkPolicy>,
    /// Endpoints of provisioned tenants' apiservers.
    pub apiservers: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::Endpoints>,
    /// The syncer's RoleBindings.
    pub role_bindings: kube::runtime::reflector::store::Writer<k8s_openapi::api::rbac::v1::RoleBinding>,
    /// Metadata of pod token Secrets.
    pub tokens: kube::runtime::reflector::store::Writer<
        kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Secret>,
    >,
    /// Super nodes.
    pub nodes: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::Node>,
}

#[cfg(test)]
impl SuperStores {
    /// Caches without watches, filled by the test through the returned writers (the others stay empty).
    pub(crate) fn for_tests() -> (Self, Writers) {
        use kube::runtime::reflector::store;
        let (namespaces, namespaces_writer) = store();
        let (services, services_writer) = store();
        let (pods, pods_writer) = crate::cache::slim_store::slim_store();
        let (claims, claims_writer) = store();
        let (storage_classes, storage_classes_writer) = store();
        let (network_policies, network_policies_writer) = store();
        let (apiservers, apiservers_writer) = store();
        let (role_bindings, role_bindings_writer) = store();
        let (tokens, tokens_writer) = store();
        let (nodes, nodes_writer) = store();
        let mut stores = Self::empty();
        stores.nodes = nodes;
        stores.pods.token_secrets = tokens;
        stores.namespaces.store = namespaces;
        stores.pods.copies = pods;
        stores.claims = claims;
        stores.services = services;
        stores.endpoints.apiservers = apiservers;
        stores.network_policies = network_policies;
        stores.namespaces.role_bindings = role_bindings;
        stores.storage_classes = storage_classes;
        let writers = Writers {
            namespaces: namespaces_writer,
            services: services_writer,
            pods: pods_writer,
            claims: claims_writer,
            storage_classes: storage_classes_writer,
            network_policies: network_policies_writer,
            apiservers: apiservers_writer,
            role_bindings: role_bindings_writer,
            tokens: tokens_writer,
            nodes: nodes_writer,
        };
        (stores, writers)
    }
}
