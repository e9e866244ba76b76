//! What the work queues carry.

use std::fmt;

/// Kinds synced from tenants down to the super cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Namespaces.
    Namespace,
    /// Pods.
    Pod,
    /// Services.
    Service,
    /// Endpoints of selector-less services.
    Endpoints,
    /// ConfigMaps.
    ConfigMap,
    /// Secrets.
    Secret,
    /// ServiceAccounts.
    ServiceAccount,
    /// PersistentVolumeClaims.
    PersistentVolumeClaim,
    /// Ingresses (by flag).
    Ingress,
    /// NetworkPolicies, their namespace selectors confined to the tenant.
    NetworkPolicy,
    /// PodDisruptionBudgets, so that drains of super nodes respect tenant budgets.
    PodDisruptionBudget,
}

impl Kind {
    /// Every kind, in the order a tenant's objects are first synced (namespaces first).
    pub const ALL: [Kind; 11] = [
        Kind::Namespace,
        Kind::ServiceAccount,
        Kind::ConfigMap,
        Kind::Secret,
        Kind::Service,
        Kind::Endpoints,
        Kind::PersistentVolumeClaim,
        Kind::Ingress,
        Kind::NetworkPolicy,
        Kind::PodDisruptionBudget,
        Kind::Pod,
    ];

    /// Lower-case name for metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Namespace => "namespace",
            Kind::Pod => "pod",
            Kind::Service => "service",
            Kind::Endpoints => "endpoints",
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
            Kind::ServiceAccount => "serviceaccount",
            Kind::PersistentVolumeClaim => "persistentvolumeclaim",
            Kind::Ingress => "ingress",
            Kind::NetworkPolicy => "networkpolicy",
            Kind::PodDisruptionBudget => "poddisruptionbudget",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tenant object to sync down: its kind, tenant namespace (empty for namespaces) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DownItem {
    /// The kind.
    pub kind: Kind,
    /// Tenant namespace; for a namespace, empty.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl DownItem {
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
        Self {
            kind: Kind::Namespace,
            namespace: String::new(),
            name: name.to_owned(),
        }
    }
}

/// Work flowing up from the super cluster into one tenant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UpItem {
    /// Status, binding and deletion of a tenant pod.
    Pod {
        /// Tenant namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Status and super cluster IP of a tenant service.
    Service {
        /// Tenant namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Status of a tenant PersistentVolumeClaim.
    PersistentVolumeClaim {
        /// Tenant namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A vNode: the tenant's view of a super node.
    Node {
        /// The super node's name.
        name: String,
    },
    /// A super PersistentVolume bound to a tenant claim.
    PersistentVolume {
        /// Name.
        name: String,
    },
    /// A public super StorageClass.
    StorageClass {
        /// Name.
        name: String,
    },
    /// A public super PriorityClass.
    PriorityClass {
        /// Name.
        name: String,
    },
    /// A super event about a synced pod or service, waiting in the event inbox as the tenant's copy.
    Event {
        /// Tenant namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl UpItem {
    /// Lower-case resource name for metric labels.
    pub fn resource(&self) -> &'static str {
        match self {
            UpItem::Pod { .. } => "pod",
            UpItem::Service { .. } => "service",
            UpItem::PersistentVolumeClaim { .. } => "persistentvolumeclaim",
            UpItem::Node { .. } => "node",
            UpItem::PersistentVolume { .. } => "persistentvolume",
            UpItem::StorageClass { .. } => "storageclass",
            UpItem::PriorityClass { .. } => "priorityclass",
            UpItem::Event { .. } => "event",
        }
    }
}
