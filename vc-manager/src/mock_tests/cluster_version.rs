//! ClusterVersions: users listed in the status, deletion blocked while any remain.

use std::{sync::Arc, time::Duration};

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::*;
use crate::cluster_version::{error_policy, reconcile};

fn cv_path() -> String {
    format!("/apis/tenancy.x-k8s.io/v1alpha1/clusterversions/{CV_NAME}")
}

fn guarded() -> ClusterVersion {
    let mut cv = cluster_version();
    cv.metadata.finalizers = Some(vec![crds::wellknown::FINALIZER_CLUSTER_VERSION.into()]);
    cv
}

fn deleting() -> ClusterVersion {
    let mut cv = guarded();
    cv.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_800_000_000).expect("time")));
    cv
}

fn user(name: &str) -> VirtualCluster {
    let mut vc = native_vc();
    vc.metadata.name = Some(name.into());
    vc
}

/// The status is applied; returns it.
async fn cv_status(api: &mut ApiServer) -> Value {
    let call = api.expect("PATCH", &format!("{}/status{APPLY}", cv_path())).await;
    assert_eq!(call.body["kind"], "ClusterVersion");
    let status = call.body["status"].clone();
    let mut object = serde_json::to_value(cluster_version()).expect("json");
    object["status"] = status.clone();
    call.ok(object);
    status
}

#[tokio::test]
async fn a_new_cluster_version_gets_its_finalizer_and_an_empty_user_list() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            let call = api.expect("PATCH", &format!("{}{MERGE}", cv_path())).await;
            assert_eq!(
                call.body,
                json!({"metadata": {"resourceVersion": "7", "finalizers": ["tenancy.x-k8s.io/clusterversion-in-use"]}})
            );
            call.ok(serde_json::to_value(guarded()).expect("json"));
            let status = cv_status(&mut api).await;
            assert_eq!(status["virtualClusterCount"], 0);
            assert_eq!(status["virtualClusters"], json!([]));
            assert_eq!(status["conditions"][0]["type"], "InUse");
            assert_eq!(status["conditions"][0]["status"], "False");
        },
        reconcile(Arc::new(cluster_version().into()), ctx),
    )
    .await;
    assert_eq!(result.expect("ok"), Action::requeue(Duration::from_secs(600)));
}

#[tokio::test]
async fn users_are_listed() {
    let (ctx, mut caches, mut api) = context(no_probe());
    caches.add_virtual_cluster(user("b"));
    caches.add_virtual_cluster(user("a"));
    let mut other = user("c");
    other.spec.cluster_version_name = Some("another".into());
    caches.add_virtual_cluster(other);
    let result = run(
        async move {
            let status = cv_status(&mut api).await;
            assert_eq!(status["virtualClusterCount"], 2);
            assert_eq!(
                status["virtualClusters"],
                json!([{"namespace": "team", "name": "a"}, {"namespace": "team", "name": "b"}])
            );
            assert_eq!(status["conditions"][0]["reason"], "InUse");
            assert_eq!(
                status["conditions"][0]["message"],
                "used by 2 VirtualCluster(s): team/a, team/b"
            );
        },
        reconcile(Arc::new(guarded().into()), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn deletion_is_blocked_while_used_and_the_users_are_named() {
    let (ctx, mut caches, mut api) = context(no_probe());
    caches.add_virtual_cluster(user("a"));
    let result = run(
        async move {
            let status = cv_status(&mut api).await;
            assert_eq!(status["conditions"][0]["reason"], "DeletionBlocked");
            let note = api.event_in("default", "DeletionBlocked").await;
            assert!(note.ends_with("used by 1 VirtualCluster(s): team/a"), "{note}");
        },
        reconcile(Arc::new(deleting().into()), ctx),
    )
    .await;
    assert_eq!(result.expect("blocked"), Action::await_change());
}

#[tokio::test]
async fn an_unused_cluster_version_is_released() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            let call = api.expect("PATCH", &format!("{}{MERGE}", cv_path())).await;
            assert_eq!(
                call.body,
                json!({"metadata": {"resourceVersion": "7", "finalizers": []}})
            );
            call.ok(serde_json::to_value(cluster_version()).expect("json"));
        },
        reconcile(Arc::new(deleting().into()), ctx),
    )
    .await;
    assert_eq!(result.expect("released"), Action::await_change());
}

#[tokio::test]
async fn an_unchanged_status_is_not_written() {
    let (ctx, mut caches, api) = context(no_probe());
    caches.add_virtual_cluster(user("a"));
    let mut cv = guarded();
    cv.status = Some(crds::ClusterVersionStatus {
        virtual_clusters: vec![crds::VirtualClusterRef {
            namespace: "team".into(),
            name: "a".into(),
        }],
        virtual_cluster_count: Some(1),
        conditions: vec![
            Condition {
                type_: "InUse".into(),
                status: "True".into(),
                reason: "InUse".into(),
                message: "used by 1 VirtualCluster(s): team/a".into(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::from_second(1_700_000_000).expect("time")),
            },
            Condition {
                type_: "TemplatesAdapted".into(),
                status: "False".into(),
                reason: "AsWritten".into(),
                message: "templates are rendered as written".into(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::from_second(1_700_000_000).expect("time")),
            },
        ],
    });
    let result = run(async move { drop(api) }, reconcile(Arc::new(cv.into()), ctx)).await;
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn failures_are_errors_with_backoff() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            api.expect("PATCH", &format!("{}/status{APPLY}", cv_path()))
                .await
                .fail(500, "InternalError", "etcd is down");
        },
        reconcile(Arc::new(guarded().into()), ctx.clone()),
    )
    .await;
    let error = result.expect_err("fails");
    assert_eq!(error.reason(), "StatusApplyFailed");
    let cv: Arc<crate::cached::CachedClusterVersion> = Arc::new(guarded().into());
    assert_eq!(
        error_policy(cv.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    assert_eq!(
        error_policy(cv, &error, ctx.clone()),
        Action::requeue(Duration::from_secs(2))
    );
    assert_eq!(
        ctx.metrics.reconcile_count("clusterversion", "StatusApplyFailed"),
        1
    );

    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            api.expect("PATCH", &format!("{}{MERGE}", cv_path()))
                .await
                .fail(409, "Conflict", "modified");
        },
        reconcile(Arc::new(cluster_version().into()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("conflict").reason(), "FinalizerFailed");
}
