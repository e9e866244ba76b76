//! The shared token Secrets' writes: a pod's shard chosen at creation ([`Tokens::mount`]), its first tokens
//! once its tenant pod is bound ([`Tokens::put_bound`]), kept and renewed with its shard
//! ([`Tokens::keep`]); each shard's writes a group commit ([`crate::engine::group_commit`]) of merge
//! patches with the shard's resourceVersion as precondition.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;

use super::{
    Tokens, legacy,
    minting::{Subject, put_for},
    mounts::{
        ANNOTATION_POD_TOKENS, ANNOTATION_TOKEN_SECRET, TokenNeed, UNASSIGNED_TOKEN_SECRET, key_prefix,
        needs_annotation, needs_of, retarget_token_secret, secret_of,
    },
    now,
    records::{Entry, Member, Put, Shard, ShardState, ShardView, choose, members_of, shard_index},
};
use crate::{
    cache::pods::{SuperPod, TenantPod},
    engine::{context::Context, events},
    error::{Error, Result},
    tenancy::{identity, tenant::Tenant},
};

/// How long a pod assigned to a shard counts as a member before its super pod shows in the cache (the pod
/// is created within seconds; the cache follows in less). Once shown, it counts until its tokens are
/// written, however long the super scheduler takes to place it.
const RESERVATION: Duration = Duration::from_secs(120);

/// Tenant TokenRequests made at once while a shard is renewed.
const MINTS_IN_FLIGHT: usize = 8;

impl Tokens {
    /// Points a new copy's token volumes at the shard it will read them from (chosen now: the volumes name
    /// it) and records on the copy what it needs and where; its tokens are minted once its tenant pod is
    /// bound ([`Tokens::put_bound`], so they name the node), and the kubelet retries the mount until then.
    pub fn mount(
        &self,
        ctx: &Context,
        copy: &mut Pod,
        needs: &[TokenNeed],
        super_namespace: &str,
        tenant_pod: &Pod,
    ) {
        let shard = self.assign(
            ctx,
            super_namespace,
            tenant_pod.metadata.namespace.as_deref().unwrap_or_default(),
            tenant_pod.metadata.name.as_deref().unwrap_or_default(),
            tenant_pod.metadata.uid.as_deref().unwrap_or_default(),
        );
        if let Some(spec) = copy.spec.as_mut() {
            retarget_token_secret(spec, UNASSIGNED_TOKEN_SECRET, &shard);
        }
        let annotations = copy.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(ANNOTATION_POD_TOKENS.to_owned(), needs_annotation(needs));
        annotations.insert(ANNOTATION_TOKEN_SECRET.to_owned(), shard);
    }

    /// Assigns a pod of `tenant_namespace` to a shard of its super namespace `namespace` (reserving its
    /// place) and returns the shard's name.
    pub fn assign(
        &self,
        ctx: &Context,
        namespace: &str,
        tenant_namespace: &str,
        pod: &str,
        tenant_uid: &str,
    ) -> String {
        let mut views = Vec::new();
        for index in 0.. {
            let shard = self.shard(namespace, tenant_namespace, index);
            let mut state = shard.load(ctx);
            shard.settle(ctx, &mut state);
            if !state.exists && state.members.is_empty() && state.reserved.is_empty() {
                break;
            }
            views.push(ShardView {
                index,
                occupancy: shard.occupancy(ctx, &state),
                holds_pod: state.members.get(pod).is_some_and(|m| &*m.uid == tenant_uid)
                    || state.reserved.get(pod).is_some_and(|(uid, _)| uid == tenant_uid),
            });
        }
        let index = choose(&views, ctx.config.pods_per_token_secret);
        let shard = self.shard(namespace, tenant_namespace, index);
        shard
            .lock()
            .reserved
            .insert(pod.to_owned(), (tenant_uid.to_owned(), Instant::now()));
        shard.name.clone()
    }
}

impl Shard {
    /// The state, read from the cache first if it is not known.
    pub(super) fn load(&self, ctx: &Context) -> std::sync::MutexGuard<'_, ShardState> {
        let mut state = self.lock();
        if !state.loaded {
            let cached = ctx
                .supers
                .pods
                .token_secrets
                .get(&ObjectRef::new(&self.name).within(&self.namespace));
            state.exists = cached.is_some();
            state.resource_version = cached.as_ref().and_then(|c| c.metadata.resource_version.clone());
            state.members = cached.map(|c| members_of(&c.metadata)).unwrap_or_default();
            state.loaded = true;
        }
        state
    }

    /// Whether a member's pod still needs its keys: its super pod names this shard and is bound to the
    /// member's tenant pod, or it was assigned here a moment ago.
    fn is_live(&self, ctx: &Context, state: &ShardState, pod: &str, uid: &str) -> bool {
        if state
            .reserved
            .get(pod)
            .is_some_and(|(reserved, at)| reserved == uid && at.elapsed() < RESERVATION)
        {
            return true;
        }
        ctx.supers
            .pods
            .copies
            .get(&ObjectRef::new(pod).within(&self.namespace))
            .is_some_and(|p| {
                secret_of(p.meta()) == Some(self.name.as_str()) && identity::tenant_uid(p.meta()) == Some(uid)
            })
    }

    fn occupancy(&self, ctx: &Context, state: &ShardState) -> usize {
        let live = state
            .members
            .iter()
            .filter(|(pod, m)| self.is_live(ctx, state, pod, &m.uid))
            .count();
        // (Settled: every reservation left is a pod still to come.)
        let reserved_apart = state
            .reserved
            .keys()
            .filter(|pod| !state.members.contains_key(*pod))
            .count();
        live + reserved_apart
    }

    /// Ends the reservations of pods whose tokens are written (members from now on, gone once their super
    /// pods are) and of pods the cache does not show once the reservation ran out (never created). A
    /// pod the cache shows keeps its reservation while the super scheduler has not placed it.
    pub(super) fn settle(&self, ctx: &Context, state: &mut ShardState) {
        let members = &state.members;
        state.reserved.retain(|pod, (uid, at)| {
            if members.get(pod).is_some_and(|m| *m.uid == **uid) {
                return false;
            }
            at.elapsed() < RESERVATION
                || ctx
                    .supers
                    .pods
                    .copies
                    .get(&ObjectRef::new(pod).within(&self.namespace))
                    .is_some_and(|p| {
                        secret_of(p.meta()) == Some(self.name.as_str())
                            && identity::tenant_uid(p.meta()) == Some(uid.as_str())
                    })
        });
    }

    /// The members whose pods are gone.
    pub(super) fn gone(&self, ctx: &Context, state: &ShardState) -> Vec<String> {
        state
            .members
            .iter()
            .filter(|(pod, m)| !self.is_live(ctx, state, pod, &m.uid))
            .map(|(pod, _)| pod.clone())
            .collect()
    }

    pub(super) async fn submit(&self, ctx: &Context, tenant: &Tenant, entry: Entry) -> Result<bool> {
        self.commit
            .submit(
                entry,
                |batch| async move { self.write(ctx, tenant, batch).await.map_err(Arc::new) },
                || {
                    Err(Arc::new(Error::Conversion(format!(
                        "the write of token Secret {}/{} was abandoned",
                        self.namespace, self.name
                    ))))
                },
            )
            .await
            .map_err(Error::Shared)
    }

    /// One write carrying a batch: the puts' keys, the renewed members' new tokens, the removal of gone
    /// members' keys. Returns whether anything was written.
    async fn write(&self, ctx: &Context, tenant: &Tenant, batch: Vec<Entry>) -> Result<bool> {
        let now = now();
        let renew = batch.iter().any(|e| matches!(e, Entry::Renew));
        let mut puts: BTreeMap<String, Put> = BTreeMap::new();
        for entry in batch {
            if let Entry::Put(put) = entry {
                puts.insert(put.pod.clone(), put);
            }
        }
        if renew {
            let renewing: Vec<(String, Member)> = {
                let state = self.load(ctx);
                state
                    .members
                    .iter()
                    .filter(|(pod, m)| {
                        !puts.contains_key(*pod)
                            && m.joins_renewal(now)
                            && self.is_live(ctx, &state, pod, &m.uid)
                    })
                    .map(|(pod, m)| (pod.clone(), m.clone()))
                    .collect()
            };
            let minted: Vec<Option<Put>> = stream::iter(renewing)
                .map(|(pod, member)| self.mint_again(ctx, tenant, pod, member))
                .buffer_unordered(MINTS_IN_FLIGHT)
                .collect()
                .await;
            for put in minted.into_iter().flatten() {
                puts.insert(put.pod.clone(), put);
            }
        }
        for attempt in 0..2 {
            let (exists, resource_version, members, gone) = {
                let mut state = self.load(ctx);
                self.settle(ctx, &mut state);
                let gone: Vec<String> = self
                    .gone(ctx, &state)
                    .into_iter()
                    .filter(|pod| !puts.contains_key(pod))
                    .collect();
                (
                    state.exists,
                    state.resource_version.clone(),
                    state.members.clone(),
                    gone,
                )
            };
            if puts.is_empty() && gone.is_empty() {
                return Ok(false);
            }
            let mut after = members.clone();
            for pod in &gone {
                after.remove(pod);
            }
            let mut added = BTreeMap::new();
            for (pod, put) in &puts {
                // A pod's earlier keys that it no longer has (another tenant pod of the same name).
                if let Some(old) = after.insert(pod.clone(), put.member.clone()) {
                    for key in old.keys.iter().filter(|k| !put.member.keys.contains(k)) {
                        added.insert(key.to_owned(), None);
                    }
                }
                for (key, value) in &put.data {
                    added.insert(key.clone(), Some(value.clone()));
                }
            }
            let removed: Vec<&Member> = gone.iter().filter_map(|pod| members.get(pod)).collect();
            let result = match (exists, after.is_empty() && puts.is_empty()) {
                // It serves no pod any more.
                (true, true) => self.delete(ctx, resource_version).await.map(|()| None),
                (false, true) => Ok(None),
                (true, false) => self
                    .patch(ctx, tenant, &added, &removed, &after, resource_version)
                    .await
                    .map(Some),
                (false, false) => self.create(ctx, tenant, &added, &after).await.map(Some),
            };
            match result {
                Ok(written) => {
                    let mut state = self.lock();
                    match written {
                        Some(meta) => {
                            state.exists = true;
                            state.resource_version = meta.resource_version;
                        }
                        None => {
                            state.exists = false;
                            state.resource_version = None;
                        }
                    }
                    state.members = after;
                    state.loaded = true;
                    return Ok(true);
                }
                // Changed or created behind our back (or the cache was behind): read what is there, again.
                Err(error) if attempt == 0 && (error.is_status(409) || error.is_status(404)) => {
                    self.reread(ctx).await?;
                }
                Err(error) => return Err(error),
            }
        }
        Err(Error::Conversion(format!(
            "token Secret {}/{} kept changing while it was written",
            self.namespace, self.name
        )))
    }

    /// Mints a member's tokens again; `None` (logged, retried by the pod's own sync) when it cannot be.
    async fn mint_again(&self, ctx: &Context, tenant: &Tenant, pod: String, member: Member) -> Option<Put> {
        let super_pod = ctx
            .supers
            .pods
            .copies
            .get(&ObjectRef::new(&pod).within(&self.namespace))?;
        let namespace = identity::tenant_namespace(super_pod.meta())?.to_owned();
        let needs = needs_of(super_pod.meta())?;
        let tenant_pod = tenant
            .stores
            .pods
            .get(&ObjectRef::new(&pod).within(&namespace))
            .filter(|p| p.uid().as_deref() == Some(&*member.uid))?;
        let subject = Subject {
            namespace: &namespace,
            name: &pod,
            uid: &member.uid,
            service_account: tenant_pod.spec.service_account_name.as_deref(),
        };
        match put_for(tenant, &subject, &needs, ctx.config.token_ttl_seconds).await {
            Ok(put) => Some(put),
            Err(error) => {
                tracing::warn!(tenant = %tenant.identity.vc_ref(), %namespace, %pod, error = &error as &dyn std::error::Error, "renewing a pod's tokens");
                None
            }
        }
    }
}

/// Reason of the event on a bound tenant pod whose service account token its apiserver refused to issue.
pub const REASON_TOKEN_NOT_ISSUED: &str = "TokenNotIssued";

/// How soon a token the tenant apiserver refused is asked for again (the service account may be created).
pub const TOKEN_RETRY: Duration = Duration::from_secs(10);

/// What [`Tokens::put_bound`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The writes made (none when the shard holds the pod's tokens already).
    Written(u32),
    /// The tenant apiserver refused to issue a token (its service account is gone): the tenant was told
    /// why; the pod's containers wait, and the token is asked for again after `retry_after`.
    NotIssued {
        /// What the tenant was told.
        message: String,
        /// When to ask again.
        retry_after: Duration,
    },
}

impl Tokens {
    /// Writes a bound pod's first tokens to the shard its volumes read, once its tenant pod is bound (the
    /// tokens name its node); none when the shard holds them already (the cache's word: a shard whose keys
    /// someone removed is mended by [`Tokens::keep`]). A token the tenant refuses is told on the tenant pod.
    pub async fn put_bound(
        &self,
        ctx: &Context,
        tenant: &Tenant,
        tenant_pod: &TenantPod,
        super_pod: &SuperPod,
    ) -> Result<Bound> {
        match self.put_bound_tokens(ctx, tenant, tenant_pod, super_pod).await {
            Ok(written) => Ok(Bound::Written(written)),
            Err(error) if error.is_tenant_refusal() => {
                let message = format!(
                    "the tenant apiserver issued no service account token for the pod, whose containers wait for it: {}",
                    error.status_message().unwrap_or_default()
                );
                let reference = tenant_pod.object_ref(&());
                events::refuse(
                    &ctx.metrics,
                    tenant,
                    Some(&reference),
                    "pod",
                    REASON_TOKEN_NOT_ISSUED,
                    &message,
                )
                .await;
                Ok(Bound::NotIssued {
                    message,
                    retry_after: TOKEN_RETRY,
                })
            }
            Err(error) => Err(error),
        }
    }

    async fn put_bound_tokens(
        &self,
        ctx: &Context,
        tenant: &Tenant,
        tenant_pod: &TenantPod,
        super_pod: &SuperPod,
    ) -> Result<u32> {
        let (Some(needs), Some(shard)) = (needs_of(super_pod.meta()), secret_of(super_pod.meta())) else {
            return Ok(0);
        };
        let Some(index) = shard_index(shard) else {
            return Ok(0);
        };
        let name = tenant_pod.name_any();
        let uid = tenant_pod.uid().unwrap_or_default();
        let held = self
            .shard(
                &super_pod.namespace().unwrap_or_default(),
                &tenant_pod.namespace().unwrap_or_default(),
                index,
            )
            .load(ctx)
            .members
            .get(&name)
            .is_some_and(|m| *m.uid == *uid && m.covers(&key_prefix(&name), &needs));
        if held {
            return Ok(0);
        }
        keep(ctx, tenant, tenant_pod, super_pod, shard, &needs).await
    }

    /// Keeps a bound pod's tokens (call it only for a bound pod: its first tokens are minted after the
    /// binding, to name its node): in its shard ([`keep`]), or, for a pod of an earlier version, in its own
    /// token Secret ([`legacy::refresh_token`]). Returns the writes made.
    pub async fn keep(
        &self,
        ctx: &Context,
        tenant: &Tenant,
        tenant_pod: &TenantPod,
        super_pod: &SuperPod,
    ) -> Result<u32> {
        let Some(needs) = needs_of(super_pod.meta()) else {
            return Ok(0);
        };
        match secret_of(super_pod.meta()) {
            Some(shard) => keep(ctx, tenant, tenant_pod, super_pod, shard, &needs).await,
            None => legacy::refresh_token(ctx, tenant, tenant_pod, super_pod, &needs).await,
        }
    }
}

/// Keeps a bound pod's tokens: written when its shard lacks them (the first time, after the binding; the
/// Secret was deleted; the pod is another of the same name), renewed with its shard when due; otherwise
/// nothing is written and the pod is looked at again when they will be due. Returns the writes made.
pub(crate) async fn keep(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    shard: &str,
    needs: &[TokenNeed],
) -> Result<u32> {
    let Some(index) = shard_index(shard) else {
        tracing::warn!(tenant = %tenant.identity.vc_ref(), pod = %super_pod.name_any(), shard, "the super pod names no token Secret of the syncer's");
        return Ok(0);
    };
    let namespace = tenant_pod.namespace().unwrap_or_default();
    let name = tenant_pod.name_any();
    let uid = tenant_pod.uid().unwrap_or_default();
    let super_namespace = super_pod.namespace().unwrap_or_default();
    let shard = ctx.tokens.shard(&super_namespace, &namespace, index);
    let prefix = key_prefix(&name);
    let now = now();
    let member = shard.load(ctx).members.get(&name).cloned();
    let mut minting = None;
    let entry = match member {
        Some(member) if *member.uid == *uid && member.covers(&prefix, needs) => {
            if !member.due(now) {
                if let Some(at) = member.refresh_at() {
                    ctx.tokens.schedule_renewal(&shard, &tenant.id, at);
                }
                return Ok(0);
            }
            Entry::Renew
        }
        _ => {
            let Some(started) = shard.start_minting(&name, &uid) else {
                return Ok(0);
            };
            minting = Some(started);
            let subject = Subject {
                namespace: &namespace,
                name: &name,
                uid: &uid,
                service_account: tenant_pod.spec.service_account_name.as_deref(),
            };
            Entry::Put(put_for(tenant, &subject, needs, ctx.config.token_ttl_seconds).await?)
        }
    };
    let wrote = shard.submit(ctx, tenant, entry).await?;
    drop(minting);
    let member = shard.load(ctx).members.get(&name).cloned();
    if let Some(at) = member.and_then(|m| m.refresh_at()) {
        ctx.tokens.schedule_renewal(&shard, &tenant.id, at);
    }
    Ok(u32::from(wrote))
}

mod secret;
#[cfg(test)]
mod tests;
