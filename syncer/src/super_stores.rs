//! Caches of the super cluster, shared by every tenant, and how their events reach the queues.

use std::sync::Arc;

use crds::wellknown::{
    COMPONENT_APISERVER, LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_SUPER_PUBLIC, LABEL_VC_NAME,
    MANAGED_BY_VC_MANAGER,
};
use k8s_openapi::api::{
    core::v1::{
        ConfigMap, Endpoints, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Secret, Service,
        ServiceAccount,
    },
    networking::v1::{Ingress, NetworkPolicy},
    rbac::v1::RoleBinding,
    scheduling::v1::PriorityClass,
    storage::v1::StorageClass,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    core::PartialObjectMeta,
    runtime::{reflector::Store, watcher},
};
use tokio::task::JoinHandle;

use crate::{
    cached::SuperPod,
    identity,
    items::{DownItem, Kind, UpItem},
    quota::Quota,
    resources::pod::token,
    stores::{Change, reflect, reflect_with, trim},
    tenant::{Queues, Tenants},
};

/// The super cluster's caches.
pub struct SuperStores {
    /// Tenant namespaces.
    pub namespaces: Store<Namespace>,
    /// Tenant pods.
    pub pods: Store<SuperPod>,
    /// Tenant services.
    pub services: Store<Service>,
    /// Endpoints of tenant services.
    pub endpoints: Store<Endpoints>,
    /// Endpoints of provisioned tenants' apiserver Services, in their root namespaces: the only
    /// addresses besides its pods' that a tenant's `default/kubernetes` Endpoints may lead to.
    pub apiservers: Store<Endpoints>,
    /// Tenant ConfigMaps.
    pub config_maps: Store<ConfigMap>,
    /// Tenant Secrets.
    pub secrets: Store<Secret>,
    /// Metadata of pod token Secrets.
    pub tokens: Store<PartialObjectMeta<Secret>>,
    /// Tenant ServiceAccounts.
    pub service_accounts: Store<ServiceAccount>,
    /// Tenant PersistentVolumeClaims.
    pub claims: Store<PersistentVolumeClaim>,
    /// Tenant Ingresses, when synced.
    pub ingresses: Option<Store<Ingress>>,
    /// Tenant NetworkPolicies and the isolating ones the syncer keeps.
    pub network_policies: Store<NetworkPolicy>,
    /// The RoleBindings the syncer keeps in tenant super namespaces (vn-agent's access).
    pub role_bindings: Store<RoleBinding>,
    /// Every node.
    pub nodes: Store<Node>,
    /// Every PersistentVolume.
    pub volumes: Store<PersistentVolume>,
    /// Public StorageClasses.
    pub storage_classes: Store<StorageClass>,
    /// Public PriorityClasses.
    pub priority_classes: Store<PriorityClass>,
    tasks: Vec<JoinHandle<()>>,
}

/// Where a super object's changes go: its tenant, tenant namespace and name.
fn tenant_key<K: Resource>(object: &K) -> Option<(Arc<str>, String, String)> {
    let meta = object.meta();
    let cluster = identity::owner_cluster(meta)?;
    let namespace = identity::tenant_namespace(meta)?.to_owned();
    Some((Arc::from(cluster), namespace, meta.name.clone()?))
}

impl SuperStores {
    /// Starts every super-cluster watch.
    pub fn start(
        client: &Client,
        queues: &Queues,
        tenants: Arc<Tenants>,
        quota: Arc<Quota>,
        sync_ingresses: bool,
    ) -> Self {
        let ours = watcher::Config::default().labels(LABEL_VC_NAME);
        let _span = tracing::info_span!("super").entered();
        let mut tasks = Vec::new();

        macro_rules! downward {
            ($type:ty, $kind:expr) => {{
                let queue = queues.down.clone();
                let (store, task) = reflect(Api::<$type>::all(client.clone()), ours.clone(), move |o| {
                    if let Some((tenant, namespace, name)) = tenant_key(o) {
                        queue.add(&tenant, DownItem::new($kind, &namespace, &name));
                    }
                });
                tasks.push(task);
                store
            }};
            ($type:ty, $kind:expr, $up:expr) => {{
                let (down, up) = (queues.down.clone(), queues.up.clone());
                let (store, task) = reflect(Api::<$type>::all(client.clone()), ours.clone(), move |o| {
                    if let Some((tenant, namespace, name)) = tenant_key(o) {
                        down.add(&tenant, DownItem::new($kind, &namespace, &name));
                        up.add(&tenant, $up(namespace, name));
                    }
                });
                tasks.push(task);
                store
            }};
        }

        let namespaces = {
            let queue = queues.down.clone();
            let (store, task) = reflect(Api::<Namespace>::all(client.clone()), ours.clone(), move |ns| {
                if let (Some(tenant), Some(tenant_ns)) = (
                    identity::owner_cluster(ns.meta()),
                    identity::tenant_namespace(ns.meta()),
                ) {
                    queue.add(&Arc::from(tenant), DownItem::namespace(tenant_ns));
                }
            });
            tasks.push(task);
            store
        };
        let pods = {
            let (down, up, quota) = (queues.down.clone(), queues.up.clone(), quota.clone());
            let (store, task) = reflect_with(
                Api::<SuperPod>::all(client.clone()),
                ours.clone(),
                trim::<SuperPod>,
                move |pod, change| {
                    quota.observe(pod, change);
                    if let Some((tenant, namespace, name)) = tenant_key(pod) {
                        down.add(&tenant, DownItem::new(Kind::Pod, &namespace, &name));
                        up.add(&tenant, UpItem::Pod { namespace, name });
                    }
                },
            );
            tasks.push(task);
            store
        };
        // Services and claims count against the tenant's object quotas: the ledger follows them too.
        macro_rules! counted {
            ($type:ty, $kind:expr, $usage:expr, $up:expr) => {{
                let (down, up, quota) = (queues.down.clone(), queues.up.clone(), quota.clone());
                let (store, task) = reflect_with(
                    Api::<$type>::all(client.clone()),
                    ours.clone(),
                    trim::<$type>,
                    move |o, change| {
                        let usage = match change {
                            Change::Applied => Some($usage(o.spec.as_ref())),
                            _ => None,
                        };
                        quota.observe_object(o.meta(), $kind, usage);
                        if let Some((tenant, namespace, name)) = tenant_key(o) {
                            down.add(&tenant, DownItem::new($kind, &namespace, &name));
                            up.add(&tenant, $up(namespace, name));
                        }
                    },
                );
                tasks.push(task);
                store
            }};
        }
        let services = counted!(
            Service,
            Kind::Service,
            crate::quota::service_usage,
            |namespace, name| UpItem::Service { namespace, name }
        );
        let endpoints = downward!(Endpoints, Kind::Endpoints);
        let apiservers = {
            let queue = queues.down.clone();
            let selector = watcher::Config::default().labels(&format!(
                "{LABEL_MANAGED_BY}={MANAGED_BY_VC_MANAGER},{LABEL_COMPONENT}={COMPONENT_APISERVER}"
            ));
            let (store, task) = reflect(Api::<Endpoints>::all(client.clone()), selector, move |o| {
                // A tenant's root namespace is its cluster key. Its apiserver moved: the tenant's own
                // record of where its apiserver is may have been refused a moment ago.
                if let Some(root) = o.namespace() {
                    queue.add(
                        &Arc::from(root.as_str()),
                        DownItem::new(Kind::Endpoints, "default", "kubernetes"),
                    );
                }
            });
            tasks.push(task);
            store
        };
        let config_maps = downward!(ConfigMap, Kind::ConfigMap);
        // Pod token Secrets are watched apart, metadata only: their values never need to be in memory.
        let not_tokens =
            watcher::Config::default().labels(&format!("{LABEL_VC_NAME},!{}", token::LABEL_POD_TOKEN));
        let secrets = {
            let queue = queues.down.clone();
            let (store, task) = reflect(Api::<Secret>::all(client.clone()), not_tokens, move |secret| {
                if let Some((tenant, namespace, name)) = tenant_key(secret) {
                    queue.add(&tenant, DownItem::new(Kind::Secret, &namespace, &name));
                }
            });
            tasks.push(task);
            store
        };
        let tokens = {
            let queue = queues.down.clone();
            let selector = watcher::Config::default().labels(&format!("{}=true", token::LABEL_POD_TOKEN));
            let (store, task) = reflect(
                Api::<PartialObjectMeta<Secret>>::all(client.clone()),
                selector,
                move |secret| {
                    // A pod's token Secret is part of the pod: repairing it means syncing the pod.
                    if let (Some((tenant, namespace, _)), Some(pod)) =
                        (tenant_key(secret), token::pod_of_token_secret(secret.meta()))
                    {
                        queue.add(&tenant, DownItem::new(Kind::Pod, &namespace, pod));
                    }
                },
            );
            tasks.push(task);
            store
        };
        let service_accounts = downward!(ServiceAccount, Kind::ServiceAccount);
        let claims = counted!(
            PersistentVolumeClaim,
            Kind::PersistentVolumeClaim,
            crate::quota::claim_usage,
            |namespace, name| UpItem::PersistentVolumeClaim { namespace, name }
        );
        let ingresses = sync_ingresses.then(|| downward!(Ingress, Kind::Ingress));
        let network_policies = {
            let queue = queues.down.clone();
            let (store, task) = reflect(
                Api::<NetworkPolicy>::all(client.clone()),
                ours.clone(),
                move |policy: &NetworkPolicy| {
                    // An isolating policy is part of its namespace: repairing it means syncing that.
                    if let Some((tenant, namespace)) = crate::resources::network::isolates(policy.meta()) {
                        queue.add(&Arc::from(tenant), DownItem::namespace(namespace));
                    } else if let Some((tenant, namespace, name)) = tenant_key(policy) {
                        queue.add(&tenant, DownItem::new(Kind::NetworkPolicy, &namespace, &name));
                    }
                },
            );
            tasks.push(task);
            store
        };
        let role_bindings = {
            let queue = queues.down.clone();
            let (store, task) = reflect(
                Api::<RoleBinding>::all(client.clone()),
                ours.clone(),
                move |binding: &RoleBinding| {
                    // A binding is part of its namespace: repairing it means syncing that.
                    if let Some((tenant, namespace)) = crate::resources::access::grants(binding.meta()) {
                        queue.add(&Arc::from(tenant), DownItem::namespace(namespace));
                    }
                },
            );
            tasks.push(task);
            store
        };

        let nodes = {
            let (queue, tenants) = (queues.up.clone(), tenants.clone());
            let (store, task) = reflect_with(
                Api::<Node>::all(client.clone()),
                watcher::Config::default(),
                trim_node,
                move |node, _| {
                    let name = node.name_any();
                    for tenant in tenants.all() {
                        let has_vnode = tenant
                            .stores
                            .vnodes
                            .get(&kube::runtime::reflector::ObjectRef::new(&name))
                            .is_some();
                        if has_vnode {
                            queue.add(&tenant.id, UpItem::Node { name: name.clone() });
                        }
                    }
                },
            );
            tasks.push(task);
            store
        };
        let volumes = {
            let (queue, namespaces) = (queues.up.clone(), namespaces.clone());
            let (store, task) = reflect(
                Api::<PersistentVolume>::all(client.clone()),
                watcher::Config::default(),
                move |pv| {
                    let claim_namespace = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .and_then(|c| c.namespace.clone());
                    let Some(claim_namespace) = claim_namespace else {
                        return;
                    };
                    let Some(ns) =
                        namespaces.get(&kube::runtime::reflector::ObjectRef::new(&claim_namespace))
                    else {
                        return;
                    };
                    if let Some(tenant) = identity::owner_cluster(ns.meta()) {
                        queue.add(
                            &Arc::from(tenant),
                            UpItem::PersistentVolume { name: pv.name_any() },
                        );
                    }
                },
            );
            tasks.push(task);
            store
        };
        let public = watcher::Config::default().labels(&format!("{LABEL_SUPER_PUBLIC}=true"));
        macro_rules! broadcast {
            ($type:ty, $item:expr) => {{
                let (queue, tenants) = (queues.up.clone(), tenants.clone());
                let (store, task) = reflect(
                    Api::<$type>::all(client.clone()),
                    public.clone(),
                    move |o| {
                        for tenant in tenants.all() {
                            queue.add(&tenant.id, $item(o.name_any()));
                        }
                    },
                );
                tasks.push(task);
                store
            }};
        }
        let storage_classes = broadcast!(StorageClass, |name| UpItem::StorageClass { name });
        let priority_classes = broadcast!(PriorityClass, |name| UpItem::PriorityClass { name });

        Self {
            namespaces,
            pods,
            services,
            endpoints,
            apiservers,
            config_maps,
            secrets,
            tokens,
            service_accounts,
            claims,
            ingresses,
            network_policies,
            role_bindings,
            nodes,
            volumes,
            storage_classes,
            priority_classes,
            tasks,
        }
    }

    /// Waits until every cache has listed the super cluster once.
    pub async fn wait_ready(&self) {
        let _ = tokio::join!(
            self.namespaces.wait_until_ready(),
            self.pods.wait_until_ready(),
            self.services.wait_until_ready(),
            self.endpoints.wait_until_ready(),
            self.apiservers.wait_until_ready(),
            self.config_maps.wait_until_ready(),
            self.secrets.wait_until_ready(),
            self.tokens.wait_until_ready(),
            self.service_accounts.wait_until_ready(),
            self.claims.wait_until_ready(),
            self.network_policies.wait_until_ready(),
            self.role_bindings.wait_until_ready(),
            self.nodes.wait_until_ready(),
            self.volumes.wait_until_ready(),
            self.storage_classes.wait_until_ready(),
            self.priority_classes.wait_until_ready(),
        );
        if let Some(ingresses) = &self.ingresses {
            let _ = ingresses.wait_until_ready().await;
        }
    }
}

impl Drop for SuperStores {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Nodes report images and volumes in use, which vNodes do not need and which dominate a node's size.
fn trim_node(node: &mut Node) {
    trim(node);
    if let Some(status) = &mut node.status {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
}

/// Writers of the caches tests fill by hand.
#[cfg(test)]
pub(crate) struct Writers {
    /// Tenant namespaces.
    pub namespaces: kube::runtime::reflector::store::Writer<Namespace>,
    /// Tenant services.
    pub services: kube::runtime::reflector::store::Writer<Service>,
    /// Tenant pods.
    pub pods: kube::runtime::reflector::store::Writer<SuperPod>,
    /// Public StorageClasses.
    pub storage_classes: kube::runtime::reflector::store::Writer<StorageClass>,
    /// NetworkPolicies.
    pub network_policies: kube::runtime::reflector::store::Writer<NetworkPolicy>,
    /// Endpoints of provisioned tenants' apiservers.
    pub apiservers: kube::runtime::reflector::store::Writer<Endpoints>,
    /// The syncer's RoleBindings.
    pub role_bindings: kube::runtime::reflector::store::Writer<RoleBinding>,
}

#[cfg(test)]
impl SuperStores {
    /// Caches without watches, filled by the test through the returned writers (the others stay empty).
    pub(crate) fn for_tests() -> (Self, Writers) {
        use kube::runtime::reflector::store;
        let (namespaces, namespaces_writer) = store();
        let (services, services_writer) = store();
        let (pods, pods_writer) = store();
        let (storage_classes, storage_classes_writer) = store();
        let (network_policies, network_policies_writer) = store();
        let (apiservers, apiservers_writer) = store();
        let (role_bindings, role_bindings_writer) = store();
        let stores = Self {
            namespaces,
            pods,
            services,
            endpoints: store().0,
            apiservers,
            config_maps: store().0,
            secrets: store().0,
            tokens: store().0,
            service_accounts: store().0,
            claims: store().0,
            ingresses: None,
            network_policies,
            role_bindings,
            nodes: store().0,
            volumes: store().0,
            storage_classes,
            priority_classes: store().0,
            tasks: Vec::new(),
        };
        let writers = Writers {
            namespaces: namespaces_writer,
            services: services_writer,
            pods: pods_writer,
            storage_classes: storage_classes_writer,
            network_policies: network_policies_writer,
            apiservers: apiservers_writer,
            role_bindings: role_bindings_writer,
        };
        (stores, writers)
    }
}
