//! Deletion: the root namespace and the syncer's tenant namespaces of this tenant (and only those) are
//! deleted, and the finalizer goes only once they are gone.

use std::{sync::Arc, time::Duration};

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::*;
use crate::virtual_cluster::reconcile;

const LIST: &str = "/api/v1/namespaces?&labelSelector=tenancy.x-k8s.io%2Fvcname%3Dvc-1%2Ctenancy.x-k8s.io%2Fvcnamespace%3Dteam";

fn deleting_vc() -> VirtualCluster {
    let mut vc = running(native_vc());
    vc.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_800_000_000).expect("time")));
    vc
}

/// A super namespace of tenant `cluster`, annotated as the syncer writes it: `name` is
/// `<cluster>-<tenant namespace>`.
fn namespace(name: &str, cluster: &str, terminating: bool) -> Value {
    let tenant_namespace = name.strip_prefix(&format!("{cluster}-")).unwrap_or(name);
    let mut ns = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "labels": {"tenancy.x-k8s.io/vcname": VC_NAME, "tenancy.x-k8s.io/vcnamespace": VC_NAMESPACE},
            "annotations": {"tenancy.x-k8s.io/cluster": cluster, "tenancy.x-k8s.io/namespace": tenant_namespace},
        }
    });
    if terminating {
        ns["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    ns
}

fn root_namespace(uid: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": root(),
            "uid": "uid-root",
            "annotations": {"tenancy.x-k8s.io/vcuid": uid, "tenancy.x-k8s.io/vcrootns": "true"},
        }
    })
}

fn namespace_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {}, "items": items})
}

async fn expect_delete(api: &mut ApiServer, name: &str) {
    let call = api.expect("DELETE", &format!("/api/v1/namespaces/{name}?")).await;
    assert_eq!(
        call.body["preconditions"]["uid"],
        format!("uid-{name}"),
        "{}",
        call.body
    );
    call.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
}

#[tokio::test]
async fn deletion_removes_this_tenants_namespaces_and_waits() {
    let (ctx, _caches, mut api) = context(no_probe());
    let tenant_ns = format!("{}-default", root());
    let result = run(
        async move {
            api.expect("GET", LIST).await.ok(namespace_list(vec![
                namespace(&tenant_ns, &root(), false),
                // Same VirtualCluster name, earlier incarnation (another cluster key): left alone.
                namespace("team-ffffff-vc-1-default", "team-ffffff-vc-1", false),
            ]));
            api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
                .await
                .ok(root_namespace(VC_UID));
            expect_delete(&mut api, &tenant_ns).await;
            let call = api
                .expect("DELETE", &format!("/api/v1/namespaces/{}?", root()))
                .await;
            assert_eq!(call.body["preconditions"]["uid"], "uid-root");
            call.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
            let note = api.event("Deleting").await;
            assert_eq!(
                note,
                format!("waiting for namespaces to be deleted: {}, {}", root(), tenant_ns)
            );
        },
        reconcile(Arc::new(deleting_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect("waiting"), Action::requeue(Duration::from_secs(2)));
}

#[tokio::test]
async fn terminating_namespaces_are_waited_for_without_deleting_again() {
    let (ctx, _caches, mut api) = context(no_probe());
    let tenant_ns = format!("{}-kube-system", root());
    let result = run(
        async move {
            api.expect("GET", LIST)
                .await
                .ok(namespace_list(vec![namespace(&tenant_ns, &root(), true)]));
            api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
                .await
                .not_found("namespaces", &root());
            api.event("Deleting").await;
        },
        reconcile(Arc::new(deleting_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect("waiting"), Action::requeue(Duration::from_secs(2)));
}

#[tokio::test]
async fn the_finalizer_goes_once_everything_is_gone() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            api.expect("GET", LIST).await.ok(namespace_list(vec![]));
            api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
                .await
                .not_found("namespaces", &root());
            let call = api
                .expect(
                    "PATCH",
                    &format!("/apis/tenancy.x-k8s.io/v1alpha1/namespaces/{VC_NAMESPACE}/virtualclusters/{VC_NAME}{MERGE}"),
                )
                .await;
            assert_eq!(call.body, json!({"metadata": {"resourceVersion": "100", "finalizers": []}}));
            let mut object = serde_json::to_value(deleting_vc()).expect("json");
            object["metadata"]["finalizers"] = json!([]);
            call.ok(object);
        },
        reconcile(Arc::new(deleting_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect("done"), Action::await_change());
}

#[tokio::test]
async fn a_root_namespace_of_another_uid_and_vanished_namespaces_are_not_waited_for() {
    let (ctx, _caches, mut api) = context(no_probe());
    let tenant_ns = format!("{}-default", root());
    let result = run(
        async move {
            api.expect("GET", LIST)
                .await
                .ok(namespace_list(vec![namespace(&tenant_ns, &root(), false)]));
            api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
                .await
                .ok(root_namespace("another-uid"));
            // Gone between list and delete.
            api.expect("DELETE", &format!("/api/v1/namespaces/{tenant_ns}?"))
                .await
                .not_found("namespaces", &tenant_ns);
            api.expect(
                "PATCH",
                &format!("/apis/tenancy.x-k8s.io/v1alpha1/namespaces/{VC_NAMESPACE}/virtualclusters/{VC_NAME}{MERGE}"),
            )
            .await
            .not_found("virtualclusters", VC_NAME);
        },
        reconcile(Arc::new(deleting_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect("done"), Action::await_change());
}

#[tokio::test]
async fn failing_to_list_namespaces_is_an_error() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            api.expect("GET", LIST)
                .await
                .fail(403, "Forbidden", "namespaces is forbidden");
            // Seen where people look: a Warning event on the VirtualCluster.
            let message = api.event("NamespaceListFailed").await;
            assert!(message.contains("forbidden"), "{message}");
        },
        reconcile(Arc::new(deleting_vc()), ctx.clone()),
    )
    .await;
    assert_eq!(result.expect_err("forbidden").reason(), "NamespaceListFailed");
    assert_eq!(
        ctx.metrics
            .reconcile_count("virtualcluster", "NamespaceListFailed"),
        1
    );
}

#[tokio::test]
async fn failing_to_delete_a_namespace_is_an_error() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            api.expect("GET", LIST).await.ok(namespace_list(vec![]));
            api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
                .await
                .ok(root_namespace(VC_UID));
            api.expect("DELETE", &format!("/api/v1/namespaces/{}?", root()))
                .await
                .fail(403, "Forbidden", "namespaces \"x\" is forbidden");
            let message = api.event("NamespaceDeleteFailed").await;
            assert!(message.contains("is forbidden"), "{message}");
        },
        reconcile(Arc::new(deleting_vc()), ctx),
    )
    .await;
    let error = result.expect_err("forbidden");
    assert_eq!(error.reason(), "NamespaceDeleteFailed");
    assert!(
        error.full_message().contains("is forbidden"),
        "{}",
        error.full_message()
    );
}

#[tokio::test]
async fn failing_to_remove_the_finalizer_is_an_error() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            api.expect("GET", LIST).await.ok(namespace_list(vec![]));
            api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
                .await
                .not_found("namespaces", &root());
            api.expect(
                "PATCH",
                &format!("/apis/tenancy.x-k8s.io/v1alpha1/namespaces/{VC_NAMESPACE}/virtualclusters/{VC_NAME}{MERGE}"),
            )
            .await
            .fail(409, "Conflict", "the object has been modified");
        },
        reconcile(Arc::new(deleting_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("conflict").reason(), "FinalizerFailed");
}

#[tokio::test]
async fn without_the_finalizer_there_is_nothing_to_do() {
    let (ctx, _caches, api) = context(no_probe());
    let mut vc = deleting_vc();
    vc.metadata.finalizers = Some(vec!["someone.else/finalizer".into()]);
    let result = run(async move { drop(api) }, reconcile(Arc::new(vc), ctx)).await;
    assert_eq!(result.expect("nothing"), Action::await_change());
}
