//! Tenant pods synced down: creation with admission (policy, quota), updates of the mutable fields, tokens,
//! and deletion in both directions.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Node, Pod, PodCondition, PodStatus, Secret, Toleration},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{GetParams, Patch},
    runtime::reflector::ObjectRef,
};

use super::{
    convert::{self, Converted, PodConversion, Refusal, TenantEndpoints, TokenNeed},
    end::{finalize_tenant_pod, has_ended},
    ephemeral,
    placement::{self, Candidate, Resolved},
    policy,
    refusal::{REASON_POLICY_VIOLATION, is_refusal},
    tenant_endpoints::tenant_endpoints,
    token, token_secrets,
};
use crate::{
    cache::meta::Tagged,
    cache::pods::{CachedPodSpec, POD_SCHEDULED, SuperPod, TenantPod},
    engine::context::Context,
    error::{Result, on_super, on_tenant},
    engine::events, tenancy::identity,
    engine::items::{DownItem, Kind},
    accounting::quota::REASON_QUOTA_EXCEEDED,
    resources::{
        claim, namespace,
        outcome::Outcome,
        public,
        runtime_class::{self, RuntimeClassChoice},
        vnode,
        write::{self, apply, delete},
    },
    tenancy::tenant::Tenant,
};

/// Reason of the event on a tenant pod that leaves out a resource its tenant's quota limits.
pub const REASON_RESOURCES_REQUIRED: &str = "ResourcesRequired";

/// The container resources a quota limits, for messages.
fn limited_dimensions(quota: Option<&crds::TenantQuota>) -> String {
    let Some(quota) = quota else {
        return String::new();
    };
    [
        (quota.requests_cpu.is_some(), "requests.cpu"),
        (quota.requests_memory.is_some(), "requests.memory"),
        (quota.limits_cpu.is_some(), "limits.cpu"),
        (quota.limits_memory.is_some(), "limits.memory"),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .map(|(_, name)| name)
    .collect::<Vec<_>>()
    .join(", ")
}

/// Whether a tenant pod was placed by the syncer (bound after its super pod was scheduled), as opposed to
/// a pod the tenant created with a node name.
pub(super) fn was_scheduled(pod: &TenantPod) -> bool {
    let status = &pod.status;
    status.pod_ip.is_some()
        || status.phase.as_deref().is_some_and(|p| p != "Pending")
        || status
            .conditions
            .iter()
            .any(|c| c.type_ == POD_SCHEDULED && c.status == "True")
}

/// The cluster IP of the tenant DNS Service (vc-dns), read from the super cluster once a minute; `Err`
/// with a reason while it cannot be read.
async fn tenant_dns_ip(ctx: &Context, service: &crate::engine::config::TenantDnsService) -> Result<String, String> {
    let fresh = |at: &std::time::Instant| at.elapsed() < Duration::from_secs(60);
    if let Some((ip, at)) = service.cached.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
        && fresh(at)
    {
        return Ok(ip.clone());
    }
    let (namespace, name) = (&service.namespace, &service.name);
    let found = Api::<k8s_openapi::api::core::v1::Service>::namespaced(ctx.super_client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| format!("reading the tenant DNS Service {namespace}/{name}: {e}"))?;
    let ip = found
        .and_then(|s| s.spec?.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None")
        .ok_or_else(|| format!("waiting for the tenant DNS Service {namespace}/{name} and its cluster IP"))?;
    *service.cached.lock().unwrap_or_else(|e| e.into_inner()) = Some((ip.clone(), std::time::Instant::now()));
    Ok(ip)
}

fn convert(
    ctx: &Context,
    tenant: &Tenant,
    pod: &Pod,
    endpoints: &TenantEndpoints,
    runtime_class: &RuntimeClassChoice,
    node_selection: Option<&Resolved>,
) -> Result<Converted, Refusal> {
    let settings = tenant.settings();
    let meta = ctx.meta_policy(&settings.opaque_prefixes);
    let namespace = pod.namespace().unwrap_or_default();
    let super_namespace = tenant.identity.super_namespace(&namespace);
    let token_key_prefix = token_secrets::key_prefix(&pod.name_any());
    let published_priority_class = |name: &str| {
        ctx.supers
            .priority_classes
            .get(&ObjectRef::new(name))
            .is_some_and(|class| public::is_published(class.meta()))
    };
    let published_storage_class = |name: &str| claim::is_published_class(&ctx.supers, name);
    let published_default_storage_class = claim::published_default_class(&ctx.supers);
    let cx = PodConversion {
        identity: &tenant.identity,
        meta: &meta,
        super_namespace: &super_namespace,
        cluster_domain: &settings.cluster_domain,
        runtime_class_name: settings.runtime_class_name.as_deref(),
        runtime_class,
        node_selection,
        pod_policy: &settings.pod_policy,
        platform_policy: &ctx.config.pod_policy,
        published_priority_class: &published_priority_class,
        published_storage_class: &published_storage_class,
        published_default_storage_class: published_default_storage_class.as_deref(),
        hardening: convert::Hardening::of(&ctx.config),
        endpoints,
        ndots: ctx.config.dns_ndots,
        upstream_nameservers: &ctx.config.pod_upstream_nameservers,
        token_secret: convert::UNASSIGNED_TOKEN_SECRET,
        token_key_prefix: &token_key_prefix,
    };
    convert::to_super(pod, &cx)
}

/// A pod's node selection resolved against the tenant's vNodes, outside `--vnode-mode pods` (there a
/// tenant sees only the nodes its pods run on, and the pod policy judges the labels a pod names).
async fn node_selection(
    ctx: &Context,
    tenant: &Tenant,
    spec: Option<&k8s_openapi::api::core::v1::PodSpec>,
) -> Result<Option<Resolved>> {
    let Some(spec) = spec.filter(|spec| placement::selects(spec)) else {
        return Ok(None);
    };
    if ctx.config.vnode_mode == crate::engine::config::VNodeMode::Pods {
        return Ok(None);
    }
    let cached = tenant.stores.nodes.state();
    let resolved = placement::resolve(spec, &candidates(ctx, tenant, cached.iter().map(|n| &**n)));
    if !resolved.narrowed || !resolved.required.is_empty() {
        return Ok(Some(resolved));
    }
    // Nothing matched in the cache: a label the tenant put on a vNode just before creating the pod may not
    // be there yet, and the copy, once made, cannot be placed again. The vNodes as they are now decide.
    let listed = Api::<Node>::all(tenant.client.clone())
        .list(&kube::api::ListParams::default().labels(crds::wellknown::LABEL_VIRTUAL_NODE))
        .await
        .map_err(on_tenant(&tenant.identity.cluster_key, "listing vNodes"))?;
    Ok(Some(placement::resolve(
        spec,
        &candidates(ctx, tenant, listed.items.iter()),
    )))
}

/// The vNodes of the super nodes the tenant may use, as the tenant labelled them.
fn candidates<'a>(ctx: &Context, tenant: &Tenant, vnodes: impl Iterator<Item = &'a Node>) -> Vec<Candidate> {
    vnodes
        .filter_map(|vnode| {
            let name = vnode.metadata.name.as_deref()?;
            let node = ctx.supers.nodes.get(&ObjectRef::new(name))?;
            vnode::wanted(ctx, tenant, &node).then(|| Candidate {
                name: name.to_owned(),
                labels: vnode.metadata.labels.clone().unwrap_or_default(),
                unschedulable: vnode.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
            })
        })
        .collect()
}

/// The super metadata a tenant pod calls for, and the sync hash over everything of a pod that may change
/// after creation (labels, annotations, images, deadline): the rest of a pod is fixed when it is created.
fn desired_state(
    ctx: &Context,
    tenant: &Tenant,
    metadata: &ObjectMeta,
    spec: &CachedPodSpec,
) -> (ObjectMeta, String) {
    let settings = tenant.settings();
    let meta = ctx.meta_policy(&settings.opaque_prefixes);
    let super_namespace = tenant
        .identity
        .super_namespace(metadata.namespace.as_deref().unwrap_or_default());
    let copied = identity::super_metadata(metadata, &tenant.identity, &meta, Some(super_namespace), true);
    let hash = identity::sync_hash(&(&copied.labels, &copied.annotations, convert::mutable_view(spec)));
    (copied, hash)
}

fn with_annotation(mut meta: ObjectMeta, key: &str, value: String) -> ObjectMeta {
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_owned(), value);
    meta
}

/// Syncs one tenant pod down.
pub async fn sync(ctx: &Context, tenant: &Tenant, item: &DownItem) -> Result<Outcome> {
    let super_namespace = tenant.identity.super_namespace(&item.namespace);
    let tenant_pod = tenant
        .stores
        .pods
        .get(&ObjectRef::new(&item.name).within(&item.namespace));
    let super_pod = ctx
        .supers
        .pods
        .get(&ObjectRef::new(&item.name).within(&super_namespace));
    let api: Api<Pod> = Api::namespaced(ctx.super_client.clone(), &super_namespace);

    // A super namespace serves one tenant namespace: nothing of another is read, written or deleted there.
    if let Some(taken) = namespace::taken(ctx, tenant, &item.namespace) {
        return Ok(taken);
    }
    if let Some(existing) = &super_pod
        && (!identity::belongs_to(existing.meta(), &tenant.identity.cluster_key)
            || identity::tenant_namespace(existing.meta()) != Some(item.namespace.as_str()))
    {
        return Ok(Outcome::Waiting {
            reason: "the super pod belongs to someone else".into(),
            retry_after: None,
        });
    }
    let Some(tenant_pod) = tenant_pod else {
        ctx.quota.stop_waiting(&tenant.id, &item.namespace, &item.name);
        return match super_pod {
            Some(existing) => {
                delete(ctx, &api, &item.name, existing.uid(), None).await?;
                Ok(Outcome::Deleted)
            }
            None => Ok(Outcome::InSync),
        };
    };
    if let Some(existing) = &super_pod
        && identity::tenant_uid(existing.meta()) != tenant_pod.uid().as_deref()
    {
        // A new tenant pod of the same name: the old super pod goes first.
        delete(ctx, &api, &item.name, existing.uid(), None).await?;
        return Ok(Outcome::Deleted);
    }
    if tenant_pod.meta().deletion_timestamp.is_some() {
        ctx.quota.stop_waiting(&tenant.id, &item.namespace, &item.name);
        return terminate(ctx, tenant, &tenant_pod, super_pod.as_deref(), &api).await;
    }
    match super_pod {
        // An ended pod needs no copy: one whose copy the super cluster collected stays as it ended.
        None if has_ended(&tenant_pod) => Ok(Outcome::InSync),
        // A pod that ended before the super scheduler placed its copy (its node refused it, see
        // `up::rejected_by_node`) must never start later, when the node has room again.
        Some(existing) if has_ended(&tenant_pod) && existing.spec.node_name.is_none() => {
            if existing.meta().deletion_timestamp.is_none() {
                delete(ctx, &api, &item.name, existing.uid(), None).await?;
            }
            Ok(Outcome::Deleted)
        }
        None if was_scheduled(&tenant_pod) && !tenant.paused_away(tenant_pod.meta()) => {
            replace_lost(ctx, tenant, &tenant_pod, &api).await
        }
        None => create(ctx, tenant, &tenant_pod, &api).await,
        Some(existing) => update(ctx, tenant, &tenant_pod, &existing, &api).await,
    }
}

/// The tenant deletes its pod: the super pod goes with the same grace period; once it is gone, the tenant
/// pod's deletion is completed (what a kubelet does on a real node).
async fn terminate(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: Option<&SuperPod>,
    api: &Api<Pod>,
) -> Result<Outcome> {
    match super_pod {
        Some(existing) if existing.meta().deletion_timestamp.is_none() => {
            let grace = tenant_pod
                .metadata
                .deletion_grace_period_seconds
                .and_then(|g| u32::try_from(g).ok());
            delete(ctx, api, &tenant_pod.name_any(), existing.uid(), grace).await?;
            Ok(Outcome::Deleted)
        }
        Some(_) => Ok(Outcome::Waiting {
            reason: "the super pod is terminating".into(),
            retry_after: None,
        }),
        // The tenant-side writes are the upward sync's to count.
        None => {
            finalize_tenant_pod(ctx, tenant, tenant_pod).await?;
            Ok(Outcome::InSync)
        }
    }
}

/// The super pod of a scheduled tenant pod disappeared behind the syncer's back: the tenant pod is deleted
/// so that its controller replaces it, as when a node is lost.
async fn replace_lost(ctx: &Context, tenant: &Tenant, tenant_pod: &TenantPod, api: &Api<Pod>) -> Result<Outcome> {
    // The cache may not show yet a copy made a moment ago (a pod recreated after a pause and synced again
    // before the copy's watch event arrived): deleting a pod is final, so the apiserver says whether its
    // copy is really gone.
    let name = tenant_pod.name_any();
    let copy = api
        .get_opt(&name)
        .await
        .map_err(on_super(format!("reading pod {}/{name}", api_namespace(api))))?;
    if copy.is_some_and(|copy| identity::tenant_uid(copy.meta()) == tenant_pod.uid().as_deref()) {
        return Ok(Outcome::InSync);
    }
    events::warn(
        tenant,
        &tenant_pod.object_ref(&()),
        "SuperPodLost",
        "the pod's copy in the super cluster was deleted after it was scheduled; deleting the pod so its controller replaces it",
    )
    .await;
    finalize_tenant_pod(ctx, tenant, tenant_pod).await?;
    Ok(Outcome::Waiting {
        reason: "super pod lost; tenant pod deleted".into(),
        retry_after: None,
    })
}

/// Adds a scheduling preference for `node` to a super pod: a pod recreated after a pause goes back where it
/// ran when that node still fits. Only a preference, scored by the super scheduler: it can never place a pod
/// where its policy-checked constraints and the node's taints would not let it run.
fn prefer_node(pod: &mut Pod, node: &str) {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm,
    };
    let spec = pod.spec.get_or_insert_with(Default::default);
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    node_affinity
        .preferred_during_scheduling_ignored_during_execution
        .get_or_insert_with(Vec::new)
        .push(PreferredSchedulingTerm {
            weight: 100,
            preference: NodeSelectorTerm {
                match_fields: Some(vec![NodeSelectorRequirement {
                    key: "metadata.name".into(),
                    operator: "In".into(),
                    values: Some(vec![node.to_owned()]),
                }]),
                match_expressions: None,
            },
        });
}

async fn create(ctx: &Context, tenant: &Tenant, cached: &TenantPod, api: &Api<Pod>) -> Result<Outcome> {
    let namespace = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    // A pod waiting for quota is queued again whenever room may have appeared (a pod ended, the quota
    // changed, the patrol): while it still does not fit, the cache says so without reading the pod.
    if ctx.quota.is_waiting(&tenant.id, &namespace, &name) {
        let usage = crate::accounting::quota::pod_usage(&cached.spec);
        let settings = tenant.settings();
        if let Err(exceeded) = ctx
            .quota
            .check(&tenant.id, settings.quota.as_ref(), &namespace, &name, usage)
        {
            hold_for_quota(ctx, tenant, cached, &exceeded.to_string()).await;
            return Ok(Outcome::Waiting {
                reason: exceeded.to_string(),
                retry_after: None,
            });
        }
    }
    let tenant_dns = match &ctx.config.tenant_dns {
        None => None,
        Some(service) => match tenant_dns_ip(ctx, service).await {
            Ok(ip) => Some(ip),
            Err(reason) => {
                return Ok(Outcome::Waiting {
                    reason,
                    retry_after: Some(Duration::from_secs(1)),
                });
            }
        },
    };
    let endpoints = match tenant_endpoints(ctx, tenant, tenant_dns) {
        Ok(endpoints) => endpoints,
        Err(reason) => {
            return Ok(Outcome::Waiting {
                reason,
                retry_after: Some(Duration::from_secs(1)),
            });
        }
    };
    // The cache keeps little of a pod, but the whole spec of an unbound one: the copy is made from it.
    // Otherwise (a pod a pause removed) the whole pod is read, from the apiserver's watch cache.
    let mut tenant_pod = match cached.unbound_pod() {
        Some(pod) => pod,
        None => {
            let tenant_api: Api<Pod> = Api::namespaced(tenant.client.clone(), &namespace);
            let at = GetParams::at(cached.meta().resource_version.as_deref().unwrap_or("0"));
            match tenant_api.get_with(&name, &at).await {
                Ok(pod) => pod,
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Outcome::InSync),
                Err(e) => {
                    return Err(on_tenant(
                        &tenant.identity.cluster_key,
                        format!("reading pod {namespace}/{name}"),
                    )(e));
                }
            }
        }
    };
    // A scheduled pod gets here only when a pause removed its super pod (`Tenant::paused_away`): its node
    // name is the syncer's binding, and the super scheduler places the copy again, preferring that node.
    let previous_node = match tenant_pod.spec.as_mut() {
        Some(spec) if was_scheduled(cached) => spec.node_name.take(),
        _ => None,
    };
    let asked_runtime_class = tenant_pod.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref());
    let runtime_class = runtime_class::choose(ctx, tenant, asked_runtime_class).await?;
    let node_selection = node_selection(ctx, tenant, tenant_pod.spec.as_ref()).await?;
    let converted = match convert(
        ctx,
        tenant,
        &tenant_pod,
        &endpoints,
        &runtime_class,
        node_selection.as_ref(),
    ) {
        Ok(mut converted) => {
            if let Some(node) = previous_node {
                prefer_node(&mut converted.pod, &node);
            }
            converted
        }
        Err(refusal) => {
            let reason = match refusal {
                Refusal::NodeNameSet(_) => "NotSupported",
                Refusal::Policy(_) => REASON_POLICY_VIOLATION,
            };
            tracing::warn!(tenant = %tenant.identity.vc_ref(), %namespace, pod = %name, reason, "{refusal}");
            ctx.metrics.refused("pod", reason);
            events::warn(tenant, &cached.object_ref(&()), reason, &refusal.to_string()).await;
            return Ok(Outcome::Waiting {
                reason: refusal.to_string(),
                retry_after: None,
            });
        }
    };
    let settings = tenant.settings();
    // A container that leaves out a resource the quota limits would not count against it.
    let unstated = crate::accounting::quota::unstated_resources(settings.quota.as_ref(), &tenant_pod);
    if !unstated.is_empty() {
        let message = format!(
            "the VirtualCluster's quota limits {}, so every container must state it; missing: {}; the pod is not synced",
            limited_dimensions(settings.quota.as_ref()),
            unstated.join(", ")
        );
        tracing::warn!(tenant = %tenant.identity.vc_ref(), %namespace, pod = %name, "{message}");
        ctx.metrics.refused("pod", REASON_RESOURCES_REQUIRED);
        events::warn(
            tenant,
            &cached.object_ref(&()),
            REASON_RESOURCES_REQUIRED,
            &message,
        )
        .await;
        return Ok(Outcome::Waiting {
            reason: message,
            retry_after: None,
        });
    }
    let usage = crate::accounting::quota::pod_usage(&convert::cached_spec(&tenant_pod));
    if let Err(exceeded) = ctx
        .quota
        .admit(&tenant.id, settings.quota.as_ref(), &namespace, &name, usage)
    {
        hold_for_quota(ctx, tenant, cached, &exceeded.to_string()).await;
        return Ok(Outcome::Waiting {
            reason: exceeded.to_string(),
            retry_after: None,
        });
    }
    match create_admitted(ctx, tenant, &tenant_pod, converted, api).await {
        // Not created (its namespace is not there yet, or refused): the reservation goes.
        Ok(outcome @ Outcome::Waiting { .. }) => {
            ctx.quota.release(&tenant.id, &namespace, &name);
            Ok(outcome)
        }
        Ok(outcome) => {
            tenant.restored(cached.meta());
            Ok(outcome)
        }
        Err(error) => {
            ctx.quota.release(&tenant.id, &namespace, &name);
            Err(error)
        }
    }
}

async fn create_admitted(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &Pod,
    converted: Converted,
    api: &Api<Pod>,
) -> Result<Outcome> {
    let namespace = tenant_pod.namespace().unwrap_or_default();
    let mut writes = match namespace::ensure(ctx, tenant, &namespace).await? {
        Ok(writes) => writes,
        Err(outcome) => return Ok(outcome),
    };
    let name = tenant_pod.metadata.name.as_deref().unwrap_or_default();
    let (_, hash) = desired_state(
        ctx,
        tenant,
        &tenant_pod.metadata,
        &convert::cached_spec(tenant_pod),
    );
    let mut pod = converted.pod;
    pod.metadata = with_annotation(pod.metadata, identity::ANNOTATION_SYNC_HASH, hash);
    if converted.needs_secret {
        // The shard its volumes read; its tokens are minted once the tenant pod is bound (so they name the
        // node) and written there (`token_secrets::put_bound`); the kubelet retries the mount until then.
        let shard = ctx.supers.token_shards.assign(
            ctx,
            &api_namespace(api),
            &namespace,
            tenant_pod.metadata.name.as_deref().unwrap_or_default(),
            tenant_pod.metadata.uid.as_deref().unwrap_or_default(),
        );
        if let Some(spec) = pod.spec.as_mut() {
            convert::retarget_token_secret(spec, convert::UNASSIGNED_TOKEN_SECRET, &shard);
        }
        pod.metadata = with_annotation(
            pod.metadata,
            token::ANNOTATION_POD_TOKENS,
            token::needs_annotation(&converted.tokens),
        );
        pod.metadata = with_annotation(pod.metadata, token::ANNOTATION_TOKEN_SECRET, shard);
    }
    // A POST, not an apply: the super apiserver decodes it once, with no YAML parse and no structured
    // merge (about a tenth of its CPU per synced pod); the pod's first update makes the fields applied.
    match write::create(ctx, api, &pod).await {
        Ok(_) => {}
        // A pod of that name is there already: this copy, made by an earlier try whose answer was lost, or a
        // copy of an earlier pod of that name still terminating. The cache shows which shortly.
        Err(error) if error.is_status(409) => {
            return Ok(Outcome::Waiting {
                reason: format!("a pod named {name} is still in the super cluster"),
                retry_after: Some(Duration::from_secs(1)),
            });
        }
        Err(error) => {
            let Some((reason, message, retry_after)) = super_refusal(&error) else {
                return Err(error);
            };
            tracing::warn!(tenant = %tenant.identity.vc_ref(), %namespace, pod = %name, reason, "{message}");
            ctx.metrics.refused("pod", reason);
            events::warn(tenant, &tenant_pod.object_ref(&()), reason, &message).await;
            return Ok(Outcome::Waiting {
                reason: message,
                retry_after,
            });
        }
    };
    writes += 1;
    Ok(Outcome::Created { writes })
}

/// Reason of the event on a tenant pod whose copy the super cluster's admission refused.
pub const REASON_REFUSED_BY_SUPER_CLUSTER: &str = "RefusedBySuperCluster";

/// How soon a pod the super cluster refused is tried again.
const REFUSED_RETRY: Duration = Duration::from_secs(60);

/// What the tenant is told when the super apiserver refused its pod's copy for what the pod says: the
/// event reason, the message, and when to try again. The super namespace's Pod Security level is the
/// platform's backstop behind podPolicy (not retried: the pod must change); any other admission refusal (a
/// RuntimeClass the super cluster lacks, a webhook, a LimitRange) is tried again now and then, in case the
/// platform changes. `None`: not a refusal, an error to retry with backoff.
fn super_refusal(error: &crate::error::Error) -> Option<(&'static str, String, Option<Duration>)> {
    let quoted = error.status_message().unwrap_or_default();
    if error.is_status(403) && quoted.contains("PodSecurity") {
        let message = format!(
            "the super cluster's Pod Security admission refused the pod ({quoted}); the pod is not synced"
        );
        return Some((REASON_POLICY_VIOLATION, message, None));
    }
    refused_by_admission(error).then(|| {
        let message = format!(
            "the super cluster refused the pod ({quoted}); it is retried every {}s",
            REFUSED_RETRY.as_secs()
        );
        (REASON_REFUSED_BY_SUPER_CLUSTER, message, Some(REFUSED_RETRY))
    })
}

/// Whether the super apiserver refused a pod for what the pod says (admission: 400, 422, or a 403 that
/// names a rejection), rather than for the syncer's own rights (an RBAC 403 stays an error, and is not
/// shown to the tenant).
fn refused_by_admission(error: &crate::error::Error) -> bool {
    let message = error.status_message().unwrap_or_default();
    error.is_status(400)
        || error.is_status(422)
        || (error.is_status(403)
            && ["pod rejected", "admission webhook", "exceeded quota", "maximum", "minimum"]
                .iter()
                .any(|m| message.contains(m)))
}

/// The namespace an `Api` of a namespace serves.
fn api_namespace(api: &Api<Pod>) -> String {
    api.namespace().unwrap_or_default().to_owned()
}

async fn write_token_secret(
    ctx: &Context,
    tenant: &Tenant,
    subject: &token::Subject<'_>,
    super_namespace: &str,
    super_pod_uid: &str,
    minted: token::Minted,
) -> Result<()> {
    let now = token::now();
    let has_tokens = !minted.tokens.is_empty();
    let ca = token::tenant_ca(tenant, subject.namespace);
    let secret = token::secret(
        &tenant.identity,
        subject,
        super_namespace,
        super_pod_uid,
        ca,
        minted,
        now,
    );
    let refresh = token::refresh_at(&secret.metadata);
    let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), super_namespace);
    apply(ctx, &api, secret, None).await?;
    if let (true, Some(at)) = (has_tokens, refresh) {
        schedule_refresh(ctx, tenant, subject.namespace, subject.name, at);
    }
    Ok(())
}

fn schedule_refresh(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str, at: i64) {
    let delay = Duration::from_secs(u64::try_from(at - token::now()).unwrap_or(0));
    ctx.queues
        .down
        .add_after(&tenant.id, DownItem::new(Kind::Pod, namespace, name), delay);
}

/// Tells the tenant why its pod waits: an event and a PodScheduled=False condition.
async fn hold_for_quota(ctx: &Context, tenant: &Tenant, tenant_pod: &TenantPod, message: &str) {
    let already =
        tenant_pod.status.conditions.iter().any(|c| {
            c.reason.as_deref() == Some(REASON_QUOTA_EXCEEDED) && c.message.as_deref() == Some(message)
        });
    if already {
        return;
    }
    events::warn(
        tenant,
        &tenant_pod.object_ref(&()),
        REASON_QUOTA_EXCEEDED,
        message,
    )
    .await;
    let status = Pod {
        metadata: ObjectMeta {
            name: Some(tenant_pod.name_any()),
            ..Default::default()
        },
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: POD_SCHEDULED.into(),
                status: "False".into(),
                reason: Some(REASON_QUOTA_EXCEEDED.into()),
                message: Some(message.to_owned()),
                last_transition_time: Some(Time(Timestamp::now())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let api: Api<Pod> = Api::namespaced(tenant.client.clone(), &tenant_pod.namespace().unwrap_or_default());
    ctx.metrics.tenant_write("pod", "status");
    let params = crate::resources::write::apply_params().force();
    if let Err(error) = api
        .patch_status(&tenant_pod.name_any(), &params, &Patch::Apply(&status))
        .await
    {
        tracing::warn!(tenant = %tenant.identity.vc_ref(), pod = %tenant_pod.name_any(), %error, "setting the quota condition");
    }
}

/// Annotation on a super pod: hash of the resize the super cluster refused. The tenant was told; the
/// resize is not asked again until the tenant's resources change.
pub const ANNOTATION_REFUSED_RESIZE: &str = "tenancy.x-k8s.io/refused-resize";

/// Annotation on a super pod: hash of the added tolerations the pod policy refused (told once).
pub const ANNOTATION_REFUSED_TOLERATIONS: &str = "tenancy.x-k8s.io/refused-tolerations";

/// Reason of the event on a tenant pod whose change the super cluster refused.
pub const REASON_UPDATE_REFUSED: &str = "UpdateRefused";

/// Reason of the event on a tenant pod whose in-place resize the super cluster refused.
pub const REASON_RESIZE_REFUSED: &str = "ResizeRefused";

/// The fields of the tenant pod's change, for messages.
fn changed_fields(tenant: &CachedPodSpec, super_spec: &CachedPodSpec, metadata: bool, tolerations: bool) -> String {
    let mut fields = Vec::new();
    if metadata {
        fields.push("metadata.labels/annotations".to_owned());
    }
    for (list, wanted, have) in [
        ("containers", &tenant.containers, &super_spec.containers),
        ("initContainers", &tenant.init_containers, &super_spec.init_containers),
    ] {
        for container in wanted {
            if have.iter().any(|h| h.name == container.name && h.image != container.image) {
                fields.push(format!("spec.{list}[{}].image", container.name));
            }
        }
    }
    if tenant.active_deadline_seconds != super_spec.active_deadline_seconds {
        fields.push("spec.activeDeadlineSeconds".to_owned());
    }
    if tolerations {
        fields.push("spec.tolerations".to_owned());
    }
    fields.join(", ")
}

/// A running tenant pod's changes go down: labels, annotations, images and deadline with the pod itself,
/// added tolerations the policy allows, and resources through the super pod's `resize` subresource.
/// What the policy or the super cluster refuses is told to the tenant in one event per change.
async fn update(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    api: &Api<Pod>,
) -> Result<Outcome> {
    let mut writes = 0;
    let name = super_pod.name_any();
    let (desired_meta, hash) = desired_state(ctx, tenant, &tenant_pod.metadata.to_object_meta(), &tenant_pod.spec);
    let reference = tenant_pod.object_ref(&());

    let missing = convert::missing_tolerations(&tenant_pod.spec, &super_pod.spec);
    let refused = policy::refused_tolerations(
        missing.iter().copied(),
        &ctx.config.pod_policy,
        &tenant.settings().pod_policy,
    );
    let added: Vec<Toleration> = missing
        .iter()
        .filter(|t| !refused.iter().any(|(r, _)| r == *t))
        .map(|t| (*t).clone())
        .collect();
    let refused_tolerations =
        (!refused.is_empty()).then(|| identity::sync_hash(&refused.iter().map(|(t, _)| t).collect::<Vec<_>>()));
    if let Some(refusal) = &refused_tolerations
        && super_pod.meta().annotation(ANNOTATION_REFUSED_TOLERATIONS) != Some(refusal.as_str())
    {
        let described: Vec<&str> = refused.iter().map(|(_, d)| d.as_str()).collect();
        let message = format!(
            "the pod policy does not allow adding the {} (the syncer's --pod-allowed-taints, or podPolicy.allowedTaints for keys in --pod-grantable-taints); the running pod keeps its tolerations",
            described.join(", ")
        );
        tracing::warn!(tenant = %tenant.identity.vc_ref(), pod = %name, reason = REASON_POLICY_VIOLATION, "{message}");
        ctx.metrics.refused("pod", REASON_POLICY_VIOLATION);
        events::warn(tenant, &reference, REASON_POLICY_VIOLATION, &message).await;
    }

    let mut resized = false;
    let refused_resize = match convert::resize_patch(&tenant_pod.spec, &super_pod.spec) {
        None => None,
        Some(patch) => {
            let wanted = identity::sync_hash(&patch);
            if super_pod.meta().annotation(ANNOTATION_REFUSED_RESIZE) == Some(wanted.as_str()) {
                Some(wanted)
            } else {
                ctx.metrics.super_write("pod", "resize");
                let result = api
                    .patch_subresource(
                        "resize",
                        &name,
                        &crate::resources::write::apply_params(),
                        &Patch::Strategic(&patch),
                    )
                    .await
                    .map_err(on_super(format!(
                        "resizing pod {}/{name}",
                        super_pod.namespace().unwrap_or_default()
                    )));
                match result {
                    Ok(_) => {
                        writes += 1;
                        resized = true;
                        None
                    }
                    Err(error) if is_refusal(&error) => {
                        let message = format!(
                            "the super cluster refused to resize {} in place: {}",
                            convert::resized_containers(&patch).join(", "),
                            error.status_message().unwrap_or_default()
                        );
                        tracing::warn!(tenant = %tenant.identity.vc_ref(), pod = %name, reason = REASON_RESIZE_REFUSED, "{message}");
                        ctx.metrics.refused("pod", REASON_RESIZE_REFUSED);
                        events::warn(tenant, &reference, REASON_RESIZE_REFUSED, &message).await;
                        Some(wanted)
                    }
                    Err(error) => return Err(error),
                }
            }
        }
    };

    let ephemeral = ephemeral::sync(ctx, tenant, tenant_pod, super_pod, api).await?;
    writes += ephemeral.writes;

    let metadata_in_sync = identity::recorded_hash(super_pod.meta()) == Some(hash.as_str())
        && identity::metadata_covers(&desired_meta, super_pod.meta());
    let in_sync = metadata_in_sync
        && convert::mutable_view(&super_pod.spec) == convert::mutable_view(&tenant_pod.spec)
        && added.is_empty()
        && super_pod.meta().annotation(ANNOTATION_REFUSED_RESIZE) == refused_resize.as_deref()
        && super_pod.meta().annotation(ANNOTATION_REFUSED_TOLERATIONS) == refused_tolerations.as_deref()
        && super_pod.meta().annotation(ephemeral::ANNOTATION_REFUSED) == ephemeral.refused.as_deref();
    if !in_sync {
        // The whole super pod is applied back with the tenant's changes, which keeps the syncer's ownership
        // of every field it set at creation; read it as it is now (after a resize, the resized one).
        let params = match resized || ephemeral.added {
            true => GetParams::default(),
            false => GetParams::at(super_pod.meta().resource_version.as_deref().unwrap_or("0")),
        };
        let full = api.get_with(&name, &params).await.map_err(on_super(format!(
            "reading pod {}/{name}",
            super_pod.namespace().unwrap_or_default()
        )))?;
        // A copy created by POST: the fields set then become the syncer's applied ones first, so that this
        // apply removes what the tenant no longer sets.
        if write::adopt_as_applied(ctx, api, &full).await? {
            writes += 1;
        }
        let mut meta = with_annotation(desired_meta, identity::ANNOTATION_SYNC_HASH, hash);
        for key in [token::ANNOTATION_POD_TOKENS, token::ANNOTATION_TOKEN_SECRET] {
            if let Some(value) = super_pod.meta().annotation(key) {
                meta = with_annotation(meta, key, value.to_owned());
            }
        }
        for (key, value) in [
            (ANNOTATION_REFUSED_RESIZE, refused_resize),
            (ANNOTATION_REFUSED_TOLERATIONS, refused_tolerations),
            (ephemeral::ANNOTATION_REFUSED, ephemeral.refused),
        ] {
            if let Some(value) = value {
                meta = with_annotation(meta, key, value);
            }
        }
        let desired = updated_pod(&full, meta, &tenant_pod.spec, &added);
        match apply(ctx, api, desired, super_pod.uid()).await {
            Ok(_) => writes += 1,
            Err(error) if is_refusal(&error) => {
                let message = format!(
                    "the super cluster refused the pod's change of {}: {}; the running pod keeps its previous settings",
                    changed_fields(&tenant_pod.spec, &super_pod.spec, !metadata_in_sync, !added.is_empty()),
                    error.status_message().unwrap_or_default()
                );
                tracing::warn!(tenant = %tenant.identity.vc_ref(), pod = %name, reason = REASON_UPDATE_REFUSED, "{message}");
                ctx.metrics.refused("pod", REASON_UPDATE_REFUSED);
                events::warn(tenant, &reference, REASON_UPDATE_REFUSED, &message).await;
                return Ok(Outcome::Waiting {
                    reason: message,
                    retry_after: None,
                });
            }
            Err(error) => return Err(error),
        }
    }
    // Tokens only for a bound pod: its first ones are minted after the binding (`up`), to name its node.
    if let Some(needs) = token::needs_of(super_pod.meta())
        && tenant_pod.spec.node_name.is_some()
    {
        writes += match token::secret_of(super_pod.meta()) {
            Some(shard) => token_secrets::keep(ctx, tenant, tenant_pod, super_pod, shard, &needs).await?,
            // A pod of an earlier version reads a token Secret of its own.
            None => refresh_token(ctx, tenant, tenant_pod, super_pod, &needs).await?,
        };
    }
    writes += sync_readiness_gates(ctx, tenant_pod, super_pod, api).await?;
    Ok(match (ephemeral.waiting, writes) {
        (Some(reason), _) => Outcome::Waiting {
            reason,
            retry_after: Some(Duration::from_secs(1)),
        },
        (None, 0) => Outcome::InSync,
        (None, writes) => Outcome::Updated { writes },
    })
}

/// The super pod as it is, with the tenant's metadata, images and deadline, and the added tolerations.
fn updated_pod(super_pod: &Pod, metadata: ObjectMeta, tenant: &CachedPodSpec, added: &[Toleration]) -> Pod {
    let mut spec = super_pod.spec.clone().unwrap_or_default();
    if !added.is_empty() {
        spec.tolerations
            .get_or_insert_with(Vec::new)
            .extend(added.iter().cloned());
    }
    let image_of = |containers: &[crate::cache::pods::ContainerImage], name: &str| {
        containers
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.image.clone())
    };
    for container in &mut spec.containers {
        if let Some(image) = image_of(&tenant.containers, &container.name) {
            container.image = Some(image);
        }
    }
    for container in spec.init_containers.iter_mut().flatten() {
        if let Some(image) = image_of(&tenant.init_containers, &container.name) {
            container.image = Some(image);
        }
    }
    spec.active_deadline_seconds = tenant.active_deadline_seconds;
    spec.node_name = None;
    // Ephemeral containers are the `ephemeralcontainers` subresource's: an apply of the pod that carried
    // them would own them, and one from a read that missed a container just added would remove it.
    spec.ephemeral_containers = None;
    Pod {
        metadata: ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            labels: metadata.labels,
            annotations: metadata.annotations,
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

async fn refresh_token(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    needs: &[TokenNeed],
) -> Result<u32> {
    let namespace = tenant_pod.namespace().unwrap_or_default();
    let name = tenant_pod.name_any();
    let super_namespace = super_pod.namespace().unwrap_or_default();
    let existing = ctx
        .supers
        .tokens
        .get(&ObjectRef::new(&token::secret_name(&name)).within(&super_namespace));
    let tenant_uid = tenant_pod.uid().unwrap_or_default();
    if !token::needs_refresh(
        existing.as_ref().map(|s| s.meta()),
        &tenant_uid,
        needs,
        token::now(),
    ) {
        if let Some(at) = existing.as_ref().and_then(|s| token::refresh_at(s.meta())) {
            // Keep a wake-up scheduled across restarts.
            schedule_refresh(ctx, tenant, &namespace, &name, at);
        }
        return Ok(0);
    }
    let subject = token::Subject {
        namespace: &namespace,
        name: &name,
        uid: &tenant_uid,
        service_account: tenant_pod.spec.service_account_name.as_deref(),
    };
    let minted = token::mint(tenant, &subject, needs, ctx.config.token_ttl_seconds).await?;
    write_token_secret(
        ctx,
        tenant,
        &subject,
        &super_namespace,
        &super_pod.uid().unwrap_or_default(),
        minted,
    )
    .await?;
    Ok(1)
}

/// Readiness-gate conditions set by tenant controllers go down to the super pod, whose readiness depends
/// on them.
async fn sync_readiness_gates(
    ctx: &Context,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    api: &Api<Pod>,
) -> Result<u32> {
    let gates = &tenant_pod.spec.readiness_gates;
    if gates.is_empty() {
        return Ok(0);
    }
    let wanted: Vec<PodCondition> = tenant_pod
        .status
        .conditions
        .iter()
        .filter(|c| gates.contains(&c.type_))
        .map(|c| PodCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_transition_time: Some(Time(Timestamp::now())),
            ..Default::default()
        })
        .collect();
    let have = super_pod
        .parsed_status()
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    let differs = wanted
        .iter()
        .any(|w| !have.iter().any(|h| h.type_ == w.type_ && h.status == w.status));
    if wanted.is_empty() || !differs {
        return Ok(0);
    }
    let status = Pod {
        metadata: ObjectMeta {
            name: Some(super_pod.name_any()),
            ..Default::default()
        },
        status: Some(PodStatus {
            conditions: Some(wanted),
            ..Default::default()
        }),
        ..Default::default()
    };
    ctx.metrics.super_write("pod", "apply");
    api.patch_status(
        &super_pod.name_any(),
        &crate::resources::write::apply_params().force(),
        &Patch::Apply(&status),
    )
    .await
    .map_err(on_super(format!(
        "setting readiness gates of pod {}",
        super_pod.name_any()
    )))?;
    Ok(1)
}

#[cfg(test)]
mod tests {
    use crds::TenantQuota;
    use k8s_openapi::{api::core::v1::Namespace, apimachinery::pkg::api::resource::Quantity};
    use serde_json::json;

    use super::*;
    use std::sync::Arc;

    use crate::{
        engine::context::testing::{self, from_json, put},
        accounting::quota::Usage,
        tenancy::settings::TenantSettings,
    };

    const HELD: &str = "tenant quota pods exceeded: 1 in use, 1 asked for, limit 1";

    fn pod_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "second", "namespace": "ns", "uid": "pod-uid", "resourceVersion": "7"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": REASON_QUOTA_EXCEEDED, "message": HELD}]}
        })
    }

    fn quota(pods: &str) -> TenantSettings {
        TenantSettings {
            quota: Some(TenantQuota {
                pods: Some(Quantity(pods.into())),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_waiting_pod_is_looked_at_from_the_cache_and_created_once_the_quota_is_raised() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, quota("1"));
        let one = Usage {
            pods: 1,
            ..Default::default()
        };
        let limit = tenant.settings().quota.clone();
        assert!(
            ctx.quota
                .admit(&tenant.id, limit.as_ref(), "ns", "first", one)
                .is_ok()
        );
        let held = ctx
            .quota
            .admit(&tenant.id, limit.as_ref(), "ns", "second", one)
            .expect_err("held");
        assert_eq!(held.to_string(), HELD);
        put(&mut caches.pods, from_json(pod_json()));
        put(
            &mut super_caches.namespaces,
            from_json::<Namespace>(json!({"metadata": {"name": "team-abc123-vc-ns", "annotations": {
                "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "ns"}}})),
        );
        let item = DownItem::new(Kind::Pod, "ns", "second");

        // Queued again while it still does not fit: no read, no write (the tenant already shows why).
        let outcome = sync(&ctx, &tenant, &item).await.expect("synced");
        assert!(matches!(outcome, Outcome::Waiting { .. }), "{outcome:?}");
        tenants.idle().await;

        // The quota is raised: the pod is queued and created from the cached spec of the unbound pod,
        // with no read of the tenant.
        assert!(crate::tenancy::attach::update_settings(&ctx, &tenant, quota("2")));
        assert_eq!(testing::drain_down(&ctx).await, std::slice::from_ref(&item));
        let (outcome, ()) = tokio::join!(sync(&ctx, &tenant, &item), async {
            let created = supers
                .expect("POST", "/api/v1/namespaces/team-abc123-vc-ns/pods?")
                .await;
            created.echo();
        });
        assert_eq!(outcome.expect("synced"), Outcome::Created { writes: 1 });
        assert!(!ctx.quota.is_waiting(&tenant.id, "ns", "second"));
        assert_eq!(ctx.quota.used(&tenant.id).pods, 2);
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_pod_the_super_cluster_refuses_is_told_to_the_tenant_and_retried_later() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let mut pod = pod_json();
        pod["status"] = json!({"phase": "Pending"});
        put(&mut caches.pods, from_json(pod));
        put(
            &mut super_caches.namespaces,
            from_json::<Namespace>(json!({"metadata": {"name": "team-abc123-vc-ns", "annotations": {
                "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "ns"}}})),
        );
        let item = DownItem::new(Kind::Pod, "ns", "second");
        let (outcome, ()) = tokio::join!(sync(&ctx, &tenant, &item), async {
            supers
                .expect("POST", "/api/v1/namespaces/team-abc123-vc-ns/pods?")
                .await
                .fail(403, "Forbidden", "pods \"second\" is forbidden: maximum cpu usage per Container is 2, but limit is 4");
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/ns/events")
                .await;
            assert_eq!(event.body["reason"], REASON_REFUSED_BY_SUPER_CLUSTER);
            let note = event.body["note"].as_str().unwrap_or_default().to_owned();
            assert!(note.contains("maximum cpu usage per Container is 2"), "{note}");
            event.echo();
        });
        match outcome.expect("synced") {
            Outcome::Waiting { retry_after, .. } => assert_eq!(retry_after, Some(REFUSED_RETRY)),
            other => panic!("{other:?}"),
        }
        supers.idle().await;
        tenants.idle().await;
    }

    #[test]
    fn only_admission_refusals_are_the_tenants_to_see() {
        let refusal = |code: u16, message: &str| {
            crate::error::on_super("creating pod")(kube::Error::Api(
                kube::core::Status::failure(message, "Forbidden")
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert!(refused_by_admission(&refusal(403, "pod rejected: RuntimeClass \"x\" not found")));
        assert!(refused_by_admission(&refusal(422, "spec.containers[0].image: Required value")));
        assert!(refused_by_admission(&refusal(403, "admission webhook \"a.example.com\" denied the request")));
        // The syncer's own rights are the platform's problem, not told to tenants.
        assert!(!refused_by_admission(&refusal(
            403,
            "pods is forbidden: User \"system:serviceaccount:vc:syncer\" cannot create resource \"pods\""
        )));
        assert!(!refused_by_admission(&refusal(500, "etcdserver: request timed out")));
    }

    #[test]
    fn a_pod_recreated_after_a_pause_prefers_its_node_and_keeps_its_own_affinity() {
        let mut pod: Pod = from_json(json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "app", "image": "nginx"}], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}
        }));
        prefer_node(&mut pod, "node-1");
        let affinity = serde_json::to_value(&pod.spec.as_ref().expect("spec").affinity).expect("json");
        assert_eq!(
            affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
            json!([{"weight": 100, "preference": {"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}}])
        );
        assert_eq!(
            affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
                ["matchExpressions"][0]["key"],
            "zone"
        );
    }

    /// A running pod as the tenant changed it, and its super pod as created before the change.
    fn running(image: &str, cpu: &str, tolerations: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid", "resourceVersion": "3"},
            "spec": {"containers": [{"name": "c", "image": image,
                "resources": {"requests": {"cpu": cpu}, "limits": {"memory": "64Mi"}}}],
                "tolerations": tolerations},
            "status": {"phase": "Running", "podIP": "10.0.0.9"}
        })
    }

    fn super_pod(annotations: serde_json::Value) -> serde_json::Value {
        let mut pod = running("busybox:1", "100m", json!([]));
        pod["metadata"]["namespace"] = json!("team-abc123-vc-shop");
        pod["metadata"]["uid"] = json!("super-uid");
        pod["metadata"]["annotations"] = annotations;
        // The super cluster's LimitRange added a default the tenant does not state.
        pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("1");
        pod
    }

    fn identity_annotations() -> serde_json::Value {
        json!({"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "shop",
            "tenancy.x-k8s.io/uid": "pod-uid"})
    }

    struct Running {
        ctx: Context,
        tenant: Arc<Tenant>,
        supers: testing::ApiServer,
        tenants: testing::ApiServer,
        super_caches: crate::cache::super_stores::Writers,
    }

    fn running_pod(tenant_pod: serde_json::Value, super_annotations: serde_json::Value) -> Running {
        let (super_client, supers) = testing::mock();
        let (tenant_client, tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(&mut caches.pods, from_json(tenant_pod));
        put(&mut super_caches.pods, from_json(super_pod(super_annotations)));
        put(
            &mut super_caches.namespaces,
            from_json::<Namespace>(json!({"metadata": {"name": "team-abc123-vc-shop", "annotations": {
                "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "shop"}}})),
        );
        Running {
            ctx,
            tenant,
            supers,
            tenants,
            super_caches,
        }
    }

    const POD: &str = "/api/v1/namespaces/team-abc123-vc-shop/pods/web";

    /// The token Secret of a pod created by an earlier version, as the metadata cache holds it.
    fn legacy_token_secret(issued: i64, expires: i64) -> kube::core::PartialObjectMeta<Secret> {
        from_json(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "web.vc-token", "namespace": "team-abc123-vc-shop",
            "labels": {"tenancy.x-k8s.io/pod-token": "true"},
            "annotations": {"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "shop",
                "tenancy.x-k8s.io/uid": "pod-uid", "tenancy.x-k8s.io/token-for-pod": "web",
                (token::ANNOTATION_TOKEN_KEYS): "token",
                (token::ANNOTATION_TOKEN_ISSUED): issued.to_string(),
                (token::ANNOTATION_TOKEN_EXPIRES): expires.to_string()}}}))
    }

    #[tokio::test]
    async fn a_pod_of_an_earlier_version_keeps_its_own_token_secret_refreshed() {
        let needs = [TokenNeed {
            key: "token".into(),
            audience: None,
            expiration_seconds: None,
        }];
        let Running {
            ctx,
            tenant,
            mut supers,
            mut tenants,
            mut super_caches,
        } = running_pod(running("busybox:1", "100m", json!([])), identity_annotations());
        let tenant_pod = tenant
            .stores
            .pods
            .get(&ObjectRef::new("web").within("shop"))
            .expect("tenant pod");
        let super_pod = ctx
            .supers
            .pods
            .get(&ObjectRef::new("web").within("team-abc123-vc-shop"))
            .expect("super pod");
        let now = token::now();

        // In sync (a restart): nothing is asked or written.
        crate::engine::context::testing::put(&mut super_caches.tokens, legacy_token_secret(now - 10, now + 3590));
        let kept = refresh_token(&ctx, &tenant, &tenant_pod, &super_pod, &needs).await;
        assert_eq!(kept.expect("kept"), 0);
        supers.idle().await;
        tenants.idle().await;

        // Due: minted again and applied to the pod's own Secret, not to a shared one.
        crate::engine::context::testing::put(&mut super_caches.tokens, legacy_token_secret(now - 3000, now + 500));
        let (refreshed, ()) = tokio::join!(refresh_token(&ctx, &tenant, &tenant_pod, &super_pod, &needs), async {
            let call = tenants
                .expect("POST", "/api/v1/namespaces/shop/serviceaccounts/default/token?")
                .await;
            assert_eq!(call.body["spec"]["boundObjectRef"]["uid"], "pod-uid");
            let spec = call.body["spec"].clone();
            call.ok(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec,
                "status": {"token": "jwt", "expirationTimestamp": "2030-01-01T00:00:00Z"}}));
            let applied = supers
                .expect("PATCH", "/api/v1/namespaces/team-abc123-vc-shop/secrets/web.vc-token?")
                .await;
            assert_eq!(applied.body["metadata"]["ownerReferences"][0]["uid"], "super-uid");
            applied.echo();
        });
        assert_eq!(refreshed.expect("refreshed"), 1);
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn image_allowed_tolerations_and_resources_of_a_running_pod_reach_the_super_pod() {
        let tolerations = json!([
            {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
        ]);
        let Running {
            ctx,
            tenant,
            mut supers,
            mut tenants,
            ..
        } = running_pod(running("busybox:2", "200m", tolerations), identity_annotations());
        let item = DownItem::new(Kind::Pod, "shop", "web");
        let (outcome, ()) = tokio::join!(sync(&ctx, &tenant, &item), async {
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], REASON_POLICY_VIOLATION);
            let note = event.body["note"].as_str().unwrap_or_default().to_owned();
            assert!(note.contains("toleration of taint dedicated=gpu"), "{note}");
            assert!(!note.contains("disk-pressure"), "{note}");
            event.echo();
            let resize = supers.expect("PATCH", &format!("{POD}/resize?")).await;
            assert_eq!(
                resize.body,
                json!({"spec": {"containers": [{"name": "c",
                    "resources": {"requests": {"cpu": "200m"}, "limits": {"memory": "64Mi"}}}]}})
            );
            resize.ok(json!({}));
            // After a resize the pod is read as it is now, not from the watch cache.
            let read = supers.expect("GET", POD).await;
            assert!(!read.uri.contains("resourceVersion"), "{}", read.uri);
            let mut resized = super_pod(identity_annotations());
            resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("200m");
            // Created by POST: the syncer's fields are an Update entry, made its applied ones first.
            resized["metadata"]["managedFields"] = json!([
                {"manager": "vc-syncer", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:stage": {}}}}},
                {"manager": "vc-syncer", "operation": "Update", "subresource": "resize", "apiVersion": "v1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}
            ]);
            read.ok(resized);
            let adopted = supers.expect("PATCH", &format!("{POD}?")).await;
            assert_eq!(adopted.body["metadata"]["resourceVersion"], "3", "{}", adopted.body);
            assert_eq!(
                adopted.body["metadata"]["managedFields"],
                json!([
                    {"manager": "vc-syncer", "operation": "Update", "subresource": "resize", "apiVersion": "v1",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}},
                    {"manager": "vc-syncer", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:metadata": {"f:labels": {"f:stage": {}}}}}
                ])
            );
            adopted.ok(json!({}));
            let applied = supers.expect("PATCH", &format!("{POD}?")).await;
            assert!(applied.uri.contains("force=true"), "{}", applied.uri);
            // Bodies are typed: the apiserver's strict second decoding is asked off.
            assert!(applied.uri.contains("fieldValidation=Ignore"), "{}", applied.uri);
            let container = &applied.body["spec"]["containers"][0];
            assert_eq!(container["image"], "busybox:2");
            assert_eq!(container["resources"]["requests"]["cpu"], "200m");
            assert_eq!(
                applied.body["spec"]["tolerations"],
                json!([{"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"}])
            );
            assert!(
                applied.body["metadata"]["annotations"][ANNOTATION_REFUSED_TOLERATIONS].is_string(),
                "{}",
                applied.body
            );
            applied.echo();
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 3 });
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_resize_the_super_cluster_does_not_serve_is_told_once() {
        let Running {
            ctx,
            tenant,
            mut supers,
            mut tenants,
            mut super_caches,
        } = running_pod(running("busybox:1", "200m", json!([])), identity_annotations());
        let item = DownItem::new(Kind::Pod, "shop", "web");
        let (outcome, recorded) = tokio::join!(sync(&ctx, &tenant, &item), async {
            supers
                .expect("PATCH", &format!("{POD}/resize?"))
                .await
                .fail(404, "NotFound", "the server could not find the requested resource");
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], REASON_RESIZE_REFUSED);
            let note = event.body["note"].as_str().unwrap_or_default().to_owned();
            assert!(
                note.contains("spec.containers[c].resources")
                    && note.contains("could not find the requested resource"),
                "{note}"
            );
            event.echo();
            let read = supers.expect("GET", POD).await;
            read.ok(super_pod(identity_annotations()));
            let applied = supers.expect("PATCH", &format!("{POD}?")).await;
            assert_eq!(applied.body["spec"]["containers"][0]["resources"]["requests"]["cpu"], "100m");
            applied.echo()["metadata"].clone()
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        assert!(
            recorded["annotations"][ANNOTATION_REFUSED_RESIZE].is_string(),
            "{recorded}"
        );

        // Synced again with the refusal recorded: nothing is asked or told again.
        let mut refused = super_pod(recorded["annotations"].clone());
        refused["metadata"]["labels"] = recorded["labels"].clone();
        put(&mut super_caches.pods, from_json(refused));
        let outcome = tokio::time::timeout(Duration::from_secs(5), sync(&ctx, &tenant, &item)).await;
        assert_eq!(outcome.expect("no request").expect("synced"), Outcome::InSync);
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn an_image_change_the_super_cluster_refuses_is_told_with_its_reason() {
        let Running {
            ctx,
            tenant,
            mut supers,
            mut tenants,
            ..
        } = running_pod(running("busybox:2", "100m", json!([])), identity_annotations());
        let item = DownItem::new(Kind::Pod, "shop", "web");
        let sync = sync(&ctx, &tenant, &item);
        let (outcome, ()) = tokio::join!(sync, async {
            supers
                .expect("GET", POD)
                .await
                .ok(super_pod(identity_annotations()));
            supers.expect("PATCH", &format!("{POD}?")).await.fail(
                422,
                "Invalid",
                "admission webhook \"images.example.com\" denied the request: registry not allowed",
            );
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], REASON_UPDATE_REFUSED);
            let note = event.body["note"].as_str().unwrap_or_default().to_owned();
            assert!(
                note.contains("spec.containers[c].image") && note.contains("registry not allowed"),
                "{note}"
            );
            event.echo();
        });
        assert!(matches!(outcome.expect("synced"), Outcome::Waiting { .. }));
        supers.idle().await;
        tenants.idle().await;
    }

    /// A running pod to which the tenant added ephemeral containers (`kubectl debug`), one of them
    /// privileged.
    fn debugged() -> serde_json::Value {
        let mut pod = running("busybox:1", "100m", json!([]));
        pod["spec"]["ephemeralContainers"] = json!([
            {"name": "dbg", "image": "busybox", "targetContainerName": "c", "stdin": true, "tty": true,
                "env": [{"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]},
            {"name": "root", "image": "busybox", "securityContext": {"privileged": true}}
        ]);
        pod
    }

    #[tokio::test]
    async fn ephemeral_containers_reach_the_running_super_pod_and_a_refused_one_is_told_once() {
        let Running {
            ctx,
            tenant,
            mut supers,
            mut tenants,
            mut super_caches,
        } = running_pod(debugged(), identity_annotations());
        let item = DownItem::new(Kind::Pod, "shop", "web");
        let (outcome, recorded) = tokio::join!(sync(&ctx, &tenant, &item), async {
            // The cache keeps names and images: the whole pod is read to translate the new containers.
            tenants
                .expect("GET", "/api/v1/namespaces/shop/pods/web?")
                .await
                .ok(debugged());
            let added = supers.expect("PATCH", &format!("{POD}/ephemeralcontainers?")).await;
            assert_eq!(added.body["metadata"]["uid"], "super-uid");
            let containers = added.body["spec"]["ephemeralContainers"].as_array().cloned().unwrap_or_default();
            assert_eq!(containers.len(), 1, "{}", added.body);
            assert_eq!(containers[0]["name"], "dbg");
            assert_eq!(containers[0]["targetContainerName"], "c");
            assert_eq!(containers[0]["env"][0], json!({"name": "MY_NS", "value": "shop"}));
            added.ok(json!({}));
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], REASON_POLICY_VIOLATION);
            let note = event.body["note"].as_str().unwrap_or_default().to_owned();
            assert!(note.contains("privileged ephemeral container \"root\""), "{note}");
            event.echo();
            // After an addition the pod is read as it is now, and applied without ephemeral containers,
            // which stay the subresource's.
            let read = supers.expect("GET", POD).await;
            assert!(!read.uri.contains("resourceVersion"), "{}", read.uri);
            let mut now = super_pod(identity_annotations());
            now["spec"]["ephemeralContainers"] = json!([{"name": "dbg", "image": "busybox"}]);
            read.ok(now);
            let applied = supers.expect("PATCH", &format!("{POD}?")).await;
            assert!(applied.body["spec"].get("ephemeralContainers").is_none(), "{}", applied.body);
            assert!(
                applied.body["metadata"]["annotations"][ephemeral::ANNOTATION_REFUSED].is_string(),
                "{}",
                applied.body
            );
            applied.echo()["metadata"].clone()
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 2 });

        // Synced again with the addition and the refusal recorded: nothing is asked or told again.
        let mut now = super_pod(recorded["annotations"].clone());
        now["metadata"]["labels"] = recorded["labels"].clone();
        now["spec"]["ephemeralContainers"] = json!([{"name": "dbg", "image": "busybox"}]);
        put(&mut super_caches.pods, from_json(now));
        let outcome = tokio::time::timeout(Duration::from_secs(5), sync(&ctx, &tenant, &item)).await;
        assert_eq!(outcome.expect("no request").expect("synced"), Outcome::InSync);
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn an_ephemeral_container_the_super_cluster_refuses_or_has_otherwise_is_told() {
        let mut tenant_pod = debugged();
        tenant_pod["spec"]["ephemeralContainers"] = json!([
            {"name": "dbg", "image": "busybox"},
            {"name": "old", "image": "busybox:2"}
        ]);
        let mut below = super_pod(identity_annotations());
        below["spec"]["ephemeralContainers"] = json!([{"name": "old", "image": "busybox:1"}]);
        let Running {
            ctx,
            tenant,
            mut supers,
            mut tenants,
            mut super_caches,
        } = running_pod(tenant_pod.clone(), identity_annotations());
        put(&mut super_caches.pods, from_json(below.clone()));
        let item = DownItem::new(Kind::Pod, "shop", "web");
        let (outcome, recorded) = tokio::join!(sync(&ctx, &tenant, &item), async {
            tenants
                .expect("GET", "/api/v1/namespaces/shop/pods/web?")
                .await
                .ok(tenant_pod.clone());
            supers
                .expect("PATCH", &format!("{POD}/ephemeralcontainers?"))
                .await
                .fail(422, "Invalid", "pods \"web\" is forbidden: violates PodSecurity \"baseline:latest\"");
            // Both in one event, each container named.
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], ephemeral::REASON_EPHEMERAL_REFUSED);
            let note = event.body["note"].as_str().unwrap_or_default().to_owned();
            assert!(note.contains("\"old\"") && note.contains("never changed"), "{note}");
            assert!(note.contains("\"dbg\"") && note.contains("violates PodSecurity"), "{note}");
            event.echo();
            supers.expect("GET", POD).await.ok(below.clone());
            let applied = supers.expect("PATCH", &format!("{POD}?")).await;
            let told = applied.body["metadata"]["annotations"][ephemeral::ANNOTATION_REFUSED]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert_eq!(told.split(',').count(), 2, "{}", applied.body);
            applied.echo()["metadata"].clone()
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });

        // Told once: with the refusals recorded nothing is tried or told again.
        let mut now = below;
        now["metadata"]["annotations"] = recorded["annotations"].clone();
        now["metadata"]["labels"] = recorded["labels"].clone();
        put(&mut super_caches.pods, from_json(now));
        let outcome = tokio::time::timeout(Duration::from_secs(5), sync(&ctx, &tenant, &item)).await;
        assert_eq!(outcome.expect("no request").expect("synced"), Outcome::InSync);
        supers.idle().await;
        tenants.idle().await;
    }

    /// A pod that failed before its copy was placed (its node refused it) loses the copy, so the super
    /// scheduler never starts it later; once the copy is gone, the failed pod stays as it is, with no copy
    /// made again and nothing deleted as lost.
    #[tokio::test]
    async fn a_pod_that_failed_before_its_copy_was_placed_keeps_no_copy() {
        let mut failed = running("busybox:1", "100m", json!([]));
        failed["spec"]["nodeName"] = json!("node-1");
        failed["status"] = json!({"phase": "Failed", "reason": "NodePorts",
            "message": "Pod was rejected: node node-1 cannot run it"});
        let Running {
            ctx,
            tenant,
            mut supers,
            mut tenants,
            mut super_caches,
        } = running_pod(failed, identity_annotations());
        let item = DownItem::new(Kind::Pod, "shop", "web");
        let (outcome, ()) = tokio::join!(sync(&ctx, &tenant, &item), async {
            let call = supers.expect("DELETE", &format!("{POD}?")).await;
            assert_eq!(call.body["preconditions"]["uid"], "super-uid");
            call.echo();
        });
        assert_eq!(outcome.expect("synced"), Outcome::Deleted);

        let copy: SuperPod = from_json(super_pod(identity_annotations()));
        super_caches
            .pods
            .apply_watcher_event(&kube::runtime::watcher::Event::Delete(copy));
        let outcome = tokio::time::timeout(Duration::from_secs(5), sync(&ctx, &tenant, &item)).await;
        assert_eq!(outcome.expect("no request").expect("synced"), Outcome::InSync);
        supers.idle().await;
        tenants.idle().await;
    }
}
