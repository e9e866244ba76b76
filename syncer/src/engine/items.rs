//! What the work queues carry: the one list of kinds the syncer syncs, and items of those kinds.

use std::fmt;

/// The one list of kinds the syncer syncs, in the order a tenant's objects are first synced (namespaces
/// first). Each line is a kind (named as the Kubernetes API names it), its metric label, the module of
/// [`crate::resources`] that syncs it, and the field of the caches that holds its objects.
///
/// The list is handed to the macro `$then`, which makes of it what it needs: [`Kind`] and
/// [`kinds`] here, the caches in [`crate::tenancy::tenant::TenantStores`] and
/// [`crate::cache::super_stores::SuperStores`], the modules and the dispatch in [`crate::resources`]. Adding
/// a kind is one module and one line here.
macro_rules! with_kinds {
    ($then:ident) => {
        $then! {
            /// Namespaces.
            Namespace = "namespace" => namespace, namespaces;
            /// ServiceAccounts.
            ServiceAccount = "serviceaccount" => service_account, service_accounts;
            /// ConfigMaps.
            ConfigMap = "configmap" => config_map, config_maps;
            /// Secrets.
            Secret = "secret" => secret, secrets;
            /// Services, down, and their super cluster IP and node ports up.
            Service = "service" => service, services;
            /// Endpoints of selector-less services.
            Endpoints = "endpoints" => endpoints, endpoints;
            /// PersistentVolumeClaims, down, and their status up.
            PersistentVolumeClaim = "persistentvolumeclaim" => claim, claims;
            /// Ingresses (by flag).
            Ingress = "ingress" => ingress, ingresses;
            /// Public IngressClasses, up (by flag, with ingresses).
            IngressClass = "ingressclass" => ingress_class, ingress_classes;
            /// NetworkPolicies, their namespace selectors confined to the tenant.
            NetworkPolicy = "networkpolicy" => network, network_policies;
            /// PodDisruptionBudgets, so that drains of super nodes respect tenant budgets.
            PodDisruptionBudget = "poddisruptionbudget" => disruption_budget, disruption_budgets;
            /// Custom resources of the kinds the platform lists (`--custom-resources`): their CRDs up,
            /// their objects down, their status up.
            CustomResource = "customresource" => custom_resource, custom_resources;
            /// Pods, down, and their binding, status and deletion up.
            Pod = "pod" => pod, pods;
            /// Nodes: a tenant's vNodes, the super nodes as it sees them.
            Node = "node" => vnode, nodes;
            /// PersistentVolumes bound to tenant claims, up.
            PersistentVolume = "persistentvolume" => volume, volumes;
            /// Public StorageClasses, up.
            StorageClass = "storageclass" => storage_class, storage_classes;
            /// Public PriorityClasses, up.
            PriorityClass = "priorityclass" => priority_class, priority_classes;
            /// Public RuntimeClasses, up; the only ones a super pod may name.
            RuntimeClass = "runtimeclass" => runtime_class, runtime_classes;
            /// Events about synced pods and services, up.
            Event = "event" => event, events;
        }
    };
}
pub(crate) use with_kinds;

macro_rules! kind_enum {
    ($( $(#[$doc:meta])* $kind:ident = $label:literal => $module:ident, $caches:ident; )*) => {
        /// A kind the syncer syncs.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kind {
            $( $(#[$doc])* $kind, )*
        }

        impl Kind {
            /// Every kind, in the order a tenant's objects are first synced (namespaces first).
            pub const ALL: &'static [Kind] = &[$( Kind::$kind, )*];

            /// Lower-case name for metric labels and logs.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Kind::$kind => $label, )*
                }
            }

            /// The kind of this Kubernetes API kind (`Pod`, `ConfigMap`, ...), if the syncer syncs it.
            pub fn of_api_kind(api_kind: &str) -> Option<Kind> {
                match api_kind {
                    $( stringify!($kind) => Some(Kind::$kind), )*
                    _ => None,
                }
            }
        }

        /// One type per kind, for the traits that say what a kind caches and how it syncs.
        pub mod kinds {
            $(
                $(#[$doc])*
                pub struct $kind;

                impl $kind {
                    /// Which kind.
                    pub const KIND: super::Kind = super::Kind::$kind;
                }
            )*
        }
    };
}
with_kinds!(kind_enum);

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One object to sync: its kind, tenant namespace (empty for namespaces and cluster-scoped objects) and
/// name. The downward queue carries tenant objects to sync into the super cluster, the upward queue
/// objects whose state flows from the super cluster into one tenant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Item {
    /// The kind.
    pub kind: Kind,
    /// Tenant namespace; for a namespace or a cluster-scoped object, empty.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// An item of the downward queue: a tenant object to sync into the super cluster.
pub type DownItem = Item;
/// An item of the upward queue: an object whose state flows from the super cluster into one tenant.
pub type UpItem = Item;

impl Item {
    /// A namespaced object.
    pub fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// A namespace.
    pub fn namespace(name: &str) -> Self {
        Self::cluster(Kind::Namespace, name)
    }

    /// A cluster-scoped object.
    pub fn cluster(kind: Kind, name: &str) -> Self {
        Self::new(kind, "", name)
    }
}

/// An object's namespace and name as one string, `namespace/name`, for ledgers that keep something for
/// each object: one allocation where a pair of strings takes two. Neither part may hold a `/` (the
/// apiserver allows none in a namespace or in a pod's name), so the key is unambiguous.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(Box<str>);

impl ObjectKey {
    /// The key of object `name` of `namespace` (empty for cluster-scoped objects).
    pub fn new(namespace: &str, name: &str) -> Self {
        let mut key = String::with_capacity(namespace.len() + 1 + name.len());
        key.push_str(namespace);
        key.push('/');
        key.push_str(name);
        Self(key.into_boxed_str())
    }

    /// Its namespace and name.
    pub fn parts(&self) -> (&str, &str) {
        self.0.split_once('/').unwrap_or(("", &self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_found_by_its_api_kind_and_labelled_once() {
        let mut labels: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        for kind in Kind::ALL {
            assert_eq!(Kind::of_api_kind(&format!("{kind:?}")), Some(*kind));
        }
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), Kind::ALL.len());
        assert_eq!(Kind::of_api_kind("RoleBinding"), None);
    }

    #[test]
    fn object_keys_give_back_their_parts() {
        assert_eq!(ObjectKey::new("default", "web-1").parts(), ("default", "web-1"));
        assert_eq!(ObjectKey::new("", "node-a").parts(), ("", "node-a"));
        assert_ne!(ObjectKey::new("a", "b"), ObjectKey::new("", "a-b"));
    }
}
