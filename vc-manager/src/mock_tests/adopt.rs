//! Adopted tenants: Running when the kubeconfig answers, and a condition naming exactly what failed when
//! it does not.

use std::{sync::Arc, time::Duration};

use base64::{Engine, engine::general_purpose::STANDARD};
use crds::{
    KubeconfigSecretRef,
    wellknown::{
        ANNOTATION_ADMIN_KUBECONFIG, CONDITION_APISERVER_READY, CONDITION_PKI_READY, CONDITION_READY,
    },
};
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::*;
use crate::{probe::classify, virtual_cluster::reconcile};
use tenant_pki::secrets::Scope;

const SECRET: &str = "tenant-kubeconfig";

const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: 'https://tenant.example:6443', insecure-skip-tls-verify: true}}]
users: [{name: t, user: {token: abc}}]
contexts: [{name: t, context: {cluster: t, user: t}}]
current-context: t
";

fn adopted_vc() -> VirtualCluster {
    let mut vc = native_vc();
    vc.spec.cluster_version_name = None;
    vc.spec.kubeconfig_secret_ref = Some(KubeconfigSecretRef {
        name: SECRET.into(),
        key: "value".into(),
    });
    vc
}

fn answering() -> Arc<dyn crate::probe::TenantProbe> {
    Arc::new(FakeProbe(Box::new(|origin, kubeconfig| {
        assert_eq!(origin, format!("Secret {VC_NAMESPACE}/{SECRET} key value"));
        assert_eq!(kubeconfig, KUBECONFIG);
        Ok(ProbeReport {
            server: "https://tenant.example:6443".into(),
            version: "v1.26.3".into(),
        })
    })))
}

fn failing(code: u16) -> Arc<dyn crate::probe::TenantProbe> {
    Arc::new(FakeProbe(Box::new(move |_, _| {
        Err(classify(
            "https://tenant.example:6443".into(),
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: "Unauthorized".into(),
                reason: "Unauthorized".into(),
                ..Default::default()
            })),
        ))
    })))
}

/// The kubeconfig Secret, labelled as meant for the VirtualCluster.
fn kubeconfig_secret(data: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": VC_NAMESPACE,
            "labels": {crds::wellknown::LABEL_KUBECONFIG_FOR: adopted_vc().metadata.name}},
        "data": data,
    })
}

async fn root_and_kubelet_client(api: &mut ApiServer, stored: &[Secret]) {
    let identity = TenantIdentity::of(&native_vc()).expect("identity");
    api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
        .await
        .ok(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": root(),
                "labels": crate::identity::managed_labels(),
                "annotations": identity.root_namespace_annotations(),
            }
        }));
    api.expect("GET", &format!("/api/v1/namespaces/{}/secrets?", root()))
        .await
        .ok(secret_list(stored));
}

/// An adopted tenant whose root namespace someone deletes is waited for, and stays adopted: its status
/// never says `Provisioned` (which would make it a control plane vc-manager runs).
#[tokio::test]
async fn an_adopted_tenant_keeps_its_mode_while_its_root_namespace_is_deleted() {
    let (ctx, _caches, mut api) = context(answering());
    let result = run(
        async move {
            api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
                .await
                .ok(json!({
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": root(), "labels": crate::identity::managed_labels(),
                        "deletionTimestamp": "2026-01-01T00:00:00Z"}
                }));
            let status = api.vc_status().await;
            assert_eq!(status["reason"], "RootNamespaceTerminating");
            assert_eq!(status["mode"], "Adopted");
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    assert_eq!(
        result.expect("waiting is not an error"),
        Action::requeue(Duration::from_secs(2))
    );
}

fn secret_path() -> String {
    format!("/api/v1/namespaces/{VC_NAMESPACE}/secrets/{SECRET}")
}

#[tokio::test]
async fn a_reachable_tenant_runs_and_gets_its_kubelet_client_certificate() {
    let (ctx, _caches, mut api) = context(answering());
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &[]).await;
            for name in ["kubelet-client-ca", "kubelet-client"] {
                let call = api
                    .expect(
                        "PATCH",
                        &format!("/api/v1/namespaces/{}/secrets/{name}{APPLY}", root()),
                    )
                    .await;
                if name == "kubelet-client" {
                    let meta = &call.body["metadata"];
                    assert_eq!(meta["labels"]["tenancy.x-k8s.io/kubelet-client"], "true");
                    assert_eq!(meta["annotations"]["tenancy.x-k8s.io/cluster"], root());
                    assert_eq!(meta["annotations"]["tenancy.x-k8s.io/vcuid"], VC_UID);
                    let keys: Vec<&String> = call.body["data"].as_object().expect("data").keys().collect();
                    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
                }
                call.echo();
            }
            assert!(api.event("CertificatesIssued").await.contains("kubelet-client"));
            api.expect("GET", &secret_path())
                .await
                .ok(kubeconfig_secret(json!({"value": STANDARD.encode(KUBECONFIG)})));
            let status = api.vc_status().await;
            assert_eq!(status["phase"], "Running");
            assert_eq!(status["conditions"].as_array().map(Vec::len), Some(3));
            assert_eq!(
                condition(&status, CONDITION_APISERVER_READY)["message"],
                "https://tenant.example:6443 answered /version with v1.26.3"
            );
            assert!(
                condition(&status, CONDITION_PKI_READY)["message"]
                    .as_str()
                    .expect("message")
                    .contains("--kubelet-client-certificate")
            );
            for reason in ["PKIReady", "APIServerReady", "Ready", "Running"] {
                api.event(reason).await;
            }
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    // Checked again periodically.
    assert_eq!(result.expect("running"), Action::requeue(Duration::from_secs(60)));
}

/// Expects the failure event and status of an adopted tenant and returns the status.
async fn adopt_failure(api: &mut ApiServer, reason: &str) -> Value {
    let note = api.event(reason).await;
    let status = api.vc_status().await;
    assert_eq!(status["phase"], "Error");
    assert_eq!(status["reason"], reason);
    // The step before the failure succeeded and says so.
    assert_eq!(
        condition(&status, CONDITION_PKI_READY)["reason"],
        "KubeletClientIssued"
    );
    for type_ in [CONDITION_APISERVER_READY, CONDITION_READY] {
        let c = condition(&status, type_);
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("False"), Some(reason)),
            "{type_}"
        );
        assert_eq!(c["message"], note);
    }
    status
}

#[tokio::test]
async fn a_missing_kubeconfig_secret_is_named() {
    let (ctx, _caches, mut api) = context(no_probe());
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            api.expect("GET", &secret_path())
                .await
                .not_found("secrets", SECRET);
            let status = adopt_failure(&mut api, "KubeconfigSecretNotFound").await;
            assert_eq!(
                status["message"],
                format!("kubeconfig Secret {VC_NAMESPACE}/{SECRET} does not exist")
            );
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("missing").reason(), "KubeconfigSecretNotFound");
}

#[tokio::test]
async fn a_missing_key_is_named() {
    let (ctx, _caches, mut api) = context(no_probe());
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            api.expect("GET", &secret_path()).await.ok(kubeconfig_secret(
                json!({"kubeconfig": STANDARD.encode(KUBECONFIG)}),
            ));
            let status = adopt_failure(&mut api, "KubeconfigKeyMissing").await;
            assert_eq!(
                status["message"],
                format!("kubeconfig Secret {VC_NAMESPACE}/{SECRET} has no key \"value\"")
            );
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("no key").reason(), "KubeconfigKeyMissing");
}

/// A Secret that does not say it is meant for this VirtualCluster (unlabelled, or labelled for another) is
/// refused before its data is read or probed, and the refusal names the Secret and the label.
#[tokio::test]
async fn a_secret_not_meant_for_the_virtual_cluster_is_refused() {
    for label in [None, Some("someone-else")] {
        let (ctx, _caches, mut api) = context(no_probe());
        let stored = stored_secrets(&Scope::KubeletClientOnly);
        let result = run(
            async move {
                root_and_kubelet_client(&mut api, &stored).await;
                let mut secret = kubeconfig_secret(json!({"value": STANDARD.encode(KUBECONFIG)}));
                secret["metadata"]["labels"] = match label {
                    Some(other) => json!({crds::wellknown::LABEL_KUBECONFIG_FOR: other}),
                    None => json!({}),
                };
                api.expect("GET", &secret_path()).await.ok(secret);
                let status = adopt_failure(&mut api, "KubeconfigSecretRefused").await;
                let message = status["message"].as_str().unwrap_or_default().to_owned();
                assert!(message.contains(&format!("{VC_NAMESPACE}/{SECRET}")), "{message}");
                assert!(
                    message.contains(crds::wellknown::LABEL_KUBECONFIG_FOR),
                    "{message}"
                );
            },
            reconcile(Arc::new(adopted_vc()), ctx),
        )
        .await;
        assert_eq!(result.expect_err("refused").reason(), "KubeconfigSecretRefused");
    }
}

#[tokio::test]
async fn an_unreadable_kubeconfig_secret_is_reported() {
    let (ctx, _caches, mut api) = context(no_probe());
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            api.expect("GET", &secret_path()).await.fail(
                403,
                "Forbidden",
                "secrets \"tenant-kubeconfig\" is forbidden",
            );
            api.event("KubeconfigSecretReadFailed").await;
            let status = api.vc_status().await;
            assert_eq!(status["phase"], "Error");
            assert_eq!(
                condition(&status, CONDITION_APISERVER_READY)["reason"],
                "KubeconfigSecretReadFailed"
            );
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    assert_eq!(
        result.expect_err("forbidden").reason(),
        "KubeconfigSecretReadFailed"
    );
}

#[tokio::test]
async fn an_unparsable_kubeconfig_is_reported() {
    let (ctx, _caches, mut api) = context(no_probe());
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            api.expect("GET", &secret_path()).await.ok(kubeconfig_secret(
                json!({"value": STANDARD.encode("clusters: [unclosed")}),
            ));
            let status = adopt_failure(&mut api, "KubeconfigInvalid").await;
            assert!(
                status["message"].as_str().expect("message").starts_with(&format!(
                    "kubeconfig from Secret {VC_NAMESPACE}/{SECRET} key value cannot be used"
                )),
                "{status}"
            );
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("invalid").reason(), "KubeconfigInvalid");
}

#[tokio::test]
async fn a_kubeconfig_that_reads_a_file_is_refused_by_field_and_never_probed() {
    // no_probe(): the probe (which builds a client) must not be reached.
    let (ctx, _caches, mut api) = context(no_probe());
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let hostile = KUBECONFIG.replace(
        "{token: abc}",
        "{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}",
    );
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            api.expect("GET", &secret_path())
                .await
                .ok(kubeconfig_secret(json!({"value": STANDARD.encode(&hostile)})));
            let status = adopt_failure(&mut api, "KubeconfigRefused").await;
            assert_eq!(
                status["message"],
                format!(
                    "kubeconfig from Secret {VC_NAMESPACE}/{SECRET} key value: field users[t].tokenFile is refused: reads a local file; only inline data (the *-data fields, token) is accepted"
                )
            );
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("refused").reason(), "KubeconfigRefused");
}

#[tokio::test]
async fn the_original_annotation_is_read_and_bad_base64_reported() {
    let (ctx, _caches, mut api) = context(no_probe());
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let mut vc = adopted_vc();
    vc.spec.kubeconfig_secret_ref = None;
    vc.metadata.annotations =
        Some([(ANNOTATION_ADMIN_KUBECONFIG.to_owned(), "not base64!".to_owned())].into());
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            // No Secret is read: the kubeconfig is in the annotation.
            let status = adopt_failure(&mut api, "KubeconfigInvalid").await;
            assert!(
                status["message"]
                    .as_str()
                    .expect("message")
                    .contains("annotation tenancy.x-k8s.io/admin-kubeconfig"),
                "{status}"
            );
        },
        reconcile(Arc::new(vc), ctx),
    )
    .await;
    assert_eq!(result.expect_err("bad base64").reason(), "KubeconfigInvalid");
}

#[tokio::test]
async fn rejected_credentials_stop_a_running_tenant() {
    let (ctx, _caches, mut api) = context(failing(401));
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            api.expect("GET", &secret_path())
                .await
                .ok(kubeconfig_secret(json!({"value": STANDARD.encode(KUBECONFIG)})));
            let status = adopt_failure(&mut api, "Unauthorized").await;
            assert!(
                status["message"]
                    .as_str()
                    .expect("message")
                    .starts_with("tenant apiserver https://tenant.example:6443 rejected the kubeconfig's credentials (401 Unauthorized)"),
                "{status}"
            );
        },
        reconcile(Arc::new(running(adopted_vc())), ctx),
    )
    .await;
    assert_eq!(result.expect_err("401").reason(), "Unauthorized");
}

#[tokio::test]
async fn a_forbidden_version_call_is_told_apart() {
    let (ctx, _caches, mut api) = context(failing(403));
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            api.expect("GET", &secret_path())
                .await
                .ok(kubeconfig_secret(json!({"value": STANDARD.encode(KUBECONFIG)})));
            adopt_failure(&mut api, "Forbidden").await;
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("403").reason(), "Forbidden");
}

#[tokio::test]
async fn an_unreachable_tenant_is_reported_with_the_real_probe() {
    let probe = Arc::new(crate::probe::KubeconfigProbe {
        timeouts: vc_runtime::clients::ClientTimeouts {
            connect: Duration::from_millis(500),
            read: Duration::from_millis(500),
        },
    });
    let (ctx, _caches, mut api) = context(probe);
    let stored = stored_secrets(&Scope::KubeletClientOnly);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let kubeconfig = KUBECONFIG.replace("tenant.example:6443", &format!("127.0.0.1:{port}"));
    let result = run(
        async move {
            root_and_kubelet_client(&mut api, &stored).await;
            api.expect("GET", &secret_path())
                .await
                .ok(kubeconfig_secret(json!({"value": STANDARD.encode(kubeconfig)})));
            let status = adopt_failure(&mut api, "APIServerUnreachable").await;
            assert!(
                status["message"].as_str().expect("message").starts_with(&format!(
                    "tenant apiserver https://127.0.0.1:{port} is unreachable"
                )),
                "{status}"
            );
        },
        reconcile(Arc::new(adopted_vc()), ctx),
    )
    .await;
    assert_eq!(result.expect_err("unreachable").reason(), "APIServerUnreachable");
}
