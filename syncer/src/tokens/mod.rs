//! Service-account tokens for tenant pods, in one place: [`Tokens`], owned by the
//! [`crate::engine::context::Context`], is what the pods reach them through.
//!
//! A super pod gets short-lived tokens for its *tenant* service account, requested from the tenant
//! apiserver ([`minting`]: TokenRequests bound to the tenant pod) and renewed when a fifth of their life
//! remains ([`renewal`]). No long-lived token is made. The copy's volumes read them, with the tenant CA and
//! namespace, from a shared token Secret of its super namespace ([`mounts`]: what the copy mounts), one of
//! its shards `shard-<n>.vc-tokens` ([`records`]: what a shard holds and the syncer knows of it;
//! [`shards`]: its writes). Gone pods' keys leave with a shard's next write or the patrol's [`sweep`]. Pods
//! created by earlier versions read a Secret of their own ([`legacy`], to be removed in 0.2.0).
//!
//! The calls pods make: [`mounts::rewrite_volumes`] while converting a pod (pure: what the copy mounts),
//! [`Tokens::mount`] when its copy is created (the shard it reads), [`Tokens::put_bound`] once its tenant
//! pod is bound, [`Tokens::keep`] while it runs. A deleted pod needs none: its keys go with its shard's
//! next write or the sweep. The token Secrets' watch (metadata only: token values never sit in the
//! syncer's memory) is the pods' super cache's, and feeds [`Tokens::observe`].
//!
//! Layers: [`mounts`] and [`records`] need nothing of the syncer's but its plumbing; this facade, its
//! [`renewal`] timers and [`minting`] are held by the `Context`; [`shards`], [`legacy`] and [`sweep`] take
//! the `Context` (its caches, client and flags), so they sit above it, below the kinds.

pub mod flags;
pub mod legacy;
pub mod minting;
pub mod mounts;
pub mod records;
pub mod renewal;
pub mod shards;
pub mod sweep;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;

use crate::{
    cache::stores::Change,
    engine::{
        group_commit::GroupCommit,
        items::{DownItem, Kind},
        queue::TenantId,
    },
    tenancy::identity,
};
use records::{Shard, member_items, shard_index, shard_name};
use renewal::Renewals;

/// Seconds since the epoch.
pub use vc_runtime::clock::now;

/// The syncer's tokens: the shards of every super namespace the syncer wrote or read since it started,
/// and their renewal timers.
#[derive(Default)]
pub struct Tokens {
    shards: Mutex<HashMap<(String, u32), Arc<Shard>>>,
    renewals: Renewals,
}

impl Tokens {
    pub(crate) fn shard(&self, namespace: &str, tenant_namespace: &str, index: u32) -> Arc<Shard> {
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((namespace.to_owned(), index))
            .or_insert_with(|| {
                Arc::new(Shard {
                    namespace: namespace.to_owned(),
                    tenant_namespace: tenant_namespace.to_owned(),
                    name: shard_name(index),
                    state: Mutex::default(),
                    commit: GroupCommit::default(),
                })
            })
            .clone()
    }

    fn known_shard(&self, namespace: &str, index: u32) -> Option<Arc<Shard>> {
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_owned(), index))
            .cloned()
    }

    /// Follows the token Secrets' cache; returns the pods to sync, with their tenant. A pod's own token
    /// Secret (of an earlier version) is part of the pod: repairing it means syncing the pod. A shard
    /// someone else changed is read again before its next write; when it is deleted, the pods it served
    /// write their keys again. Our own writes queue nothing.
    pub fn observe(
        &self,
        secret: &PartialObjectMeta<Secret>,
        change: Change,
    ) -> Option<(TenantId, Vec<DownItem>)> {
        let meta = &secret.metadata;
        if let (Some(pod), Some(cluster), Some(namespace)) = (
            identity::pod_of_token_secret(meta),
            identity::owner_cluster(meta),
            identity::tenant_namespace(meta),
        ) {
            return Some((Arc::from(cluster), vec![DownItem::new(Kind::Pod, namespace, pod)]));
        }
        self.observe_shard(meta, change);
        if change == Change::Deleted {
            return member_items(meta);
        }
        None
    }

    /// A shard someone else changed or deleted is read again from the cache before its next use.
    fn observe_shard(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        change: Change,
    ) {
        let (Some(namespace), Some(index)) = (
            meta.namespace.as_deref(),
            meta.name.as_deref().and_then(shard_index),
        ) else {
            return;
        };
        let Some(shard) = self.known_shard(namespace, index) else {
            return;
        };
        let mut state = shard.lock();
        let newer = |seen: Option<&str>| match (
            seen.and_then(|v| v.parse::<u64>().ok()),
            state
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok()),
        ) {
            (Some(seen), Some(known)) => seen > known,
            _ => seen != state.resource_version.as_deref(),
        };
        if change == Change::Deleted || newer(meta.resource_version.as_deref()) {
            state.loaded = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While one worker mints a pod's tokens, another that finds them missing leaves them to it.
    #[test]
    fn a_pods_tokens_are_minted_by_one_worker_at_a_time() {
        let shards = Tokens::default();
        let shard = shards.shard("team-abc123-vc-ns", "ns", 0);
        let first = shard.start_minting("p1", "uid-p1").expect("the first mints");
        assert!(shard.start_minting("p1", "uid-p1").is_none());
        assert!(shard.start_minting("p2", "uid-p2").is_some());
        drop(first);
        assert!(shard.start_minting("p1", "uid-p1").is_some());
    }
}
