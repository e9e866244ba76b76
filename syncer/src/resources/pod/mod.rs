//! Tenant pods. Down: [`plan`] decides from the caches what a pod and its copy need next (a pure function),
//! and [`down`] does it, with the executors of creation ([`create`]) and of a running pod's changes
//! ([`update`]); the copy is converted by [`convert`] (what it carries besides: [`desired`]), admitted by
//! [`policy`], placed in the tenant's view of its nodes ([`placement`]); service-account tokens
//! ([`token`], kept in shared Secrets: [`token_secrets`]) and ephemeral containers added later
//! ([`ephemeral`]). Up: [`up`]. Their end ([`end`]): the deletion completed, and the terminal status of a
//! deleted pod a finalizer holds. [`refusal`] and [`tenant_endpoints`] serve [`create`], [`update`] and
//! [`ephemeral`], which import them rather than each other.

pub mod convert;
pub mod create;
pub mod desired;
pub mod down;
pub mod end;
pub mod ephemeral;
pub mod placement;
pub mod plan;
pub mod policy;
pub mod refusal;
pub mod tenant_endpoints;
pub mod token_secrets;
pub mod token;
pub mod up;
pub mod update;

use super::{outcome::Outcome, synced::SyncedKind};
use crate::{
    cache::{
        meta::Tagged,
        pods::{SuperPod, TenantPod, WatchedSuperPod, WatchedTenantPod},
        slim_store::SlimStore,
        stores::Change,
        super_stores::{SuperCache, SuperWatch, ours, tenant_key},
    },
    engine::{
        context::Context,
        items::{DownItem, Item, Kind, UpItem, kinds},
        patrol::findings::{Findings, found, super_objects},
    },
    error::Result,
    tenancy::{identity, tenant::{Tenant, TenantCache, TenantWatch}},
};

impl TenantCache for kinds::Pod {
    type Cache = SlimStore<TenantPod>;

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        let (queue, id) = (tenant.queues.down.clone(), tenant.id.clone());
        let on_change = move |pod: &TenantPod, change, previous: Option<&TenantPod>| {
            if change == Change::Deleted || plan::tenant_change_needs_down_sync(previous, pod) {
                let namespace = pod.metadata.object_namespace().unwrap_or_default();
                queue.add(&id, DownItem::new(Kind::Pod, namespace, &pod.metadata.name))
            }
        };
        tenant.watch_converted::<WatchedTenantPod, _, _>(Self::KIND, TenantPod::from, on_change)
    }
}

impl SuperCache for kinds::Pod {
    type Cache = SlimStore<SuperPod>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        let (down, up, quota, tenants) = (
            supers.queues.down.clone(),
            supers.queues.up.clone(),
            supers.quota.clone(),
            supers.tenants.clone(),
        );
        let on_change = move |pod: &SuperPod, change, previous: Option<&SuperPod>| {
            quota.observe(pod, change);
            if let Some((tenant, namespace, name)) = tenant_key(pod) {
                if change == Change::Deleted || plan::copy_change_needs_down_sync(previous, pod) {
                    down.add(&tenant, DownItem::new(Kind::Pod, &namespace, &name));
                }
                up.add(&tenant, UpItem::new(Kind::Pod, &namespace, &name));
                // An address the pod gave up may be another pod's next: whatever of the tenant's
                // Endpoints led to it is judged again now, not at the next patrol.
                let given_up = match change {
                    Change::Deleted => pod.addresses(),
                    Change::Applied => pod.given_up_addresses(),
                };
                if !given_up.is_empty()
                    && let Some(attached) = tenants.get(&tenant)
                {
                    for item in super::endpoints::leading_to(&attached, &given_up) {
                        down.add(&tenant, item);
                    }
                }
            }
        };
        supers.watch_converted::<WatchedSuperPod, _, _>(ours(), SuperPod::from, on_change)
    }
}

impl SyncedKind for kinds::Pod {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        down::sync(ctx, tenant, item).await
    }

    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        up::pod(ctx, tenant, &item.namespace, &item.name).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        patrol(ctx, tenant)
    }
}

/// Compares a tenant's pods with the super pods: missing and orphaned copies, pods waiting for quota,
/// and status that did not flow up.
fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
    let mut findings = Findings::default();
    let mut supers = super_objects(ctx.supers.pods.state(), &tenant.identity.cluster_key);
    for pod in tenant.stores.pods.state() {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let item = DownItem::new(Kind::Pod, &namespace, &name);
        match supers.remove(&(namespace.clone(), name.clone())) {
            None => {
                let unbound = pod.spec.node_name.is_none();
                let waiting = ctx.quota.is_waiting(&tenant.id, &namespace, &name);
                if pod.meta().deletion_timestamp.is_some() || (unbound && !waiting) {
                    findings.missing += 1;
                    found(ctx, "pod", "missing");
                    ctx.queues.down.add(&tenant.id, item);
                } else if unbound {
                    // Waiting for quota: admission is looked at again (from the cache, without writes
                    // while nothing changed), in case an event that should have woken it was missed.
                    findings.quota_waiting += 1;
                    found(ctx, "pod", "quota-waiting");
                    ctx.queues.down.add(&tenant.id, item);
                }
            }
            Some(existing) if identity::tenant_uid(existing.meta()) != pod.uid().as_deref() => {
                findings.drifted += 1;
                found(ctx, "pod", "drifted");
                ctx.queues.down.add(&tenant.id, item);
            }
            Some(existing) => {
                let bound = pod.spec.node_name.clone();
                let super_node = existing.spec.node_name.clone();
                let super_phase = existing.phase();
                let tenant_phase = pod.status.phase.clone();
                if (super_node.is_some() && bound.is_none()) || super_phase != tenant_phase {
                    findings.status += 1;
                    found(ctx, "pod", "status");
                    ctx.queues.up.add(&tenant.id, UpItem::new(Kind::Pod, &namespace, &name));
                }
            }
        }
    }
    for ((namespace, name), _) in supers {
        findings.orphaned += 1;
        found(ctx, "pod", "orphaned");
        ctx.queues
            .down
            .add(&tenant.id, DownItem::new(Kind::Pod, &namespace, &name));
    }
    findings
}
