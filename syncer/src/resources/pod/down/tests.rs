//! The down path against a scripted super apiserver: creation held for quota and refused by the super
//! cluster, a running pod's changes, ephemeral containers, a pod ended unplaced. (Tokens of earlier
//! versions: [`crate::tokens::legacy`].)

use crds::TenantQuota;
use k8s_openapi::{api::core::v1::Namespace, apimachinery::pkg::api::resource::Quantity};
use serde_json::json;

use super::*;
use std::{sync::Arc, time::Duration};

use super::super::{
    ephemeral,
    refusal::{REASON_POLICY_VIOLATION, REASON_REFUSED_BY_SUPER_CLUSTER, REFUSED_RETRY},
    update::{
        ANNOTATION_REFUSED_RESIZE, ANNOTATION_REFUSED_TOLERATIONS, REASON_RESIZE_REFUSED,
        REASON_UPDATE_REFUSED,
    },
};

use crate::{
    accounting::quota::{REASON_QUOTA_EXCEEDED, Usage},
    engine::{
        context::testing::{self, from_json, put},
        items::Kind,
    },
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
            .fail(
                403,
                "Forbidden",
                "pods \"second\" is forbidden: maximum cpu usage per Container is 2, but limit is 4",
            );
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
        from_json::<Namespace>(
            json!({"metadata": {"name": "team-abc123-vc-shop", "annotations": {
            "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "shop"}}}),
        ),
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
        assert_eq!(
            adopted.body["metadata"]["resourceVersion"], "3",
            "{}",
            adopted.body
        );
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
        supers.expect("PATCH", &format!("{POD}/resize?")).await.fail(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
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
        assert_eq!(
            applied.body["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "100m"
        );
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
        let added = supers
            .expect("PATCH", &format!("{POD}/ephemeralcontainers?"))
            .await;
        assert_eq!(added.body["metadata"]["uid"], "super-uid");
        let containers = added.body["spec"]["ephemeralContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
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
        assert!(
            applied.body["spec"].get("ephemeralContainers").is_none(),
            "{}",
            applied.body
        );
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
            .fail(
                422,
                "Invalid",
                "pods \"web\" is forbidden: violates PodSecurity \"baseline:latest\"",
            );
        // Both in one event, each container named.
        let event = tenants
            .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
            .await;
        assert_eq!(event.body["reason"], ephemeral::REASON_EPHEMERAL_REFUSED);
        let note = event.body["note"].as_str().unwrap_or_default().to_owned();
        assert!(
            note.contains("\"old\"") && note.contains("never changed"),
            "{note}"
        );
        assert!(
            note.contains("\"dbg\"") && note.contains("violates PodSecurity"),
            "{note}"
        );
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
