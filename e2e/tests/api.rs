//! The tenancy.x-k8s.io API against a real kube-apiserver: the CRDs install, the examples and YAML in the
//! original project's shape apply, defaults are filled in, print columns show, and invalid objects are
//! rejected with messages that name the field and the reason.

use std::path::PathBuf;

use anyhow::Context;
use crds::{ClusterVersion, VirtualCluster};
use kube::{Api, Client, api::PostParams};
use local_cluster::{Binary, ControlPlane, ControlPlaneOptions, apply};

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver];

fn workspace_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace_file(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

async fn apiserver_with_crds(name: &str) -> anyhow::Result<ControlPlane> {
    let cluster = ControlPlane::start(ControlPlaneOptions::bare(name)).await?;
    local_cluster::install_crds(&cluster.client()).await?;
    Ok(cluster)
}

#[tokio::test]
async fn crds_install_and_examples_apply() -> anyhow::Result<()> {
    if !local_cluster::require("crds_install_and_examples_apply", NEEDS) {
        return Ok(());
    }
    let cluster = apiserver_with_crds("api-examples").await?;
    let client = cluster.client();

    for example in [
        "examples/clusterversion-nodeport.yaml",
        "examples/clusterversion-clusterip.yaml",
        "examples/virtualcluster-native.yaml",
        "examples/virtualcluster-adopt.yaml",
        "e2e/fixtures/original-style-clusterversion.yaml",
        "e2e/fixtures/original-style-virtualcluster.yaml",
    ] {
        apply::apply_yaml(&client, &read(example), "default")
            .await
            .with_context(|| format!("applying {example}"))?;
    }

    // The typed API reads back what was applied, with server-side defaults filled in.
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), "default");
    let original = vcs.get("vc-sample-1").await?;
    assert_eq!(
        original.spec.cluster_version_name.as_deref(),
        Some("cv-original-style")
    );
    assert_eq!(original.spec.cluster_domain, "cluster.local");
    assert_eq!(original.spec.weight, 1);
    assert_eq!(original.spec.pki_expire_days, 365);
    let adopted = vcs.get("team-b").await?;
    let secret_ref = adopted
        .spec
        .kubeconfig_secret_ref
        .clone()
        .context("team-b has a kubeconfigSecretRef")?;
    assert_eq!(
        (secret_ref.name.as_str(), secret_ref.key.as_str()),
        ("team-b-kubeconfig", "value")
    );
    let native = vcs.get("team-a").await?;
    assert_eq!(native.spec.weight, 2);
    assert_eq!(
        native
            .spec
            .quota
            .as_ref()
            .and_then(|q| q.requests_memory.clone())
            .map(|q| q.0),
        Some("40Gi".into())
    );

    let cvs: Api<ClusterVersion> = Api::all(client.clone());
    let cv = cvs.get("cv-original-style").await?;
    // Embedded objects keep every field, including ones our schema does not spell out.
    let sts_spec = cv
        .spec
        .controller_manager
        .statefulset
        .spec
        .context("statefulset spec")?;
    assert_eq!(
        sts_spec.update_strategy.and_then(|s| s.type_).as_deref(),
        Some("OnDelete")
    );
    assert_eq!(
        cv.spec
            .api_server
            .service
            .context("apiserver service")?
            .spec
            .and_then(|s| s.type_)
            .as_deref(),
        Some("NodePort")
    );

    // kubectl's columns: Phase, ClusterVersion, ClusterNamespace, Age.
    let columns = table_columns(
        &client,
        "/apis/tenancy.x-k8s.io/v1alpha1/namespaces/default/virtualclusters",
    )
    .await?;
    assert_eq!(
        columns,
        ["Name", "Phase", "ClusterVersion", "ClusterNamespace", "Age"]
    );
    // And the short names resolve.
    let discovery = kube::Discovery::new(client.clone())
        .filter(&["tenancy.x-k8s.io"])
        .run()
        .await?;
    let group = discovery.get("tenancy.x-k8s.io").context("group discovered")?;
    assert!(
        group
            .recommended_resources()
            .iter()
            .any(|(r, _)| r.plural == "virtualclusters")
    );
    Ok(())
}

/// The original project's sample ClusterVersion, byte for byte but for its images.
const ORIGINAL_SAMPLE: &str = "e2e/fixtures/original-clusterversion-v1-nodeport.yaml";

#[tokio::test]
async fn the_original_sample_applies_unchanged_with_embedded_type_meta_defaulted() -> anyhow::Result<()> {
    if !local_cluster::require(
        "the_original_sample_applies_unchanged_with_embedded_type_meta_defaulted",
        NEEDS,
    ) {
        return Ok(());
    }
    let cluster = apiserver_with_crds("api-original-sample").await?;
    let client = cluster.client();
    let sample = read(ORIGINAL_SAMPLE);
    // The sample really leaves them out.
    let object = apply::parse_documents(&sample)?.remove(0);
    for bundle in ["etcd", "apiServer", "controllerManager"] {
        let statefulset = &object.data["spec"][bundle]["statefulset"];
        assert!(
            statefulset.get("apiVersion").is_none() && statefulset.get("kind").is_none(),
            "{bundle}: {statefulset}"
        );
    }

    // As `kubectl create -f` sends it (a POST), then as `kubectl apply --server-side -f` does.
    let cvs: Api<ClusterVersion> = Api::all(client.clone());
    apply::create_strict(&client, object, "default")
        .await
        .context("creating the original sample")?;
    check_embedded_type_meta(&client)
        .await
        .context("after a create")?;
    cvs.delete("cv-sample-np", &Default::default()).await?;
    apply::apply_yaml(&client, &sample, "default")
        .await
        .context("applying the original sample")?;
    check_embedded_type_meta(&client)
        .await
        .context("after an apply")?;

    // The typed API reads what was stored.
    let cv = cvs.get("cv-sample-np").await?;
    assert_eq!(
        cv.spec
            .api_server
            .service
            .and_then(|s| s.spec)
            .and_then(|s| s.type_)
            .as_deref(),
        Some("NodePort")
    );
    assert_eq!(
        cv.spec
            .etcd
            .statefulset
            .spec
            .and_then(|s| s.template.spec)
            .map(|s| s.containers[0].image.clone()),
        Some(Some("registry.k8s.io/etcd:3.5.21-0".to_owned()))
    );

    // Given kinds are still checked, and the rejection names the field.
    for (case, from, to, field, message) in [
        (
            "etcd statefulset as a Deployment",
            "    statefulset:\n      metadata:\n        name: etcd\n",
            "    statefulset:\n      kind: Deployment\n      metadata:\n        name: etcd\n",
            "spec.etcd",
            "statefulset.kind must be StatefulSet",
        ),
        (
            "apiserver service as a Deployment",
            "    service:\n      metadata:\n        name: apiserver-svc\n",
            "    service:\n      kind: Deployment\n      metadata:\n        name: apiserver-svc\n",
            "spec.apiServer",
            "service.kind must be Service",
        ),
    ] {
        assert!(sample.contains(from), "{case}: the sample changed");
        let wrong = sample
            .replacen(from, to, 1)
            .replace("name: cv-sample-np", "name: cv-wrong-kind");
        let error = apply::apply_yaml(&client, &wrong, "default")
            .await
            .err()
            .with_context(|| format!("{case}: accepted"))?;
        let text = error_message(&error);
        assert!(
            text.contains(field) && text.contains(message),
            "{case}: rejection {text:?} does not name {field} and say {message:?}"
        );
    }
    Ok(())
}

/// Every embedded StatefulSet and Service of the stored `cv-sample-np` has the default apiVersion and kind.
async fn check_embedded_type_meta(client: &Client) -> anyhow::Result<()> {
    let request =
        http::Request::get("/apis/tenancy.x-k8s.io/v1alpha1/clusterversions/cv-sample-np").body(Vec::new())?;
    let stored: serde_json::Value = client.request(request).await?;
    let spec = &stored["spec"];
    for bundle in ["etcd", "apiServer", "controllerManager"] {
        let statefulset = &spec[bundle]["statefulset"];
        assert_eq!(
            (statefulset["apiVersion"].as_str(), statefulset["kind"].as_str()),
            (Some("apps/v1"), Some("StatefulSet")),
            "{bundle}.statefulset"
        );
        // The rest is kept as given.
        assert_eq!(
            statefulset["spec"]["updateStrategy"]["type"], "OnDelete",
            "{bundle}.statefulset"
        );
    }
    for bundle in ["etcd", "apiServer"] {
        let service = &spec[bundle]["service"];
        assert_eq!(
            (service["apiVersion"].as_str(), service["kind"].as_str()),
            (Some("v1"), Some("Service")),
            "{bundle}.service"
        );
    }
    assert_eq!(
        spec["etcd"]["service"]["metadata"]["annotations"]["service.alpha.kubernetes.io/tolerate-unready-endpoints"],
        "true"
    );
    // No Service is made up where the sample has none.
    assert!(
        spec["controllerManager"].get("service").is_none(),
        "{}",
        spec["controllerManager"]
    );
    Ok(())
}

async fn table_columns(client: &Client, path: &str) -> anyhow::Result<Vec<String>> {
    let request = http::Request::get(path)
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())?;
    let table: serde_json::Value = client.request(request).await?;
    Ok(table["columnDefinitions"]
        .as_array()
        .context("a Table")?
        .iter()
        .filter(|c| c["priority"].as_i64().unwrap_or(0) == 0)
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect())
}

/// Each invalid object with the words its rejection must contain.
const INVALID: &[(&str, &str, &[&str])] = &[
    (
        "both modes set",
        "spec: {clusterVersionName: cv, kubeconfigSecretRef: {name: kc}}",
        &["spec", "mutually exclusive"],
    ),
    (
        "neither mode set",
        "spec: {clusterDomain: cluster.local}",
        &["spec", "one of spec.clusterVersionName"],
    ),
    (
        "weight 0",
        "spec: {clusterVersionName: cv, weight: 0}",
        &["spec.weight", "greater than or equal to 1"],
    ),
    (
        "weight 101",
        "spec: {clusterVersionName: cv, weight: 101}",
        &["spec.weight", "less than or equal to 100"],
    ),
    (
        "bad clusterDomain",
        "spec: {clusterVersionName: cv, clusterDomain: Bad_Domain.local}",
        &["spec.clusterDomain", "RFC 1123 DNS domain"],
    ),
    (
        "pkiExpireDays 0",
        "spec: {clusterVersionName: cv, pkiExpireDays: 0}",
        &["spec.pkiExpireDays", "greater than or equal to 1"],
    ),
    (
        "bad serviceCidr",
        "spec: {clusterVersionName: cv, serviceCidr: banana}",
        &["spec.serviceCidr", "must be a CIDR"],
    ),
    (
        "burst below qps",
        "spec: {clusterVersionName: cv, rateLimit: {qps: 10, burst: 5}}",
        &["spec.rateLimit", "burst must be at least qps"],
    ),
    (
        "bad quota",
        "spec: {clusterVersionName: cv, quota: {pods: lots}}",
        &["spec.quota.pods", "should match"],
    ),
    (
        "bad runtimeClassName",
        "spec: {clusterVersionName: cv, runtimeClassName: Kata_VM}",
        &["spec.runtimeClassName", "RuntimeClass name"],
    ),
    (
        "unknown field",
        "spec: {clusterVersionName: cv, clusterVersion: typo}",
        &["unknown field", "spec.clusterVersion"],
    ),
];

#[tokio::test]
async fn invalid_virtual_clusters_are_rejected_with_clear_messages() -> anyhow::Result<()> {
    if !local_cluster::require("invalid_virtual_clusters_are_rejected_with_clear_messages", NEEDS) {
        return Ok(());
    }
    let cluster = apiserver_with_crds("api-invalid").await?;
    let client = cluster.client();

    for (case, spec, expected) in INVALID {
        let yaml = format!(
            "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata: {{name: invalid}}\n{spec}\n"
        );
        let object = apply::parse_documents(&yaml)?.remove(0);
        let error = apply::create_strict(&client, object, "default")
            .await
            .err()
            .with_context(|| format!("{case}: was accepted"))?;
        let message = error_message(&error);
        for word in *expected {
            assert!(
                message.contains(word),
                "{case}: rejection {message:?} does not mention {word:?}"
            );
        }
    }

    // A name with a dot cannot become part of a namespace name.
    let yaml = "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata: {name: team.a}\nspec: {clusterVersionName: cv}\n";
    let error = apply::create_strict(&client, apply::parse_documents(yaml)?.remove(0), "default")
        .await
        .err()
        .context("dotted name accepted")?;
    assert!(
        error_message(&error).contains("metadata.name must be a DNS label"),
        "{}",
        error_message(&error)
    );

    // Switching an existing VirtualCluster between provisioned and adopted is refused.
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), "default");
    let mut vc = VirtualCluster::new(
        "switcher",
        crds::VirtualClusterSpec {
            cluster_version_name: Some("cv".into()),
            ..Default::default()
        },
    );
    vc = vcs.create(&PostParams::default(), &vc).await?;
    vc.spec.cluster_version_name = None;
    vc.spec.kubeconfig_secret_ref = Some(crds::KubeconfigSecretRef {
        name: "kc".into(),
        key: "value".into(),
    });
    let error = vcs
        .replace("switcher", &PostParams::default(), &vc)
        .await
        .err()
        .context("mode switch accepted")?;
    assert!(
        format!("{error}").contains("cannot switch between a provisioned and an adopted"),
        "{error}"
    );

    // ClusterVersion bundles must hold a StatefulSet, and all three are required.
    let bad_kind = read("examples/clusterversion-nodeport.yaml")
        .replacen("kind: StatefulSet", "kind: Deployment", 1)
        .replace("cv-v1-33-nodeport", "cv-bad-kind");
    let error = apply::apply_yaml(&client, &bad_kind, "default")
        .await
        .err()
        .context("Deployment accepted")?;
    assert!(
        error_message(&error).contains("statefulset.kind must be StatefulSet"),
        "{}",
        error_message(&error)
    );
    let missing =
        "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: ClusterVersion\nmetadata: {name: cv-empty}\nspec: {}\n";
    let error = apply::apply_yaml(&client, missing, "default")
        .await
        .err()
        .context("empty ClusterVersion accepted")?;
    let message = error_message(&error);
    for field in ["spec.etcd", "spec.apiServer", "spec.controllerManager"] {
        assert!(
            message.contains(field) && message.contains("Required value"),
            "{message}"
        );
    }
    Ok(())
}

/// The apiserver's message, with the harness's context.
fn error_message(error: &local_cluster::Error) -> String {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
