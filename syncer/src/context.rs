//! What every reconcile needs.

use std::sync::Arc;

use crds::VirtualCluster;
use kube::{Client, runtime::reflector::Store};

use crate::{
    config::SyncerConfig,
    events::EventInbox,
    metrics::Metrics,
    quota::Quota,
    super_stores::SuperStores,
    tenant::{Queues, Tenants},
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
}

impl Context {
    /// Super-owned label/annotation prefixes for a tenant: the flag's and the VirtualCluster's.
    pub fn opaque_prefixes(&self, tenant_prefixes: &[String]) -> Vec<String> {
        self.config
            .opaque_meta_prefixes
            .iter()
            .chain(tenant_prefixes)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod testing;
