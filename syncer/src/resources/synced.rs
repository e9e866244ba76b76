//! What a kind needs besides its caches: how its objects sync down and up, and what the patrol compares.

use std::future::Future;

use super::outcome::Outcome;
use crate::{
    cache::super_stores::SuperCache,
    engine::{context::Context, items::Item, patrol::findings::Findings},
    error::Result,
    tenancy::tenant::{Tenant, TenantCache},
};

/// A kind the syncer syncs: its caches on both sides (and the watches that feed the queues from them),
/// its sync in either direction, and its part of the patrol. Each kind's module implements it for the
/// kind's type in [`crate::engine::items::kinds`]; the registry in [`crate::resources`] dispatches to it.
pub trait SyncedKind: TenantCache + SuperCache {
    /// Syncs one tenant object into the super cluster. Kinds that only flow up never get items here.
    fn sync_down(
        _ctx: &Context,
        _tenant: &Tenant,
        _item: &Item,
    ) -> impl Future<Output = Result<Outcome>> + Send {
        async { Ok(Outcome::InSync) }
    }

    /// Syncs the state of one super object into the tenant. Kinds that only flow down never get items
    /// here.
    fn sync_up(
        _ctx: &Context,
        _tenant: &Tenant,
        _item: &Item,
    ) -> impl Future<Output = Result<Outcome>> + Send {
        async { Ok(Outcome::InSync) }
    }

    /// Compares the tenant with the super cluster for this kind and queues repairs.
    fn patrol(_ctx: &Context, _tenant: &Tenant) -> Findings {
        Findings::default()
    }
}
