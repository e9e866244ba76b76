//! `kubectl vc` against the scripted apiserver ([`mock_apiserver`]): the requests each command makes, in order, and what it
//! prints.

use std::time::Duration;

use base64::{Engine, engine::general_purpose::STANDARD};
use clap::Parser;
use crds::{VirtualCluster, VirtualClusterSpec};
use kube::Client;
use serde_json::{Value, json};

use mock_apiserver::{ApiServer, Call};
use tenant_pki::{
    fixtures::{CV_NAME, VC_NAME, VC_NAMESPACE, VC_UID, native_vc, network, root, running, stored_secrets},
    pki::{CertificateAuthority, inspect, is_signed_by},
    secrets::Scope,
};

use crate::{self as cli, Args, Error};

const VCS: &str = "/apis/tenancy.x-k8s.io/v1alpha1/namespaces/team/virtualclusters";

/// A client on a scripted apiserver whose kubeconfig context namespace is `team`.
fn mock() -> (Client, ApiServer) {
    mock_apiserver::pair_in(VC_NAMESPACE)
}

/// What a command printed and returned.
struct Ran {
    out: String,
    err: String,
    result: Result<(), Error>,
}

/// Runs `kubectl vc <line>` against `script`, as on a terminal (progress lines on stderr).
async fn kubectl_vc<S>(line: &str, client: Client, script: S) -> Ran
where
    S: std::future::Future<Output = ()> + Send + 'static,
{
    let args = Args::try_parse_from(std::iter::once("kubectl-vc").chain(line.split_whitespace()))
        .expect("arguments");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let streams = cli::Streams::new(&mut out, &mut err, true);
    let result = mock_apiserver::run(
        script,
        cli::run_with(&args, client, streams, std::future::pending()),
    )
    .await;
    Ran {
        out: String::from_utf8(out).expect("utf-8"),
        err: String::from_utf8(err).expect("utf-8"),
        result,
    }
}

/// The test tenant's Secrets, made once so that every request sees the same PKI.
fn secrets() -> &'static [k8s_openapi::api::core::v1::Secret] {
    static SECRETS: std::sync::OnceLock<Vec<k8s_openapi::api::core::v1::Secret>> = std::sync::OnceLock::new();
    SECRETS.get_or_init(|| stored_secrets(&Scope::Native(Box::new(network()))))
}

fn secret(name: &str) -> Value {
    let secret = secrets()
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("Secret {name}"));
    serde_json::to_value(secret).expect("json")
}

fn secret_key(name: &str, key: &str) -> String {
    let encoded = secret(name)["data"][key].as_str().expect("key").to_owned();
    String::from_utf8(STANDARD.decode(encoded).expect("base64")).expect("utf-8")
}

fn running_vc() -> Value {
    serde_json::to_value(running(native_vc())).expect("json")
}

fn adopted_vc() -> Value {
    let mut vc = running(native_vc());
    vc.spec = VirtualClusterSpec {
        kubeconfig_secret_ref: Some(crds::KubeconfigSecretRef {
            name: "team-kubeconfig".into(),
            key: "value".into(),
        }),
        ..Default::default()
    };
    serde_json::to_value(vc).expect("json")
}

/// The apiserver Service of the test ClusterVersion as a NodePort.
fn node_port_service() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "apiserver-svc", "namespace": root()},
        "spec": {"type": "NodePort", "clusterIP": "10.96.0.50", "ports": [{"name": "https", "port": 6443, "nodePort": 31443}]},
    })
}

fn nodes() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "NodeList",
        "metadata": {"resourceVersion": "5"},
        "items": [{
            "metadata": {"name": "node-1"},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "192.0.2.11"}],
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }],
    })
}

async fn get(api: &mut ApiServer, uri: &str) -> Call {
    api.expect("GET", uri).await
}

fn cluster_of(kubeconfig: &kube::config::Kubeconfig) -> kube::config::Cluster {
    kubeconfig.clusters[0].cluster.clone().expect("cluster")
}

#[tokio::test]
async fn native_kubeconfig_points_at_a_node_port_and_keeps_the_tenant_ca() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("kubeconfig vc-1", client, async move {
        let root = root();
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(running_vc());
        get(
            &mut api,
            &format!("/api/v1/namespaces/{root}/secrets/admin-kubeconfig"),
        )
        .await
        .ok(secret("admin-kubeconfig"));
        get(
            &mut api,
            &format!("/api/v1/namespaces/{root}/services/apiserver-svc"),
        )
        .await
        .ok(node_port_service());
        get(&mut api, "/api/v1/nodes?").await.ok(nodes());
        get(
            &mut api,
            &format!("/api/v1/namespaces/{root}/secrets/apiserver-ca"),
        )
        .await
        .ok(secret("apiserver-ca"));
    })
    .await;
    ran.result.expect("succeeds");
    assert_eq!(ran.err, "");
    let config = kube::config::Kubeconfig::from_yaml(&ran.out).expect("a kubeconfig");
    assert_eq!(config.current_context.as_deref(), Some("team-vc-1"));
    assert_eq!(config.auth_infos[0].name, "team-vc-1-admin");
    let cluster = cluster_of(&config);
    assert_eq!(cluster.server.as_deref(), Some("https://192.0.2.11:31443"));
    // The node address is not in the apiserver certificate: its Service name is.
    assert_eq!(
        cluster.tls_server_name.as_deref(),
        Some(format!("apiserver-svc.{}.svc", root()).as_str())
    );
    assert_eq!(cluster.insecure_skip_tls_verify, None);
    assert!(!ran.out.contains("insecure"));
    let ca = String::from_utf8(
        STANDARD
            .decode(cluster.certificate_authority_data.expect("CA kept"))
            .expect("base64"),
    )
    .expect("pem");
    assert_eq!(ca, secret_key("root-ca", "tls.crt"));
    // The admin's own certificate, unchanged.
    let stored =
        tenant_pki::kubeconfig::client_certificate(&secret_key("admin-kubeconfig", "admin-kubeconfig"))
            .expect("stored certificate");
    assert_eq!(tenant_pki::kubeconfig::client_certificate(&ran.out), Some(stored));
}

#[tokio::test]
async fn a_cluster_ip_apiserver_keeps_its_in_cluster_address_with_a_warning() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("kubeconfig vc-1 -o json", client, async move {
        let root = root();
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(running_vc());
        get(
            &mut api,
            &format!("/api/v1/namespaces/{root}/secrets/admin-kubeconfig"),
        )
        .await
        .ok(secret("admin-kubeconfig"));
        let mut service = node_port_service();
        service["spec"] = json!({"type": "ClusterIP", "ports": [{"name": "https", "port": 6443}]});
        get(
            &mut api,
            &format!("/api/v1/namespaces/{root}/services/apiserver-svc"),
        )
        .await
        .ok(service);
    })
    .await;
    ran.result.expect("succeeds");
    let config: Value = serde_json::from_str(&ran.out).expect("JSON");
    assert_eq!(
        config["clusters"][0]["cluster"]["server"],
        format!("https://apiserver-svc.{}.svc:6443", root())
    );
    assert!(config["clusters"][0]["cluster"].get("tls-server-name").is_none());
    assert!(
        ran.err.starts_with("warning: https://apiserver-svc."),
        "{}",
        ran.err
    );
    assert!(
        ran.err.contains("reachable only from inside the super cluster"),
        "{}",
        ran.err
    );
    assert!(ran.err.contains("--server"), "{}", ran.err);
    assert_eq!(ran.err.lines().count(), 1);
}

#[tokio::test]
async fn user_kubeconfigs_carry_a_certificate_minted_by_the_tenant_ca() {
    let (client, mut api) = mock();
    let ran = kubectl_vc(
        "kubeconfig vc-1 --user alice --group dev --group ops --ttl 90m --server https://vc-1.example.com:6443",
        client,
        async move {
        let root = root();
            get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(running_vc());
            get(&mut api, &format!("/api/v1/namespaces/{root}/secrets/admin-kubeconfig"))
                .await
                .ok(secret("admin-kubeconfig"));
            get(&mut api, &format!("/api/v1/namespaces/{root}/secrets/apiserver-ca"))
                .await
                .ok(secret("apiserver-ca"));
            get(&mut api, &format!("/api/v1/namespaces/{root}/secrets/root-ca"))
                .await
                .ok(secret("root-ca"));
        },
    )
    .await;
    ran.result.expect("succeeds");
    assert_eq!(ran.err, "");
    let config = kube::config::Kubeconfig::from_yaml(&ran.out).expect("a kubeconfig");
    assert_eq!(config.current_context.as_deref(), Some("alice@team-vc-1"));
    let cluster = cluster_of(&config);
    assert_eq!(cluster.server.as_deref(), Some("https://vc-1.example.com:6443"));
    assert_eq!(
        cluster.tls_server_name.as_deref(),
        Some(format!("apiserver-svc.{}.svc", root()).as_str())
    );
    let minted = tenant_pki::kubeconfig::client_certificate(&ran.out).expect("certificate");
    let ca = secret_key("root-ca", "tls.crt");
    assert!(is_signed_by(&minted.cert_pem, &ca));
    let info = inspect(&minted.cert_pem).expect("readable");
    assert_eq!(info.common_name.as_deref(), Some("alice"));
    assert_eq!(info.organizations, ["dev".to_owned(), "ops".to_owned()].into());
    let lifetime = info.not_after - vc_runtime::clock::now();
    assert!((90 * 60 - 5..=90 * 60).contains(&lifetime), "{lifetime}");
    // The tenant CA can load its own key: the certificate came from it, not from a new CA.
    CertificateAuthority::load(&ca, &secret_key("root-ca", "tls.key"), vc_runtime::clock::now()).expect("CA");
}

fn adopted_kubeconfig() -> String {
    "apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster:
    server: https://tenant.example.com:6443
    certificate-authority-data: Q0E=
contexts:
- name: admin@prod
  context: {cluster: prod, user: admin}
- name: other
  context: {cluster: prod, user: viewer}
current-context: admin@prod
users:
- name: admin
  user: {token: secret-token}
- name: viewer
  user: {token: viewer-token}
"
    .into()
}

#[tokio::test]
async fn adopted_kubeconfigs_come_from_their_secret() {
    let (client, mut api) = mock();
    let ran = kubectl_vc(
        "kubeconfig vc-1 --server https://203.0.113.20:6443",
        client,
        async move {
            get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(adopted_vc());
            get(&mut api, "/api/v1/namespaces/team/secrets/team-kubeconfig")
                .await
                .ok(json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "team-kubeconfig", "namespace": "team", "labels": {"tenancy.x-k8s.io/kubeconfig-for": VC_NAME}},
                    "data": {"value": STANDARD.encode(adopted_kubeconfig())},
                }));
        },
    )
    .await;
    ran.result.expect("succeeds");
    let config = kube::config::Kubeconfig::from_yaml(&ran.out).expect("a kubeconfig");
    assert_eq!(config.contexts.len(), 1);
    assert_eq!(config.current_context.as_deref(), Some("team-vc-1"));
    let cluster = cluster_of(&config);
    assert_eq!(cluster.server.as_deref(), Some("https://203.0.113.20:6443"));
    assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
    assert!(ran.out.contains("secret-token"), "{}", ran.out);
    assert!(!ran.out.contains("viewer-token"), "{}", ran.out);
}

fn adopted_kubeconfig_secret() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "team-kubeconfig", "namespace": "team", "labels": {"tenancy.x-k8s.io/kubeconfig-for": VC_NAME}},
        "data": {"value": STANDARD.encode(adopted_kubeconfig())},
    })
}

#[tokio::test]
async fn adopted_tenants_get_no_user_certificates_without_their_client_ca() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("kubeconfig vc-1 --user alice", client, async move {
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(adopted_vc());
        get(&mut api, "/api/v1/namespaces/team/secrets/team-kubeconfig")
            .await
            .ok(adopted_kubeconfig_secret());
        get(
            &mut api,
            &format!("/api/v1/namespaces/{}/secrets/client-ca", root()),
        )
        .await
        .not_found("secrets", "client-ca");
    })
    .await;
    let error = ran.result.expect_err("refused");
    assert!(matches!(error, Error::AdoptedNoCa { .. }));
    let line = error.one_line();
    assert!(
        line.contains("vc-manager does not hold its certificate authority")
            && line.contains(&format!("Secret {}/client-ca", root())),
        "{line}"
    );
    assert_eq!(ran.out, "");
}

#[tokio::test]
async fn adopted_tenants_get_user_certificates_from_a_handed_over_client_ca() {
    let ca = CertificateAuthority::generate(
        "adopted client CA",
        "adopted",
        Duration::from_secs(3600 * 24),
        vc_runtime::clock::now(),
    )
    .expect("CA");
    let (ca_cert, ca_key) = (ca.pem().cert_pem.clone(), ca.pem().key_pem.clone());
    let (client, mut api) = mock();
    let ran = kubectl_vc(
        "kubeconfig vc-1 --user alice --group dev --ttl 2h",
        client,
        async move {
            get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(adopted_vc());
            get(&mut api, "/api/v1/namespaces/team/secrets/team-kubeconfig")
                .await
                .ok(adopted_kubeconfig_secret());
            get(
                &mut api,
                &format!("/api/v1/namespaces/{}/secrets/client-ca", root()),
            )
            .await
            .ok(json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "client-ca", "namespace": root()},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": STANDARD.encode(&ca_cert), "tls.key": STANDARD.encode(&ca_key)},
            }));
        },
    )
    .await;
    ran.result.expect("succeeds");
    let config = kube::config::Kubeconfig::from_yaml(&ran.out).expect("a kubeconfig");
    // The adopted kubeconfig's server and CA; the admin's token is not handed out.
    let cluster = cluster_of(&config);
    assert_eq!(cluster.server.as_deref(), Some("https://tenant.example.com:6443"));
    assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
    assert!(!ran.out.contains("secret-token"), "{}", ran.out);
    let auth = config.auth_infos[0].auth_info.clone().expect("user");
    assert!(auth.token.is_none());
    let cert = String::from_utf8(
        STANDARD
            .decode(auth.client_certificate_data.expect("certificate"))
            .expect("base64"),
    )
    .expect("pem");
    assert!(is_signed_by(&cert, ca.cert_pem()));
    let info = inspect(&cert).expect("certificate");
    assert_eq!(info.common_name.as_deref(), Some("alice"));
    assert_eq!(info.organizations.iter().collect::<Vec<_>>(), ["dev"]);
    let left = info.not_after - vc_runtime::clock::now();
    assert!((2 * 3600 - 60..=2 * 3600 + 60).contains(&left), "{left}s left");
}

#[tokio::test]
async fn missing_secrets_and_virtual_clusters_are_named() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("kubeconfig vc-1", client, async move {
        let root = root();
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(running_vc());
        get(
            &mut api,
            &format!("/api/v1/namespaces/{root}/secrets/admin-kubeconfig"),
        )
        .await
        .not_found("secrets", "admin-kubeconfig");
    })
    .await;
    assert_eq!(
        ran.result.expect_err("missing").one_line(),
        format!(
            "Secret \"admin-kubeconfig\" not found in namespace \"{}\"",
            root()
        )
    );

    let (client, mut api) = mock();
    let ran = kubectl_vc("kubeconfig vc-1", client, async move {
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(adopted_vc());
        get(&mut api, "/api/v1/namespaces/team/secrets/team-kubeconfig")
            .await
            .not_found("secrets", "team-kubeconfig");
    })
    .await;
    assert_eq!(
        ran.result.expect_err("missing").one_line(),
        "kubeconfig Secret team/team-kubeconfig does not exist"
    );

    let (client, mut api) = mock();
    let ran = kubectl_vc("kubeconfig nope -n elsewhere", client, async move {
        get(
            &mut api,
            "/apis/tenancy.x-k8s.io/v1alpha1/namespaces/elsewhere/virtualclusters/nope",
        )
        .await
        .not_found("virtualclusters.tenancy.x-k8s.io", "nope");
    })
    .await;
    assert_eq!(
        ran.result.expect_err("missing").one_line(),
        "VirtualCluster \"nope\" not found in namespace \"elsewhere\""
    );

    let (client, mut api) = mock();
    let ran = kubectl_vc("describe vc-1", client, async move {
        get(&mut api, &format!("{VCS}/{VC_NAME}"))
            .await
            .fail(403, "Forbidden", "virtualclusters.tenancy.x-k8s.io \"vc-1\" is forbidden: User \"bob\" cannot get resource \"virtualclusters\"");
    })
    .await;
    assert_eq!(
        ran.result.expect_err("forbidden").one_line(),
        "reading VirtualCluster team/vc-1: virtualclusters.tenancy.x-k8s.io \"vc-1\" is forbidden: User \"bob\" cannot get resource \"virtualclusters\""
    );
}

fn metadata_list(items: Vec<Value>) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "9"},
        "items": items.into_iter().map(|metadata| json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": metadata,
        })).collect::<Vec<_>>(),
    })
}

#[tokio::test]
async fn list_counts_tenant_namespaces_and_pods() {
    let (client, mut api) = mock();
    let mut adopted: VirtualCluster = serde_json::from_value(adopted_vc()).expect("vc");
    adopted.metadata.name = Some("vc-2".into());
    adopted.metadata.uid = Some("uid-2".into());
    let vc = running(native_vc());
    let key = crds::naming::cluster_key_of(&vc).expect("key");
    let ran = kubectl_vc("list", client, async move {
        get(&mut api, &format!("{VCS}?")).await.ok(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1",
            "kind": "VirtualClusterList",
            "metadata": {"resourceVersion": "9"},
            "items": [vc, adopted],
        }));
        let namespace = |tenant: &str| {
            json!({
                "name": crds::naming::super_namespace(&key, tenant),
                "labels": {"tenancy.x-k8s.io/vcname": VC_NAME, "tenancy.x-k8s.io/vcnamespace": VC_NAMESPACE},
                "annotations": {"tenancy.x-k8s.io/cluster": key, "tenancy.x-k8s.io/namespace": tenant},
            })
        };
        let call = get(
            &mut api,
            "/api/v1/namespaces?&labelSelector=tenancy.x-k8s.io%2Fvcnamespace%3Dteam",
        )
        .await;
        call.ok(metadata_list(vec![namespace("default"), namespace("web")]));
        let pod = |tenant: &str, name: &str| {
            json!({"name": name, "namespace": crds::naming::super_namespace(&key, tenant)})
        };
        get(
            &mut api,
            "/api/v1/pods?&labelSelector=tenancy.x-k8s.io%2Fvcnamespace%3Dteam",
        )
        .await
        .ok(metadata_list(
            vec![pod("web", "a"), pod("web", "b"), pod("default", "c")],
        ));
    })
    .await;
    ran.result.expect("succeeds");
    let lines: Vec<Vec<&str>> = ran
        .out
        .lines()
        .map(|l| l.split("   ").map(str::trim).filter(|c| !c.is_empty()).collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "PHASE", "VERSION", "AGE", "TENANT NAMESPACES", "PODS"]
    );
    // No creation time in the mock: the AGE column is empty.
    assert_eq!(lines[1], ["vc-1", "Running", CV_NAME, "2", "3"]);
    assert_eq!(lines[2], ["vc-2", "Running", "adopted", "0", "0"]);
}

#[tokio::test]
async fn list_says_when_there_is_nothing() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("list", client, async move {
        get(&mut api, &format!("{VCS}?")).await.ok(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1",
            "kind": "VirtualClusterList",
            "metadata": {"resourceVersion": "9"},
            "items": [],
        }));
    })
    .await;
    ran.result.expect("succeeds");
    assert_eq!(ran.out, "");
    assert_eq!(ran.err, "No VirtualClusters found in namespace team.\n");
}

/// A watch answer: one JSON event per line.
fn watch_events(events: &[(&str, Value)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (type_, object) in events {
        body.extend(serde_json::to_vec(&json!({"type": type_, "object": object})).expect("json"));
        body.push(b'\n');
    }
    body
}

fn respond_raw(call: Call, body: Vec<u8>) {
    call.respond_bytes(200, body);
}

#[tokio::test]
async fn delete_waits_until_the_finalizer_is_done() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("delete vc-1 --wait --timeout 30s", client, async move {
        let mut deleting = running_vc();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        deleting["metadata"]["resourceVersion"] = json!("101");
        let call = api.expect("DELETE", &format!("{VCS}/{VC_NAME}?")).await;
        call.ok(deleting.clone());
        get(&mut api, &format!("{VCS}/{VC_NAME}"))
            .await
            .ok(deleting.clone());
        let call = api.next().await;
        assert_eq!(call.method, "GET");
        assert!(
            call.uri.starts_with(&format!("{VCS}?&watch=true")),
            "{}",
            call.uri
        );
        assert!(
            call.uri.contains("fieldSelector=metadata.name%3Dvc-1"),
            "{}",
            call.uri
        );
        assert!(call.uri.contains("resourceVersion=101"), "{}", call.uri);
        let mut released = deleting.clone();
        released["metadata"]["finalizers"] = json!([]);
        respond_raw(
            call,
            watch_events(&[("MODIFIED", released.clone()), ("DELETED", released)]),
        );
    })
    .await;
    ran.result.expect("succeeds");
    assert_eq!(
        ran.out,
        "virtualcluster.tenancy.x-k8s.io \"vc-1\" deleted\nteam/vc-1 is gone\n"
    );
    assert_eq!(
        ran.err,
        "team/vc-1: waiting for finalizers tenancy.x-k8s.io/virtualcluster (vc-manager deletes the tenant's namespaces first)\n\
         team/vc-1: no finalizers left; waiting for the apiserver to remove it\n"
    );
}

#[tokio::test]
async fn delete_of_a_missing_virtual_cluster_fails_unless_told_otherwise() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("delete vc-1", client, async move {
        api.expect("DELETE", &format!("{VCS}/{VC_NAME}?"))
            .await
            .not_found("virtualclusters.tenancy.x-k8s.io", "vc-1");
    })
    .await;
    assert!(matches!(ran.result, Err(Error::NotFound { .. })));
    let (client, mut api) = mock();
    let ran = kubectl_vc("delete vc-1 --ignore-not-found", client, async move {
        api.expect("DELETE", &format!("{VCS}/{VC_NAME}?"))
            .await
            .not_found("virtualclusters.tenancy.x-k8s.io", "vc-1");
    })
    .await;
    ran.result.expect("ignored");
}

#[tokio::test]
async fn delete_wait_times_out_naming_the_finalizer() {
    let (client, mut api) = mock();
    let ran = tokio::time::timeout(
        Duration::from_secs(10),
        kubectl_vc("delete vc-1 --wait --timeout 1s", client, async move {
            let mut deleting = running_vc();
            deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            api.expect("DELETE", &format!("{VCS}/{VC_NAME}?"))
                .await
                .ok(deleting.clone());
            get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(deleting);
            // The watch never answers; keep it open until the client gives up.
            let call = api.next().await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            drop(call);
        }),
    )
    .await
    .expect("the timeout ends it");
    let error = ran.result.expect_err("timed out");
    assert!(
        error
            .one_line()
            .starts_with("timed out after 1s waiting for VirtualCluster team/vc-1 to be deleted; last seen: finalizers tenancy.x-k8s.io/virtualcluster still set"),
        "{}",
        error.one_line()
    );
}

#[tokio::test]
async fn pause_sets_spec_paused_and_waits_for_the_control_plane_and_the_syncer() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("pause vc-1 --wait --timeout 30s", client, async move {
        let call = api
            .expect("PATCH", &format!("{VCS}/{VC_NAME}?&fieldManager=kubectl-vc"))
            .await;
        assert_eq!(call.content_type, "application/merge-patch+json");
        assert!(call.uri.contains("fieldManager=kubectl-vc"), "{}", call.uri);
        assert_eq!(call.body, json!({"spec": {"paused": true}}));
        let mut patched = running_vc();
        patched["spec"]["paused"] = json!(true);
        patched["metadata"]["generation"] = json!(3);
        patched["metadata"]["resourceVersion"] = json!("101");
        call.ok(patched.clone());
        get(&mut api, &format!("{VCS}/{VC_NAME}"))
            .await
            .ok(patched.clone());
        let watch = api.next().await;
        assert!(
            watch.uri.starts_with(&format!("{VCS}?&watch=true")),
            "{}",
            watch.uri
        );
        let condition = |type_: &str, status: &str, reason: &str| {
            json!({"type": type_, "status": status, "reason": reason, "message": "m",
                "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        let mut pausing = patched.clone();
        pausing["status"]["phase"] = json!("Paused");
        pausing["status"]["reason"] = json!("Pausing");
        pausing["status"]["message"] = json!("scaling the control plane to zero; still running: etcd");
        pausing["status"]["conditions"] = json!([condition("Paused", "True", "Paused")]);
        let mut paused = pausing.clone();
        paused["status"]["reason"] = json!("Paused");
        paused["status"]["message"] = json!("the control plane is scaled to zero");
        paused["status"]["conditions"] = json!([
            condition("Paused", "True", "Paused"),
            condition("TenantSynced", "False", "TenantPaused"),
        ]);
        respond_raw(
            watch,
            watch_events(&[("MODIFIED", pausing), ("MODIFIED", paused)]),
        );
    })
    .await;
    ran.result.expect("succeeds");
    assert!(
        ran.out
            .starts_with("virtualcluster.tenancy.x-k8s.io \"vc-1\" paused\nteam/vc-1 is Paused ("),
        "{}",
        ran.out
    );
    assert!(
        ran.err.contains(
            "team/vc-1: phase Paused: Pausing: scaling the control plane to zero; still running: etcd\n"
        ) && ran
            .err
            .contains("team/vc-1: TenantSynced=False TenantPaused: m\n"),
        "{}",
        ran.err
    );
}

#[tokio::test]
async fn resume_removes_spec_paused_and_prints_the_object() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("resume vc-1 -o json", client, async move {
        let call = api
            .expect("PATCH", &format!("{VCS}/{VC_NAME}?&fieldManager=kubectl-vc"))
            .await;
        assert_eq!(call.body, json!({"spec": {"paused": null}}));
        call.ok(running_vc());
    })
    .await;
    ran.result.expect("succeeds");
    let printed: Value = serde_json::from_str(&ran.out).expect("json");
    assert_eq!(printed["metadata"]["name"], VC_NAME);
    assert!(printed["metadata"]["managedFields"].is_null());
    assert!(ran.err.is_empty(), "{}", ran.err);
    let (client, mut api) = mock();
    let ran = kubectl_vc("pause vc-1", client, async move {
        api.expect("PATCH", &format!("{VCS}/{VC_NAME}?&fieldManager=kubectl-vc"))
            .await
            .not_found("virtualclusters.tenancy.x-k8s.io", "vc-1");
    })
    .await;
    assert!(
        matches!(ran.result, Err(Error::NotFound { .. })),
        "{:?}",
        ran.result
    );
}

#[tokio::test]
async fn create_applies_and_follows_the_virtual_cluster_until_running() {
    let dir = std::env::temp_dir().join(format!("kubectl-vc-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("vc.yaml");
    std::fs::write(
        &file,
        "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata:\n  name: vc-1\nspec:\n  clusterVersionName: cv-v1-33-clusterip\n",
    )
    .expect("file");
    let (client, mut api) = mock();
    let line = format!("create -f {} --wait", file.display());
    let ran = kubectl_vc(&line, client, async move {
        let call = api
            .expect(
                "PATCH",
                &format!("{VCS}/{VC_NAME}?&fieldManager=kubectl-vc&fieldValidation=Strict"),
            )
            .await;
        assert_eq!(call.content_type, "application/apply-patch+yaml");
        assert_eq!(call.body["metadata"]["namespace"], "team");
        assert!(call.body["spec"].get("weight").is_none(), "only what the file says");
        let mut created = serde_json::to_value(native_vc()).expect("json");
        created["metadata"]["generation"] = json!(1);
        call.ok(created.clone());
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(created.clone());
        let call = api.next().await;
        assert!(call.uri.contains("watch=true"), "{}", call.uri);
        let status = |phase: &str, reason: &str, conditions: Value, observed: Option<i64>| {
            let mut vc = created.clone();
            vc["status"] = json!({
                "phase": phase,
                "reason": reason,
                "message": format!("{reason} message"),
                "clusterNamespace": root(),
                "conditions": conditions,
                "observedGeneration": observed,
            });
            vc
        };
        let condition = |type_: &str, status: &str, reason: &str| {
            json!({"type": type_, "status": status, "reason": reason, "message": "m", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        respond_raw(
            call,
            watch_events(&[
                (
                    "MODIFIED",
                    status(
                        "Pending",
                        "WaitingForEtcd",
                        json!([condition("PKIReady", "True", "CertificatesValid"), condition("EtcdReady", "False", "StatefulSetNotReady")]),
                        None,
                    ),
                ),
                (
                    "MODIFIED",
                    status(
                        "Running",
                        "TenantControlPlaneRunning",
                        json!([condition("PKIReady", "True", "CertificatesValid"), condition("EtcdReady", "True", "StatefulSetReady")]),
                        Some(1),
                    ),
                ),
            ]),
        );
    })
    .await;
    std::fs::remove_dir_all(&dir).ok();
    ran.result.expect("succeeds");
    let results: Vec<&str> = ran.out.lines().collect();
    assert_eq!(results.len(), 2, "{}", ran.out);
    assert_eq!(
        results[0],
        "virtualcluster.tenancy.x-k8s.io/vc-1 serverside-applied"
    );
    assert!(results[1].starts_with("team/vc-1 is Running ("), "{}", results[1]);
    let lines: Vec<&str> = ran.err.lines().collect();
    assert_eq!(
        lines,
        [
            "team/vc-1: no status yet (is vc-manager running?)",
            "team/vc-1: phase Pending: WaitingForEtcd: WaitingForEtcd message",
            "team/vc-1: PKIReady=True CertificatesValid: m",
            "team/vc-1: EtcdReady=False StatefulSetNotReady: m",
            "team/vc-1: phase Running: TenantControlPlaneRunning: TenantControlPlaneRunning message",
            "team/vc-1: EtcdReady=True StatefulSetReady: m",
        ]
    );
}

#[tokio::test]
async fn create_wait_reports_the_failing_condition() {
    let dir = std::env::temp_dir().join(format!("kubectl-vc-fail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("vc.yaml");
    std::fs::write(
        &file,
        "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata:\n  name: vc-1\n  namespace: team\nspec:\n  clusterVersionName: missing\n",
    )
    .expect("file");
    let (client, mut api) = mock();
    let line = format!("create -f {} --wait", file.display());
    let ran = kubectl_vc(&line, client, async move {
        let call = api.next().await;
        assert_eq!(call.method, "PATCH");
        let mut created = serde_json::to_value(native_vc()).expect("json");
        created["metadata"]["generation"] = json!(1);
        call.ok(created.clone());
        let mut failed = created;
        failed["status"] = json!({
            "phase": "Error",
            "reason": "ClusterVersionNotFound",
            "message": "ClusterVersion missing does not exist",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ClusterVersionNotFound", "message": "ClusterVersion missing does not exist", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        });
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(failed);
    })
    .await;
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        ran.result.expect_err("failed").one_line(),
        "VirtualCluster team/vc-1 failed: Ready=False ClusterVersionNotFound: ClusterVersion missing does not exist"
    );
}

#[tokio::test]
async fn describe_reads_namespaces_pods_and_events_of_this_virtual_cluster() {
    let (client, mut api) = mock();
    let vc = running(native_vc());
    let key = crds::naming::cluster_key_of(&vc).expect("key");
    let ran = kubectl_vc("describe vc-1", client, async move {
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(running_vc());
        let selector = "labelSelector=tenancy.x-k8s.io%2Fvcname%3Dvc-1%2Ctenancy.x-k8s.io%2Fvcnamespace%3Dteam";
        let web = crds::naming::super_namespace(&key, "web");
        get(&mut api, &format!("/api/v1/namespaces?&{selector}"))
            .await
            .ok(metadata_list(vec![json!({
                "name": web,
                "labels": {"tenancy.x-k8s.io/vcname": VC_NAME, "tenancy.x-k8s.io/vcnamespace": VC_NAMESPACE},
                "annotations": {"tenancy.x-k8s.io/cluster": key, "tenancy.x-k8s.io/namespace": "web"},
            })]));
        get(&mut api, &format!("/api/v1/pods?&{selector}")).await.ok(json!({
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": "9"},
            "items": [
                {"metadata": {"name": "a", "namespace": web}, "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "250m"}}}]}, "status": {"phase": "Running"}},
                {"metadata": {"name": "b", "namespace": "someone-else"}, "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]}},
            ],
        }));
        get(
            &mut api,
            &format!(
                "/api/v1/namespaces/team/events?&fieldSelector=involvedObject.kind%3DVirtualCluster%2CinvolvedObject.name%3Dvc-1%2CinvolvedObject.uid%3D{}",
                VC_UID
            ),
        )
        .await
        .ok(json!({
            "apiVersion": "v1",
            "kind": "EventList",
            "metadata": {"resourceVersion": "9"},
            "items": [{
                "metadata": {"name": "vc-1.1", "namespace": "team"},
                "involvedObject": {"kind": "VirtualCluster", "name": "vc-1", "namespace": "team"},
                "type": "Normal",
                "reason": "Running",
                "message": "phase changed to Running",
                "reportingComponent": "vc-manager",
                "eventTime": "2026-01-01T00:00:00.000000Z",
            }],
        }));
    })
    .await;
    ran.result.expect("succeeds");
    for expected in [
        "Name:               vc-1\n",
        &format!("Cluster version:    {}\n", CV_NAME),
        "  requests.cpu      250m   -\n",
        "Running   ",
        "phase changed to Running\n",
    ] {
        assert!(ran.out.contains(expected), "missing {expected:?} in\n{}", ran.out);
    }
    assert!(
        ran.out.contains(&format!(
            "{}   web                1\n",
            crds::naming::super_namespace(
                &crds::naming::cluster_key_of(&running(native_vc())).expect("key"),
                "web"
            )
        )),
        "{}",
        ran.out
    );
}

/// A loopback port nothing listens on (connections are refused at once).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// Answers the requests of a native tenant's admin kubeconfig whose node port is `node_port` on a node
/// at 127.0.0.1.
async fn serve_native_admin(api: &mut ApiServer, node_port: u16) {
    let root = root();
    get(api, &format!("{VCS}/{VC_NAME}")).await.ok(running_vc());
    get(
        api,
        &format!("/api/v1/namespaces/{root}/secrets/admin-kubeconfig"),
    )
    .await
    .ok(secret("admin-kubeconfig"));
    let mut service = node_port_service();
    service["spec"]["ports"][0]["nodePort"] = json!(node_port);
    service["spec"]["selector"] = json!({"component": "apiserver"});
    get(api, &format!("/api/v1/namespaces/{root}/services/apiserver-svc"))
        .await
        .ok(service);
    let mut nodes = nodes();
    nodes["items"][0]["status"]["addresses"][0]["address"] = json!("127.0.0.1");
    get(api, "/api/v1/nodes?").await.ok(nodes);
    get(api, &format!("/api/v1/namespaces/{root}/secrets/apiserver-ca"))
        .await
        .ok(secret("apiserver-ca"));
}

#[tokio::test]
async fn connect_merges_the_admin_context_into_the_kubeconfig_file() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("config");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Config\nclusters: [{name: prod, cluster: {server: 'https://prod:6443'}}]\nusers: [{name: prod, user: {token: t}}]\ncontexts: [{name: prod, context: {cluster: prod, user: prod}}]\ncurrent-context: prod\n",
    )
    .expect("file");
    let port = closed_port();
    let (client, mut api) = mock();
    let line = format!(
        "connect vc-1 --write-kubeconfig {} --port-forward never --switch",
        file.display()
    );
    let ran = kubectl_vc(&line, client, async move {
        serve_native_admin(&mut api, port).await;
    })
    .await;
    ran.result.expect("written");
    let server = format!("https://127.0.0.1:{port}");
    assert!(
        ran.err
            .contains(&format!("warning: {server} does not answer from here (")),
        "{}",
        ran.err
    );
    assert_eq!(
        ran.out.lines().take(2).collect::<Vec<_>>(),
        [
            format!(
                "Wrote context \"team-vc-1\" to {}: cluster \"team-vc-1\" added, user \"team-vc-1-admin\" added, context \"team-vc-1\" added.",
                file.display()
            ),
            "Switched to context \"team-vc-1\".".to_owned(),
        ]
    );
    assert!(
        ran.out.contains(&format!(
            "kubectl --kubeconfig {} --context team-vc-1 get namespaces",
            file.display()
        )),
        "{}",
        ran.out
    );
    let config = kube::config::Kubeconfig::read_from(&file).expect("kube reads it");
    assert_eq!(config.current_context.as_deref(), Some("team-vc-1"));
    assert_eq!(config.contexts.len(), 2, "prod kept");
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == "team-vc-1")
        .and_then(|c| c.cluster.clone())
        .expect("cluster");
    assert_eq!(cluster.server.as_deref(), Some(server.as_str()));
    assert!(cluster.insecure_skip_tls_verify.is_none());
    assert_eq!(
        cluster.certificate_authority_data.as_deref(),
        Some(STANDARD.encode(secret_key("root-ca", "tls.crt")).as_str())
    );

    // -o json, under another context name: one document saying what was written, nothing else.
    let (client, mut api) = mock();
    let line = format!(
        "connect vc-1 --write-kubeconfig {} --port-forward never --context-name mine -o json",
        file.display()
    );
    let ran = kubectl_vc(&line, client, async move {
        serve_native_admin(&mut api, port).await;
    })
    .await;
    ran.result.expect("written");
    let document: Value = serde_json::from_str(&ran.out).expect("only JSON on stdout");
    assert_eq!(document["context"]["name"], "mine");
    assert_eq!(document["context"]["context"]["user"], "mine-admin");
    assert_eq!(document["cluster"]["cluster"]["server"], json!(server));
    assert_eq!(document["currentContext"], "team-vc-1", "not switched");
    assert_eq!(document["portForward"], Value::Null);
    assert_eq!(
        document["changes"][2],
        json!({"kind": "context", "name": "mine", "change": "added"})
    );
    assert!(!ran.err.contains("Checking"), "no progress with -o: {}", ran.err);
}

#[tokio::test]
async fn connect_refuses_to_replace_someone_elses_context_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("config");
    let before = "apiVersion: v1\nkind: Config\nclusters: [{name: team-vc-1, cluster: {server: 'https://elsewhere:6443'}}]\ncontexts: [{name: team-vc-1, context: {cluster: team-vc-1}}]\n";
    std::fs::write(&file, before).expect("file");
    let port = closed_port();
    let (client, mut api) = mock();
    let line = format!(
        "connect vc-1 --write-kubeconfig {} --port-forward never",
        file.display()
    );
    let ran = kubectl_vc(&line, client, async move {
        serve_native_admin(&mut api, port).await;
    })
    .await;
    let error = ran.result.expect_err("conflict");
    assert!(matches!(error, Error::KubeconfigConflict { .. }), "{error}");
    assert!(
        error
            .one_line()
            .contains("already has cluster \"team-vc-1\", context \"team-vc-1\" for something else"),
        "{}",
        error.one_line()
    );
    assert_eq!(std::fs::read_to_string(&file).expect("file"), before);
    assert_eq!(ran.out, "");
}

#[tokio::test]
async fn connect_port_forwards_only_to_a_ready_apiserver_pod() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("config");
    let (client, mut api) = mock();
    let line = format!(
        "connect vc-1 --write-kubeconfig {} --port-forward always",
        file.display()
    );
    let ran = kubectl_vc(&line, client, async move {
        let root = root();
        serve_native_admin(&mut api, closed_port()).await;
        let mut service = node_port_service();
        service["spec"]["selector"] = json!({"component": "apiserver"});
        get(&mut api, &format!("/api/v1/namespaces/{root}/services/apiserver-svc"))
            .await
            .ok(service);
        get(
            &mut api,
            &format!("/api/v1/namespaces/{root}/pods?&labelSelector=component%3Dapiserver"),
        )
        .await
        .ok(json!({
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": "9"},
            "items": [{"metadata": {"name": "apiserver-0", "namespace": root}, "status": {"phase": "Pending"}}],
        }));
    })
    .await;
    let error = ran.result.expect_err("no ready pod");
    assert!(
        error.one_line().starts_with(&format!(
            "port-forward to the tenant apiserver: no running and ready pod matches Service {}/apiserver-svc (component=apiserver); 1 found",
            root()
        )),
        "{}",
        error.one_line()
    );
    assert!(!file.exists(), "nothing written");
}

#[tokio::test]
async fn connect_cannot_port_forward_to_an_adopted_apiserver() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("config");
    let (client, mut api) = mock();
    let line = format!("connect vc-1 --write-kubeconfig {}", file.display());
    let unreachable = format!("https://127.0.0.1:{}", closed_port());
    let kubeconfig = adopted_kubeconfig().replace("https://tenant.example.com:6443", &unreachable);
    let ran = kubectl_vc(&line, client, async move {
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(adopted_vc());
        get(&mut api, "/api/v1/namespaces/team/secrets/team-kubeconfig")
            .await
            .ok(json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "team-kubeconfig", "namespace": "team", "labels": {"tenancy.x-k8s.io/kubeconfig-for": VC_NAME}},
                "data": {"value": STANDARD.encode(kubeconfig)},
            }));
    })
    .await;
    let error = ran.result.expect_err("unreachable");
    let line = error.one_line();
    assert!(
        line.starts_with(
            "VirtualCluster team/vc-1 is adopted: its apiserver does not run in the super cluster"
        ),
        "{line}"
    );
    assert!(
        line.contains(&format!("{unreachable} does not answer from here")),
        "{line}"
    );
    assert!(line.contains("--port-forward never"), "{line}");
    assert!(!file.exists(), "nothing written");
}

#[tokio::test]
async fn machine_readable_output_is_never_mixed_with_progress() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("delete vc-1 --wait -o json", client, async move {
        let mut deleting = running_vc();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        deleting["metadata"]["managedFields"] = json!([{"manager": "x"}]);
        api.expect("DELETE", &format!("{VCS}/{VC_NAME}?"))
            .await
            .ok(deleting.clone());
        get(&mut api, &format!("{VCS}/{VC_NAME}"))
            .await
            .not_found("virtualclusters.tenancy.x-k8s.io", "vc-1");
    })
    .await;
    ran.result.expect("deleted");
    assert_eq!(ran.err, "", "no progress even on a terminal");
    let object: Value = serde_json::from_str(&ran.out).expect("only JSON");
    assert_eq!(object["metadata"]["name"], "vc-1");
    assert!(object["metadata"].get("managedFields").is_none());
    assert!(object["metadata"]["deletionTimestamp"].is_string());
}

#[tokio::test]
async fn describe_prints_one_document_with_o_yaml() {
    let (client, mut api) = mock();
    let ran = kubectl_vc("describe vc-1 -o yaml", client, async move {
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(running_vc());
        let call = api.next().await;
        assert!(call.uri.starts_with("/api/v1/namespaces?"), "{}", call.uri);
        call.ok(metadata_list(Vec::new()));
        let call = api.next().await;
        assert!(call.uri.starts_with("/api/v1/pods?"), "{}", call.uri);
        call.ok(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}));
        let call = api.next().await;
        assert!(call.uri.contains("/events?"), "{}", call.uri);
        call.ok(json!({"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": []}));
    })
    .await;
    ran.result.expect("described");
    let document: Value = serde_saphyr::from_str(&ran.out).expect("YAML");
    assert_eq!(document["virtualCluster"]["metadata"]["name"], "vc-1");
    assert_eq!(document["superNamespaces"], json!([]));
    assert_eq!(document["usage"][0]["resource"], "pods");
    assert_eq!(document["events"], json!([]));
}

#[tokio::test]
async fn snapshots_are_refused_for_adopted_tenants_before_anything_is_read() {
    let dir = tempfile::tempdir().expect("dir");
    let (client, mut api) = mock();
    let line = format!("snapshot create vc-1 --to {}", dir.path().display());
    let ran = kubectl_vc(&line, client, async move {
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(adopted_vc());
    })
    .await;
    let error = ran.result.expect_err("adopted").one_line();
    assert!(
        error.starts_with("VirtualCluster team/vc-1 is not provisioned by vc-manager"),
        "{error}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        0,
        "nothing written"
    );
}

/// A snapshot folder of the test tenant, as `snapshot create` writes it (with no etcd keys).
fn snapshot_folder(dir: &std::path::Path) {
    use crate::snapshot::{
        create::StoredSecret,
        format::{self, FileEntry, Manifest},
    };
    let pki: Vec<StoredSecret> = secrets().iter().map(StoredSecret::of).collect();
    let files = [
        (format::ETCD_KEYS, Vec::new()),
        (format::PKI_SECRETS, serde_json::to_vec(&pki).expect("json")),
        (
            format::VIRTUAL_CLUSTER,
            serde_json::to_vec(&native_vc()).expect("json"),
        ),
        (format::CLUSTER_VERSION, b"{}".to_vec()),
    ];
    let entries = files
        .iter()
        .map(|(name, bytes)| {
            std::fs::write(dir.join(name), bytes).expect("write");
            FileEntry {
                name: (*name).to_owned(),
                size: bytes.len() as u64,
                sha256: format::sha256_hex(bytes),
            }
        })
        .collect();
    let manifest = Manifest {
        format: format::FORMAT.into(),
        virtual_cluster: format::SourceTenant {
            namespace: VC_NAMESPACE.into(),
            name: VC_NAME.into(),
            uid: VC_UID.into(),
            cluster_key: root(),
        },
        cluster_version_name: CV_NAME.into(),
        created_at: "2026-11-25T02:00:00Z".into(),
        etcd: format::EtcdSummary {
            revision: 1,
            keys: 0,
            skipped_leased_keys: 0,
        },
        files: entries,
    };
    std::fs::write(
        dir.join(format::MANIFEST),
        serde_json::to_vec(&manifest).expect("json"),
    )
    .expect("write");
}

#[tokio::test]
async fn a_restore_never_touches_an_existing_virtual_cluster() {
    let dir = tempfile::tempdir().expect("dir");
    snapshot_folder(dir.path());
    let (client, mut api) = mock();
    let line = format!("snapshot restore vc-1 --from {}", dir.path().display());
    let ran = kubectl_vc(&line, client, async move {
        get(
            &mut api,
            &format!("/apis/tenancy.x-k8s.io/v1alpha1/clusterversions/{CV_NAME}"),
        )
        .await
        .ok(serde_json::to_value(tenant_pki::fixtures::cluster_version()).expect("json"));
        // The VirtualCluster exists: nothing is applied (an extra request would fail the script).
        get(&mut api, &format!("{VCS}/{VC_NAME}")).await.ok(running_vc());
    })
    .await;
    let error = ran.result.expect_err("exists").one_line();
    assert!(
        error.contains("VirtualCluster team/vc-1 exists; a snapshot is restored into a new VirtualCluster"),
        "{error}"
    );
    assert!(ran.err.contains("verifying snapshot"), "{}", ran.err);
}

/// The status code of `GET path` on `address`, `None` while nothing answers.
async fn http_get(address: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// The scheduler on the shared runtime: `/readyz` only once it has listed the VirtualClusters, `/healthz`
/// while it makes progress, `/metrics` with its `vc_snapshots_` series; an interrupt stops it cleanly.
#[tokio::test]
async fn the_scheduler_serves_health_and_metrics_once_it_has_listed_the_virtual_clusters() {
    let dir = tempfile::tempdir().expect("dir");
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let line = format!(
        "snapshot schedule --to {} --store-name pvc/vc-snapshots --poll 60s --admin-address {admin}",
        dir.path().display()
    );
    let args = Args::try_parse_from(std::iter::once("kubectl-vc").chain(line.split_whitespace()))
        .expect("arguments");
    let (client, api) = mock();
    let mut api = api.matching_uri_prefixes();
    let (answer, answered) = tokio::sync::oneshot::channel::<()>();
    let script = async move {
        let list = api
            .expect("GET", "/apis/tenancy.x-k8s.io/v1alpha1/virtualclusters")
            .await;
        // Not ready before the first list is answered.
        let _ = answer.send(());
        list.ok(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1",
            "kind": "VirtualClusterList",
            "metadata": {"resourceVersion": "1"},
            "items": [],
        }));
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let streams = cli::Streams::new(&mut out, &mut err, false);
    let checks = async move {
        answered.await.expect("listed");
        let mut ready = None;
        for _ in 0..500 {
            ready = http_get(admin, "/readyz").await.map(|(status, _)| status);
            if ready == Some(200) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let health = http_get(admin, "/healthz").await;
        let metrics = http_get(admin, "/metrics").await;
        stop.send(()).expect("running");
        (ready, health, metrics)
    };
    let (result, (ready, health, metrics)) = tokio::join!(
        mock_apiserver::run(
            script,
            cli::run_with(&args, client, streams, async {
                let _ = stopped.await;
            })
        ),
        checks
    );
    result.expect("a clean stop");
    assert_eq!(ready, Some(200));
    assert_eq!(health.map(|(status, _)| status), Some(200));
    let (status, text) = metrics.expect("metrics answered");
    assert_eq!(status, 200);
    for line in [
        "vc_snapshots_scheduled_tenants 0",
        "vc_snapshots_overdue_tenants 0",
        "vc_snapshots_last_success_timestamp_seconds 0",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    assert_eq!(
        http_get(admin, "/healthz").await,
        None,
        "the endpoint stops with the scheduler"
    );
    let out = String::from_utf8(out).expect("utf-8");
    assert!(
        out.contains("snapshot scheduler for store pvc/vc-snapshots"),
        "{out}"
    );
}

const ALL_VCS: &str = "/apis/tenancy.x-k8s.io/v1alpha1/virtualclusters";
const ALL_CVS: &str = "/apis/tenancy.x-k8s.io/v1alpha1/clusterversions";

fn vc_list(items: Vec<Value>) -> Value {
    json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1",
        "kind": "VirtualClusterList",
        "metadata": {"resourceVersion": "1"},
        "items": items,
    })
}

#[tokio::test]
async fn uninstall_prepare_refuses_while_virtual_clusters_exist_and_names_them() {
    let (client, api) = mock();
    let mut api = api.matching_uri_prefixes();
    let ran = kubectl_vc("uninstall prepare", client, async move {
        api.expect("GET", ALL_VCS).await.ok(vc_list(vec![running_vc()]));
    })
    .await;
    let error = ran.result.expect_err("refused").one_line();
    assert!(error.contains("1 VirtualCluster(s) exist"), "{error}");
    assert!(error.contains("team/vc-1 (Running)"), "{error}");
    assert!(error.contains("uninstall.virtualClusters=delete"), "{error}");

    // None: nothing to refuse.
    let (client, api) = mock();
    let mut api = api.matching_uri_prefixes();
    let ran = kubectl_vc("uninstall prepare", client, async move {
        api.expect("GET", ALL_VCS).await.ok(vc_list(vec![]));
    })
    .await;
    ran.result.expect("nothing to refuse");
    // The CRD is gone (or was never installed): nothing to refuse either.
    let (client, api) = mock();
    let mut api = api.matching_uri_prefixes();
    let ran = kubectl_vc("uninstall prepare", client, async move {
        api.expect("GET", ALL_VCS).await.not_found("virtualclusters", "");
    })
    .await;
    ran.result.expect("no CRD, nothing to refuse");
}

#[tokio::test]
async fn uninstall_prepare_delete_deletes_each_by_uid_and_waits_until_none_is_left() {
    let (client, api) = mock();
    let mut api = api.matching_uri_prefixes();
    let ran = kubectl_vc(
        "uninstall prepare --virtual-clusters delete --timeout 1m",
        client,
        async move {
            api.expect("GET", ALL_VCS).await.ok(vc_list(vec![running_vc()]));
            let delete = api.expect("DELETE", &format!("{VCS}/{VC_NAME}")).await;
            assert_eq!(
                delete.body["preconditions"]["uid"],
                json!(VC_UID),
                "{}",
                delete.body
            );
            delete.ok(running_vc());
            // Still finalizing, then gone.
            let mut deleting = running_vc();
            deleting["metadata"]["deletionTimestamp"] = json!("2026-11-25T12:00:00Z");
            api.expect("GET", ALL_VCS).await.ok(vc_list(vec![deleting]));
            api.expect("GET", ALL_VCS).await.ok(vc_list(vec![]));
        },
    )
    .await;
    ran.result.expect("deleted");
    assert!(
        ran.out.contains("deleting VirtualCluster team/vc-1"),
        "{}",
        ran.out
    );
    assert!(ran.out.contains("every VirtualCluster is deleted"), "{}", ran.out);
    assert!(
        ran.err.contains("team/vc-1 (Running, being deleted)"),
        "{}",
        ran.err
    );
}

#[tokio::test]
async fn uninstall_prepare_orphan_leaves_them_and_says_so() {
    let (client, api) = mock();
    let mut api = api.matching_uri_prefixes();
    let ran = kubectl_vc(
        "uninstall prepare --virtual-clusters orphan",
        client,
        async move {
            api.expect("GET", ALL_VCS).await.ok(vc_list(vec![running_vc()]));
        },
    )
    .await;
    ran.result.expect("left running");
    assert!(ran.out.contains("stay, unmanaged"), "{}", ran.out);
}

#[tokio::test]
async fn uninstall_release_waits_for_vc_manager_then_removes_only_its_finalizers() {
    let (client, api) = mock();
    let mut api = api.matching_uri_prefixes();
    let line = "uninstall release --controllers-namespace vc-system --controllers-selector app.kubernetes.io/component=vc-manager --timeout 1m";
    let script = tokio::spawn(async move {
        let pods = api.expect("GET", "/api/v1/namespaces/vc-system/pods?").await;
        assert!(
            pods.uri
                .contains("labelSelector=app.kubernetes.io%2Fcomponent%3Dvc-manager"),
            "{}",
            pods.uri
        );
        pods.ok(
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": [
                {"metadata": {"name": "vc-manager-1", "namespace": "vc-system"}},
            ]}),
        );
        api.expect("GET", "/api/v1/namespaces/vc-system/pods?").await.ok(
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "2"}, "items": []}),
        );
        // The ConfigMaps the controllers made at run time go, each pinned to its uid.
        for (selector, name) in [
            (
                "labelSelector=tenancy.x-k8s.io%2Fsyncer-journal",
                "vc-syncer-journal",
            ),
            (
                "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dvc-manager",
                "vc-kubelet-client-cas",
            ),
        ] {
            let list = api
                .expect("GET", "/api/v1/namespaces/vc-system/configmaps?")
                .await;
            assert!(list.uri.contains(selector), "{}", list.uri);
            list.ok(
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                "metadata": {"resourceVersion": "3"}, "items": [
                    {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                     "metadata": {"name": name, "namespace": "vc-system", "uid": format!("uid-{name}")}},
                ]}),
            );
            let delete = api
                .expect(
                    "DELETE",
                    &format!("/api/v1/namespaces/vc-system/configmaps/{name}"),
                )
                .await;
            assert_eq!(delete.body["preconditions"]["uid"], format!("uid-{name}"));
            delete.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
        }
        let mut held = running_vc();
        held["metadata"]["finalizers"] = json!(["example.com/backup", "tenancy.x-k8s.io/virtualcluster"]);
        held["metadata"]["resourceVersion"] = json!("7");
        api.expect("GET", ALL_VCS).await.ok(vc_list(vec![held.clone()]));
        let patch = api.expect("PATCH", &format!("{VCS}/{VC_NAME}")).await;
        assert_eq!(
            patch.body,
            json!({"metadata": {"finalizers": ["example.com/backup"], "resourceVersion": "7"}})
        );
        held["metadata"]["finalizers"] = json!(["example.com/backup"]);
        patch.ok(held);
        let mut cv = serde_json::to_value(tenant_pki::fixtures::cluster_version()).expect("json");
        cv["metadata"]["finalizers"] = json!(["tenancy.x-k8s.io/clusterversion-in-use"]);
        cv["metadata"]["resourceVersion"] = json!("3");
        api.expect("GET", ALL_CVS).await.ok(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "ClusterVersionList",
            "metadata": {"resourceVersion": "1"}, "items": [cv],
        }));
        // Changed meanwhile: read again, then removed.
        api.expect("PATCH", &format!("{ALL_CVS}/{CV_NAME}")).await.fail(
            409,
            "Conflict",
            "the object has been modified",
        );
        let mut again = cv.clone();
        again["metadata"]["resourceVersion"] = json!("4");
        api.expect("GET", &format!("{ALL_CVS}/{CV_NAME}"))
            .await
            .ok(again.clone());
        let patch = api.expect("PATCH", &format!("{ALL_CVS}/{CV_NAME}")).await;
        assert_eq!(
            patch.body,
            json!({"metadata": {"finalizers": [], "resourceVersion": "4"}})
        );
        again["metadata"]["finalizers"] = json!([]);
        patch.ok(again);
    });
    let args =
        Args::try_parse_from(std::iter::once("kubectl-vc").chain(line.split_whitespace())).expect("args");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = cli::run_with(
        &args,
        client,
        cli::Streams::new(&mut out, &mut err, false),
        std::future::pending(),
    )
    .await;
    script.await.expect("the script");
    result.expect("released");
    let out = String::from_utf8(out).expect("utf-8");
    assert!(out.contains("released 2 finalizer(s)"), "{out}");
}
