//! vc-manager adopting a second real apiserver: Running while its kubeconfig answers, a condition naming
//! exactly what failed when it does not (missing Secret, missing key, rejected token, unreachable server),
//! recovery as soon as the cause is fixed, and the kubelet-client certificate an operator hands to the
//! adopted apiserver.

use std::{sync::Arc, time::Duration};

use crate::vc_manager_support::*;
use anyhow::Context as _;
use base64::{Engine, engine::general_purpose::STANDARD};
use crds::{
    ClusterPhase, KubeconfigSecretRef, VirtualCluster, VirtualClusterSpec,
    wellknown::{CONDITION_APISERVER_READY, CONDITION_PKI_READY, CONDITION_READY},
};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Secret},
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use local_cluster::{Binary, ControlPlane, ControlPlaneOptions, Etcd, pki::CertifiedKey, wait};

const NAMESPACE: &str = "default";
const SECRET: &str = "beta-kubeconfig";

fn adopting(name: &str, secret: &str, key: &str) -> VirtualCluster {
    VirtualCluster::new(
        name,
        VirtualClusterSpec {
            kubeconfig_secret_ref: Some(KubeconfigSecretRef {
                name: secret.into(),
                key: key.into(),
            }),
            ..Default::default()
        },
    )
}

fn kubeconfig_secret(name: &str, key: &str, kubeconfig: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            // Meant for the VirtualCluster it is named after (`<name>-kubeconfig`), as an adopted
            // tenant's kubeconfig Secret must say.
            labels: name
                .strip_suffix("-kubeconfig")
                .map(|vc| [(crds::wellknown::LABEL_KUBECONFIG_FOR.to_owned(), vc.to_owned())].into()),
            ..Default::default()
        },
        data: Some([(key.to_owned(), ByteString(kubeconfig.as_bytes().to_vec()))].into()),
        ..Default::default()
    }
}

/// The tenant's admin kubeconfig with its client certificate replaced by a token nobody issued.
fn bogus_token_kubeconfig(server: &str, ca_pem: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters: [{{name: tenant, cluster: {{server: '{server}', certificate-authority-data: {ca}}}}}]
users: [{{name: intruder, user: {{token: not-a-real-token}}}}]
contexts: [{{name: tenant, context: {{cluster: tenant, user: intruder}}}}]
current-context: tenant
",
        ca = STANDARD.encode(ca_pem)
    )
}

/// Waits until the APIServerReady condition has `reason` (and Ready agrees); returns the VirtualCluster.
async fn wait_reason(
    api: &Api<VirtualCluster>,
    name: &str,
    reason: &'static str,
) -> anyhow::Result<VirtualCluster> {
    wait_vc(api, name, Duration::from_secs(60), reason, move |vc| {
        [CONDITION_APISERVER_READY, CONDITION_READY]
            .iter()
            .all(|t| condition(vc, t).is_some_and(|c| c.reason == reason))
    })
    .await
}

#[tokio::test]
async fn adopted_tenant_follows_its_kubeconfig() -> anyhow::Result<()> {
    if !local_cluster::require(
        "adopted_tenant_follows_its_kubeconfig",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager],
    ) {
        return Ok(());
    }
    Box::pin(adoption()).await
}

async fn adoption() -> anyhow::Result<()> {
    init_logging();
    let started = std::time::Instant::now();
    let etcd = Arc::new(Etcd::start().await?);
    let (super_cluster, mut tenant) = tokio::try_join!(
        // The super cluster runs kube-controller-manager: deleting the root namespace needs its namespace
        // controller.
        ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::super_cluster()),
        ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::bare("adopted")),
    )?;
    let client = super_cluster.client();
    local_cluster::install_crds(&client).await?;
    let manager = RunningManager::start(client.clone(), fast_settings(), None).await?;
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);

    // No Secret yet: the condition names it.
    vcs.create(&PostParams::default(), &adopting("beta", SECRET, "value"))
        .await?;
    let vc = wait_reason(&vcs, "beta", "KubeconfigSecretNotFound").await?;
    assert_eq!(vc.phase(), Some(ClusterPhase::Error));
    let message = &condition(&vc, CONDITION_APISERVER_READY)
        .context("condition")?
        .message;
    assert_eq!(
        message,
        &format!("kubeconfig Secret {NAMESPACE}/{SECRET} does not exist")
    );
    // The tenant already has its root namespace and kubelet-client certificate.
    let root = crds::naming::cluster_key_of(&vc).context("cluster key")?;
    assert_eq!(
        condition(&vc, CONDITION_PKI_READY).map(|c| c.status.as_str()),
        Some("True")
    );
    assert_eq!(
        vc.status.as_ref().and_then(|s| s.cluster_namespace.as_deref()),
        Some(root.as_str())
    );

    // The Secret under the wrong key.
    let server = tenant.apiserver().url().to_owned();
    let ca = tenant.apiserver().ca().cert_pem().to_owned();
    secrets
        .create(
            &PostParams::default(),
            &kubeconfig_secret(SECRET, "kubeconfig", &bogus_token_kubeconfig(&server, &ca)),
        )
        .await?;
    let vc = wait_reason(&vcs, "beta", "KubeconfigKeyMissing").await?;
    assert!(
        condition(&vc, CONDITION_READY).is_some_and(|c| c.message.contains("has no key \"value\"")),
        "{:?}",
        vc.status
    );

    // A token the tenant apiserver does not know: unauthorized, said so.
    let add_key =
        serde_json::json!({"data": {"value": STANDARD.encode(bogus_token_kubeconfig(&server, &ca))}});
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&add_key))
        .await?;
    let vc = wait_reason(&vcs, "beta", "Unauthorized").await?;
    assert_eq!(vc.phase(), Some(ClusterPhase::Error));
    let message = &condition(&vc, CONDITION_APISERVER_READY)
        .context("condition")?
        .message;
    assert!(
        message.starts_with(&format!(
            "tenant apiserver {server} rejected the kubeconfig's credentials (401 Unauthorized)"
        )),
        "{message}"
    );

    // Fixing the Secret recovers at once (the Secret is watched), without waiting out the backoff.
    let fixed =
        serde_json::json!({"data": {"value": STANDARD.encode(tenant.apiserver().admin_kubeconfig())}});
    let fixed_at = std::time::Instant::now();
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&fixed))
        .await?;
    let vc = wait_vc(&vcs, "beta", Duration::from_secs(30), "Running", |vc| {
        phase_is(vc, ClusterPhase::Running)
    })
    .await?;
    let recovered_in = fixed_at.elapsed();
    let answered = &condition(&vc, CONDITION_APISERVER_READY)
        .context("condition")?
        .message;
    // The version the adopted apiserver itself reports, whichever Kubernetes the harness runs.
    let version = tenant.client().apiserver_version().await?.git_version;
    assert!(
        answered.contains(&format!("answered /version with {version}")),
        "{answered} (apiserver reports {version})"
    );

    // The kubelet-client pair vn-agent trusts for this tenant.
    let root_secrets: Api<Secret> = Api::namespaced(client.clone(), &root);
    let kubelet_client = root_secrets.get("kubelet-client").await?;
    assert_eq!(kubelet_client.labels()["tenancy.x-k8s.io/kubelet-client"], "true");
    assert_eq!(kubelet_client.annotations()["tenancy.x-k8s.io/cluster"], root);
    assert_eq!(kubelet_client.annotations()["tenancy.x-k8s.io/vcname"], "beta");
    assert_eq!(
        kubelet_client.annotations()["tenancy.x-k8s.io/vcuid"],
        vc.uid().context("uid")?
    );
    let client_cert = secret_text(&kubelet_client, "tls.crt")?;
    let client_key = secret_text(&kubelet_client, "tls.key")?;
    let client_ca = secret_text(&kubelet_client, "ca.crt")?;
    assert_eq!(
        client_ca,
        secret_text(&root_secrets.get("kubelet-client-ca").await?, "tls.crt")?
    );
    verify_client_certificate(&client_cert, &client_ca)?;
    assert_eq!(subject(&client_cert)?.0, root);
    // Only the kubelet-client pair: an adopted tenant's own PKI is not vc-manager's.
    let names: Vec<String> = root_secrets
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|s| s.name_any())
        .filter(|n| !n.starts_with("default-token"))
        .collect();
    assert_eq!(names, ["kubelet-client", "kubelet-client-ca"]);

    // The documented procedure: the operator gives the adopted apiserver this certificate as its
    // kubelet client certificate (--kubelet-client-certificate/--kubelet-client-key) and restarts it.
    tenant
        .apiserver_mut()
        .restart_with_kubelet_client(&CertifiedKey {
            cert_pem: client_cert,
            key_pem: client_key,
        })
        .await?;
    wait_vc(
        &vcs,
        "beta",
        Duration::from_secs(30),
        "Running after the restart",
        |vc| phase_is(vc, ClusterPhase::Running),
    )
    .await?;

    // The adopted apiserver goes away: unreachable; it comes back: Running.
    tenant.apiserver_mut().stop();
    let vc = wait_reason(&vcs, "beta", "APIServerUnreachable").await?;
    assert_eq!(vc.phase(), Some(ClusterPhase::Error));
    tenant.apiserver_mut().restart().await?;
    wait_vc(&vcs, "beta", Duration::from_secs(30), "Running again", |vc| {
        phase_is(vc, ClusterPhase::Running)
    })
    .await?;

    // Deleting the VirtualCluster removes what vc-manager made, not the adopted cluster or its Secret.
    vcs.delete("beta", &DeleteParams::default()).await?;
    wait::until_true(Duration::from_secs(60), "VirtualCluster beta gone", || {
        let vcs = vcs.clone();
        async move { vcs.get_opt("beta").await.is_ok_and(|v| v.is_none()) }
    })
    .await?;
    wait::until_true(Duration::from_secs(60), "root namespace gone", || {
        let namespaces = Api::<Namespace>::all(client.clone());
        let root = root.clone();
        async move { namespaces.get_opt(&root).await.is_ok_and(|n| n.is_none()) }
    })
    .await?;
    assert!(
        secrets.get_opt(SECRET).await?.is_some(),
        "the user's kubeconfig Secret stays"
    );
    Api::<Namespace>::all(tenant.client()).get("default").await?;
    manager.stop().await?;
    eprintln!(
        "adopted tenant: recovered {:.2} s after the Secret was fixed; whole test {:.1} s",
        recovered_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
