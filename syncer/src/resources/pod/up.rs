//! Tenant pods synced up: binding to a vNode once the super pod is scheduled, status, and the completed
//! deletion of a pod whose super pod is gone.

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kube::{Api, api::PostParams, runtime::reflector::ObjectRef};

use super::{
    end::{finalize_tenant_pod, has_ended, write_status},
    plan::was_scheduled,
    token_secrets,
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

/// Reason of the event on a bound tenant pod whose service account token its apiserver refused to issue.
pub const REASON_TOKEN_NOT_ISSUED: &str = "TokenNotIssued";

/// How soon a token the tenant apiserver refused is asked for again (the service account may be created).
const TOKEN_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

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
        tracing::info!(tenant = %tenant.identity.vc_ref(), %namespace, pod = %name, %reason, "{message}");
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
            token_secrets::put_bound(ctx, tenant, &tenant_pod, &super_pod).await
        } else {
            Ok(0)
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
    match tokens {
        Ok(written) => writes += written,
        Err(error) if error.is_tenant_refusal() => {
            let message = format!(
                "the tenant apiserver issued no service account token for the pod, whose containers wait for it: {}",
                error.status_message().unwrap_or_default()
            );
            tracing::warn!(tenant = %tenant.identity.vc_ref(), %namespace, pod = %name, reason = REASON_TOKEN_NOT_ISSUED, "{message}");
            ctx.metrics.resources.refused("pod", REASON_TOKEN_NOT_ISSUED);
            events::warn(
                tenant,
                &tenant_pod.object_ref(&()),
                REASON_TOKEN_NOT_ISSUED,
                &message,
            )
            .await;
            return Ok(Outcome::Waiting {
                reason: message,
                retry_after: Some(TOKEN_RETRY),
            });
        }
        Err(error) => return Err(error),
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
    tracing::info!(tenant = %tenant.identity.vc_ref(), %namespace, pod = %name, node = %lost.node, reason = REASON_NODE_LOST, "{message}");
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

/// Applies `status` to the tenant pod; the number of writes made (0: the pod is gone).
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::{
        engine::context::testing::{self, from_json, put},
        tenancy::settings::TenantSettings,
    };

    /// The super copy of tenant pod `shop/web`, scheduled to `node-1`, with `status`.
    fn super_copy(status: serde_json::Value) -> crate::cache::pods::SuperPod {
        from_json(super_copy_json(status))
    }

    fn super_copy_json(status: serde_json::Value) -> serde_json::Value {
        json!({
            "metadata": {"name": "web", "namespace": "team-abc123-vc-shop", "uid": "super-pod-uid",
                "annotations": {"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/uid": "pod-uid",
                    "tenancy.x-k8s.io/namespace": "shop"}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "nginx"}]},
            "status": status
        })
    }

    /// [`super_copy`] naming a token its pod needs and the shard that holds it.
    fn with_tokens(status: serde_json::Value) -> crate::cache::pods::SuperPod {
        let mut copy = super_copy_json(status);
        let annotations = &mut copy["metadata"]["annotations"];
        annotations["tenancy.x-k8s.io/tokens"] = json!(r#"[{"key":"token"}]"#);
        annotations["tenancy.x-k8s.io/token-secret"] = json!("shard-0.vc-tokens");
        from_json(copy)
    }

    /// A tenant pod on no node yet and its super copy, bound to `node-1` (a vNode the tenant already has),
    /// with `status`.
    fn bound_below(
        status: serde_json::Value,
    ) -> (Context, Arc<Tenant>, testing::ApiServer, testing::ApiServer) {
        let (ctx, tenant, supers, tenants, _) = bound_below_with_caches(status);
        (ctx, tenant, supers, tenants)
    }

    /// [`bound_below`], with the super caches' writers.
    fn bound_below_with_caches(
        status: serde_json::Value,
    ) -> (
        Context,
        Arc<Tenant>,
        testing::ApiServer,
        testing::ApiServer,
        crate::cache::super_stores::Writers,
    ) {
        let (super_client, supers) = testing::mock();
        let (tenant_client, tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(
            &mut caches.pods,
            from_json(json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid"},
                "spec": {"containers": [{"name": "app", "image": "nginx"}]},
                "status": {"phase": "Pending", "qosClass": "BestEffort"}
            })),
        );
        put(&mut super_caches.pods, super_copy(status));
        put(
            &mut caches.vnodes,
            from_json(json!({"metadata": {"name": "node-1"}})),
        );
        (ctx, tenant, supers, tenants, super_caches)
    }

    /// A bound pod whose token the tenant apiserver will not issue (its service account is gone) waits:
    /// the tenant is told why, and the token is asked for again later.
    #[tokio::test]
    async fn a_token_the_tenant_will_not_issue_is_told_and_asked_for_again() {
        let (ctx, tenant, mut supers, mut tenants, mut super_caches) = bound_below_with_caches(json!({
            "phase": "Pending", "qosClass": "BestEffort", "conditions": [{"type": "PodScheduled", "status": "True"}]
        }));
        put(
            &mut super_caches.pods,
            with_tokens(
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}),
            ),
        );
        let (outcome, ()) = tokio::join!(sync_pod(&ctx, &tenant), async {
            tenants.expect("POST", BINDING).await.respond(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            );
            tenants
                .expect("POST", "/api/v1/namespaces/shop/serviceaccounts/default/token?")
                .await
                .fail(404, "NotFound", "serviceaccounts \"default\" not found");
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], REASON_TOKEN_NOT_ISSUED);
            let note = event.body["note"].as_str().unwrap_or_default().to_owned();
            assert!(note.contains("serviceaccounts \"default\" not found"), "{note}");
            event.echo();
        });
        match outcome.expect("synced") {
            Outcome::Waiting { retry_after, .. } => assert_eq!(retry_after, Some(TOKEN_RETRY)),
            other => panic!("{other:?}"),
        }
        assert!(tenant.state.pods.bound_to("pod-uid", "node-1"));
        supers.idle().await;
        tenants.idle().await;
    }

    /// `pod`, failing instead of hanging when it makes a request the test does not answer.
    async fn sync_pod(ctx: &Context, tenant: &Tenant) -> Result<Outcome> {
        tokio::time::timeout(std::time::Duration::from_secs(5), pod(ctx, tenant, "shop", "web"))
            .await
            .expect("pod sync made a request the test did not expect")
    }

    const BINDING: &str = "/api/v1/namespaces/shop/pods/web/binding?";
    const POD_STATUS: &str = "/api/v1/namespaces/shop/pods/web/status?&force=true&fieldManager=vc-syncer";

    /// A pod bound and running below: its tokens go to the super cluster while its status goes to the
    /// tenant, neither waiting for the other (the token Secret write is held until the status arrives).
    #[tokio::test]
    async fn tokens_and_status_are_written_at_once() {
        let (ctx, tenant, mut supers, mut tenants, mut super_caches) = bound_below_with_caches(json!({}));
        put(
            &mut super_caches.pods,
            with_tokens(json!({"phase": "Running", "podIP": "10.244.1.9",
                "conditions": [{"type": "PodScheduled", "status": "True"}]})),
        );
        let (status_seen_tx, status_seen_rx) = tokio::sync::oneshot::channel();
        let tenant_script = async {
            tenants.expect("POST", BINDING).await.respond(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            );
            let mut status_seen = Some(status_seen_tx);
            let mut phase = None;
            for _ in 0..2 {
                let call = tenants.next().await;
                if call.uri.starts_with(POD_STATUS) {
                    phase = call.body["status"]["phase"].as_str().map(str::to_owned);
                    let _ = status_seen.take().map(|seen| seen.send(()));
                    call.echo();
                } else {
                    assert!(
                        call.uri
                            .starts_with("/api/v1/namespaces/shop/serviceaccounts/default/token?"),
                        "{}",
                        call.uri
                    );
                    let answer = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": call.body["spec"],
                        "status": {"token": "jwt-web", "expirationTimestamp": "2030-01-01T00:00:00Z"}});
                    call.ok(answer);
                }
            }
            phase
        };
        let super_script = async {
            let call = supers.next().await;
            assert!(
                call.uri
                    .starts_with("/api/v1/namespaces/team-abc123-vc-shop/secrets"),
                "{}",
                call.uri
            );
            // Answered only once the status write has reached the tenant: a status that waited for the
            // tokens would never come.
            status_seen_rx
                .await
                .expect("the status was written while the tokens were");
            call.echo();
        };
        let (outcome, phase, ()) = tokio::join!(sync_pod(&ctx, &tenant), tenant_script, super_script);
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 3 });
        assert_eq!(phase.as_deref(), Some("Running"));
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn binding_alone_carries_a_scheduled_status() {
        let (ctx, tenant, mut supers, mut tenants) = bound_below(json!({
            "phase": "Pending", "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-23T10:00:00Z"}]
        }));
        let (outcome, binding) = tokio::join!(sync_pod(&ctx, &tenant), async {
            let call = tenants.expect("POST", BINDING).await;
            let body = call.body.clone();
            call.respond(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            );
            body
        });
        // The binding sets PodScheduled=True in the tenant; a status apply on top would write nothing new.
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        assert_eq!(
            binding["target"],
            json!({"apiVersion": "v1", "kind": "Node", "name": "node-1"})
        );
        assert_eq!(binding["metadata"]["uid"], json!("pod-uid"));
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn binding_and_a_running_status_are_both_written() {
        let (ctx, tenant, mut supers, mut tenants) = bound_below(json!({
            "phase": "Running", "hostIP": "192.168.0.7", "podIP": "10.244.1.9", "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-11-23T10:00:01Z"}}}]
        }));
        let (outcome, status) = tokio::join!(sync_pod(&ctx, &tenant), async {
            tenants.expect("POST", BINDING).await.respond(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            );
            tenants.expect("PATCH", POD_STATUS).await.echo()
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 2 });
        assert_eq!(status["status"]["phase"], json!("Running"));
        assert_eq!(status["status"]["podIP"], json!("10.244.1.9"));
        assert_eq!(status["status"]["conditions"][1]["type"], json!("Ready"));
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_binding_the_cache_does_not_show_yet_is_not_made_twice() {
        let (ctx, tenant, mut supers, mut tenants, mut super_caches) = bound_below_with_caches(json!({
            "phase": "Pending", "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True"}]
        }));
        let (outcome, ()) = tokio::join!(sync_pod(&ctx, &tenant), async {
            tenants.expect("POST", BINDING).await.respond(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            );
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        assert!(tenant.state.pods.bound_to("pod-uid", "node-1"));

        // The super pod runs before the binding's watch event arrives: only the status is written.
        put(
            &mut super_caches.pods,
            super_copy(json!({"phase": "Running", "qosClass": "BestEffort",
                "conditions": [{"type": "PodScheduled", "status": "True"}]})),
        );
        let (outcome, status) = tokio::join!(sync_pod(&ctx, &tenant), async {
            tenants.expect("PATCH", POD_STATUS).await.echo()
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        assert_eq!(status["status"]["phase"], json!("Running"));
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_pod_bound_meanwhile_gets_its_status_from_the_cache_comparison() {
        // 409: someone bound it already; nothing is assumed about its status, which is written.
        let (ctx, tenant, mut supers, mut tenants) = bound_below(json!({
            "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]
        }));
        let (outcome, _) = tokio::join!(sync_pod(&ctx, &tenant), async {
            tenants.expect("POST", BINDING).await.fail(
                409,
                "Conflict",
                "pod web is already assigned to node node-1",
            );
            tenants.expect("PATCH", POD_STATUS).await.echo()
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        supers.idle().await;
        tenants.idle().await;
    }

    #[test]
    fn only_the_tenants_own_ephemeral_containers_report_up_and_a_change_of_theirs_is_written() {
        let statuses = |state: &str| -> PodStatus {
            from_json(json!({"phase": "Running", "ephemeralContainerStatuses": [
                {"name": "dbg", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {state: {}}},
                {"name": "platform-debugger", "image": "netshoot", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"running": {}}}
            ]}))
        };
        let tenant: Vec<ContainerImage> = from_json(json!([{"name": "dbg", "image": "busybox"}]));
        let want = status_from_super(statuses("waiting"), &[], &tenant);
        let names: Vec<String> = want
            .ephemeral_container_statuses
            .iter()
            .flatten()
            .map(|s| s.name.clone())
            .collect();
        assert_eq!(names, ["dbg"]);
        // The tenant pod as that status left it, then the container starts: a status write.
        let written: TenantPodStatus = from_json(serde_json::to_value(&want).expect("status"));
        assert!(status_matches(&want, &written));
        let started = status_from_super(statuses("running"), &[], &tenant);
        assert!(!status_matches(&started, &written));
        // A pod without ephemeral containers reports none.
        assert_eq!(
            status_from_super(statuses("running"), &[], &[]).ephemeral_container_statuses,
            None
        );
    }

    /// The super cluster deletes a copy: the tenant pod is deleted with it only when the copy's node no
    /// longer answers, the tenant pod lives on, and the copy is its own.
    #[test]
    fn a_copy_evicted_from_a_lost_node_deletes_the_tenant_pod() {
        let copy = |deleting: bool| -> SuperPod {
            let mut copy = super_copy_json(json!({"phase": "Running"}));
            if deleting {
                copy["metadata"]["deletionTimestamp"] = json!("2026-11-29T10:00:00Z");
                copy["metadata"]["deletionGracePeriodSeconds"] = json!(30);
            }
            from_json(copy)
        };
        let tenant_pod = |extra_meta: serde_json::Value, phase: &str| -> TenantPod {
            let mut meta = json!({"name": "web", "namespace": "shop", "uid": "pod-uid"});
            for (k, v) in extra_meta.as_object().into_iter().flatten() {
                meta[k] = v.clone();
            }
            from_json(json!({"metadata": meta, "spec": {"nodeName": "node-1",
                "containers": [{"name": "app", "image": "nginx"}]}, "status": {"phase": phase}}))
        };
        let node = |ready: Option<&str>, taint: Option<&str>| -> Node {
            from_json(json!({"metadata": {"name": "node-1"},
                "spec": {"taints": taint.map(|key| vec![json!({"key": key, "effect": "NoExecute"})])},
                "status": {"conditions": ready.map(|status| vec![json!({"type": "Ready", "status": status, "reason": "NodeStatusUnknown"})])}}))
        };
        let live = tenant_pod(json!({}), "Running");
        let unknown = node(Some("Unknown"), Some("node.kubernetes.io/unreachable"));
        let lost = evicted_from_lost_node(&live, &copy(true), Some(&unknown)).expect("lost");
        assert_eq!(lost.node, "node-1");
        assert_eq!(lost.grace_period_seconds, Some(30));
        assert_eq!(lost.why, "its Ready condition is Unknown (NodeStatusUnknown)");
        let not_ready = node(Some("False"), None);
        assert!(evicted_from_lost_node(&live, &copy(true), Some(&not_ready)).is_some());
        // No Ready condition, but the node lifecycle controller's taint.
        let tainted = node(None, Some("node.kubernetes.io/not-ready"));
        assert!(evicted_from_lost_node(&live, &copy(true), Some(&tainted)).is_some());

        let cases: [(&str, TenantPod, SuperPod, Option<Node>); 7] = [
            (
                "the copy is not being deleted",
                live.clone(),
                copy(false),
                Some(unknown.clone()),
            ),
            (
                "a node that answers (a pause, a drain, a platform admin)",
                live.clone(),
                copy(true),
                Some(node(Some("True"), None)),
            ),
            (
                "a node that answers while a taint lags",
                live.clone(),
                copy(true),
                Some(node(Some("True"), Some("node.kubernetes.io/unreachable"))),
            ),
            (
                "a node just registered",
                live.clone(),
                copy(true),
                Some(node(None, None)),
            ),
            ("a node the cache does not hold", live.clone(), copy(true), None),
            (
                "the tenant deleted the pod itself",
                tenant_pod(json!({"deletionTimestamp": "2026-11-29T09:59:00Z"}), "Running"),
                copy(true),
                Some(unknown.clone()),
            ),
            (
                "the pod ended",
                tenant_pod(json!({}), "Succeeded"),
                copy(true),
                Some(unknown.clone()),
            ),
        ];
        for (case, tenant_pod, copy, node) in cases {
            assert_eq!(
                evicted_from_lost_node(&tenant_pod, &copy, node.as_ref()),
                None,
                "{case}"
            );
        }
    }

    /// The copy is evicted from a node that stopped answering: the tenant is told, and its pod is deleted
    /// with the copy's grace period, pinned to its uid. From a node that answers, nothing is written and
    /// the pod is looked at again soon.
    #[tokio::test]
    async fn a_pod_whose_copy_is_evicted_from_a_lost_node_is_deleted() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(
            &mut caches.pods,
            from_json(json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid"},
                "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "nginx"}]},
                "status": {"phase": "Running", "podIP": "10.244.1.9", "qosClass": "BestEffort",
                    "conditions": [{"type": "PodScheduled", "status": "True"}]}
            })),
        );
        let mut copy = super_copy_json(
            json!({"phase": "Running", "podIP": "10.244.1.9", "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True"}]}),
        );
        copy["metadata"]["deletionTimestamp"] = json!("2026-11-29T10:00:00Z");
        copy["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        put(&mut super_caches.pods, from_json(copy));
        let node = |ready: &str| -> Node {
            from_json(json!({"metadata": {"name": "node-1"},
                "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "NodeStatusUnknown"}]}}))
        };

        // The node answers (a drain, a platform admin's deletion): the kubelet confirms, nothing written.
        put(&mut super_caches.nodes, node("True"));
        match sync_pod(&ctx, &tenant).await.expect("synced") {
            Outcome::Waiting { retry_after, .. } => assert_eq!(retry_after, Some(NODE_RECHECK)),
            other => panic!("{other:?}"),
        }

        put(&mut super_caches.nodes, node("Unknown"));
        let (outcome, ()) = tokio::join!(sync_pod(&ctx, &tenant), async {
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], REASON_NODE_LOST);
            let note = event.body["note"].as_str().unwrap_or_default().to_owned();
            assert!(
                note.contains("node node-1 stopped answering (its Ready condition is Unknown"),
                "{note}"
            );
            event.echo();
            let delete = tenants
                .expect("DELETE", "/api/v1/namespaces/shop/pods/web?")
                .await;
            assert_eq!(delete.body["gracePeriodSeconds"], 30);
            assert_eq!(delete.body["preconditions"]["uid"], "pod-uid");
            delete.ok(
                json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "web", "namespace": "shop"}}),
            );
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        supers.idle().await;
        tenants.idle().await;
    }

    #[test]
    fn the_kubelets_reason_is_what_the_scheduler_says_first() {
        let cases = [
            (
                "0/3 nodes are available: 1 node(s) didn't have free ports for the requested pod ports, 2 node(s) didn't match Pod's node affinity/selector.",
                "NodePorts",
            ),
            (
                "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory.",
                "OutOfcpu",
            ),
            (
                "0/1 nodes are available: 1 Insufficient example.com/gpu.",
                "OutOfexample.com/gpu",
            ),
            ("0/1 nodes are available: 1 Too many pods.", "OutOfpods"),
            (
                "0/1 nodes are available: 1 node(s) had untolerated taint {a: b}.",
                "Unschedulable",
            ),
        ];
        for (message, reason) in cases {
            assert_eq!(admission_reason(message), reason, "{message}");
        }
    }

    /// A pod the tenant bound to its vNode by name fails as that node's kubelet would fail it once the
    /// super scheduler says the node cannot take its copy; a pending copy that was not refused, or the copy
    /// of a pod the syncer placed, leaves the pod as it is.
    #[tokio::test]
    async fn a_pod_bound_by_name_fails_when_its_node_cannot_take_it() {
        let unschedulable = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 1 node(s) didn't have free ports for the requested pod ports, 1 node(s) didn't match Pod's node affinity/selector."}]});
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(
            &mut caches.vnodes,
            from_json(json!({"metadata": {"name": "node-1"}})),
        );
        let mut unplaced = super_copy(unschedulable);
        unplaced.spec.node_name = None;
        put(&mut super_caches.pods, unplaced.clone());
        put(
            &mut caches.pods,
            from_json(json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid"},
                "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "nginx"}]},
                "status": {"phase": "Pending", "qosClass": "BestEffort"}
            })),
        );
        let (outcome, ()) = tokio::join!(sync_pod(&ctx, &tenant), async {
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], "NodePorts");
            event.echo();
            let status = tenants.expect("PATCH", POD_STATUS).await;
            assert!(status.uri.contains("fieldValidation=Ignore"), "{}", status.uri);
            assert_eq!(status.body["status"]["phase"], "Failed");
            assert_eq!(status.body["status"]["reason"], "NodePorts");
            let message = status.body["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                message.starts_with("Pod was rejected: node node-1 cannot run it: 0/2 nodes"),
                "{message}"
            );
            status.echo();
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });

        // Not refused yet: the pod waits, with the copy's status.
        let pending = json!({"phase": "Pending"});
        let mut waiting = super_copy(pending);
        waiting.spec.node_name = None;
        put(&mut super_caches.pods, waiting);
        let outcome = sync_pod(&ctx, &tenant).await;
        assert_eq!(outcome.expect("synced"), Outcome::InSync);

        // A pod the syncer bound before (its copy was made again and waits): not failed.
        put(
            &mut caches.pods,
            from_json(json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid"},
                "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "nginx"}]},
                "status": {"phase": "Pending", "qosClass": "BestEffort",
                    "conditions": [{"type": "PodScheduled", "status": "True"}]}
            })),
        );
        put(&mut super_caches.pods, unplaced);
        let (outcome, ()) = tokio::join!(sync_pod(&ctx, &tenant), async {
            let status = tenants.expect("PATCH", POD_STATUS).await;
            assert_eq!(status.body["status"]["phase"], "Pending");
            status.echo();
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        supers.idle().await;
        tenants.idle().await;
    }
}
