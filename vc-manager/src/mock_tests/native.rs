//! Provisioned tenants: the full first reconcile, a steady state that writes nothing but the
//! StatefulSets, readiness and rollouts, drift, and every failure branch.

use std::{sync::Arc, time::Duration};

use crds::wellknown::{
    CONDITION_APISERVER_READY, CONDITION_CONTROLLER_MANAGER_READY, CONDITION_ETCD_READY, CONDITION_PKI_READY,
    CONDITION_READY,
};
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::*;
use crate::{
    Error,
    component::Component,
    virtual_cluster::{error_policy, reconcile},
};
use tenant_pki::{
    pki::{inspect, is_signed_by},
    secrets::Scope,
};

fn ns_path() -> String {
    format!("/api/v1/namespaces/{}", root())
}

fn secret_path(name: &str) -> String {
    format!("/api/v1/namespaces/{}/secrets/{name}", root())
}

fn sts_path(name: &str) -> String {
    format!("/apis/apps/v1/namespaces/{}/statefulsets/{name}", root())
}

fn service_path(name: &str) -> String {
    format!("/api/v1/namespaces/{}/services/{name}", root())
}

fn root_namespace_object() -> Value {
    let identity = TenantIdentity::of(&native_vc()).expect("identity");
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": root(),
            "uid": "ns-uid",
            "labels": crate::identity::managed_labels(),
            "annotations": identity.root_namespace_annotations(),
        }
    })
}

/// The root namespace exists as vc-manager left it.
async fn root_namespace_exists(api: &mut ApiServer) {
    api.expect("GET", &ns_path()).await.ok(root_namespace_object());
}

/// The ClusterVersion is read live (or found missing).
async fn cluster_version_read(api: &mut ApiServer, cv: Option<ClusterVersion>) {
    let call = api
        .expect(
            "GET",
            &format!("/apis/tenancy.x-k8s.io/v1alpha1/clusterversions/{CV_NAME}"),
        )
        .await;
    match cv {
        Some(cv) => call.ok(serde_json::to_value(cv).expect("json")),
        None => call.not_found("clusterversions", CV_NAME),
    }
}

/// The Services are applied; the apiserver's gets a cluster IP.
async fn services(api: &mut ApiServer) {
    let mut calls = api
        .concurrent(&service_path(""), &["etcd", "apiserver-svc"])
        .await;
    let etcd = calls.remove("etcd").expect("etcd");
    assert_eq!(etcd.body["metadata"]["namespace"], root());
    assert_eq!(etcd.body["spec"]["clusterIP"], "None");
    etcd.echo();
    let call = calls.remove("apiserver-svc").expect("apiserver");
    let mut body = call.body.clone();
    body["spec"]["clusterIP"] = json!("10.96.0.50");
    body["spec"]["clusterIPs"] = json!(["10.96.0.50"]);
    call.ok(body);
}

const SECRET_ORDER: [&str; 12] = [
    "root-ca",
    "etcd-ca",
    "front-proxy-ca",
    "kubelet-client-ca",
    "serviceaccount-rsa",
    "apiserver-ca",
    "etcd-server",
    "etcd-client",
    "front-proxy-client",
    "kubelet-client",
    "admin-kubeconfig",
    "controller-manager-kubeconfig",
];

fn text(secret: &Value, key: &str) -> String {
    use base64::Engine;
    let encoded = secret["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} in {secret}"));
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("base64"),
    )
    .expect("utf-8")
}

#[tokio::test]
async fn first_reconcile_provisions_namespace_services_pki_and_etcd_then_waits() {
    let (ctx, _caches, mut api) = context(no_probe());
    let vc = native_vc();
    let result = run(
        async move {
            api.expect("GET", &ns_path())
                .await
                .not_found("namespaces", &root());
            let namespace = api.expect("PATCH", &format!("{}{APPLY}", ns_path())).await;
            let annotations = namespace.body["metadata"]["annotations"].clone();
            assert_eq!(annotations["tenancy.x-k8s.io/vcname"], VC_NAME);
            assert_eq!(annotations["tenancy.x-k8s.io/vcnamespace"], VC_NAMESPACE);
            assert_eq!(annotations["tenancy.x-k8s.io/vcuid"], VC_UID);
            assert_eq!(annotations["tenancy.x-k8s.io/vcrootns"], "true");
            assert_eq!(annotations["tenancy.x-k8s.io/cluster"], root());
            assert_eq!(
                namespace.body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
                "vc-manager"
            );
            namespace.echo();
            assert!(api.event("Provisioning").await.contains(&root()));
            cluster_version_read(&mut api, Some(cluster_version())).await;
            services(&mut api).await;

            api.expect("GET", &format!("/api/v1/namespaces/{}/secrets?", root()))
                .await
                .ok(secret_list(&[]));
            let mut written = BTreeMap::new();
            // Authorities first, then what they sign; each group written at once.
            for group in [&SECRET_ORDER[..5], &SECRET_ORDER[5..]] {
                for (name, call) in api.concurrent(&secret_path(""), group).await {
                    written.insert(name, call.body.clone());
                    call.echo();
                }
            }
            let note = api.event("CertificatesIssued").await;
            assert!(
                note.contains("root-ca") && note.contains("admin-kubeconfig"),
                "{note}"
            );
            // The serving certificate covers the Service's cluster IP and chains to the root CA.
            let serving = text(&written["apiserver-ca"], "tls.crt");
            assert!(is_signed_by(&serving, &text(&written["root-ca"], "tls.crt")));
            let info = inspect(&serving).expect("serving cert");
            assert!(info.ip_addresses.contains(&"10.96.0.50".parse().expect("ip")));
            assert!(info.dns_names.contains(&format!("apiserver-svc.{}.svc", root())));
            assert_eq!(
                written["kubelet-client"]["metadata"]["labels"]["tenancy.x-k8s.io/kubelet-client"],
                "true"
            );

            let etcd = api.expect("PATCH", &format!("{}{APPLY}", sts_path("etcd"))).await;
            let args = etcd.body["spec"]["template"]["spec"]["containers"][0]["args"].clone();
            assert!(
                args.as_array()
                    .expect("args")
                    .iter()
                    .any(|a| a == "--initial-cluster=etcd-0=https://etcd-0.etcd:2380"),
                "{args}"
            );
            let checksums = etcd.body["spec"]["template"]["metadata"]["annotations"].clone();
            assert!(
                checksums["checksum.tenancy.x-k8s.io/etcd-server"].is_string(),
                "{checksums}"
            );
            let body = with_status(etcd.body.clone(), 1, 0);
            etcd.ok(body);
            assert!(api.event("EtcdCreated").await.contains("etcd"));
            // apiserver and controller-manager wait for etcd: no request for them.

            let status = api.vc_status().await;
            assert_eq!(status["phase"], "Pending");
            assert_eq!(status["clusterNamespace"], root());
            assert_eq!(status["observedGeneration"], 2);
            assert_eq!(condition(&status, CONDITION_PKI_READY)["status"], "True");
            assert_eq!(
                condition(&status, CONDITION_ETCD_READY)["reason"],
                "StatefulSetNotReady"
            );
            assert_eq!(
                condition(&status, CONDITION_APISERVER_READY)["reason"],
                "WaitingForEtcd"
            );
            assert_eq!(
                condition(&status, CONDITION_CONTROLLER_MANAGER_READY)["reason"],
                "WaitingForAPIServer"
            );
            assert_eq!(condition(&status, CONDITION_READY)["status"], "False");
            assert_eq!(status["conditions"].as_array().map(Vec::len), Some(5));
            api.event("PKIReady").await;
            api.event("Pending").await;
        },
        reconcile(Arc::new(vc), ctx.clone()),
    )
    .await;
    let action = result.expect("reconciled");
    assert_eq!(action, Action::requeue(Duration::from_secs(600)));
    assert_eq!(ctx.metrics.reconcile_count("virtualcluster", "success"), 1);
    let expiries = ctx
        .metrics
        .expiries_of(&kube::runtime::reflector::ObjectRef::new(VC_NAME).within(VC_NAMESPACE));
    assert_eq!(expiries.len(), 11);
}

/// Everything exists and is valid: only the StatefulSets are applied (drift repair) and the status is
/// already right, so nothing else is written.
#[tokio::test]
async fn a_healthy_tenant_reapplies_its_statefulsets_and_writes_nothing_else() {
    let (ctx, mut caches, mut api) = context(no_probe());
    for component in Component::ALL {
        caches.add_statefulset(cached_statefulset(component, true));
    }
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    let first = run(
        {
            let secrets = secrets.clone();
            async move {
                root_namespace_exists(&mut api).await;
                cluster_version_read(&mut api, Some(cluster_version())).await;
                services(&mut api).await;
                api.expect("GET", &format!("/api/v1/namespaces/{}/secrets?", root()))
                    .await
                    .ok(secret_list(&secrets));
                for name in ["etcd", "apiserver", "controller-manager"] {
                    let call = api.expect("PATCH", &format!("{}{APPLY}", sts_path(name))).await;
                    let body = with_status(call.body.clone(), 1, 1);
                    call.ok(body);
                }
                let status = api.vc_status().await;
                assert_eq!(status["phase"], "Running");
                assert_eq!(status["reason"], "TenantControlPlaneRunning");
                for type_ in [
                    CONDITION_ETCD_READY,
                    CONDITION_APISERVER_READY,
                    CONDITION_CONTROLLER_MANAGER_READY,
                ] {
                    assert_eq!(condition(&status, type_)["status"], "True", "{type_}");
                    assert_eq!(condition(&status, type_)["message"], "1/1 replicas ready");
                }
                assert_eq!(condition(&status, CONDITION_READY)["status"], "True");
                for reason in [
                    "PKIReady",
                    "EtcdReady",
                    "APIServerReady",
                    "ControllerManagerReady",
                    "Ready",
                ] {
                    api.event(reason).await;
                }
                assert!(api.event("Running").await.contains("ready"));
            }
        },
        reconcile(Arc::new(native_vc()), ctx.clone()),
    )
    .await;
    assert!(first.is_ok(), "{first:?}");
}

#[tokio::test]
async fn an_unchanged_running_status_is_not_written() {
    let (ctx, mut caches, mut api) = context(no_probe());
    for component in Component::ALL {
        caches.add_statefulset(cached_statefulset(component, true));
    }
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    // The status a previous reconcile wrote.
    let mut vc = native_vc();
    let desired = {
        let components: Vec<_> = Component::ALL
            .iter()
            .map(|c| {
                (
                    *c,
                    crate::status::ComponentState::of(&cached_statefulset(*c, true)),
                )
            })
            .collect();
        let (phase, reason, message) = crate::status::native_phase(None, &components);
        let identity = TenantIdentity::of(&vc).expect("identity");
        let plan = tenant_pki::secrets::plan(
            &secrets.iter().map(|s| (s.name_any(), s.clone())).collect(),
            &PkiInput {
                identity: &identity,
                lifetimes: Lifetimes::for_days(365),
                now: crate::steps::now(),
                scope: &Scope::Native(Box::new(network())),
            },
        )
        .expect("plan");
        let next = plan
            .next_renewal
            .and_then(|at| Timestamp::from_second(at).ok())
            .map(|t| t.to_string())
            .unwrap_or_default();
        let mut conditions = vec![crate::status::ConditionState::met(
            CONDITION_PKI_READY,
            "CertificatesValid",
            format!("12 Secrets in {}; next certificate renewal at {next}", root()),
        )];
        conditions.extend(components.iter().map(|(c, s)| s.condition(*c)));
        conditions.push(crate::status::native_ready(phase, &reason, &message, &components));
        crate::status::DesiredStatus {
            phase,
            reason,
            message,
            cluster_namespace: root(),
            mode: crds::ControlPlaneMode::Provisioned,
            conditions,
            observed_generation: Some(2),
        }
    };
    vc.status = Some(VirtualClusterStatus {
        phase: Some(desired.phase),
        reason: Some(desired.reason.clone()),
        message: Some(desired.message.clone()),
        cluster_namespace: Some(root()),
        conditions: desired.conditions_at(&vc, Timestamp::now()),
        observed_generation: Some(2),
        mode: Some(crds::ControlPlaneMode::Provisioned),
        usage: None,
        snapshots: None,
        attach_backoff: None,
    });
    let result = run(
        async move {
            up_to_the_statefulsets(&mut api, &secrets).await;
            for name in ["etcd", "apiserver", "controller-manager"] {
                let call = api.expect("PATCH", &format!("{}{APPLY}", sts_path(name))).await;
                let body = with_status(call.body.clone(), 1, 1);
                call.ok(body);
            }
            // No status write, no events.
        },
        reconcile(Arc::new(vc), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}

/// The steps of a provisioned native tenant's reconcile before its StatefulSets: root namespace,
/// ClusterVersion, Services, and the Secrets, which are all stored already.
async fn up_to_the_statefulsets(api: &mut ApiServer, secrets: &[Secret]) {
    root_namespace_exists(api).await;
    cluster_version_read(api, Some(cluster_version())).await;
    services(api).await;
    api.expect("GET", &format!("/api/v1/namespaces/{}/secrets?", root()))
        .await
        .ok(secret_list(secrets));
}

/// A reconcile of a provisioned native tenant whose apiserver StatefulSet was deleted: the StatefulSets
/// are applied, the apiserver's made again (not ready yet).
async fn apiserver_made_again(api: &mut ApiServer) {
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    up_to_the_statefulsets(api, &secrets).await;
    for (name, ready) in [("etcd", 1), ("apiserver", 0), ("controller-manager", 1)] {
        let call = api.expect("PATCH", &format!("{}{APPLY}", sts_path(name))).await;
        let body = with_status(call.body.clone(), 1, ready);
        call.ok(body);
    }
}

#[tokio::test]
async fn a_deleted_statefulset_of_a_running_tenant_is_restored_and_reported() {
    let (ctx, mut caches, mut api) = context(no_probe());
    // The apiserver StatefulSet was deleted: it is not in the cache.
    caches.add_statefulset(cached_statefulset(Component::Etcd, true));
    caches.add_statefulset(cached_statefulset(Component::ControllerManager, true));
    let result = run(
        async move {
            apiserver_made_again(&mut api).await;
            assert!(api.event("APIServerRestored").await.contains("apiserver"));
            let status = api.vc_status().await;
            assert_eq!(status["phase"], "Updating");
            assert_eq!(condition(&status, CONDITION_APISERVER_READY)["status"], "False");
            assert_eq!(condition(&status, CONDITION_READY)["status"], "False");
            assert!(
                api.event("APIServerNotReady")
                    .await
                    .contains("StatefulSetNotReady")
            );
            api.event("NotReady").await;
            api.event("Updating").await;
        },
        reconcile(Arc::new(running(native_vc())), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}

/// The same, when the status went to Pending (apiserver not ready) before the StatefulSet was made again:
/// its condition shows it was observed before, so it is reported as restored, not as created.
#[tokio::test]
async fn a_deleted_statefulset_is_reported_restored_after_the_status_went_to_pending() {
    let (ctx, mut caches, mut api) = context(no_probe());
    caches.add_statefulset(cached_statefulset(Component::Etcd, true));
    caches.add_statefulset(cached_statefulset(Component::ControllerManager, true));
    let mut vc = running(native_vc());
    if let Some(status) = vc.status.as_mut() {
        status.phase = Some(crds::ClusterPhase::Pending);
        for condition in &mut status.conditions {
            if condition.type_ == CONDITION_APISERVER_READY || condition.type_ == CONDITION_READY {
                condition.status = "False".into();
                condition.reason = "StatefulSetNotReady".into();
            }
        }
    }
    let result = run(
        async move {
            apiserver_made_again(&mut api).await;
            assert!(api.event("APIServerRestored").await.contains("apiserver"));
            let _ = api.vc_status().await;
        },
        reconcile(Arc::new(vc), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}

/// A pass that restores a StatefulSet and then fails on the next one still tells the restore: the pass
/// after it finds the StatefulSet in its cache, and would not.
#[tokio::test]
async fn a_restore_is_told_when_a_later_apply_of_the_same_pass_fails() {
    let (ctx, mut caches, mut api) = context(no_probe());
    caches.add_statefulset(cached_statefulset(Component::Etcd, true));
    caches.add_statefulset(cached_statefulset(Component::ControllerManager, true));
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    let result = run(
        async move {
            up_to_the_statefulsets(&mut api, &secrets).await;
            for (name, ready) in [("etcd", 1), ("apiserver", 0)] {
                let call = api.expect("PATCH", &format!("{}{APPLY}", sts_path(name))).await;
                let body = with_status(call.body.clone(), 1, ready);
                call.ok(body);
            }
            api.expect("PATCH", &format!("{}{APPLY}", sts_path("controller-manager")))
                .await
                .fail(500, "InternalError", "etcdserver: request timed out");
            assert!(api.event("APIServerRestored").await.contains("apiserver"));
            failure_reported(&mut api, "StatefulSetApplyFailed").await;
        },
        reconcile(Arc::new(running(native_vc())), ctx),
    )
    .await;
    assert_eq!(result.expect_err("fails").reason(), "StatefulSetApplyFailed");
}

#[tokio::test]
async fn a_changed_cluster_version_rolls_the_control_plane_and_keeps_the_keys() {
    let (ctx, mut caches, mut api) = context(no_probe());
    let mut cv = cluster_version();
    cv.metadata.generation = Some(2);
    if let Some(pod) = cv
        .spec
        .api_server
        .statefulset
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
    {
        pod.containers[0].image = Some("registry.k8s.io/kube-apiserver:v1.34.0".into());
    }
    let upgraded = cv;
    for component in Component::ALL {
        caches.add_statefulset(cached_statefulset(component, true));
    }
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    let result = run(
        async move {
            root_namespace_exists(&mut api).await;
            cluster_version_read(&mut api, Some(upgraded)).await;
            services(&mut api).await;
            api.expect("GET", &format!("/api/v1/namespaces/{}/secrets?", root()))
                .await
                .ok(secret_list(&secrets));
            // No Secret is rewritten: the CA and service-account key stay.
            for name in ["etcd", "apiserver", "controller-manager"] {
                let call = api.expect("PATCH", &format!("{}{APPLY}", sts_path(name))).await;
                assert_eq!(
                    call.body["metadata"]["annotations"]["tenancy.x-k8s.io/cluster-version-generation"],
                    "2"
                );
                let mut body = with_status(call.body.clone(), 1, 1);
                if name == "apiserver" {
                    assert_eq!(
                        call.body["spec"]["template"]["spec"]["containers"][0]["image"],
                        "registry.k8s.io/kube-apiserver:v1.34.0"
                    );
                    body["metadata"]["generation"] = json!(2);
                    body["status"]["updatedReplicas"] = json!(0);
                    body["status"]["updateRevision"] = json!("r2");
                }
                call.ok(body);
            }
            let note = api.event("Upgrading").await;
            assert!(
                note.contains("generation 1") && note.contains("generation 2"),
                "{note}"
            );
            assert!(
                note.starts_with("rolling etcd, apiserver, controller-manager"),
                "{note}"
            );
            let status = api.vc_status().await;
            assert_eq!(status["phase"], "Updating");
            assert_eq!(status["reason"], "RollingOut");
            assert_eq!(
                condition(&status, CONDITION_APISERVER_READY)["reason"],
                "RollingOut"
            );
            api.event("Updating").await;
        },
        reconcile(Arc::new(running(native_vc())), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn a_root_namespace_being_deleted_is_waited_for() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            let mut namespace = root_namespace_object();
            namespace["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            api.expect("GET", &ns_path()).await.ok(namespace);
            let status = api.vc_status().await;
            assert_eq!(status["phase"], "Updating");
            assert_eq!(status["reason"], "RootNamespaceTerminating");
            assert_eq!(condition(&status, CONDITION_READY)["status"], "False");
            api.event("PKINotReady").await;
            api.event("NotReady").await;
            api.event("Updating").await;
        },
        reconcile(Arc::new(running(native_vc())), ctx),
    )
    .await;
    assert_eq!(
        result.expect("waiting is not an error"),
        Action::requeue(Duration::from_secs(2))
    );
}

/// Expects the failure event and status after a failed step.
async fn failure_reported(api: &mut ApiServer, reason: &str) -> Value {
    let note = api.event(reason).await;
    assert!(!note.is_empty());
    let status = api.vc_status().await;
    assert_eq!(status["reason"], reason);
    status
}

#[tokio::test]
async fn a_missing_finalizer_is_added_first_and_a_conflict_is_retried() {
    let (ctx, _caches, mut api) = context(no_probe());
    let mut vc = native_vc();
    vc.metadata.finalizers = None;
    let result = run(
        async move {
            let call = api
                .expect(
                    "PATCH",
                    &format!("/apis/tenancy.x-k8s.io/v1alpha1/namespaces/{VC_NAMESPACE}/virtualclusters/{VC_NAME}{MERGE}"),
                )
                .await;
            assert_eq!(call.content_type, "application/merge-patch+json");
            assert_eq!(
                call.body,
                json!({"metadata": {"resourceVersion": "100", "finalizers": ["tenancy.x-k8s.io/virtualcluster"]}})
            );
            call.fail(409, "Conflict", "the object has been modified");
            let status = failure_reported(&mut api, "FinalizerFailed").await;
            assert_eq!(status["phase"], "Error");
            assert_eq!(condition(&status, CONDITION_READY)["reason"], "FinalizerFailed");
        },
        reconcile(Arc::new(vc.clone()), ctx.clone()),
    )
    .await;
    let error = result.expect_err("conflict");
    assert_eq!(error.reason(), "FinalizerFailed");
    // Exponential backoff per object, reset by a success.
    let vc = Arc::new(vc);
    assert_eq!(
        error_policy(vc.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    assert_eq!(
        error_policy(vc.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(2))
    );
    assert_eq!(
        error_policy(vc, &error, ctx.clone()),
        Action::requeue(Duration::from_secs(4))
    );
    assert_eq!(
        ctx.metrics.reconcile_count("virtualcluster", "FinalizerFailed"),
        1
    );
}

#[tokio::test]
async fn an_unreadable_root_namespace_fails_the_pki_step() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            api.expect("GET", &ns_path())
                .await
                .fail(500, "InternalError", "etcd timeout");
            let status = failure_reported(&mut api, "RootNamespaceFailed").await;
            assert_eq!(status["phase"], "Error");
            let pki = condition(&status, CONDITION_PKI_READY);
            assert_eq!(pki["status"], "False");
            assert!(
                pki["message"].as_str().expect("message").contains("etcd timeout"),
                "{pki}"
            );
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("fails").reason(), "RootNamespaceFailed");
}

#[tokio::test]
async fn a_root_namespace_of_another_virtual_cluster_is_refused() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            let mut namespace = root_namespace_object();
            namespace["metadata"]["annotations"]["tenancy.x-k8s.io/vcuid"] = json!("someone-else");
            api.expect("GET", &ns_path()).await.ok(namespace);
            let status = failure_reported(&mut api, "RootNamespaceConflict").await;
            assert!(
                status["message"]
                    .as_str()
                    .expect("message")
                    .contains("someone-else")
            );
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert!(
        matches!(result, Err(Error::RootNamespaceConflict { .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_missing_cluster_version_is_an_error_until_it_appears() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            root_namespace_exists(&mut api).await;
            cluster_version_read(&mut api, None).await;
            let status = failure_reported(&mut api, "ClusterVersionNotFound").await;
            assert_eq!(status["phase"], "Error");
            let ready = condition(&status, CONDITION_READY);
            assert_eq!(ready["status"], "False");
            assert_eq!(
                ready["message"],
                format!("ClusterVersion {CV_NAME} does not exist")
            );
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("missing").reason(), "ClusterVersionNotFound");
}

#[tokio::test]
async fn an_unreadable_cluster_version_is_reported() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            root_namespace_exists(&mut api).await;
            api.expect(
                "GET",
                &format!("/apis/tenancy.x-k8s.io/v1alpha1/clusterversions/{CV_NAME}"),
            )
            .await
            .fail(500, "InternalError", "etcd leader changed");
            let status = failure_reported(&mut api, "ClusterVersionReadFailed").await;
            assert!(
                status["message"]
                    .as_str()
                    .expect("message")
                    .contains("etcd leader changed")
            );
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("fails").reason(), "ClusterVersionReadFailed");
}

#[tokio::test]
async fn an_invalid_cluster_version_leaves_a_running_tenant_running() {
    let (ctx, _caches, mut api) = context(no_probe());
    let mut cv = cluster_version();
    cv.spec.api_server.service = None;
    let result = run(
        async move {
            root_namespace_exists(&mut api).await;
            cluster_version_read(&mut api, Some(cv)).await;
            let status = failure_reported(&mut api, "ClusterVersionInvalid").await;
            // The control plane still runs; the failure is in reason/message and the event.
            assert_eq!(status["phase"], "Running");
            assert_eq!(condition(&status, CONDITION_READY)["status"], "True");
            assert!(
                status["message"]
                    .as_str()
                    .expect("message")
                    .contains("has no Service")
            );
        },
        reconcile(Arc::new(running(native_vc())), ctx),
    )
    .await;
    assert_eq!(result.expect_err("invalid").reason(), "ClusterVersionInvalid");
}

#[tokio::test]
async fn a_failed_service_apply_is_reported_on_its_component() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            root_namespace_exists(&mut api).await;
            cluster_version_read(&mut api, Some(cluster_version())).await;
            let mut calls = api
                .concurrent(&service_path(""), &["etcd", "apiserver-svc"])
                .await;
            calls
                .remove("etcd")
                .expect("etcd")
                .fail(422, "Invalid", "spec.ports: Required value");
            calls.remove("apiserver-svc").expect("apiserver").echo();
            let status = failure_reported(&mut api, "ServiceApplyFailed").await;
            assert_eq!(condition(&status, CONDITION_ETCD_READY)["status"], "False");
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("fails").reason(), "ServiceApplyFailed");
}

#[tokio::test]
async fn a_failed_secret_list_is_reported() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            root_namespace_exists(&mut api).await;
            cluster_version_read(&mut api, Some(cluster_version())).await;
            services(&mut api).await;
            api.expect("GET", &format!("/api/v1/namespaces/{}/secrets?", root()))
                .await
                .fail(403, "Forbidden", "secrets is forbidden");
            let status = failure_reported(&mut api, "SecretListFailed").await;
            assert_eq!(condition(&status, CONDITION_PKI_READY)["status"], "False");
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("fails").reason(), "SecretListFailed");
}

#[tokio::test]
async fn a_failed_secret_apply_stops_before_the_statefulsets() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            root_namespace_exists(&mut api).await;
            cluster_version_read(&mut api, Some(cluster_version())).await;
            services(&mut api).await;
            api.expect("GET", &format!("/api/v1/namespaces/{}/secrets?", root()))
                .await
                .ok(secret_list(&[]));
            let mut calls = api.concurrent(&secret_path(""), &SECRET_ORDER[..5]).await;
            calls
                .remove("root-ca")
                .expect("root-ca")
                .fail(500, "InternalError", "quota exceeded");
            for (_, call) in calls {
                call.echo();
            }
            let status = failure_reported(&mut api, "SecretApplyFailed").await;
            let pki = condition(&status, CONDITION_PKI_READY);
            assert_eq!(pki["status"], "False");
            assert!(pki["message"].as_str().expect("message").contains("root-ca"));
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("fails").reason(), "SecretApplyFailed");
}

#[tokio::test]
async fn a_rejected_statefulset_is_reported_on_its_component() {
    let (ctx, _caches, mut api) = context(no_probe());
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    let result = run(
        async move {
            up_to_the_statefulsets(&mut api, &secrets).await;
            api.expect("PATCH", &format!("{}{APPLY}", sts_path("etcd")))
                .await
                .fail(
                    422,
                    "Invalid",
                    "spec.template.spec.containers[0].image: Required value",
                );
            let status = failure_reported(&mut api, "StatefulSetApplyFailed").await;
            assert_eq!(status["phase"], "Error");
            assert_eq!(
                condition(&status, CONDITION_PKI_READY)["reason"],
                "CertificatesValid"
            );
            let etcd = condition(&status, CONDITION_ETCD_READY);
            assert_eq!(etcd["status"], "False");
            assert!(
                etcd["message"]
                    .as_str()
                    .expect("message")
                    .contains("image: Required value"),
                "{etcd}"
            );
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("fails").reason(), "StatefulSetApplyFailed");
}

#[tokio::test]
async fn a_failed_status_write_is_an_error_and_retried() {
    let (ctx, mut caches, mut api) = context(no_probe());
    for component in Component::ALL {
        caches.add_statefulset(cached_statefulset(component, true));
    }
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    let result = run(
        async move {
            up_to_the_statefulsets(&mut api, &secrets).await;
            for name in ["etcd", "apiserver", "controller-manager"] {
                let call = api.expect("PATCH", &format!("{}{APPLY}", sts_path(name))).await;
                let body = with_status(call.body.clone(), 1, 1);
                call.ok(body);
            }
            api.expect(
                "PATCH",
                &format!("/apis/tenancy.x-k8s.io/v1alpha1/namespaces/{VC_NAMESPACE}/virtualclusters/{VC_NAME}/status{APPLY}"),
            )
            .await
            .fail(500, "InternalError", "try again");
            // The failure report tries the status once more.
            api.event("StatusApplyFailed").await;
            api.expect(
                "PATCH",
                &format!("/apis/tenancy.x-k8s.io/v1alpha1/namespaces/{VC_NAMESPACE}/virtualclusters/{VC_NAME}/status{APPLY}"),
            )
            .await
            .fail(500, "InternalError", "still failing");
        },
        reconcile(Arc::new(native_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("fails").reason(), "StatusApplyFailed");
}

#[tokio::test]
async fn a_virtual_cluster_without_uid_is_refused_without_requests() {
    let (ctx, _caches, api) = context(no_probe());
    let mut vc = native_vc();
    vc.metadata.uid = None;
    let result = run(async move { drop(api) }, reconcile(Arc::new(vc), ctx)).await;
    assert_eq!(result.expect_err("no uid").reason(), "MissingIdentity");
}

#[tokio::test]
async fn a_standby_replica_does_nothing() {
    let (ctx, _caches, api) = context(no_probe());
    ctx.leader.set(false);
    let result = run(async move { drop(api) }, reconcile(Arc::new(native_vc()), ctx)).await;
    assert_eq!(result.expect("no error"), Action::await_change());
}
