//! Tenant pods. Down: [`plan`] decides from the caches what a pod and its copy need next (a pure function),
//! and [`down`] does it, with the executors of creation ([`create`]) and of a running pod's changes
//! ([`update`]); the copy is converted by [`convert`] (what it carries besides: [`desired`]), admitted by
//! [`policy`], placed in the tenant's view of its nodes ([`placement`]); ephemeral containers added later
//! ([`ephemeral`]). Up: [`up`]. Their end ([`end`]): the deletion completed, and the terminal status of a
//! deleted pod a finalizer holds. Their service-account tokens are [`crate::tokens`]', reached through
//! [`crate::engine::context::Context::tokens`]. [`refusal`] and [`tenant_endpoints`] serve [`create`], [`update`] and
//! [`ephemeral`], which import them rather than each other. [`bindings`]: what the pods keep of each tenant
//! besides their cache.

pub mod bindings;
pub mod convert;
pub mod create;
pub mod desired;
pub mod down;
pub mod end;
pub mod flags;
pub mod ephemeral;
pub mod placement;
pub mod plan;
pub mod policy;
pub mod refusal;
pub mod tenant_endpoints;
pub mod up;
pub mod update;

use crds::wellknown::LABEL_POD_TOKEN;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    core::PartialObjectMeta,
    runtime::{reflector::Store, watcher},
};

use super::{outcome::Outcome, synced::SyncedKind};
use crate::{
    cache::{
        meta::Tagged,
        pods::{SuperPod, TenantPod, WatchedSuperPod, WatchedTenantPod},
        slim_store::SlimStore,
        stores::{Cache, Change, trim},
        super_stores::{EventSubject, SuperCache, SuperWatch, ours, tenant_key},
    },
    engine::{
        context::Context,
        items::{DownItem, Item, Kind, UpItem, kinds},
        patrol::findings::{Findings, found, super_objects},
    },
    error::Result,
    tenancy::{
        identity,
        tenant::{Tenant, TenantCache, TenantWatch},
    },
};

impl TenantCache for kinds::Pod {
    type Cache = SlimStore<TenantPod>;
    /// Bindings made that the pod cache may not show yet.
    type State = bindings::RecentBindings;

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

/// The super cluster's pods the syncer reads: its copies of tenants' pods, and the Secrets that hold their
/// service-account tokens (what the syncer wrote of those is the Context's [`crate::tokens::Tokens`]).
pub struct SuperPods {
    /// The copies of tenants' pods.
    pub copies: SlimStore<SuperPod>,
    /// Metadata of pods' token Secrets (shared ones, and a pod's own of an earlier version).
    pub token_secrets: Store<PartialObjectMeta<Secret>>,
}

impl Cache for SuperPods {
    async fn wait_ready(&self) {
        self.copies.wait_ready().await;
        self.token_secrets.wait_ready().await;
    }

    #[cfg(test)]
    fn empty() -> Self {
        Self {
            copies: Cache::empty(),
            token_secrets: Cache::empty(),
        }
    }
}

/// Watches pods' token Secrets, apart from the tenants' Secrets and metadata only: their values never need
/// to be in memory. What a change means is the tokens' ([`crate::tokens::Tokens::observe`]).
fn watch_token_secrets(supers: &mut SuperWatch<'_>) -> Store<PartialObjectMeta<Secret>> {
    let queue = supers.queues.down.clone();
    let selector = watcher::Config::default().labels(&format!("{LABEL_POD_TOKEN}=true"));
    let tokens = supers.tokens.clone();
    supers.watch_with(
        selector,
        trim,
        move |secret: &PartialObjectMeta<Secret>, change| {
            if let Some((tenant, items)) = tokens.observe(secret, change) {
                for item in items {
                    queue.add(&tenant, item);
                }
            }
        },
    )
}

impl SuperCache for kinds::Pod {
    type Cache = SuperPods;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        let (down, up, quota, tenants) = (
            supers.queues.down.clone(),
            supers.queues.up.clone(),
            supers.quota.clone(),
            supers.tenants.clone(),
        );
        let token_secrets = watch_token_secrets(supers);
        let copies = supers.watch_converted::<WatchedSuperPod, _, _>(
            ours(),
            SuperPod::from,
            move |pod: &SuperPod, change, previous: Option<&SuperPod>| {
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
            },
        );
        SuperPods {
            copies,
            token_secrets,
        }
    }

    fn event_subject(cache: &Self::Cache, namespace: &str, name: &str) -> EventSubject {
        cache
            .copies
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))
            .map_or(EventSubject::Missing, |pod| {
                EventSubject::Found(Box::new(pod.meta().to_object_meta()))
            })
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
    let mut supers = super_objects(ctx.supers.pods.copies.state(), &tenant.identity.cluster_key);
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
                    ctx.queues
                        .up
                        .add(&tenant.id, UpItem::new(Kind::Pod, &namespace, &name));
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
