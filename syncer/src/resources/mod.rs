//! Syncing each kind of object, down and up: one module per kind, registered once in
//! [`crate::engine::items::with_kinds`], and what the kinds share.
//!
//! A kind's module implements [`SyncedKind`] (with [`crate::tenancy::tenant::TenantCache`] and
//! [`crate::cache::super_stores::SuperCache`] for its caches) for its type in
//! [`crate::engine::items::kinds`]. Namespaced kinds copied with little change implement [`copy::Downward`]
//! and leave the work to [`copy`]'s engine.

pub mod access;
pub mod copy;
pub mod flags;
pub mod isolation;
pub mod metrics;
pub mod outcome;
pub mod public;
pub mod synced;
pub mod upward;
pub mod write;

pub use outcome::Outcome;
pub use synced::SyncedKind;

use crate::{
    engine::{
        context::Context,
        items::{Item, Kind, kinds, with_kinds},
        patrol::findings::Findings,
    },
    error::Result,
    tenancy::tenant::Tenant,
};

macro_rules! registry {
    ($( $(#[$doc:meta])* $kind:ident = $label:literal => $module:ident, $caches:ident; )*) => {
        $( pub mod $module; )*

        /// Syncs one tenant object into the super cluster, by its kind.
        pub async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
            match item.kind {
                $( Kind::$kind => <kinds::$kind as SyncedKind>::sync_down(ctx, tenant, item).await, )*
            }
        }

        /// Syncs the state of one super object into the tenant, by its kind.
        pub async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
            match item.kind {
                $( Kind::$kind => <kinds::$kind as SyncedKind>::sync_up(ctx, tenant, item).await, )*
            }
        }

        /// Compares a tenant with the super cluster, kind by kind, and queues repairs.
        pub fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
            let mut findings = Findings::default();
            $( findings += <kinds::$kind as SyncedKind>::patrol(ctx, tenant); )*
            findings
        }
    };
}
with_kinds!(registry);
