//! Tenant pods synced up: binding to a vNode once the super pod is scheduled, status, and the completed
//! deletion of a pod whose super pod is gone.

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kube::{Api, api::PostParams, runtime::reflector::ObjectRef};

use super::{
    end::{finalize_tenant_pod, has_ended, write_status},
    plan::was_scheduled,
};
use crate::{
    cache::pods::{
        CachedCondition, ContainerImage, POD_SCHEDULED, SuperPod, TenantPod, TenantPodStatus,
        container_statuses_hash,
    },
    engine::{context::Context, events},
    error::{Result, on_tenant},
    resources::{
        outcome::Outcome,
        upward::{matching_super, transparent},
        vnode,
    },
    tenancy::tenant::Tenant,
    tokens::shards::Bound,
};

/// The tenant pod's status as the super pod reports it; condition types the tenant's own controllers
/// manage (readiness gates) stay theirs, and only the tenant's own ephemeral containers are reported (one
/// the platform added to the super pod to debug it is not the tenant's to see).
fn status_from_super(super_status: PodStatus, gates: &[String], ephemeral: &[ContainerImage]) -> PodStatus {
    let ephemeral_container_statuses = super_status
        .ephemeral_container_statuses
        .map(|statuses| {
            statuses
                .into_iter()
                .filter(|s| ephemeral.iter().any(|c| c.name == s.name))
                .collect::<Vec<_>>()
        })
        .filter(|statuses| !statuses.is_empty());
    PodStatus {
        phase: super_status.phase,
        message: super_status.message,
        reason: super_status.reason,
        host_ip: super_status.host_ip,
        pod_ip: super_status.pod_ip,
        pod_ips: super_status.pod_ips,
        start_time: super_status.start_time,
        conditions: super_status
            .conditions
            .map(|cs| cs.into_iter().filter(|c| !gates.contains(&c.type_)).collect()),
        container_statuses: super_status.container_statuses,
        init_container_statuses: super_status.init_container_statuses,
        ephemeral_container_statuses,
        ..Default::default()
    }
}

/// Whether every field of `want` is already on the cached tenant status.
fn status_matches(want: &PodStatus, have: &TenantPodStatus) -> bool {
    let conditions_present = want.conditions.iter().flatten().all(|w| {
        have.conditions
            .iter()
            .any(|h| h.type_ == w.type_ && h.status == w.status && h.reason == w.reason)
    });
    want.phase == have.phase
        && want.pod_ip == have.pod_ip
        && want.host_ip == have.host_ip
        && want.message == have.message
        && want.reason == have.reason
        && container_statuses_hash(want.container_statuses.as_deref().unwrap_or_default())
            == have.container_statuses
        && container_statuses_hash(want.init_container_statuses.as_deref().unwrap_or_default())
            == have.init_container_statuses
        && container_statuses_hash(want.ephemeral_container_statuses.as_deref().unwrap_or_default())
            == have.ephemeral_container_statuses
        && conditions_present
}

/// A tenant pod's status after its binding: the apiserver sets `PodScheduled=True` (no reason) itself, as
/// for any bound pod, so a super status that says no more than that costs no status write of its own.
fn bound_status(before: &TenantPodStatus) -> TenantPodStatus {
    let mut conditions: Vec<CachedCondition> = before
        .conditions
        .iter()
        .filter(|c| c.type_ != POD_SCHEDULED)
        .cloned()
        .collect();
    conditions.push(CachedCondition {
        type_: POD_SCHEDULED.to_owned(),
        status: "True".to_owned(),
        reason: None,
        message: None,
    });
    TenantPodStatus {
        conditions: conditions.into(),
        ..before.clone()
    }
}

/// Why the node a tenant bound its pod to refuses it, as that node's kubelet would say: `Some((reason,
/// message))` once the super scheduler reports that the node cannot take the pod's copy.
///
/// A pod created with `spec.nodeName` skips the scheduler, and on a plain cluster the named node's kubelet
/// admits it or fails it at once (host port taken, no room); controllers rely on that (a StatefulSet makes
/// a failed pod again). Its copy requires that node of the super scheduler, which would instead keep it
/// Pending until the node has room, and the tenant's pod would wait for ever.
fn rejected_by_node(
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    super_status: &PodStatus,
) -> Option<(String, String)> {
    let node = tenant_pod.spec.node_name.as_deref()?;
    if super_pod.spec.node_name.is_some()
        || was_scheduled(tenant_pod)
        || has_ended(tenant_pod)
        || tenant_pod.meta().deletion_timestamp.is_some()
    {
        return None;
    }
    let unschedulable = super_status.conditions.iter().flatten().find(|c| {
        c.type_ == POD_SCHEDULED && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
    })?;
    let why = unschedulable.message.clone().unwrap_or_default();
    Some((
        admission_reason(&why),
        format!("Pod was rejected: node {node} cannot run it: {why}"),
    ))
}

/// The kubelet's admission reason for what the scheduler's message says first (`NodePorts`, `OutOfcpu`,
/// ...), else `Unschedulable`.
fn admission_reason(scheduler_message: &str) -> String {
    let lowered = scheduler_message.to_ascii_lowercase();
    let at = |needle: &str| lowered.find(needle);
    let ports = at("didn't have free ports").map(|i| (i, "NodePorts".to_owned()));
    let pods = at("too many pods").map(|i| (i, "OutOfpods".to_owned()));
    let insufficient = at("insufficient ").map(|i| {
        let resource = scheduler_message[i + "insufficient ".len()..]
            .split(|c: char| c == ',' || c.is_whitespace())
            .next()
            .unwrap_or_default()
            .trim_end_matches('.');
        (i, format!("OutOf{resource}"))
    });
    [ports, pods, insufficient]
        .into_iter()
        .flatten()
        .min_by_key(|(i, _)| *i)
        .map(|(_, reason)| reason)
        .unwrap_or_else(|| "Unschedulable".to_owned())
}

/// Syncs one tenant pod up: binding to a vNode, its first tokens, status, completed deletion.
pub async fn pod(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str) -> Result<Outcome> {
    let Some(tenant_pod) = tenant.stores.pods.get(&ObjectRef::new(name).within(namespace)) else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(namespace);
    let super_pod = ctx
        .supers
        .pods
        .copies
        .get(&ObjectRef::new(name).within(&super_namespace));
    let Some(super_pod) = matching_super(super_pod, tenant, tenant_pod.uid()) else {
        if tenant_pod.meta().deletion_timestamp.is_some() {
            return finalize_tenant_pod(ctx, tenant, &tenant_pod).await;
        }
        return Ok(Outcome::InSync);
    };
    let mut writes = 0;
    let api: Api<Pod> = Api::namespaced(tenant.client.clone(), namespace);

    let node = super_pod
        .spec
        .node_name
        .as_deref()
        .and_then(|node| ctx.supers.nodes.get(&ObjectRef::new(node)));
    if let Some(lost) = evicted_from_lost_node(&tenant_pod, &super_pod, node.as_deref()) {
        return delete_evicted(ctx, tenant, &tenant_pod, &api, &lost).await;
    }

    let mut bound = false;
    let tenant_node = &tenant_pod.spec.node_name;
    let super_node = &super_pod.spec.node_name;
    let uid = tenant_pod.uid().unwrap_or_default();
    if tenant_node.is_some() {
        tenant.state.pods.forget(&uid);
    }
    let bound_lately = super_node
        .as_deref()
        .is_some_and(|node| tenant_node.is_none() && tenant.state.pods.bound_to(&uid, node));
    if bound_lately {
        // Bound by an earlier pass whose watch event has not reached the cache yet.
        bound = true;
    } else if let (None, Some(node), None) = (tenant_node, super_node, &tenant_pod.meta().deletion_timestamp)
    {
        writes += vnode::ensure(ctx, tenant, node).await?;
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": { "name": name, "uid": tenant_pod.uid() },
            "target": { "apiVersion": "v1", "kind": "Node", "name": node },
        });
        ctx.metrics.resources.tenant_write("pod", "bind");
        match api
            .create_subresource::<_, serde_json::Value>("binding", name, &PostParams::default(), &binding)
            .await
        {
            Ok(_) => {
                writes += 1;
                bound = true;
                tenant.state.pods.record(&uid, node);
            }
            // Bound meanwhile (409) or gone (404): the next event shows the current state.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => {
                return Err(on_tenant(
                    &tenant.identity.cluster_key,
                    format!("binding pod {namespace}/{name} to {node}"),
                )(e));
            }
        }
    }

    let super_status = super_pod.parsed_status();
    if let Some((reason, message)) = super_status
        .as_ref()
        .and_then(|status| rejected_by_node(&tenant_pod, &super_pod, status))
    {
        // The down worker removes the copy once the cache shows the pod failed, so it never starts later.
        tracing::info!(%reason, "{message}");
        events::warn(tenant, &tenant_pod.object_ref(&()), &reason, &message).await;
        let failed = PodStatus {
            phase: Some("Failed".to_owned()),
            reason: Some(reason),
            message: Some(message),
            ..Default::default()
        };
        writes += write_status(ctx, tenant, &api, namespace, name, failed).await?;
        return Ok(match writes {
            0 => Outcome::InSync,
            writes => Outcome::Updated { writes },
        });
    }

    // The first tokens of a bound pod, and its status: the tokens go to the super cluster (its kubelet is
    // waiting for them), the status to the tenant, so neither waits for the other.
    let tokens = async {
        if (bound || tenant_node.is_some()) && tenant_pod.meta().deletion_timestamp.is_none() {
            ctx.tokens.put_bound(ctx, tenant, &tenant_pod, &super_pod).await
        } else {
            Ok(Bound::Written(0))
        }
    };
    let status = async {
        // An ended pod's phase never changes again: a copy that has not ended (one its node refused, on its
        // way out) has nothing more to tell.
        let super_ended = matches!(
            super_status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let Some(super_status) = super_status.filter(|_| super_ended || !has_ended(&tenant_pod)) else {
            return Ok(0);
        };
        let want = status_from_super(
            super_status,
            &tenant_pod.spec.readiness_gates,
            &tenant_pod.spec.ephemeral_containers,
        );
        let after_binding;
        let have = if bound {
            after_binding = bound_status(&tenant_pod.status);
            &after_binding
        } else {
            &tenant_pod.status
        };
        if status_matches(&want, have) {
            return Ok(0);
        }
        write_status(ctx, tenant, &api, namespace, name, want).await
    };
    let (tokens, status) = tokio::join!(tokens, status);
    match tokens? {
        Bound::Written(written) => writes += written,
        // The tenant was told; the pod waits for the token.
        Bound::NotIssued {
            message,
            retry_after,
        } => {
            return Ok(Outcome::Waiting {
                reason: message,
                retry_after: Some(retry_after),
            });
        }
    }
    writes += status?;
    writes += transparent::<Pod>(ctx, tenant, tenant_pod.meta(), super_pod.meta()).await?;
    Ok(match writes {
        // A copy being deleted from a node the cache still shows Ready: looked at again, in case the
        // node's change arrives after the pod's (see `evicted_from_lost_node`).
        0 if super_pod.meta().deletion_timestamp.is_some()
            && tenant_pod.meta().deletion_timestamp.is_none()
            && !has_ended(&tenant_pod) =>
        {
            Outcome::Waiting {
                reason: "the super pod is being deleted; its node answers".into(),
                retry_after: Some(NODE_RECHECK),
            }
        }
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

/// How soon a tenant pod whose copy is being deleted from a node that answers is looked at again.
const NODE_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// Reason of the event on a tenant pod deleted because its node was lost.
pub const REASON_NODE_LOST: &str = "NodeLost";

/// Why the super cluster is deleting a pod's copy from a node that stopped answering.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LostNode {
    /// The node.
    node: String,
    /// What says it is lost: its `Ready` condition or a condition taint.
    why: String,
    /// The grace period the copy is deleted with.
    grace_period_seconds: Option<i64>,
}

/// Whether the super cluster is deleting the copy of a live tenant pod from a node that no longer answers
/// (the node lifecycle controller's taints evict it, or someone deletes it there): `Some` with the node and
/// why it counts as lost (its `Ready` condition is not `True`, or it has none and carries a condition taint).
///
/// On a plain cluster the tenant would see its pod terminating at that moment, and its controller would
/// replace it at once; the kubelet of a dead node never confirms the deletion, so waiting for the copy to
/// be gone (as for any other deletion) can wait for ever (v1.25 keeps such pods Terminating until the node
/// comes back or is deleted). Only a node that is not Ready counts: a pause
/// (which removes copies from live nodes and detaches the tenant first), a deletion by the tenant, a pod
/// that ended or a copy of another pod of the same name never get here.
fn evicted_from_lost_node(
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    node: Option<&Node>,
) -> Option<LostNode> {
    super_pod.meta().deletion_timestamp.as_ref()?;
    if tenant_pod.meta().deletion_timestamp.is_some() || has_ended(tenant_pod) {
        return None;
    }
    let node = node?;
    let name = super_pod.spec.node_name.clone()?;
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
    let taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|taints| {
            taints.iter().find(|t| {
                t.effect == "NoExecute"
                    && matches!(
                        t.key.as_str(),
                        "node.kubernetes.io/unreachable" | "node.kubernetes.io/not-ready"
                    )
            })
        });
    let why = match (ready, taint) {
        (Some(ready), _) if ready.status != "True" => format!(
            "its Ready condition is {}{}",
            ready.status,
            ready
                .reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
        // Ready: its kubelet confirms the deletion, as for any other.
        (Some(_), _) | (None, None) => return None,
        (None, Some(taint)) => format!("it is tainted {}:{}", taint.key, taint.effect),
    };
    Some(LostNode {
        node: name,
        why,
        grace_period_seconds: super_pod.meta().deletion_grace_period_seconds,
    })
}

/// Deletes a tenant pod whose copy the super cluster is evicting from a lost node (see
/// [`evicted_from_lost_node`]), with the copy's grace period and pinned to the pod's uid: the pod turns
/// Terminating and its controller replaces it, as on a plain cluster. Its deletion completes once the copy
/// is gone (the node came back, or was deleted).
async fn delete_evicted(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    api: &Api<Pod>,
    lost: &LostNode,
) -> Result<Outcome> {
    let namespace = tenant_pod.namespace().unwrap_or_default();
    let name = tenant_pod.name_any();
    let message = format!(
        "node {} stopped answering ({}) and the super cluster is deleting the pod's copy there; deleting the pod so that its controller replaces it",
        lost.node, lost.why
    );
    tracing::info!(node = %lost.node, reason = REASON_NODE_LOST, "{message}");
    events::warn(tenant, &tenant_pod.object_ref(&()), REASON_NODE_LOST, &message).await;
    let params = kube::api::DeleteParams {
        grace_period_seconds: lost.grace_period_seconds.and_then(|g| u32::try_from(g).ok()),
        preconditions: Some(kube::api::Preconditions {
            uid: tenant_pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    ctx.metrics.resources.tenant_write("pod", "delete");
    match api.delete(&name, &params).await {
        Ok(_) => Ok(Outcome::Updated { writes: 1 }),
        // Gone, or another pod of the name now: the next event shows which.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Outcome::InSync),
        Err(e) => Err(on_tenant(
            &tenant.identity.cluster_key,
            format!("deleting pod {namespace}/{name}, whose node was lost"),
        )(e)),
    }
}

#[cfg(test)]
mod tests;
