//! Custom resources the platform chooses to sync (`--custom-resources`): for each listed kind, the
//! super cluster's CRD is published into the tenants it admits, the tenants' instances are copied down
//! into their super namespaces and their status comes back up.
//!
//! Every listed kind shares the one queue kind [`crate::engine::items::Kind::CustomResource`] (one metric
//! label, the same fairness, backoff and rate limits as the typed kinds); an item's name says which CRD and
//! object it is about ([`item`]). The caches are dynamic objects, started when the CRDs show ([`caches`]).

pub mod caches;
pub mod convert;
pub mod definition;
pub mod instance;
pub mod item;

use crate::{
    cache::super_stores::{SuperCache, SuperWatch},
    engine::{
        context::Context,
        items::{Item, kinds as typed},
        patrol::findings::{Findings, found},
    },
    error::Result,
    resources::{Outcome, SyncedKind},
    tenancy::tenant::{Tenant, TenantCache, TenantWatch},
};

impl TenantCache for typed::CustomResource {
    type Cache = caches::TenantCustomResources;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        caches::watch_tenant(tenant)
    }
}

impl SuperCache for typed::CustomResource {
    type Cache = caches::SuperCustomResources;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        caches::watch_super(supers)
    }
}

impl SyncedKind for typed::CustomResource {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        match item::target(item) {
            item::Target::Instance { crd, namespace, name } => {
                instance::sync_down(ctx, tenant, crd, namespace, name).await
            }
            // CRDs flow up only.
            item::Target::Definition(_) => Ok(Outcome::InSync),
        }
    }

    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        match item::target(item) {
            item::Target::Instance { crd, namespace, name } => {
                instance::sync_up(ctx, tenant, crd, namespace, name).await
            }
            item::Target::Definition(crd) => definition::sync(ctx, tenant, crd).await,
        }
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        let mut findings = Findings::default();
        for crd in definition::names(ctx, tenant) {
            if definition::needs_sync(ctx, tenant, &crd) {
                findings.drifted += 1;
                found(ctx, Self::KIND.as_str(), "definition");
                ctx.queues.up.add(&tenant.id, item::definition(&crd));
            }
            findings += instance::patrol(ctx, tenant, &crd);
        }
        findings
    }
}
