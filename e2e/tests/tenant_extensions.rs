//! A native tenant's own API extensions running as its pods on real nodes: a validating admission webhook
//! and an aggregated API (`metrics.k8s.io`, read by `kubectl top`), both served by the `tenant-extensions`
//! binary (its image built by the harness) behind a tenant Service. The tenant apiserver, itself a pod on
//! the real nodes, reaches them at their pods' super cluster addresses (`--enable-aggregator-routing` in the
//! ClusterVersion example routes webhooks and APIServices to the Service's endpoints).

use std::{collections::BTreeSet, path::Path, time::Duration};

use anyhow::Context;
use base64::Engine;
use k8s_openapi::api::core::v1::{Endpoints, Pod};
use kube::Api;
use local_cluster::{
    Binary, realnodes,
    sandbox::{NodeKind, Sandbox, SandboxOptions},
    tenant_extensions::{DENY_LABEL, IMAGE, WEBHOOK_PATH},
    wait,
};
use serde_json::{Value, json};

use crate::kubectl_support::Kubectl;

const NEEDS: &[Binary] = &[
    Binary::Etcd,
    Binary::KubeApiserver,
    Binary::KubeControllerManager,
    Binary::KubeScheduler,
    Binary::Kubectl,
];

/// Where the extension server runs in the tenant.
const NAMESPACE: &str = "extensions";
const NAME: &str = "tenant-extensions";
/// The namespace whose ConfigMaps the webhook judges (others are left alone, so that the tenant's own
/// controllers never wait for it).
const SHOP: &str = "shop";

/// The tenant's objects: the server's ServiceAccount and rights (read nodes and their stats through the
/// node proxy; read the front proxy's CA), its TLS Secret, Deployment and Service.
fn server_objects(cert_pem: &str, key_pem: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": SHOP, "labels": {"tenant-extensions/validate": "true"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": NAME},
         "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["nodes/proxy", "nodes/stats"], "verbs": ["get"]}
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": NAME},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": NAME, "namespace": "kube-system"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
            "name": "extension-apiserver-authentication-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
         "metadata": {"name": NAME, "namespace": NAMESPACE},
         "stringData": {"tls.crt": cert_pem, "tls.key": key_pem}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, "namespace": NAMESPACE},
         "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": NAME}},
            "template": {
                "metadata": {"labels": {"app": NAME}},
                "spec": {
                    "serviceAccountName": NAME,
                    "containers": [{
                        "name": "server", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                        "args": ["--listen=0.0.0.0:8443"],
                        "ports": [{"name": "https", "containerPort": 8443}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8443, "scheme": "HTTPS"},
                            "periodSeconds": 2},
                        "volumeMounts": [{"name": "tls", "mountPath": "/etc/tenant-extensions", "readOnly": true}]
                    }],
                    "volumes": [{"name": "tls", "secret": {"secretName": NAME}}]
                }
            }
         }},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "namespace": NAMESPACE},
         "spec": {"selector": {"app": NAME}, "ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}
    ]})
}

/// The registrations: webhook on ConfigMaps of [`SHOP`], and the metrics API.
fn registrations(ca_bundle: &str) -> Value {
    let service = json!({"namespace": NAMESPACE, "name": NAME, "port": 443});
    let mut webhook_service = service.clone();
    webhook_service["path"] = json!(WEBHOOK_PATH);
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": NAME},
         "webhooks": [{
            "name": "configmaps.tenant-extensions.example.com",
            "clientConfig": {"service": webhook_service, "caBundle": ca_bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"tenant-extensions/validate": "true"}},
            // Unreachable means refused: an allowed ConfigMap then fails too, and the test with it.
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10
         }]},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": "v1beta1.metrics.k8s.io"},
         "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "service": service,
            "caBundle": ca_bundle, "groupPriorityMinimum": 100, "versionPriority": 100}}
    ]})
}

fn configmap(name: &str, deny: bool) -> String {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": SHOP, "labels": {DENY_LABEL: deny.to_string()}},
        "data": {"greeting": "hello"}})
    .to_string()
}

async fn apply(kubectl: &Kubectl, objects: &str) -> anyhow::Result<crate::kubectl_support::Output> {
    kubectl.run(&["apply", "-f", "-"], Some(objects.as_bytes())).await
}

/// `kubectl top` rows as (name, CPU in millicores, memory in MiB), failing on a row without figures.
fn top_rows(output: &str, skip_columns: usize) -> anyhow::Result<Vec<(String, u64, u64)>> {
    output
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            let name = columns.get(skip_columns).context("a name")?;
            let cpu = columns
                .get(skip_columns + 1)
                .and_then(|c| c.strip_suffix('m'))
                .and_then(|c| c.parse().ok())
                .with_context(|| format!("CPU figure in {line:?}"))?;
            let memory = columns
                .iter()
                .skip(skip_columns + 2)
                .find_map(|c| c.strip_suffix("Mi").and_then(|m| m.parse().ok()))
                .with_context(|| format!("memory figure in {line:?}"))?;
            Ok(((*name).to_owned(), cpu, memory))
        })
        .collect()
}

/// GET `path` straight from the server pod at `address` (as any pod could), verifying its certificate
/// for the Service's name and presenting `identity` when given; returns the status line.
async fn get_directly(
    address: &str,
    ca: &str,
    identity: Option<&local_cluster::pki::CertifiedKey>,
    path: &str,
) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = local_cluster::http_client::client_tls(ca, identity)?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls_pki_types::ServerName::try_from(format!("{NAME}.{NAMESPACE}.svc"))?;
    let tcp = tokio::net::TcpStream::connect((address, 8443)).await?;
    let mut tls = connector.connect(name, tcp).await?;
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_string(&mut response)).await??;
    Ok(response.lines().next().unwrap_or_default().to_owned())
}

/// The server's pods, events and log, for a failure report.
async fn server_state(kubectl: &Kubectl) -> String {
    let mut report = String::new();
    for args in [
        &["get", "pods", "-n", NAMESPACE, "-o", "wide"][..],
        &["get", "events", "-n", NAMESPACE],
        &["logs", "-n", NAMESPACE, &format!("deployment/{NAME}")],
    ] {
        match kubectl.run(args, None).await {
            Ok(output) => report.push_str(&format!(
                "kubectl {args:?}:\n{}{}\n",
                output.stdout, output.stderr
            )),
            Err(error) => report.push_str(&format!("kubectl {args:?}: {error}\n")),
        }
    }
    report
}

#[tokio::test]
async fn a_tenant_s_webhook_and_metrics_api_run_as_its_own_pods() -> anyhow::Result<()> {
    const TEST: &str = "a_tenant_s_webhook_and_metrics_api_run_as_its_own_pods";
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let program = Path::new(env!("CARGO_BIN_EXE_tenant-extensions")).to_owned();
    tokio::task::spawn_blocking(move || realnodes::RealNodes::add_program_image(IMAGE, &program)).await??;
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["ext".to_owned()],
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    let kubeconfig = sandbox.tenant_kubeconfigs()["ext"].clone();
    let tenant = local_cluster::client_from_kubeconfig_file(&kubeconfig).await?;
    let kubectl = Kubectl::new(&kubeconfig)?;

    // The server's certificate names the Service as the apiserver dials it, from a CA of the tenant's own.
    let ca = local_cluster::pki::CertificateAuthority::new("tenant-extensions")?;
    let serving = ca.issue(
        NAME,
        &[],
        &[&format!("{NAME}.{NAMESPACE}.svc")],
        local_cluster::pki::Usage::Server,
    )?;
    apply(
        &kubectl,
        &server_objects(&serving.cert_pem, &serving.key_pem).to_string(),
    )
    .await?
    .ok()?;

    // The Service's endpoint is the server pod's address, which is the super cluster pod's.
    let endpoints: Api<Endpoints> = Api::namespaced(tenant.clone(), NAMESPACE);
    let address = wait::until(Duration::from_secs(180), "a ready endpoint of the server", || {
        let endpoints = endpoints.clone();
        async move {
            let subsets = endpoints.get(NAME).await.ok()?.subsets?;
            subsets
                .into_iter()
                .flat_map(|s| s.addresses.unwrap_or_default())
                .map(|a| a.ip)
                .next()
        }
    })
    .await;
    let address = match address {
        Ok(address) => address,
        Err(error) => anyhow::bail!(
            "{NAME} never became ready: {error}\n{}",
            server_state(&kubectl).await
        ),
    };
    let vcs: Api<crds::VirtualCluster> = Api::namespaced(sandbox.super_client(), "default");
    let key = crds::naming::cluster_key_of(&vcs.get("ext").await?).context("cluster key")?;
    let super_pods: Api<Pod> = Api::namespaced(
        sandbox.super_client(),
        &crds::naming::super_namespace(&key, NAMESPACE),
    );
    let super_ips: Vec<String> = super_pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .collect();
    assert_eq!(
        super_ips,
        vec![address.clone()],
        "the endpoint is the super pod's address"
    );

    // The metrics are the front proxy's alone: a pod of the tenant reaching the server straight, without
    // the front proxy's client certificate or with a made-up one, reads nothing.
    let pods_path = "/apis/metrics.k8s.io/v1beta1/pods";
    let healthz = get_directly(&address, ca.cert_pem(), None, "/healthz").await?;
    assert!(healthz.contains(" 200 "), "{healthz}");
    let anonymous = get_directly(&address, ca.cert_pem(), None, pods_path).await?;
    assert!(anonymous.contains(" 401 "), "{anonymous}");
    let forged = ca.issue("front-proxy-client", &[], &[], local_cluster::pki::Usage::Client)?;
    match get_directly(&address, ca.cert_pem(), Some(&forged), pods_path).await {
        Ok(status) => assert!(
            !status.contains(" 200 "),
            "a forged front proxy read metrics: {status}"
        ),
        Err(refused) => tracing::debug!(%refused, "the forged certificate was refused in the handshake"),
    }

    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());
    apply(&kubectl, &registrations(&ca_bundle).to_string())
        .await?
        .ok()?;

    // The webhook: refusing once the apiserver has loaded its configuration, with the server's message.
    let refusal = wait::until(Duration::from_secs(60), "the webhook refusing deny=true", || {
        let kubectl = kubectl.clone();
        async move {
            let output = apply(&kubectl, &configmap("refused", true)).await.ok()?;
            (output.code != Some(0) && output.stderr.contains("refused by the tenant's own webhook"))
                .then_some(output.stderr)
        }
    })
    .await
    .context("the tenant's webhook never refused a ConfigMap labelled deny=true")?;
    assert!(
        refusal.contains("admission webhook \"configmaps.tenant-extensions.example.com\" denied the request")
            && refusal.contains(&format!("ConfigMap {SHOP}/refused is labelled {DENY_LABEL}=true")),
        "{refusal}"
    );
    let applied = apply(&kubectl, &configmap("admitted", false)).await?.ok()?;
    assert!(
        applied.stdout.contains("configmap/admitted created"),
        "{}",
        applied.stdout
    );
    let names = kubectl
        .run(&["get", "configmaps", "-n", SHOP, "-o", "name"], None)
        .await?
        .ok()?
        .stdout;
    assert!(
        names.contains("configmap/admitted") && !names.contains("configmap/refused"),
        "{names}"
    );

    // The aggregated API: available, and `kubectl top` prints the tenant's pods' real figures.
    wait::until_true(Duration::from_secs(120), "metrics.k8s.io available", || {
        let kubectl = kubectl.clone();
        async move {
            kubectl
                .run(
                    &[
                        "get",
                        "apiservice",
                        "v1beta1.metrics.k8s.io",
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
                    ],
                    None,
                )
                .await
                .is_ok_and(|o| o.stdout.trim() == "True")
        }
    })
    .await?;
    kubectl
        .run(
            &[
                "run",
                "web",
                "-n",
                SHOP,
                "--image=busybox",
                "--",
                "httpd",
                "-f",
                "-p",
                "8080",
            ],
            None,
        )
        .await?
        .ok()?;
    let pods = wait::until(Duration::from_secs(180), "kubectl top pod figures", || {
        let kubectl = kubectl.clone();
        async move {
            let output = kubectl
                .run(&["top", "pod", "-A", "--no-headers"], None)
                .await
                .ok()?;
            (output.code == Some(0)).then_some(())?;
            let rows = top_rows(&output.stdout, 1).ok()?;
            let web = output
                .stdout
                .lines()
                .any(|l| l.starts_with(SHOP) && l.contains(" web "));
            let server = output
                .stdout
                .lines()
                .any(|l| l.starts_with(NAMESPACE) && l.contains(NAME));
            (web && server).then_some((rows, output.stdout))
        }
    })
    .await
    .context("kubectl top pod never showed the tenant's pods")?;
    let (rows, text) = pods;
    // Only the tenant's own pods: its control plane shares these nodes and is not among them.
    let own: BTreeSet<String> = kubectl
        .run(
            &[
                "get",
                "pods",
                "-A",
                "--no-headers",
                "-o",
                "custom-columns=NAME:.metadata.name",
            ],
            None,
        )
        .await?
        .ok()?
        .stdout
        .lines()
        .map(str::to_owned)
        .collect();
    for (name, _, _) in &rows {
        assert!(
            own.contains(name),
            "kubectl top pod shows {name}, not the tenant's:\n{text}"
        );
    }
    // Figures are measured, not made up: the server's working set is megabytes.
    assert!(
        rows.iter()
            .any(|(name, _, memory)| name.starts_with(NAME) && *memory > 0),
        "{text}"
    );

    let nodes = wait::until(Duration::from_secs(60), "kubectl top node figures", || {
        let kubectl = kubectl.clone();
        async move {
            let output = kubectl.run(&["top", "node", "--no-headers"], None).await.ok()?;
            (output.code == Some(0)).then_some(())?;
            top_rows(&output.stdout, 0).ok().filter(|rows| !rows.is_empty())
        }
    })
    .await
    .context("kubectl top node never printed figures")?;
    let real_nodes = sandbox.tenancy().nodes.names();
    for (name, _, _) in &nodes {
        assert!(real_nodes.contains(name), "vNode {name} is a real node");
    }
    // A vNode's figures are the sums over the tenant's pods there, the server's among them.
    assert!(
        nodes.iter().map(|(_, _, memory)| memory).sum::<u64>() > 0,
        "{nodes:?}"
    );
    sandbox.shutdown().await;
    Ok(())
}
