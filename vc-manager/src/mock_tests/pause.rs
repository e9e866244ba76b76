//! Pausing and resuming a provisioned tenant: its StatefulSets scale to zero and back, the phase and the
//! `Paused` condition say so, and nothing is deleted.

use std::sync::Arc;

use crds::wellknown::{CONDITION_PAUSED, CONDITION_READY};
use serde_json::{Value, json};

use super::*;
use crate::{component::Component, virtual_cluster::reconcile};
use tenant_pki::secrets::Scope;

fn sts_path(name: &str) -> String {
    format!("/apis/apps/v1/namespaces/{}/statefulsets/{name}", root())
}

/// The root namespace, ClusterVersion, Services and Secrets are there as a previous reconcile left them.
pub(super) async fn everything_but_the_statefulsets(api: &mut ApiServer, secrets: &[Secret]) {
    let identity = TenantIdentity::of(&native_vc()).expect("identity");
    api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
        .await
        .ok(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": root(),
                "uid": "ns-uid",
                "labels": crate::identity::managed_labels(),
                "annotations": identity.root_namespace_annotations(),
            }
        }));
    api.expect(
        "GET",
        &format!("/apis/tenancy.x-k8s.io/v1alpha1/clusterversions/{CV_NAME}"),
    )
    .await
    .ok(serde_json::to_value(cluster_version()).expect("json"));
    let service_path = format!("/api/v1/namespaces/{}/services/", root());
    for (_, call) in api.concurrent(&service_path, &["etcd", "apiserver-svc"]).await {
        let mut body = call.body.clone();
        if body["metadata"]["name"] == "apiserver-svc" {
            body["spec"]["clusterIP"] = json!("10.96.0.50");
            body["spec"]["clusterIPs"] = json!(["10.96.0.50"]);
        }
        call.ok(body);
    }
    api.expect("GET", &format!("/api/v1/namespaces/{}/secrets?", root()))
        .await
        .ok(secret_list(secrets));
}

/// Each StatefulSet is applied with `replicas`; answers as if `ready` replicas were ready.
async fn statefulsets_applied(api: &mut ApiServer, replicas: i64, ready: i64) {
    for name in ["etcd", "apiserver", "controller-manager"] {
        let call = api.expect("PATCH", &format!("{}{APPLY}", sts_path(name))).await;
        assert_eq!(call.body["spec"]["replicas"], replicas, "{name}: {}", call.body);
        let body = with_status(call.body.clone(), replicas, ready);
        call.ok(body);
    }
}

fn paused(mut vc: VirtualCluster) -> VirtualCluster {
    vc.spec.paused = true;
    vc
}

#[tokio::test]
async fn a_paused_tenant_scales_its_control_plane_to_zero_and_says_so() {
    let (ctx, mut caches, mut api) = context(no_probe());
    for component in Component::ALL {
        caches.add_statefulset(cached_statefulset(component, true));
    }
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    let result = run(
        async move {
            everything_but_the_statefulsets(&mut api, &secrets).await;
            // Scaled to zero, never deleted; the apiserver is not asked whether it answers.
            statefulsets_applied(&mut api, 0, 0).await;
            let status: Value = api.vc_status().await;
            assert_eq!(status["phase"], "Paused");
            assert_eq!(status["reason"], "Paused");
            assert!(
                status["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("scaled to zero")),
                "{status}"
            );
            assert_eq!(condition(&status, CONDITION_PAUSED)["status"], "True");
            assert_eq!(condition(&status, CONDITION_READY)["status"], "False");
            assert_eq!(condition(&status, CONDITION_READY)["reason"], "Paused");
            // The phase change is announced (after the conditions' events).
            loop {
                let call = api
                    .expect(
                        "POST",
                        &format!("/apis/events.k8s.io/v1/namespaces/{VC_NAMESPACE}/events?"),
                    )
                    .await;
                let reason = call.body["reason"].as_str().unwrap_or_default().to_owned();
                let body = call.body.clone();
                call.ok(body);
                if reason == "Paused" {
                    break;
                }
            }
        },
        reconcile(Arc::new(paused(running(native_vc()))), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn a_resumed_tenant_scales_back_and_goes_through_readiness() {
    let (ctx, mut caches, mut api) = context(no_probe());
    for component in Component::ALL {
        let mut sts = cached_statefulset(component, false);
        if let Some(spec) = sts.spec.as_mut() {
            spec.replicas = Some(0);
        }
        caches.add_statefulset(sts);
    }
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    // As the pause left it: phase Paused, Paused=True.
    let mut vc = running(native_vc());
    if let Some(status) = vc.status.as_mut() {
        status.phase = Some(crds::ClusterPhase::Paused);
        status.conditions.push(Condition {
            type_: CONDITION_PAUSED.into(),
            status: "True".into(),
            reason: "Paused".into(),
            message: "spec.paused is true".into(),
            observed_generation: Some(2),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        });
    }
    let result = run(
        async move {
            everything_but_the_statefulsets(&mut api, &secrets).await;
            // Back to the ClusterVersion's replicas; not ready yet.
            statefulsets_applied(&mut api, 1, 0).await;
            let status: Value = api.vc_status().await;
            assert_eq!(status["phase"], "Pending", "{status}");
            assert_eq!(condition(&status, CONDITION_PAUSED)["status"], "False");
            assert_eq!(condition(&status, CONDITION_PAUSED)["reason"], "Resumed");
            assert_eq!(condition(&status, CONDITION_READY)["status"], "False");
        },
        reconcile(Arc::new(vc), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}
