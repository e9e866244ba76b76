//! What every reconcile needs.

use std::sync::Arc;

use crds::VirtualCluster;
use kube::{Client, runtime::reflector::Store};

use crate::{
    accounting::quota::Quota,
    cache::super_stores::SuperStores,
    engine::{config::SyncerConfig, events::EventInbox},
    metrics::Metrics,
    tenancy::{
        identity::MetaPolicy,
        shards::Shards,
        tenant::{Queues, Tenants},
    },
    tokens::Tokens,
};

/// Clients, caches, queues and metrics shared by the syncer's loops.
pub struct Context {
    /// Client of the super cluster.
    pub super_client: Client,
    /// Flags.
    pub config: SyncerConfig,
    /// Attached tenants.
    pub tenants: Arc<Tenants>,
    /// Super-cluster caches.
    pub supers: SuperStores,
    /// Service-account tokens of tenant pods: their shared token Secrets, renewal and sweep.
    pub tokens: Arc<Tokens>,
    /// VirtualClusters.
    pub virtual_clusters: Store<VirtualCluster>,
    /// Work queues.
    pub queues: Queues,
    /// Per-tenant quota ledger.
    pub quota: Arc<Quota>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Tenant copies of super events waiting for the upward workers.
    pub events: EventInbox,
    /// This replica's share of the tenants, when they are sharded across replicas (`--shards`).
    pub shards: Option<Arc<Shards>>,
    /// The attach journal (`--attach-journal`).
    pub journal: Option<Arc<crate::tenancy::journal::Journal>>,
}

impl Context {
    /// Whether this replica syncs tenant `cluster_key`: always without sharding, else while it holds the
    /// tenant's Lease.
    pub fn owns(&self, cluster_key: &str) -> bool {
        self.shards
            .as_ref()
            .is_none_or(|shards| shards.holds(cluster_key))
    }

    /// Whether this replica runs the duties that must run once for the whole super cluster (removing the
    /// namespaces of deleted tenants): always without sharding, else while it holds the duties' Lease.
    pub fn runs_cluster_duties(&self) -> bool {
        self.shards.as_ref().is_none_or(|shards| shards.runs_duties())
    }

    /// Runs `admit` (attaching a tenant) unless sharding says this replica does not hold `cluster_key`,
    /// atomically with the check: a tenant handed over meanwhile is never attached afterwards.
    pub fn admit<R>(&self, cluster_key: &str, admit: impl FnOnce() -> R) -> Option<R> {
        match &self.shards {
            Some(shards) => shards.admit(cluster_key, admit),
            None => Some(admit()),
        }
    }

    /// Wakes whenever the tenants this replica holds change (`None` without sharding: they never do), so
    /// that a tenant's supervisor follows handovers without knowing the shards.
    pub fn ownership_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.shards.as_ref().map(|shards| shards.subscribe())
    }

    /// Which of a tenant's labels and annotations reach super objects: the platform's allow-lists, and the
    /// super-owned prefixes of the flag and the VirtualCluster (`tenant_prefixes`).
    pub fn meta_policy(&self, tenant_prefixes: &[String]) -> MetaPolicy {
        MetaPolicy {
            copied: self.config.copied_meta_keys.clone(),
            namespace_labels: self.config.copied_namespace_label_keys.clone(),
            opaque: self
                .config
                .opaque_meta_prefixes
                .iter()
                .chain(tenant_prefixes)
                .cloned()
                .collect(),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing;
