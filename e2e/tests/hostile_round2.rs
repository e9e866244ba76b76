//! Hard multi-tenancy, round two (issue 32): what a hostile tenant or VirtualCluster editor tried next.
//! Each test is written as the attacker would try it, against real etcd, kube-apiserver and
//! controller-manager processes with the syncer running in process and simulated nodes, and checks what
//! reaches the super cluster:
//!
//! - `a_tenant_pod_cannot_mount_storage_the_platform_keeps` (item 1): pods with inline nfs, iscsi, rbd,
//!   cephfs, glusterfs, fc, flexVolume, gitRepo and CSI volumes of an unlisted driver, and a generic
//!   ephemeral volume of an unpublished StorageClass, are refused (`PodPolicyViolation`); a generic
//!   ephemeral volume past the claim quota waits with its claim (`TenantQuotaExceeded`) and the super
//!   cluster makes no claim for it; once there is room its claim is the tenant's copy, of the published
//!   class, without the identity label its template forged.
//! - `ingresses_reach_only_published_classes_and_the_tenants_hosts` (item 4): Ingresses naming an
//!   unpublished IngressClass, another host than the tenant's (the platform's login host, a suffix the
//!   editor claimed without the platform granting it), a catch-all rule, and a LoadBalancer Service of an
//!   unoffered `loadBalancerClass` are refused; an Ingress without a class gets the published default,
//!   and certificate and DNS annotations do not reach the copy.
//! - `tenant_labels_and_annotations_reach_the_super_cluster_only_through_the_allow_list` (item 6): mesh
//!   injection, CNI, autoscaler, log, Secret-replicator and cloud-identity keys on namespaces, pods,
//!   Secrets and ServiceAccounts do not reach the copies; namespace labels reach the super namespace only
//!   encoded, so no platform selector matches them; the tenant's Services, NetworkPolicies and budgets
//!   still select what they did, an operator's prefixed labels included, and label changes still flow.
//! - `a_forced_runtime_class_is_published_and_tolerates_only_what_pods_may` (item 7): a VirtualCluster
//!   forcing an unpublished RuntimeClass, or a published one whose scheduling tolerates the control plane,
//!   gets its pods refused and the field named on the VirtualCluster; a published class with ordinary
//!   tolerations runs.
//! - `a_virtual_cluster_cannot_raise_its_share_past_the_platforms_ceilings` (item 9): weight 100, 1000
//!   pods and 1000 writes a second are clamped to the platform's ceilings, named in `SpecLimited`, and the
//!   tenant runs no more pods than the ceiling.
//! - `a_tenant_cannot_run_another_tenants_image_from_the_node_cache` (item 10): containers asking for
//!   `IfNotPresent` and `Never` (which runs only what a node has cached) are pulled `Always`.
//! - `tenant_containers_cannot_forge_packets` (item 11): every container of the super pod drops `NET_RAW`.

use crate::object_support::{create, until};
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use crds::{VirtualCluster, VirtualClusterSpec, wellknown};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount},
    events::v1::Event,
    networking::v1::{Ingress, IngressClass, NetworkPolicy},
    node::v1::RuntimeClass,
    policy::v1::PodDisruptionBudget,
    storage::v1::StorageClass,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions, TenantMaster, VC_NAMESPACE},
    wait,
};
use serde_json::json;
use syncer::{Args, Metrics, Syncer, SyncerConfig};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(60);

/// The syncer's settings from flags, as a platform passes them.
fn syncer_config(flags: &[&str]) -> anyhow::Result<SyncerConfig> {
    let args = Args::try_parse_from(
        [
            "syncer",
            "--patrol-interval-seconds=3",
            "--vnode-grace-seconds=3",
            "--tenant-health-period-seconds=2",
            "--downward-workers=4",
            "--upward-workers=4",
            "--token-ttl-seconds=600",
        ]
        .iter()
        .chain(flags),
    )?;
    SyncerConfig::try_from(args.syncer).map_err(anyhow::Error::msg)
}

/// A super cluster with simulated nodes (and its controller-manager when `super_controllers`), the
/// syncer with `flags`, and one tenant, `attacker`, with `spec`.
async fn tenancy(
    spec: serde_json::Value,
    flags: &[&str],
    super_controllers: bool,
) -> anyhow::Result<(Tenancy, Syncer)> {
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let mut tenancy = Tenancy::start(TenancyOptions {
        tenants: 0,
        nodes: 1,
        super_controller_manager: super_controllers,
        ..Default::default()
    })
    .await?;
    let mut spec = spec;
    spec["kubeconfigSecretRef"] = json!({"name": "x"});
    let spec: VirtualClusterSpec = serde_json::from_value(spec)?;
    tenancy.add_tenant("attacker", spec).await?;
    let syncer = Syncer::start(
        tenancy.super_client(),
        syncer_config(flags)?,
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?;
    until(&vcs(&tenancy), "attacker", "attacker TenantSynced=True", |vc| {
        condition(vc, wellknown::CONDITION_TENANT_SYNCED).is_some_and(|(status, _)| status == "True")
    })
    .await?;
    Ok((tenancy, syncer))
}

fn vcs(tenancy: &Tenancy) -> Api<VirtualCluster> {
    Api::namespaced(tenancy.super_client(), VC_NAMESPACE)
}

/// Status and message of a VirtualCluster's condition.
fn condition(vc: Option<&VirtualCluster>, type_: &str) -> Option<(String, String)> {
    vc?.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.message.clone()))
}

/// Waits for an event with `reason` about `regarding` whose note contains `says`; returns the note.
async fn event(
    client: &Client,
    namespace: &str,
    regarding: &str,
    reason: &str,
    says: &str,
) -> anyhow::Result<String> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let found = wait::until(
        PATIENCE,
        &format!("event {reason} about {regarding} saying {says:?}"),
        || {
            let api = api.clone();
            async move {
                api.list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding)
                    })
                    .filter_map(|e| e.note)
                    .find(|note| note.contains(says))
            }
        },
    )
    .await?;
    Ok(found)
}

fn super_api<K>(tenancy: &Tenancy, tenant: &TenantMaster, namespace: &str) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    Api::namespaced(tenancy.super_client(), &tenant.super_namespace(namespace))
}

/// A tenant namespace with its default ServiceAccount (pods need it), with `labels`.
async fn seed(tenant: &TenantMaster, namespace: &str, labels: serde_json::Value) -> anyhow::Result<()> {
    let client = tenant.client();
    create::<Namespace>(
        &client,
        None,
        json!({"metadata": {"name": namespace, "labels": labels}}),
    )
    .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
    until(&accounts, "default", "default ServiceAccount", |sa| sa.is_some()).await?;
    Ok(())
}

fn pod(name: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    })
}

/// Sleeps long enough for the syncer to have acted on what was just written (used before asserting that
/// something did not happen, after a positive wait has shown the syncer is working).
async fn settle() {
    tokio::time::sleep(Duration::from_secs(3)).await;
}

fn labels<K: Resource>(object: &K) -> BTreeMap<String, String> {
    object.meta().labels.clone().unwrap_or_default()
}

fn annotations<K: Resource>(object: &K) -> BTreeMap<String, String> {
    object.meta().annotations.clone().unwrap_or_default()
}

/// Item 1, the attack: pods mounting storage straight from the platform's network (another tenant's NFS
/// export, an iSCSI target, a Ceph image, a fibre-channel LUN, a node plugin, a git checkout run by the
/// kubelet, a CSI driver's volume by handle), and generic ephemeral volumes that would have the super
/// cluster's own controller make a claim of a StorageClass the platform keeps to itself, or past the
/// tenant's claim quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_pod_cannot_mount_storage_the_platform_keeps() -> anyhow::Result<()> {
    if !local_cluster::require("a_tenant_pod_cannot_mount_storage_the_platform_keeps", NEEDS) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({"quota": {"persistentvolumeclaims": "1"}}), &[], true).await?;
    let super_client = tenancy.super_client();
    create::<StorageClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "platform-ssd"}, "provisioner": "example.com/none",
            "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .await?;
    create::<StorageClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "shared", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}},
            "provisioner": "example.com/none", "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(tenant, "apps", json!({})).await?;
    until(
        &Api::<StorageClass>::all(client.clone()),
        "shared",
        "published StorageClass in the tenant",
        |sc| sc.is_some(),
    )
    .await?;
    // The claim quota's one claim.
    create::<PersistentVolumeClaim>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "data"}, "spec": {"storageClassName": "shared",
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await?;
    let super_claims = super_api::<PersistentVolumeClaim>(&tenancy, tenant, "apps");
    until(&super_claims, "data", "claim data synced", |c| c.is_some()).await?;

    let inline: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "nfs",
            json!({"nfs": {"server": "10.0.0.5", "path": "/exports/tenant-b"}}),
            "nfs volume \"v\"",
        ),
        (
            "iscsi",
            json!({"iscsi": {"targetPortal": "10.0.0.6:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}}),
            "iscsi volume \"v\"",
        ),
        (
            "rbd",
            json!({"rbd": {"monitors": ["10.0.0.7:6789"], "image": "tenant-b-db"}}),
            "rbd volume \"v\"",
        ),
        (
            "cephfs",
            json!({"cephfs": {"monitors": ["10.0.0.7:6789"], "path": "/"}}),
            "cephfs volume \"v\"",
        ),
        (
            "glusterfs",
            json!({"glusterfs": {"endpoints": "glusterfs-cluster", "path": "tenant-b"}}),
            "glusterfs volume \"v\"",
        ),
        (
            "fc",
            json!({"fc": {"targetWWNs": ["500a0982991b8dc5"], "lun": 2}}),
            "fc volume \"v\"",
        ),
        (
            "flex",
            json!({"flexVolume": {"driver": "example.com/lvm"}}),
            "flexVolume volume \"v\"",
        ),
        (
            "git",
            json!({"gitRepo": {"repository": "https://example.com/hooks.git"}}),
            "gitRepo volume \"v\"",
        ),
        (
            "csi",
            json!({"csi": {"driver": "ebs.csi.aws.com", "volumeAttributes": {"volumeID": "vol-0tenantb"}}}),
            "csi volume \"v\" of driver \"ebs.csi.aws.com\"",
        ),
    ];
    let ephemeral = |name: &str, class: &str| {
        let mut object = pod(name);
        object["spec"]["volumes"] = json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "metadata": {"labels": {(wellknown::LABEL_CLUSTER): "someone-else", "app": name}},
            "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}}}]);
        object
    };
    for (name, source, _) in &inline {
        let mut object = pod(name);
        let mut volume = source.clone();
        volume["name"] = json!("v");
        object["spec"]["volumes"] = json!([volume]);
        create::<Pod>(&client, Some("apps"), object).await?;
    }
    create::<Pod>(&client, Some("apps"), ephemeral("private", "platform-ssd")).await?;
    create::<Pod>(&client, Some("apps"), ephemeral("over", "shared")).await?;

    for (name, _, says) in &inline {
        event(&client, "apps", name, "PodPolicyViolation", says).await?;
    }
    event(
        &client,
        "apps",
        "private",
        "PodPolicyViolation",
        "ephemeral volume \"scratch\": StorageClass \"platform-ssd\" is not published",
    )
    .await?;
    // The tenant's own controller-manager made the claim of the allowed one; past the quota it waits.
    event(
        &client,
        "apps",
        "over-scratch",
        "TenantQuotaExceeded",
        "tenant quota persistentvolumeclaims exceeded",
    )
    .await?;
    let super_pods = super_api::<Pod>(&tenancy, tenant, "apps");
    let over = until(&super_pods, "over", "super copy of over", |p| p.is_some())
        .await?
        .context("super pod")?;
    let volume = &over.spec.context("spec")?.volumes.context("volumes")?[0];
    assert!(volume.ephemeral.is_none(), "{volume:?}");
    assert_eq!(
        volume
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str()),
        Some("over-scratch")
    );
    settle().await;
    for (name, _, _) in &inline {
        assert!(
            super_pods.get_opt(name).await?.is_none(),
            "{name} reached the super cluster"
        );
    }
    assert!(super_pods.get_opt("private").await?.is_none());
    // Nothing made a claim the quota did not count, nor one of the platform's class.
    let claims: Vec<String> = super_claims
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(claims, ["data"], "claims in the super namespace");

    // Room: the ephemeral claim is the tenant's copy, of the published class, without the forged label.
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "apps")
        .delete("data", &DeleteParams::default())
        .await?;
    let copy = until(&super_claims, "over-scratch", "ephemeral claim synced", |c| {
        c.is_some()
    })
    .await?
    .context("super claim")?;
    assert_eq!(
        copy.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()),
        Some("shared")
    );
    assert_eq!(
        labels(&copy).get(wellknown::LABEL_CLUSTER),
        None,
        "{:?}",
        labels(&copy)
    );
    assert_eq!(
        annotations(&copy).get(wellknown::ANNOTATION_CLUSTER),
        Some(&tenant.cluster_key)
    );
    Ok(())
}

/// Item 4, the attack: the tenant's Ingresses reach for the platform's internal ingress class, the
/// platform's own login host, every host (a rule without one), and a host under a suffix the
/// VirtualCluster's editor claimed without the platform granting it; certificate and DNS annotations ask
/// the platform's issuers and DNS controllers to act; a LoadBalancer Service names the platform's
/// internal load-balancer class.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ingresses_reach_only_published_classes_and_the_tenants_hosts() -> anyhow::Result<()> {
    if !local_cluster::require(
        "ingresses_reach_only_published_classes_and_the_tenants_hosts",
        NEEDS,
    ) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(
        json!({"ingressHostSuffixes": ["attacker.shops.example.com", "api.platform.example.com"]}),
        &[
            "--sync-ingresses",
            "--ingress-host-suffix={name}.{namespace}.apps.example.com",
            "--ingress-grantable-host-suffixes=shops.example.com",
        ],
        false,
    )
    .await?;
    let super_client = tenancy.super_client();
    create::<IngressClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "public", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"},
            "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
            "spec": {"controller": "k8s.io/ingress-nginx"}}),
    )
    .await?;
    create::<IngressClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "internal", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
            "spec": {"controller": "example.com/internal"}}),
    )
    .await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(tenant, "apps", json!({})).await?;
    until(
        &Api::<IngressClass>::all(client.clone()),
        "public",
        "published IngressClass in the tenant",
        |c| c.is_some(),
    )
    .await?;
    let own = format!("attacker.{VC_NAMESPACE}.apps.example.com");
    let backend = json!({"service": {"name": "web", "port": {"number": 80}}});
    let rule = |host: Option<&str>| {
        let mut rule = json!({"http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}});
        if let Some(host) = host {
            rule["host"] = json!(host);
        }
        rule
    };
    let ingress = |name: &str, class: Option<&str>, rules: Vec<serde_json::Value>| {
        let mut object = json!({"metadata": {"name": name}, "spec": {"rules": rules}});
        if let Some(class) = class {
            object["spec"]["ingressClassName"] = json!(class);
        }
        object
    };
    let attacks = [
        (
            ingress(
                "private-class",
                Some("internal"),
                vec![rule(Some(&format!("web.{own}")))],
            ),
            "IngressClass \"internal\" is not published",
        ),
        (
            ingress(
                "steal-login",
                None,
                vec![rule(Some("login.platform.example.com"))],
            ),
            "spec.rules[0].host \"login.platform.example.com\"",
        ),
        (
            ingress("catch-all", None, vec![rule(None)]),
            "spec.rules[0] without a host",
        ),
        (
            ingress("ungranted", None, vec![rule(Some("api.platform.example.com"))]),
            "spec.rules[0].host \"api.platform.example.com\"",
        ),
        (
            {
                // The class by the annotation ingress controllers still read.
                let mut object = ingress("legacy", None, vec![rule(Some(&format!("web.{own}")))]);
                object["metadata"]["annotations"] = json!({"kubernetes.io/ingress.class": "internal"});
                object
            },
            "IngressClass \"internal\" is not published",
        ),
    ];
    for (object, _) in &attacks {
        create::<Ingress>(&client, Some("apps"), object.clone()).await?;
    }
    let mut certs = ingress("certs", None, vec![rule(Some(&format!("web.{own}")))]);
    certs["metadata"]["annotations"] = json!({
        "cert-manager.io/cluster-issuer": "platform-ca",
        "acme.cert-manager.io/http01-edit-in-place": "true",
        "kubernetes.io/tls-acme": "true",
        "external-dns.alpha.kubernetes.io/hostname": "login.platform.example.com",
        "note": "kept"
    });
    certs["spec"]["tls"] = json!([{"hosts": [format!("web.{own}")], "secretName": "web-tls"}]);
    create::<Ingress>(&client, Some("apps"), certs).await?;
    create::<Ingress>(
        &client,
        Some("apps"),
        ingress(
            "granted",
            None,
            vec![rule(Some("shop.attacker.shops.example.com"))],
        ),
    )
    .await?;
    create::<Service>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "internal-lb"}, "spec": {"type": "LoadBalancer",
            "loadBalancerClass": "platform.example/internal", "selector": {"app": "web"}, "ports": [{"port": 80}]}}),
    )
    .await?;

    for (object, says) in &attacks {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        event(&client, "apps", name, "IngressRefused", says).await?;
    }
    event(
        &client,
        "apps",
        "internal-lb",
        "LoadBalancerClassRefused",
        "loadBalancerClass \"platform.example/internal\"",
    )
    .await?;
    let super_ingresses = super_api::<Ingress>(&tenancy, tenant, "apps");
    let copy = until(&super_ingresses, "certs", "super copy of certs", |i| i.is_some())
        .await?
        .context("super ingress")?;
    assert_eq!(
        copy.spec.as_ref().and_then(|s| s.ingress_class_name.as_deref()),
        Some("public")
    );
    let copied = annotations(&copy);
    assert_eq!(copied.get("note").map(String::as_str), Some("kept"));
    for key in [
        "cert-manager.io/cluster-issuer",
        "acme.cert-manager.io/http01-edit-in-place",
        "kubernetes.io/tls-acme",
        "external-dns.alpha.kubernetes.io/hostname",
    ] {
        assert!(!copied.contains_key(key), "{key} copied down: {copied:?}");
    }
    // Without a class: the published default, by name.
    let granted = until(&super_ingresses, "granted", "super copy of granted", |i| {
        i.is_some()
    })
    .await?
    .context("super ingress")?;
    assert_eq!(
        granted
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.as_deref()),
        Some("public")
    );
    // The editor's ungranted suffix is named on the VirtualCluster.
    until(&vcs(&tenancy), "attacker", "SpecLimited names the suffix", |vc| {
        condition(vc, "SpecLimited").is_some_and(|(status, message)| {
            status == "True" && message.contains("spec.ingressHostSuffixes[1] \"api.platform.example.com\"")
        })
    })
    .await?;
    settle().await;
    for (object, _) in &attacks {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        assert!(
            super_ingresses.get_opt(name).await?.is_none(),
            "{name} reached the super cluster"
        );
    }
    assert!(
        super_api::<Service>(&tenancy, tenant, "apps")
            .get_opt("internal-lb")
            .await?
            .is_none()
    );

    // A synced Ingress turned to another host keeps its copy as it was.
    Api::<Ingress>::namespaced(client.clone(), "apps")
        .patch(
            "granted",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rules": [rule(Some("login.platform.example.com"))]}})),
        )
        .await?;
    event(
        &client,
        "apps",
        "granted",
        "IngressRefused",
        "\"login.platform.example.com\"",
    )
    .await?;
    let kept = super_ingresses.get("granted").await?;
    let host = kept.spec.and_then(|s| s.rules).and_then(|r| r[0].host.clone());
    assert_eq!(host.as_deref(), Some("shop.attacker.shops.example.com"));
    Ok(())
}

/// Item 6, the attack: labels and annotations that the super cluster's own controllers act on, set on the
/// tenant's namespaces and objects: mesh injection (its sidecar would carry a super-cluster credential),
/// a second network and a chosen address from the CNI, an autoscaler and a log opt-out, a Secret
/// replicator copying the platform's Secret in, a cloud role for a ServiceAccount, and namespace labels
/// the platform's policies and webhooks select on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_labels_and_annotations_reach_the_super_cluster_only_through_the_allow_list()
-> anyhow::Result<()> {
    if !local_cluster::require(
        "tenant_labels_and_annotations_reach_the_super_cluster_only_through_the_allow_list",
        NEEDS,
    ) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({}), &[], false).await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(
        tenant,
        "apps",
        json!({"istio-injection": "enabled", "name": "monitoring", "team": "a",
            "kyverno.io/exclude": "true"}),
    )
    .await?;
    let mut web = pod("web-0");
    web["metadata"]["labels"] = json!({"app": "web", "strimzi.io/cluster": "main",
        "sidecar.istio.io/inject": "true", "app.kubernetes.io/name": "web"});
    web["metadata"]["annotations"] = json!({
        "k8s.v1.cni.cncf.io/networks": "platform/storage-net",
        "cni.projectcalico.org/ipAddrs": "[\"10.0.0.1\"]",
        "linkerd.io/inject": "enabled",
        "sidecar.istio.io/inject": "true",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
        "fluentbit.io/exclude": "true",
        "vault.hashicorp.com/agent-inject": "true",
        "note": "kept"
    });
    create::<Pod>(&client, Some("apps"), web).await?;
    create::<Secret>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "creds", "annotations": {
            "replicator.v1.mittwald.de/replicate-from": "kube-system/platform-registry",
            "reflector.v1.k8s.emberstack.com/reflects": "kube-system/platform-registry"}},
            "type": "Opaque", "data": {}}),
    )
    .await?;
    create::<ServiceAccount>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "deployer", "annotations": {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/platform-admin",
            "iam.gke.io/gcp-service-account": "platform@project.iam.gserviceaccount.com"}}}),
    )
    .await?;
    // The tenant's own selectors: an operator's prefixed pod label, a namespace label.
    create::<Service>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "kafka"}, "spec": {"selector": {"strimzi.io/cluster": "main"}, "ports": [{"port": 9092}]}}),
    )
    .await?;
    create::<NetworkPolicy>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "from-team"}, "spec": {"podSelector": {"matchLabels": {"strimzi.io/cluster": "main"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}]}}),
    )
    .await?;
    create::<PodDisruptionBudget>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "kafka"}, "spec": {"maxUnavailable": 1,
            "selector": {"matchLabels": {"strimzi.io/cluster": "main"}}}}),
    )
    .await?;

    let super_pods = super_api::<Pod>(&tenancy, tenant, "apps");
    let copy = until(&super_pods, "web-0", "super copy of web-0", |p| p.is_some())
        .await?
        .context("super pod")?;
    let pod_labels = labels(&copy);
    let pod_annotations = annotations(&copy);
    assert_eq!(pod_labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(
        pod_labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("web")
    );
    assert_eq!(pod_annotations.get("note").map(String::as_str), Some("kept"));
    assert!(
        !pod_labels.contains_key("sidecar.istio.io/inject"),
        "{pod_labels:?}"
    );
    assert!(!pod_labels.contains_key("strimzi.io/cluster"), "{pod_labels:?}");
    for key in [
        "k8s.v1.cni.cncf.io/networks",
        "cni.projectcalico.org/ipAddrs",
        "linkerd.io/inject",
        "sidecar.istio.io/inject",
        "cluster-autoscaler.kubernetes.io/safe-to-evict",
        "fluentbit.io/exclude",
        "vault.hashicorp.com/agent-inject",
    ] {
        assert!(!pod_annotations.contains_key(key), "{key} copied down");
    }
    let super_namespace = Api::<Namespace>::all(tenancy.super_client())
        .get(&tenant.super_namespace("apps"))
        .await?;
    let namespace_labels = labels(&super_namespace);
    for key in ["istio-injection", "name", "team", "kyverno.io/exclude"] {
        assert!(
            !namespace_labels.contains_key(key),
            "namespace label {key} copied as it is: {namespace_labels:?}"
        );
    }
    let secret = until(
        &super_api::<Secret>(&tenancy, tenant, "apps"),
        "creds",
        "super copy of creds",
        |s| s.is_some(),
    )
    .await?
    .context("super Secret")?;
    assert!(
        annotations(&secret)
            .keys()
            .all(|k| !k.starts_with("replicator.") && !k.starts_with("reflector.")),
        "{:?}",
        annotations(&secret)
    );
    let account = until(
        &super_api::<ServiceAccount>(&tenancy, tenant, "apps"),
        "deployer",
        "super copy of deployer",
        |s| s.is_some(),
    )
    .await?
    .context("super ServiceAccount")?;
    assert!(
        annotations(&account)
            .keys()
            .all(|k| !k.starts_with("eks.amazonaws.com/") && !k.starts_with("iam.gke.io/")),
        "{:?}",
        annotations(&account)
    );

    // The tenant's selectors still select what they did in its cluster.
    let selects = |selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>| {
        !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    let service = until(
        &super_api::<Service>(&tenancy, tenant, "apps"),
        "kafka",
        "super copy of Service kafka",
        |s| s.is_some(),
    )
    .await?
    .context("super Service")?;
    let selector = service.spec.and_then(|s| s.selector).unwrap_or_default();
    assert!(
        selects(&selector, &pod_labels),
        "{selector:?} against {pod_labels:?}"
    );
    let policy = until(
        &super_api::<NetworkPolicy>(&tenancy, tenant, "apps"),
        "from-team",
        "super copy of from-team",
        |p| p.is_some(),
    )
    .await?
    .context("super NetworkPolicy")?;
    let spec = policy.spec.context("spec")?;
    let pods = spec.pod_selector.and_then(|s| s.match_labels).unwrap_or_default();
    assert!(selects(&pods, &pod_labels), "{pods:?} against {pod_labels:?}");
    let from = spec.ingress.context("ingress")?[0].from.clone().context("from")?;
    let namespaces = from[0]
        .namespace_selector
        .clone()
        .and_then(|s| s.match_labels)
        .unwrap_or_default();
    assert!(
        selects(&namespaces, &namespace_labels),
        "{namespaces:?} against {namespace_labels:?}"
    );
    let budget = until(
        &super_api::<PodDisruptionBudget>(&tenancy, tenant, "apps"),
        "kafka",
        "super copy of budget kafka",
        |b| b.is_some(),
    )
    .await?
    .context("super budget")?;
    let budget_selector = budget
        .spec
        .and_then(|s| s.selector)
        .and_then(|s| s.match_labels)
        .unwrap_or_default();
    assert!(selects(&budget_selector, &pod_labels), "{budget_selector:?}");

    // Label changes and removals still reach the super pod, encoded ones too.
    Api::<Pod>::namespaced(client.clone(), "apps")
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": null, "strimzi.io/cluster": "other", "tier": "front"}}})),
        )
        .await?;
    let changed = until(&super_pods, "web-0", "label change reached web-0", |p| {
        p.is_some_and(|p| labels(p).get("tier").map(String::as_str) == Some("front"))
    })
    .await?
    .context("super pod")?;
    let changed = labels(&changed);
    assert!(!changed.contains_key("app"), "{changed:?}");
    assert!(
        !selects(&selector, &changed),
        "the Service still selects the relabelled pod"
    );
    assert!(changed.values().any(|v| v == "other"), "{changed:?}");
    Ok(())
}

/// Item 7, the attack of a VirtualCluster editor: forcing the platform's privileged RuntimeClass on every
/// pod of the tenant, then a published class whose scheduling tolerates the control plane's taint (the
/// super cluster's admission adds it to each pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forced_runtime_class_is_published_and_tolerates_only_what_pods_may() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_forced_runtime_class_is_published_and_tolerates_only_what_pods_may",
        NEEDS,
    ) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({"runtimeClassName": "platform-privileged"}), &[], false).await?;
    let super_client = tenancy.super_client();
    let public = json!({(wellknown::LABEL_SUPER_PUBLIC): "true"});
    create::<RuntimeClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "platform-privileged"}, "handler": "runc-privileged"}),
    )
    .await?;
    create::<RuntimeClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "control-plane", "labels": public}, "handler": "runc",
            "scheduling": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}}),
    )
    .await?;
    create::<RuntimeClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "sandboxed", "labels": public}, "handler": "runsc",
            "scheduling": {"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]}}),
    )
    .await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(tenant, "apps", json!({})).await?;
    let vcs = vcs(&tenancy);
    let super_pods = super_api::<Pod>(&tenancy, tenant, "apps");

    create::<Pod>(&client, Some("apps"), pod("first")).await?;
    event(
        &client,
        "apps",
        "first",
        "PodPolicyViolation",
        "spec.runtimeClassName \"platform-privileged\", which the platform neither publishes",
    )
    .await?;
    until(&vcs, "attacker", "SpecLimited names the forced class", |vc| {
        condition(vc, "SpecLimited").is_some_and(|(status, message)| {
            status == "True" && message.contains("spec.runtimeClassName \"platform-privileged\"")
        })
    })
    .await?;
    settle().await;
    assert!(
        super_pods.get_opt("first").await?.is_none(),
        "first reached the super cluster with the platform's privileged runtime"
    );

    let force = |class: &'static str| {
        let vcs = vcs.clone();
        async move {
            vcs.patch(
                "attacker",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"runtimeClassName": class}})),
            )
            .await
        }
    };
    force("control-plane").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    create::<Pod>(&client, Some("apps"), pod("second")).await?;
    event(
        &client,
        "apps",
        "second",
        "PodPolicyViolation",
        "toleration of taint node-role.kubernetes.io/control-plane of RuntimeClass \"control-plane\"",
    )
    .await?;
    settle().await;
    for name in ["first", "second"] {
        assert!(
            super_pods.get_opt(name).await?.is_none(),
            "{name} reached the super cluster tolerating the control plane"
        );
    }

    force("sandboxed").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    create::<Pod>(&client, Some("apps"), pod("third")).await?;
    let third = until(&super_pods, "third", "super copy of third", |p| p.is_some())
        .await?
        .context("super pod")?;
    assert_eq!(
        third.spec.and_then(|s| s.runtime_class_name).as_deref(),
        Some("sandboxed")
    );
    // The pods refused before wait in the tenant and are synced now, with the acceptable class.
    for name in ["first", "second"] {
        let copy = until(&super_pods, name, &format!("{name} synced at last"), |p| {
            p.is_some()
        })
        .await?
        .context("super pod")?;
        assert_eq!(
            copy.spec.and_then(|s| s.runtime_class_name).as_deref(),
            Some("sandboxed"),
            "{name}"
        );
    }
    Ok(())
}

/// Item 9, the attack of a VirtualCluster editor: the highest weight the schema allows (a hundred times
/// another tenant's share of the syncer's queues), a quota of a thousand pods, and a thousand writes a
/// second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_virtual_cluster_cannot_raise_its_share_past_the_platforms_ceilings() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_virtual_cluster_cannot_raise_its_share_past_the_platforms_ceilings",
        NEEDS,
    ) {
        return Ok(());
    }
    let (tenancy, syncer) = tenancy(
        json!({"weight": 100, "quota": {"pods": "1000"}, "rateLimit": {"qps": 1000, "burst": 5000}}),
        &["--max-weight=4", "--max-quota=pods=2", "--max-rate-limit=20/40"],
        false,
    )
    .await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    let limited = until(&vcs(&tenancy), "attacker", "SpecLimited=True", |vc| {
        condition(vc, "SpecLimited").is_some_and(|(status, _)| status == "True")
    })
    .await?;
    let (_, message) = condition(limited.as_ref(), "SpecLimited").context("condition")?;
    for says in [
        "spec.weight 100 is above the platform's maximum 4",
        "spec.quota[pods] 1000 is above the platform's maximum 2",
        "spec.rateLimit 1000 qps, burst 5000 is above the platform's maximum 20 qps, burst 40",
    ] {
        assert!(message.contains(says), "{says} not in {message}");
    }
    let settings = syncer
        .context
        .tenants
        .get(&tenant.cluster_key)
        .context("attached tenant")?
        .settings();
    assert_eq!(settings.weight, 4);
    assert_eq!(settings.rate_limit, Some((20, 40)));

    seed(tenant, "apps", json!({})).await?;
    for name in ["a", "b", "c"] {
        create::<Pod>(&client, Some("apps"), pod(name)).await?;
    }
    event(
        &client,
        "apps",
        "c",
        "TenantQuotaExceeded",
        "tenant quota pods exceeded: 2 in use, 1 asked for, limit 2",
    )
    .await?;
    let super_pods = super_api::<Pod>(&tenancy, tenant, "apps");
    settle().await;
    let synced = super_pods.list(&Default::default()).await?.items.len();
    assert_eq!(synced, 2, "pods in the super cluster");
    Ok(())
}

/// Item 10, the attack: another tenant's private image, which a node has cached, run without that
/// tenant's pull secret: `IfNotPresent` and `Never` run what the node has.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_cannot_run_another_tenants_image_from_the_node_cache() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_tenant_cannot_run_another_tenants_image_from_the_node_cache",
        NEEDS,
    ) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({}), &[], false).await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(tenant, "apps", json!({})).await?;
    let private = "registry.example.com/tenant-b/billing:1.0";
    create::<Pod>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "borrow"}, "spec": {
        "initContainers": [{"name": "init", "image": private, "imagePullPolicy": "Never"}],
        "containers": [
            {"name": "main", "image": private, "imagePullPolicy": "IfNotPresent"},
            {"name": "side", "image": private}
        ]}}),
    )
    .await?;
    let copy = until(
        &super_api::<Pod>(&tenancy, tenant, "apps"),
        "borrow",
        "super copy of borrow",
        |p| p.is_some(),
    )
    .await?
    .context("super pod")?;
    let spec = copy.spec.context("spec")?;
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        assert_eq!(
            container.image_pull_policy.as_deref(),
            Some("Always"),
            "container {}",
            container.name
        );
    }
    Ok(())
}

/// Item 11, the attack: raw sockets on a shared node (forged packets, ARP and ICMP tricks), which container
/// runtimes give every container unless it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_containers_cannot_forge_packets() -> anyhow::Result<()> {
    if !local_cluster::require("tenant_containers_cannot_forge_packets", NEEDS) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({}), &[], false).await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(tenant, "apps", json!({})).await?;
    create::<Pod>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "ping"}, "spec": {
        "initContainers": [{"name": "init", "image": "busybox"}],
        "containers": [
            {"name": "main", "image": "busybox"},
            {"name": "dropped", "image": "busybox", "securityContext": {"capabilities": {"drop": ["CHOWN"]}}}
        ]}}),
    )
    .await?;
    let mut adds = pod("adds");
    adds["spec"]["containers"][0]["securityContext"] = json!({"capabilities": {"add": ["NET_RAW"]}});
    create::<Pod>(&client, Some("apps"), adds).await?;
    event(
        &client,
        "apps",
        "adds",
        "PodPolicyViolation",
        "capability NET_RAW of container \"main\"",
    )
    .await?;
    let super_pods = super_api::<Pod>(&tenancy, tenant, "apps");
    let copy = until(&super_pods, "ping", "super copy of ping", |p| p.is_some())
        .await?
        .context("super pod")?;
    let spec = copy.spec.context("spec")?;
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let dropped = container
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.drop.clone())
            .unwrap_or_default();
        assert!(
            dropped.iter().any(|d| d == "NET_RAW"),
            "container {} keeps NET_RAW: {dropped:?}",
            container.name
        );
    }
    settle().await;
    assert!(super_pods.get_opt("adds").await?.is_none());
    Ok(())
}
