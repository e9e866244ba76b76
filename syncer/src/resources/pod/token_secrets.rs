//! Shared token Secrets: the tokens of many pods of a super namespace in a few Secrets, written in batches.
//!
//! A pod's tokens (TokenRequests bound to the tenant pod) are keys `<pod>.<file>` of one shard Secret
//! `shard-<n>.vc-tokens` of its super namespace, beside the shared `ca.crt` and `namespace`; the pod's
//! volumes select only its own keys. A shard holds at most `--pods-per-token-secret` pods, so the Secret
//! every kubelet running one of them watches stays small. The shard is fixed when the pod is created (its
//! volumes name it) and recorded on the super pod ([`token::ANNOTATION_TOKEN_SECRET`]).
//!
//! Writes to a shard are a group commit: one write at a time; what arrives while one is in flight goes in
//! the next, together. At low load a pod's key is written at once; in a burst many pods share a write.
//!
//! A pod's first tokens are minted once its tenant pod is bound to its vNode ([`put_bound`]): the tenant
//! apiserver then names the node in each token (`authentication.kubernetes.io/node-name` and `node-uid`),
//! as it does for a kubelet's, and a token stops working when that vNode is deleted. The super pod is
//! created first, naming keys not written yet; its kubelet retries the mount until they are there, which
//! is the moment the syncer binds the tenant pod, a round trip after the super scheduler bound the copy.
//!
//! Token values are never kept: writes are merge patches naming only the keys they add or remove, and
//! the shard's annotation [`ANNOTATION_TOKEN_MEMBERS`] says which pod (tenant uid) owns which keys and when
//! its tokens expire. Keys of gone pods are removed by the shard's next write and by the patrol
//! ([`sweep`]), which deletes a shard that serves no pod. A member due for renewal renews the whole shard:
//! every member past half its tokens' life is minted again, in one write. Renewal is timed per shard, not
//! per pod ([`renew`]): one timer at the shard's earliest member's renewal time queues the members then due.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use crds::wellknown::LABEL_POD_TOKEN;
use futures::{StreamExt, stream};
use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    core::PartialObjectMeta,
    runtime::reflector::ObjectRef,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{
    convert::{self, KEY_CA, KEY_NAMESPACE, KEY_UID, TokenNeed},
    token,
};
use crate::cache::token_shards::{
    ANNOTATION_TOKEN_MEMBERS, Entry, Member, Members, Put, Shard, ShardState, TokenShards, members_of,
    shard_index,
};
use crate::{
    cache::pods::{SuperPod, TenantPod},
    engine::context::Context,
    error::{Error, Result, on_super},
    tenancy::{identity, tenant::Tenant},
};

/// How long a pod assigned to a shard counts as a member before its super pod shows in the cache (the pod
/// is created within seconds; the cache follows in less). Once shown, it counts until its tokens are
/// written, however long the super scheduler takes to place it.
const RESERVATION: Duration = Duration::from_secs(120);

/// Tenant TokenRequests made at once while a shard is renewed.
const MINTS_IN_FLIGHT: usize = 8;

/// The prefix of a pod's keys: its name (a DNS subdomain, so a valid key), shortened with a hash when a
/// key would exceed the 253 characters a key may have.
pub fn key_prefix(pod: &str) -> String {
    if pod.len() <= 200 {
        return pod.to_owned();
    }
    let digest = hex::encode(Sha256::digest(pod.as_bytes()));
    format!("{}.{}", pod[..180].trim_end_matches('.'), &digest[..16])
}

impl Member {
    /// Whether it holds every key `needs` asks for.
    pub fn covers(&self, prefix: &str, needs: &[TokenNeed]) -> bool {
        needs
            .iter()
            .all(|n| self.keys.contains(&convert::pod_data_key(prefix, &n.key)))
            && self.keys.contains(&convert::pod_data_key(prefix, KEY_UID))
    }
}

/// The shard a new pod goes to: the one it is already in, else the first with room (`occupancy` below
/// `capacity`), else a new one after the last in use.
pub fn choose(shards: &[ShardView], capacity: usize) -> u32 {
    if let Some(own) = shards.iter().find(|s| s.holds_pod) {
        return own.index;
    }
    shards
        .iter()
        .find(|s| s.occupancy < capacity)
        .map(|s| s.index)
        .unwrap_or_else(|| shards.iter().map(|s| s.index + 1).max().unwrap_or(0))
}

/// What [`choose`] knows of a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardView {
    /// Its index.
    pub index: u32,
    /// Live members and reservations.
    pub occupancy: usize,
    /// Whether the pod is a member or reserved there already.
    pub holds_pod: bool,
}

/// A write's merge patch of the data: keys added with their values, keys of removed members as `null`,
/// and the shared CA and namespace.
pub fn data_patch(
    added: &BTreeMap<String, ByteString>,
    removed: &[&Member],
    ca: &str,
    namespace: &str,
) -> serde_json::Map<String, Value> {
    let mut data = serde_json::Map::new();
    for member in removed {
        for key in member.keys.iter() {
            data.insert(key.to_owned(), Value::Null);
        }
    }
    for (key, value) in added {
        data.insert(key.clone(), json!(value));
    }
    data.insert(KEY_CA.to_owned(), json!(ByteString(ca.as_bytes().to_vec())));
    data.insert(
        KEY_NAMESPACE.to_owned(),
        json!(ByteString(namespace.as_bytes().to_vec())),
    );
    data
}

impl TokenShards {
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
    fn load(&self, ctx: &Context) -> std::sync::MutexGuard<'_, ShardState> {
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
                token::secret_of(p.meta()) == Some(self.name.as_str())
                    && identity::tenant_uid(p.meta()) == Some(uid)
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
    fn settle(&self, ctx: &Context, state: &mut ShardState) {
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
                        token::secret_of(p.meta()) == Some(self.name.as_str())
                            && identity::tenant_uid(p.meta()) == Some(uid.as_str())
                    })
        });
    }

    /// The members whose pods are gone.
    fn gone(&self, ctx: &Context, state: &ShardState) -> Vec<String> {
        state
            .members
            .iter()
            .filter(|(pod, m)| !self.is_live(ctx, state, pod, &m.uid))
            .map(|(pod, _)| pod.clone())
            .collect()
    }

    async fn submit(&self, ctx: &Context, tenant: &Tenant, entry: Entry) -> Result<bool> {
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
        let now = token::now();
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
        let needs = token::needs_of(super_pod.meta())?;
        let tenant_pod = tenant
            .stores
            .pods
            .get(&ObjectRef::new(&pod).within(&namespace))
            .filter(|p| p.uid().as_deref() == Some(&*member.uid))?;
        let subject = token::Subject {
            namespace: &namespace,
            name: &pod,
            uid: &member.uid,
            service_account: tenant_pod.spec.service_account_name.as_deref(),
        };
        match put_for(tenant, &subject, &needs, ctx.config.token_ttl_seconds).await {
            Ok(put) => Some(put),
            Err(error) => {
                tracing::warn!(tenant = %tenant.identity.vc_ref(), %namespace, %pod, %error, "renewing a pod's tokens");
                None
            }
        }
    }

    fn metadata(
        &self,
        tenant: &Tenant,
        members: &Members,
        resource_version: Option<String>,
    ) -> Result<Value> {
        let mut meta = identity::super_metadata(
            &ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.tenant_namespace.clone()),
                ..Default::default()
            },
            &tenant.identity,
            &Default::default(),
            Some(self.namespace.clone()),
            true,
        );
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_POD_TOKEN.to_owned(), "true".to_owned());
        let recorded = serde_json::to_string(members).map_err(|source| Error::Serialize {
            what: format!("members of token Secret {}/{}", self.namespace, self.name),
            source,
        })?;
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION_TOKEN_MEMBERS.to_owned(), recorded);
        meta.resource_version = resource_version;
        serde_json::to_value(meta).map_err(|source| Error::Serialize {
            what: format!("token Secret {}/{}", self.namespace, self.name),
            source,
        })
    }

    fn shared_values(&self, tenant: &Tenant) -> (String, String) {
        let ca = token::tenant_ca(tenant, &self.tenant_namespace).unwrap_or_default();
        (ca, self.tenant_namespace.clone())
    }

    async fn create(
        &self,
        ctx: &Context,
        tenant: &Tenant,
        added: &BTreeMap<String, Option<ByteString>>,
        members: &Members,
    ) -> Result<ObjectMeta> {
        let (ca, namespace) = self.shared_values(tenant);
        let values: BTreeMap<String, ByteString> = added
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
            .collect();
        let data = data_patch(&values, &[], &ca, &namespace);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": self.metadata(tenant, members, None)?,
            "type": "Opaque",
            "data": data,
        }))
        .map_err(|source| Error::Serialize {
            what: format!("token Secret {}/{}", self.namespace, self.name),
            source,
        })?;
        let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), &self.namespace);
        let params = PostParams {
            field_manager: Some(crds::wellknown::FIELD_MANAGER_SYNCER.to_owned()),
            ..Default::default()
        };
        ctx.metrics.resources.super_write("secret", "create");
        let created = api.create(&params, &secret).await.map_err(on_super(format!(
            "creating token Secret {}/{}",
            self.namespace, self.name
        )))?;
        Ok(created.metadata)
    }

    async fn patch(
        &self,
        ctx: &Context,
        tenant: &Tenant,
        added: &BTreeMap<String, Option<ByteString>>,
        removed: &[&Member],
        members: &Members,
        resource_version: Option<String>,
    ) -> Result<ObjectMeta> {
        let (ca, namespace) = self.shared_values(tenant);
        let values: BTreeMap<String, ByteString> = added
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
            .collect();
        let mut data = data_patch(&values, removed, &ca, &namespace);
        for (key, value) in added {
            if value.is_none() {
                data.insert(key.clone(), Value::Null);
            }
        }
        let patch = json!({
            "metadata": self.metadata(tenant, members, resource_version)?,
            "data": data,
        });
        let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), &self.namespace);
        let params = PatchParams {
            field_manager: Some(crds::wellknown::FIELD_MANAGER_SYNCER.to_owned()),
            field_validation: Some(kube::api::ValidationDirective::Ignore),
            ..Default::default()
        };
        ctx.metrics.resources.super_write("secret", "patch");
        let patched = api
            .patch(&self.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(on_super(format!(
                "writing token Secret {}/{}",
                self.namespace, self.name
            )))?;
        Ok(patched.metadata)
    }

    async fn delete(&self, ctx: &Context, resource_version: Option<String>) -> Result<()> {
        let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), &self.namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: None,
                resource_version,
            }),
            ..Default::default()
        };
        ctx.metrics.resources.super_write("secret", "delete");
        match api.delete(&self.name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(on_super(format!(
                "deleting token Secret {}/{}",
                self.namespace, self.name
            ))(e)),
        }
    }

    /// Reads the shard's metadata from the super cluster (never its values).
    async fn reread(&self, ctx: &Context) -> Result<()> {
        let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), &self.namespace);
        let found: Option<PartialObjectMeta<Secret>> = match api.get_metadata(&self.name).await {
            Ok(meta) => Some(meta),
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => {
                return Err(on_super(format!(
                    "reading token Secret {}/{}",
                    self.namespace, self.name
                ))(e));
            }
        };
        let mut state = self.lock();
        state.exists = found.is_some();
        state.resource_version = found.as_ref().and_then(|f| f.metadata.resource_version.clone());
        state.members = found.map(|f| members_of(&f.metadata)).unwrap_or_default();
        state.loaded = true;
        Ok(())
    }
}

/// Mints a pod's tokens: its member record and data keys.
async fn put_for(
    tenant: &Tenant,
    subject: &token::Subject<'_>,
    needs: &[TokenNeed],
    ttl: i64,
) -> Result<Put> {
    let prefix = key_prefix(subject.name);
    let minted = token::mint(tenant, subject, needs, ttl).await?;
    let mut data: BTreeMap<String, ByteString> = minted
        .tokens
        .into_iter()
        .map(|(key, value)| (convert::pod_data_key(&prefix, &key), value))
        .collect();
    data.insert(
        convert::pod_data_key(&prefix, KEY_UID),
        ByteString(subject.uid.as_bytes().to_vec()),
    );
    let has_tokens = !needs.is_empty();
    Ok(Put {
        pod: subject.name.to_owned(),
        member: Member {
            uid: subject.uid.into(),
            keys: data.keys().collect(),
            issued: if has_tokens { token::now() } else { 0 },
            expires: if has_tokens { minted.expires } else { 0 },
        },
        data,
    })
}

/// Writes a bound pod's first tokens to the shard its volumes read, once its tenant pod is bound (the
/// tokens name its node); returns the writes made, none when the shard holds them already (the cache's
/// word: a shard whose keys someone removed is mended by [`keep`]).
pub async fn put_bound(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
) -> Result<u32> {
    let (Some(needs), Some(shard)) = (
        token::needs_of(super_pod.meta()),
        token::secret_of(super_pod.meta()),
    ) else {
        return Ok(0);
    };
    let Some(index) = shard_index(shard) else {
        return Ok(0);
    };
    let name = tenant_pod.name_any();
    let uid = tenant_pod.uid().unwrap_or_default();
    let held = ctx
        .supers
        .pods
        .token_shards
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

/// Keeps a bound pod's tokens: written when its shard lacks them (the first time, after the binding; the
/// Secret was deleted; the pod is another of the same name), renewed with its shard when due; otherwise
/// nothing is written and the pod is looked at again when they will be due. Returns the writes made.
pub async fn keep(
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
    let shard = ctx
        .supers
        .pods
        .token_shards
        .shard(&super_namespace, &namespace, index);
    let prefix = key_prefix(&name);
    let now = token::now();
    let member = shard.load(ctx).members.get(&name).cloned();
    let mut minting = None;
    let entry = match member {
        Some(member) if *member.uid == *uid && member.covers(&prefix, needs) => {
            if !member.due(now) {
                if let Some(at) = member.refresh_at() {
                    ctx.supers
                        .pods
                        .token_shards
                        .schedule_renewal(&shard, &tenant.id, at);
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
            let subject = token::Subject {
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
        ctx.supers
            .pods
            .token_shards
            .schedule_renewal(&shard, &tenant.id, at);
    }
    Ok(u32::from(wrote))
}

/// Runs the shards' renewal timers: queues each member due for renewal on its tenant's down queue.
pub async fn renew(ctx: Arc<Context>) {
    let shards = &ctx.supers.pods.token_shards;
    loop {
        let woken = shards.renewals.wake.notified();
        let now = token::now();
        let (due, next) = shards.fire_renewals(now);
        for (tenant, item) in due {
            ctx.queues.down.add(&tenant, item);
        }
        let wait = next.map_or(Duration::from_secs(3600), |at| {
            Duration::from_secs(u64::try_from(at - now).unwrap_or(0).max(1))
        });
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// The patrol's part: removes gone pods' keys from every shard of attached tenants, and deletes shards
/// that serve no pod. Returns how many shards it wrote.
pub async fn sweep(ctx: &Context) -> usize {
    let mut swept = 0;
    for cached in ctx.supers.pods.token_secrets.state() {
        let (Some(namespace), Some(tenant_namespace), Some(index)) = (
            cached.metadata.namespace.clone(),
            identity::tenant_namespace(&cached.metadata),
            cached.metadata.name.as_deref().and_then(shard_index),
        ) else {
            continue;
        };
        let Some(tenant) = identity::owner_cluster(&cached.metadata).and_then(|c| ctx.tenants.get(c)) else {
            continue;
        };
        let shard = ctx
            .supers
            .pods
            .token_shards
            .shard(&namespace, tenant_namespace, index);
        let stale = {
            let mut state = shard.load(ctx);
            shard.settle(ctx, &mut state);
            !shard.gone(ctx, &state).is_empty()
        };
        if !stale {
            continue;
        }
        crate::engine::patrol::findings::found(ctx, "secret", "stale-token-keys");
        match shard.submit(ctx, &tenant, Entry::Sweep).await {
            Ok(true) => swept += 1,
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(%namespace, shard = %shard.name, %error, "removing gone pods' tokens")
            }
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::{self, Timestamp};

    use super::*;
    use crate::{cache::token_shards::shard_name, engine::items::Kind};

    #[test]
    fn shard_names_round_trip_and_are_reserved() {
        assert_eq!(shard_name(0), "shard-0.vc-tokens");
        assert_eq!(shard_index("shard-12.vc-tokens"), Some(12));
        assert_eq!(shard_index("shard-012.vc-tokens"), None);
        assert_eq!(shard_index("web-1.vc-token"), None);
        assert_eq!(shard_index("shard-x.vc-tokens"), None);
        assert!(crate::cache::token_shards::is_reserved_secret_name(&shard_name(
            7
        )));
        assert!(crate::cache::token_shards::is_reserved_secret_name(
            &token::secret_name("web-1")
        ));
        assert!(!crate::cache::token_shards::is_reserved_secret_name("vc-tokens"));
    }

    #[test]
    fn key_prefixes_are_valid_keys_for_any_pod_name() {
        assert_eq!(key_prefix("web-1"), "web-1");
        let long = format!("{}.b", "a".repeat(251));
        let prefix = key_prefix(&long);
        assert!(convert::pod_data_key(&prefix, "token-0123456789").len() <= 253);
        assert_ne!(key_prefix(&format!("{}.c", "a".repeat(251))), prefix);
    }

    fn member(issued: i64, expires: i64) -> Member {
        Member {
            uid: "u".into(),
            keys: ["p.token", "p.uid"].into_iter().collect(),
            issued,
            expires,
        }
    }

    #[test]
    fn members_are_due_in_the_last_fifth_and_join_a_renewal_past_half_their_life() {
        let m = member(1000, 2000);
        assert_eq!(m.refresh_at(), Some(1800));
        assert!(!m.due(1799));
        assert!(m.due(1800));
        assert!(!m.joins_renewal(1499));
        assert!(m.joins_renewal(1500));
        let no_token = member(0, 0);
        assert!(!no_token.due(i64::MAX) && !no_token.joins_renewal(i64::MAX));
        assert!(m.covers(
            "p",
            &[TokenNeed {
                key: "token".into(),
                audience: None,
                expiration_seconds: None
            }]
        ));
        assert!(!m.covers(
            "p",
            &[TokenNeed {
                key: "token-x".into(),
                audience: None,
                expiration_seconds: None
            }]
        ));
    }

    #[test]
    fn a_pod_goes_to_its_own_shard_else_the_first_with_room_else_a_new_one() {
        let view = |index, occupancy, holds_pod| ShardView {
            index,
            occupancy,
            holds_pod,
        };
        assert_eq!(choose(&[], 32), 0);
        assert_eq!(choose(&[view(0, 32, false), view(1, 5, false)], 32), 1);
        assert_eq!(choose(&[view(0, 32, false), view(1, 32, false)], 32), 2);
        assert_eq!(choose(&[view(0, 3, false), view(1, 32, true)], 32), 1);
    }

    #[test]
    fn a_data_patch_adds_removes_and_keeps_the_shared_keys() {
        let added: BTreeMap<String, ByteString> =
            [("a.token".to_owned(), ByteString(b"jwt".to_vec()))].into();
        let gone = member(1, 2);
        let data = data_patch(&added, &[&gone], "CA", "shop");
        assert_eq!(data["a.token"], json!("and0"));
        assert_eq!(data["p.token"], Value::Null);
        assert_eq!(data["p.uid"], Value::Null);
        assert_eq!(data["ca.crt"], json!("Q0E="));
        assert_eq!(data["namespace"], json!("c2hvcA=="));
    }

    // Controller tests on scripted apiservers: what creating and renewing cost the super cluster.

    use crate::{
        engine::{
            context::testing::{self, from_json, put as cache},
            items::Item,
        },
        resources::Outcome,
        tenancy::settings::TenantSettings,
    };
    use k8s_openapi::api::core::v1::Namespace;

    const SUPER_NS: &str = "team-abc123-vc-ns";

    fn tenant_pod(name: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "7"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": [{"name": "kube-api-access-x",
                "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]},
            "status": {"phase": "Pending"}
        })
    }

    /// A TokenRequest's answer, bound to the pod the request names.
    fn issued(request: &Value, expires: &str) -> Value {
        let pod = request["spec"]["boundObjectRef"]["name"]
            .as_str()
            .unwrap_or_default();
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": request["spec"],
            "status": {"token": format!("jwt-{pod}"), "expirationTimestamp": expires}})
    }

    fn decoded(value: &Value) -> String {
        let bytes: ByteString = serde_json::from_value(value.clone()).expect("base64");
        String::from_utf8(bytes.0).expect("utf-8")
    }

    /// Pods are created naming their shard's keys; their tokens are minted once each tenant pod is bound
    /// (so the tenant apiserver names the node in them), and a burst of bindings shares the writes.
    #[tokio::test]
    async fn tokens_are_minted_after_the_binding_and_a_burst_shares_token_secret_writes() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        for name in ["p1", "p2", "p3"] {
            cache(&mut caches.pods, from_json(tenant_pod(name)));
        }
        cache(
            &mut caches.vnodes,
            from_json(json!({"metadata": {"name": "node-1"}})),
        );
        cache(
            &mut super_caches.namespaces,
            from_json::<Namespace>(json!({"metadata": {"name": SUPER_NS, "annotations": {
                "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "ns"}}})),
        );
        let items: Vec<Item> = ["p1", "p2", "p3"]
            .into_iter()
            .map(|name| Item::new(Kind::Pod, "ns", name))
            .collect();

        // Down: the copies are created at once, naming keys of shard-0 not written yet; the tenant is not
        // asked for anything (unbound pods are copied from the cache's whole spec).
        let super_script = async {
            let mut created = Vec::new();
            for _ in 0..3 {
                let call = supers.next().await;
                assert_eq!(call.method, "POST", "{}", call.uri);
                assert!(
                    call.uri
                        .starts_with(&format!("/api/v1/namespaces/{SUPER_NS}/pods?")),
                    "{}",
                    call.uri
                );
                let pod = call.body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let volume = &call.body["spec"]["volumes"][0]["projected"]["sources"];
                assert_eq!(volume[0]["secret"]["name"], "shard-0.vc-tokens");
                let key = volume[0]["secret"]["items"][0]["key"]
                    .as_str()
                    .unwrap_or_default();
                assert!(key.starts_with(&format!("{pod}.token-")), "{key}");
                assert_eq!(
                    call.body["metadata"]["annotations"][token::ANNOTATION_TOKEN_SECRET],
                    "shard-0.vc-tokens"
                );
                created.push(call.echo());
            }
            created
        };
        let (o1, o2, o3, mut created) = tokio::join!(
            super::super::down::sync(&ctx, &tenant, &items[0]),
            super::super::down::sync(&ctx, &tenant, &items[1]),
            super::super::down::sync(&ctx, &tenant, &items[2]),
            super_script,
        );
        for outcome in [o1, o2, o3] {
            assert_eq!(outcome.expect("synced"), Outcome::Created { writes: 1 });
        }
        assert_eq!(
            ctx.metrics
                .resources.super_write_counts()
                .iter()
                .filter(|(r, _, _)| *r == "secret")
                .count(),
            0
        );

        // The super scheduler places them; up: each tenant pod is bound, then its tokens are minted.
        for copy in &mut created {
            copy["spec"]["nodeName"] = json!("node-1");
            copy["status"] =
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]});
            cache(&mut super_caches.pods, from_json(copy.clone()));
        }
        let (minted_tx, mut minted_rx) = tokio::sync::watch::channel(0);
        let tenant_script = async {
            let mut bound = Vec::new();
            for _ in 0..6 {
                let call = tenants.next().await;
                let path = call.uri.trim_end_matches('?').to_owned();
                match (call.method.as_str(), path.as_str()) {
                    ("POST", "/api/v1/namespaces/ns/serviceaccounts/default/token") => {
                        let pod = call.body["spec"]["boundObjectRef"]["name"]
                            .as_str()
                            .unwrap_or_default();
                        assert!(
                            bound.iter().any(|b| b == pod),
                            "{pod}'s token was asked for before its binding"
                        );
                        let answer = issued(&call.body, "2030-01-01T00:00:00Z");
                        call.ok(answer);
                        minted_tx.send_modify(|n| *n += 1);
                    }
                    ("POST", binding) if binding.ends_with("/binding") => {
                        assert_eq!(call.body["target"]["name"], "node-1");
                        bound.push(
                            call.body["metadata"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned(),
                        );
                        call.respond(
                            201,
                            &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
                        );
                    }
                    (method, uri) => panic!("unexpected tenant request {method} {uri}"),
                }
            }
        };
        let super_script = async {
            let mut secret_writes = Vec::new();
            for _ in 0..2 {
                let call = supers.next().await;
                let secrets = format!("/api/v1/namespaces/{SUPER_NS}/secrets");
                match call.method.as_str() {
                    "POST" if call.uri.starts_with(&secrets) => {
                        // The first pod's keys are written at once; the others' tokens arrive meanwhile.
                        let _ = minted_rx.wait_for(|n| *n == 3).await;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        assert_eq!(call.body["metadata"]["name"], "shard-0.vc-tokens");
                        assert_eq!(call.body["metadata"]["labels"][LABEL_POD_TOKEN], "true");
                        secret_writes.push(call.body.clone());
                        call.echo();
                    }
                    "PATCH" if call.uri.starts_with(&format!("{secrets}/shard-0.vc-tokens?")) => {
                        assert_eq!(call.content_type, "application/merge-patch+json");
                        assert_eq!(call.body["metadata"]["resourceVersion"], "200");
                        secret_writes.push(call.body.clone());
                        let mut answer = call.body.clone();
                        answer["metadata"]["resourceVersion"] = json!("201");
                        call.ok(answer);
                    }
                    _ => panic!("unexpected super request {} {}", call.method, call.uri),
                }
            }
            secret_writes
        };
        let (o1, o2, o3, (), writes) = tokio::join!(
            super::super::up::pod(&ctx, &tenant, "ns", "p1"),
            super::super::up::pod(&ctx, &tenant, "ns", "p2"),
            super::super::up::pod(&ctx, &tenant, "ns", "p3"),
            tenant_script,
            super_script,
        );
        for outcome in [o1, o2, o3] {
            // The binding and the pod's share of a token Secret write.
            assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 2 });
        }
        // Three pods, two token Secret writes: the first alone, the two that waited together.
        assert_eq!(writes.len(), 2);
        assert_eq!(
            writes[0]["data"].as_object().map(|d| d.len()),
            Some(4),
            "{}",
            writes[0]
        );
        assert_eq!(
            writes[1]["data"].as_object().map(|d| d.len()),
            Some(6),
            "{}",
            writes[1]
        );
        let first = writes[0]["data"]
            .as_object()
            .and_then(|d| d.keys().find(|k| k.contains(".token-")).cloned())
            .expect("a token");
        let pod = first.split(".token-").next().unwrap_or_default();
        assert_eq!(decoded(&writes[0]["data"][&first]), format!("jwt-{pod}"));
        assert_eq!(
            decoded(&writes[0]["data"][&format!("{pod}.uid")]),
            format!("uid-{pod}")
        );
        assert_eq!(decoded(&writes[0]["data"]["namespace"]), "ns");
        let members: Members = serde_json::from_str(
            writes[1]["metadata"]["annotations"][ANNOTATION_TOKEN_MEMBERS]
                .as_str()
                .expect("members"),
        )
        .expect("members json");
        assert_eq!(members.keys().collect::<Vec<_>>(), ["p1", "p2", "p3"]);
        let counts = ctx.metrics.resources.super_write_counts();
        let count = |resource, verb| {
            counts
                .iter()
                .find(|(r, v, _)| *r == resource && *v == verb)
                .map_or(0, |(_, _, n)| *n)
        };
        assert_eq!(count("pod", "create"), 3);
        assert_eq!(count("secret", "create") + count("secret", "patch"), 2);

        // Once the binding shows, the next pass finds the tokens written: nothing is minted twice.
        for name in ["p1", "p2", "p3"] {
            let mut pod = tenant_pod(name);
            pod["spec"]["nodeName"] = json!("node-1");
            pod["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True"}]);
            cache(&mut caches.pods, from_json(pod));
            let again = tokio::time::timeout(
                Duration::from_secs(5),
                super::super::up::pod(&ctx, &tenant, "ns", name),
            )
            .await
            .expect("no request");
            assert_eq!(again.expect("synced"), Outcome::InSync);
        }
        supers.idle().await;
        tenants.idle().await;
    }

    /// While one worker mints a pod's tokens, another that finds them missing leaves them to it.
    #[test]
    fn a_pods_tokens_are_minted_by_one_worker_at_a_time() {
        let shards = TokenShards::default();
        let shard = shards.shard(SUPER_NS, "ns", 0);
        let first = shard.start_minting("p1", "uid-p1").expect("the first mints");
        assert!(shard.start_minting("p1", "uid-p1").is_none());
        assert!(shard.start_minting("p2", "uid-p2").is_some());
        drop(first);
        assert!(shard.start_minting("p1", "uid-p1").is_some());
    }

    fn super_pod(name: &str) -> SuperPod {
        from_json(json!({
            "metadata": {"name": name, "namespace": SUPER_NS, "uid": format!("super-{name}"), "annotations": {
                "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "ns",
                "tenancy.x-k8s.io/uid": format!("uid-{name}"),
                (token::ANNOTATION_POD_TOKENS): token::needs_annotation(&[need()]),
                (token::ANNOTATION_TOKEN_SECRET): "shard-0.vc-tokens"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }))
    }

    fn need() -> TokenNeed {
        TokenNeed {
            key: "token".into(),
            audience: None,
            expiration_seconds: None,
        }
    }

    fn shard_meta(members: &Members) -> PartialObjectMeta<Secret> {
        from_json(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "shard-0.vc-tokens", "namespace": SUPER_NS, "resourceVersion": "300",
            "labels": {(LABEL_POD_TOKEN): "true"},
            "annotations": {"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "ns",
                (ANNOTATION_TOKEN_MEMBERS): serde_json::to_string(members).expect("json")}}}))
    }

    fn recorded(pod: &str, issued: i64, expires: i64) -> Member {
        Member {
            uid: format!("uid-{pod}").into(),
            keys: [format!("{pod}.token"), format!("{pod}.uid")]
                .into_iter()
                .collect(),
            issued,
            expires,
        }
    }

    #[tokio::test]
    async fn a_due_shard_is_renewed_in_one_write_that_also_drops_gone_pods() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let now = token::now();
        // p1 is due, p2 past half its life, p3's pod is gone, p4 fresh.
        let members: Members = [
            ("p1".to_owned(), recorded("p1", now - 3000, now + 500)),
            ("p2".to_owned(), recorded("p2", now - 2000, now + 1600)),
            ("p3".to_owned(), recorded("p3", now - 3000, now + 500)),
            ("p4".to_owned(), recorded("p4", now - 10, now + 3590)),
        ]
        .into();
        cache(&mut super_caches.tokens, shard_meta(&members));
        for name in ["p1", "p2", "p4"] {
            cache(&mut super_caches.pods, super_pod(name));
            cache(&mut caches.pods, from_json(tenant_pod(name)));
        }
        let tenant_pod_of = |name: &str| {
            tenant
                .stores
                .pods
                .get(&ObjectRef::new(name).within("ns"))
                .expect("pod")
        };
        let super_pod_of = |name: &str| {
            ctx.supers
                .pods
                .copies
                .get(&ObjectRef::new(name).within(SUPER_NS))
                .expect("pod")
        };
        let needs = [need()];
        let (tenant_pods, super_pods): (Vec<_>, Vec<_>) = ["p1", "p2", "p4"]
            .into_iter()
            .map(|name| (tenant_pod_of(name), super_pod_of(name)))
            .unzip();
        let shard = "shard-0.vc-tokens";

        // A fresh member is in sync: nothing is asked or written (also right after a restart).
        let fresh = keep(&ctx, &tenant, &tenant_pods[2], &super_pods[2], shard, &needs);
        assert_eq!(fresh.await.expect("kept"), 0);
        supers.idle().await;
        tenants.idle().await;

        let expires = (Timestamp::now() + jiff::SignedDuration::from_secs(3600)).to_string();
        let (renewed, ()) = tokio::join!(
            keep(&ctx, &tenant, &tenant_pods[0], &super_pods[0], shard, &needs),
            async {
                for _ in 0..2 {
                    let call = tenants
                        .expect("POST", "/api/v1/namespaces/ns/serviceaccounts/default/token?")
                        .await;
                    let answer = issued(&call.body, &expires);
                    call.ok(answer);
                }
                let call = supers
                    .expect(
                        "PATCH",
                        &format!("/api/v1/namespaces/{SUPER_NS}/secrets/shard-0.vc-tokens?"),
                    )
                    .await;
                let data = call.body["data"].as_object().cloned().unwrap_or_default();
                assert_eq!(decoded(&data["p1.token"]), "jwt-p1");
                assert_eq!(decoded(&data["p2.token"]), "jwt-p2");
                assert!(!data.contains_key("p4.token"), "{}", call.body);
                assert_eq!(data["p3.token"], Value::Null);
                assert_eq!(data["p3.uid"], Value::Null);
                assert_eq!(call.body["metadata"]["resourceVersion"], "300");
                let mut answer = call.body.clone();
                answer["metadata"]["resourceVersion"] = json!("301");
                call.ok(answer);
            }
        );
        assert_eq!(renewed.expect("renewed"), 1);
        // p2 was renewed with p1: its own wake-up finds nothing to do.
        let along = keep(&ctx, &tenant, &tenant_pods[1], &super_pods[1], shard, &needs);
        assert_eq!(along.await.expect("kept"), 0);
        assert_eq!(ctx.metrics.resources.super_writes_total(), 1);
        supers.idle().await;
        tenants.idle().await;

        // The shard's one timer fires at its earliest member's renewal (p4's, at now + 2870), queues
        // the members then due, and is set again for the renewed ones (at about now + 2880).
        let shards = &ctx.supers.pods.token_shards;
        let due_at = |at: i64| -> Vec<String> {
            let (due, _) = shards.fire_renewals(at);
            due.into_iter()
                .inspect(|(tenant_id, _)| assert_eq!(*tenant_id, tenant.id))
                .map(|(_, item)| format!("{}/{}", item.namespace, item.name))
                .collect()
        };
        assert_eq!(due_at(now + 2860), Vec::<String>::new());
        assert_eq!(due_at(now + 2875), ["ns/p4"]);
        // p4 again with them: nothing renewed it meanwhile.
        assert_eq!(due_at(now + 2890), ["ns/p1", "ns/p2", "ns/p4"]);
    }
}
