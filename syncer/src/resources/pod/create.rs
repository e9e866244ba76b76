//! A tenant pod's copy created: the quota's hold, the tenant DNS and endpoints it needs, the conversion
//! with the pod policy and the tenant's node selection, the quota's admission, and the POST.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Node, Pod, PodCondition, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{GetParams, Patch},
    runtime::reflector::ObjectRef,
};

use super::{
    convert::{self, Converted, PodConversion, Refusal, TenantEndpoints},
    desired::{desired_state, with_annotation},
    placement::{self, Candidate, Resolved},
    plan::was_scheduled,
    refusal::{REASON_POLICY_VIOLATION, super_refusal},
    tenant_endpoints::tenant_endpoints,
};
use crate::{
    accounting::quota::REASON_QUOTA_EXCEEDED,
    cache::pods::{POD_SCHEDULED, TenantPod},
    engine::{context::Context, events},
    error::{Result, on_tenant},
    tokens::mounts::{self, UNASSIGNED_TOKEN_SECRET},
    resources::{
        claim, namespace,
        outcome::Outcome,
        public,
        runtime_class::{self, RuntimeClassChoice},
        vnode, write,
    },
    tenancy::{identity, tenant::Tenant},
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

/// Creates the copy of a tenant pod that has none: admitted by the pod policy and the quota, converted,
/// placed in the tenant's node selection, written by one POST.
pub(super) async fn create(
    ctx: &Context,
    tenant: &Tenant,
    cached: &TenantPod,
    api: &Api<Pod>,
) -> Result<Outcome> {
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
    let asked_runtime_class = tenant_pod
        .spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.as_deref());
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
            events::refuse(&ctx.metrics, tenant, Some(&cached.object_ref(&())), "pod", reason, &refusal.to_string()).await;
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
        let reference = cached.object_ref(&());
        events::refuse(&ctx.metrics, tenant, Some(&reference), "pod", REASON_RESOURCES_REQUIRED, &message).await;
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
        ctx.tokens
            .mount(ctx, &mut pod, &converted.tokens, &api_namespace(api), tenant_pod);
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
            events::refuse(&ctx.metrics, tenant, Some(&tenant_pod.object_ref(&())), "pod", reason, &message).await;
            return Ok(Outcome::Waiting {
                reason: message,
                retry_after,
            });
        }
    };
    writes += 1;
    Ok(Outcome::Created { writes })
}

/// The cluster IP of the tenant DNS Service (vc-dns), read from the super cluster once a minute; `Err`
/// with a reason while it cannot be read.
async fn tenant_dns_ip(
    ctx: &Context,
    service: &crate::resources::pod::flags::TenantDnsService,
) -> Result<String, String> {
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
    let token_key_prefix = mounts::key_prefix(&pod.name_any());
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
        token_secret: UNASSIGNED_TOKEN_SECRET,
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
    if ctx.config.vnode_mode == crate::resources::vnode::flags::VNodeMode::Pods {
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
    ctx.metrics.resources.tenant_write("pod", "status");
    let params = crate::resources::write::apply_params().force();
    if let Err(error) = api
        .patch_status(&tenant_pod.name_any(), &params, &Patch::Apply(&status))
        .await
    {
        tracing::warn!(error = &error as &dyn std::error::Error, "setting the quota condition");
    }
}

/// The namespace an `Api` of a namespace serves.
fn api_namespace(api: &Api<Pod>) -> String {
    api.namespace().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::engine::context::testing::from_json;

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
            affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                [0]["matchExpressions"][0]["key"],
            "zone"
        );
    }
}
