//! What the patrol finds when it compares a tenant with the super cluster, counted in its metrics.

use std::{collections::HashMap, sync::Arc};

use crate::{
    cache::meta::{HasTags, Tagged},
    engine::context::Context,
    engine::patrol::metrics::PatrolLabels,
    tenancy::identity,
};

/// What one scan found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Tenant objects without a super copy.
    pub missing: usize,
    /// Super copies that differ from their tenant object.
    pub drifted: usize,
    /// Super objects whose tenant object is gone.
    pub orphaned: usize,
    /// vNodes to look at again.
    pub stale_vnodes: usize,
    /// Status that did not reach the tenant.
    pub status: usize,
    /// Pods waiting for quota, queued to be admitted again (a safety net: they are also queued when a pod
    /// of their tenant ends and when the tenant's quota changes).
    pub quota_waiting: usize,
}

impl std::ops::AddAssign for Findings {
    fn add_assign(&mut self, other: Self) {
        self.missing += other.missing;
        self.drifted += other.drifted;
        self.orphaned += other.orphaned;
        self.stale_vnodes += other.stale_vnodes;
        self.status += other.status;
        self.quota_waiting += other.quota_waiting;
    }
}

/// Counts a finding of the patrol and the remedy it queued.
pub fn found(ctx: &Context, resource: &'static str, finding: &'static str) {
    let labels = PatrolLabels { resource, finding };
    ctx.metrics.patrol.patrol_findings.get_or_create(&labels).inc();
    ctx.metrics.patrol.patrol_remedies.get_or_create(&labels).inc();
}

/// Super objects of one tenant, by tenant namespace and name.
pub fn super_objects<K: HasTags>(
    objects: Vec<Arc<K>>,
    cluster_key: &str,
) -> HashMap<(String, String), Arc<K>> {
    objects
        .into_iter()
        .filter(|o| identity::belongs_to(o.tags(), cluster_key))
        .filter_map(|o| {
            let namespace = identity::tenant_namespace(o.tags())?.to_owned();
            Some(((namespace, o.tags().object_name()?.to_owned()), o))
        })
        .collect()
}
