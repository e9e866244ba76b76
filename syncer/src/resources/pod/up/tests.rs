//! The up path against scripted apiservers: bindings, status, tokens the tenant will not issue, pods
//! evicted from lost nodes.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::{
    engine::context::testing::{self, from_json, put},
    tenancy::settings::TenantSettings,
    tokens::shards::{REASON_TOKEN_NOT_ISSUED, TOKEN_RETRY},
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
