//! The syncer against a real super cluster and real tenant masters (kube-apiserver + controller-manager
//! each), with simulated nodes.

use crate::object_support::{create, syncer_series, until};
use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, bail};
use crds::{VirtualCluster, wellknown};
use k8s_openapi::api::{
    apps::v1::Deployment,
    authentication::v1::{TokenReview, TokenReviewSpec},
    core::v1::{
        ConfigMap, Endpoints, Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
        Service, ServiceAccount,
    },
    networking::v1::{Ingress, IngressClass},
    scheduling::v1::PriorityClass,
    storage::v1::StorageClass,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions, TenantMaster},
    wait,
};
use serde_json::json;
use syncer::{Metrics, Syncer, SyncerConfig};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(60);

pub(crate) fn config() -> SyncerConfig {
    SyncerConfig {
        patrol_interval: Duration::from_secs(3),
        vnode_grace: Duration::from_secs(3),
        tenant_health_period: Duration::from_secs(2),
        downward_workers: 8,
        upward_workers: 8,
        token_ttl_seconds: 600,
        sync_ingresses: true,
        // The external database the tenants' selector-less `database` Service leads to.
        tenant_allowed_cidrs: vec!["10.20.30.0/24".parse().expect("CIDR")],
        limits: syncer::tenancy::settings::PlatformLimits {
            // Each tenant's Ingress hosts, under a suffix naming it.
            ingress_host_suffix: Some(INGRESS_HOST_SUFFIX.to_owned()),
            ..Default::default()
        },
        ..SyncerConfig::for_tests()
    }
}

/// The platform's `--ingress-host-suffix` in these tests.
const INGRESS_HOST_SUFFIX: &str = "{key}.apps.example.com";

pub(crate) async fn start_syncer(tenancy: &Tenancy, config: SyncerConfig) -> anyhow::Result<Syncer> {
    // Shown with --nocapture; RUST_LOG=syncer=debug for detail.
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    Ok(Syncer::start(
        tenancy.super_client(),
        config,
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?)
}

pub(crate) async fn tenant_synced(
    tenancy: &Tenancy,
    name: &str,
    status: &str,
) -> anyhow::Result<VirtualCluster> {
    let api: Api<VirtualCluster> =
        Api::namespaced(tenancy.super_client(), local_cluster::tenancy::VC_NAMESPACE);
    let vc = until(&api, name, &format!("{name} TenantSynced={status}"), |vc| {
        vc.and_then(|vc| vc.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == wellknown::CONDITION_TENANT_SYNCED && c.status == status)
        })
    })
    .await?;
    vc.context("VirtualCluster")
}

fn annotation<'a, K: Resource>(object: &'a K, key: &str) -> Option<&'a str> {
    object.meta().annotations.as_ref()?.get(key).map(String::as_str)
}

fn super_api<K>(tenancy: &Tenancy, tenant: &TenantMaster, namespace: &str) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    Api::namespaced(tenancy.super_client(), &tenant.super_namespace(namespace))
}

/// Objects every test tenant gets: a namespace and a kube-dns Service, as a tenant running CoreDNS has.
pub(crate) async fn seed(tenant: &TenantMaster, namespace: &str) -> anyhow::Result<()> {
    let client = tenant.client();
    create::<Namespace>(&client, None, json!({"metadata": {"name": namespace}})).await?;
    if Api::<Service>::namespaced(client.clone(), "kube-system")
        .get_opt("kube-dns")
        .await?
        .is_none()
    {
        create::<Service>(
            &client,
            Some("kube-system"),
            json!({"metadata": {"name": "kube-dns"}, "spec": {"selector": {"k8s-app": "kube-dns"}, "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}),
        )
        .await?;
    }
    // The controller-manager creates the default ServiceAccount pods need.
    let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
    until(&accounts, "default", "default ServiceAccount", |sa| sa.is_some()).await?;
    Ok(())
}

/// The node port of a Service's first port.
fn node_port(service: &Service) -> Option<i32> {
    service.spec.as_ref()?.ports.as_ref()?.first()?.node_port
}

/// Waits until a tenant Service shows the node port its super copy has (the one open on the nodes), and
/// returns it.
async fn node_port_copied_up(
    tenancy: &Tenancy,
    tenant: &TenantMaster,
    namespace: &str,
    name: &str,
) -> anyhow::Result<i32> {
    let supers = super_api::<Service>(tenancy, tenant, namespace);
    let tenants = Api::<Service>::namespaced(tenant.client(), namespace);
    wait::until(
        PATIENCE,
        &format!("{}: node port of {namespace}/{name} copied up", tenant.name),
        || {
            let (supers, tenants, name) = (supers.clone(), tenants.clone(), name.to_owned());
            async move {
                let allocated = node_port(&supers.get_opt(&name).await.ok()??)?;
                (node_port(&tenants.get_opt(&name).await.ok()??)? == allocated).then_some(allocated)
            }
        },
    )
    .await
    .map_err(Into::into)
}

pub(crate) fn pod_json(name: &str, labels: serde_json::Value, image: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{
            "name": "main", "image": image,
            "env": [{"name": "MY_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
        }]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_kind_syncs_down_and_up_without_collisions() -> anyhow::Result<()> {
    if !local_cluster::require("every_kind_syncs_down_and_up_without_collisions", NEEDS) {
        return Ok(());
    }
    let tenancy = Tenancy::start(TenancyOptions::default()).await?;
    let _syncer = start_syncer(&tenancy, config()).await?;
    for name in tenancy.names() {
        tenant_synced(&tenancy, &name, "True").await?;
    }
    let (a, b) = (tenancy.tenant("tenant-0"), tenancy.tenant("tenant-1"));
    assert_ne!(a.super_namespace("shop"), b.super_namespace("shop"));

    // Public storage and priority classes appear in every tenant; claims may use only those.
    create::<StorageClass>(&tenancy.super_client(), None, json!({"metadata": {"name": "fast", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}}, "provisioner": "example.com/fast"})).await?;

    // The same namespace and object names in both tenants.
    for tenant in [a, b] {
        seed(tenant, "shop").await?;
        let client = tenant.client();
        create::<ConfigMap>(
            &client,
            Some("shop"),
            json!({"metadata": {"name": "settings"}, "data": {"owner": tenant.name}}),
        )
        .await?;
        create::<Secret>(
            &client,
            Some("shop"),
            json!({"metadata": {"name": "creds"}, "stringData": {"password": tenant.name}}),
        )
        .await?;
        create::<ServiceAccount>(&client, Some("shop"), json!({"metadata": {"name": "robot"}})).await?;
        create::<Service>(&client, Some("shop"), json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})).await?;
        create::<Service>(
            &client,
            Some("shop"),
            json!({"metadata": {"name": "database"}, "spec": {"ports": [{"port": 5432}]}}),
        )
        .await?;
        create::<Endpoints>(&client, Some("shop"), json!({"metadata": {"name": "database"}, "subsets": [{"addresses": [{"ip": "10.20.30.40"}], "ports": [{"port": 5432}]}]})).await?;
        create::<PersistentVolumeClaim>(&client, Some("shop"), json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}}})).await?;
        create::<Pod>(
            &client,
            Some("shop"),
            pod_json("web-1", json!({"app": "web"}), "nginx:1"),
        )
        .await?;
    }

    for tenant in [a, b] {
        // Down: every kind, with identity metadata, in the tenant's own super namespace.
        let config_maps = super_api::<ConfigMap>(&tenancy, tenant, "shop");
        let cm = until(&config_maps, "settings", "super ConfigMap", |c| c.is_some())
            .await?
            .context("cm")?;
        assert_eq!(cm.data.as_ref().and_then(|d| d.get("owner")), Some(&tenant.name));
        assert_eq!(
            annotation(&cm, wellknown::ANNOTATION_CLUSTER),
            Some(tenant.cluster_key.as_str())
        );
        assert_eq!(annotation(&cm, wellknown::ANNOTATION_NAMESPACE), Some("shop"));
        assert_eq!(cm.labels().get(wellknown::LABEL_VC_NAME), Some(&tenant.name));
        let tenant_cm = Api::<ConfigMap>::namespaced(tenant.client(), "shop")
            .get("settings")
            .await?;
        assert_eq!(
            annotation(&cm, wellknown::ANNOTATION_UID),
            tenant_cm.uid().as_deref()
        );

        let secret = until(
            &super_api::<Secret>(&tenancy, tenant, "shop"),
            "creds",
            "super Secret",
            |s| s.is_some(),
        )
        .await?
        .context("secret")?;
        assert_eq!(
            secret
                .data
                .as_ref()
                .and_then(|d| d.get("password"))
                .map(|b| b.0.clone()),
            Some(tenant.name.as_bytes().to_vec())
        );
        let sa = until(
            &super_api::<ServiceAccount>(&tenancy, tenant, "shop"),
            "robot",
            "super ServiceAccount",
            |s| s.is_some(),
        )
        .await?
        .context("sa")?;
        assert_eq!(sa.automount_service_account_token, Some(false));
        let services = super_api::<Service>(&tenancy, tenant, "shop");
        let svc = until(&services, "web", "super Service", |s| s.is_some())
            .await?
            .context("svc")?;
        let tenant_svc = Api::<Service>::namespaced(tenant.client(), "shop")
            .get("web")
            .await?;
        let tenant_ip = tenant_svc.spec.as_ref().and_then(|s| s.cluster_ip.clone());
        assert_eq!(
            annotation(&svc, wellknown::ANNOTATION_TENANT_CLUSTER_IP).map(str::to_owned),
            tenant_ip
        );
        let super_ip = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.clone())
            .context("super cluster IP")?;
        assert_eq!(
            svc.spec.as_ref().and_then(|s| s.ports.clone()).map(|p| p[0].port),
            Some(80)
        );
        let endpoints = until(
            &super_api::<Endpoints>(&tenancy, tenant, "shop"),
            "database",
            "super Endpoints",
            |e| e.is_some(),
        )
        .await?
        .context("ep")?;
        assert_eq!(
            endpoints
                .subsets
                .as_ref()
                .and_then(|s| s[0].addresses.clone())
                .map(|a| a[0].ip.clone()),
            Some("10.20.30.40".into())
        );
        until(
            &super_api::<PersistentVolumeClaim>(&tenancy, tenant, "shop"),
            "data",
            "super PVC",
            |c| c.is_some(),
        )
        .await?;

        // Up: the super cluster IP on the tenant Service.
        let tenant_services = Api::<Service>::namespaced(tenant.client(), "shop");
        until(&tenant_services, "web", "super IP annotation", |s| {
            s.and_then(|s| annotation(s, wellknown::ANNOTATION_SUPER_CLUSTER_IP)) == Some(super_ip.as_str())
        })
        .await?;

        // Pods: rewritten for the super cluster, then Running in the tenant on a vNode.
        let super_pods = super_api::<Pod>(&tenancy, tenant, "shop");
        let pod = until(&super_pods, "web-1", "super pod", |p| p.is_some())
            .await?
            .context("pod")?;
        assert_eq!(
            pod.labels().get(wellknown::LABEL_CLUSTER),
            Some(&tenant.cluster_key)
        );
        let spec = pod.spec.clone().context("spec")?;
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.dns_policy.as_deref(), Some("None"));
        let dns_ip =
            Api::<Service>::namespaced(tenancy.super_client(), &tenant.super_namespace("kube-system"))
                .get("kube-dns")
                .await?
                .spec
                .and_then(|s| s.cluster_ip);
        assert_eq!(
            spec.dns_config
                .as_ref()
                .and_then(|d| d.nameservers.clone())
                .map(|n| n[0].clone()),
            dns_ip
        );
        let env = spec.containers[0].env.clone().unwrap_or_default();
        let apiserver_ip =
            Api::<Service>::namespaced(tenancy.super_client(), &tenant.super_namespace("default"))
                .get("kubernetes")
                .await?
                .spec
                .and_then(|s| s.cluster_ip);
        // In-cluster clients connect by a name in the tenant apiserver's certificate, which a host alias
        // maps to the super cluster IP of the tenant's `kubernetes` Service.
        assert_eq!(
            env.iter()
                .find(|e| e.name == "KUBERNETES_SERVICE_HOST")
                .and_then(|e| e.value.clone())
                .as_deref(),
            Some("kubernetes.default.svc")
        );
        assert!(spec.host_aliases.iter().flatten().any(|alias| {
            Some(&alias.ip) == apiserver_ip.as_ref()
                && alias
                    .hostnames
                    .iter()
                    .flatten()
                    .any(|h| h == "kubernetes.default.svc")
        }));
        assert_eq!(
            env.iter()
                .find(|e| e.name == "MY_NAMESPACE")
                .and_then(|e| e.value.clone())
                .as_deref(),
            Some("shop")
        );

        let tenant_pods = Api::<Pod>::namespaced(tenant.client(), "shop");
        let running = until(&tenant_pods, "web-1", "tenant pod Running", |p| {
            p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await?
        .context("tenant pod")?;
        let node = running
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .context("bound")?;
        assert!(tenancy.nodes.names().contains(&node));
        assert!(running.status.as_ref().and_then(|s| s.pod_ip.clone()).is_some());
        let vnode = Api::<Node>::all(tenant.client()).get(&node).await?;
        assert_eq!(
            vnode
                .labels()
                .get(wellknown::LABEL_VIRTUAL_NODE)
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(vnode.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        let status = vnode.status.context("vNode status")?;
        assert_eq!(
            status
                .daemon_endpoints
                .and_then(|d| d.kubelet_endpoint)
                .map(|e| e.port),
            Some(10550)
        );
        assert_eq!(
            status.capacity.as_ref().map(|c| c["cpu"].0.clone()).as_deref(),
            Some("64")
        );

        // The pod's token is a tenant token bound to the tenant pod, in the shared token Secret its super
        // pod names, under the pod's own keys.
        let super_pod = super_api::<Pod>(&tenancy, tenant, "shop").get("web-1").await?;
        let shard = super_pod
            .annotations()
            .get("tenancy.x-k8s.io/token-secret")
            .context("the super pod names its token Secret")?
            .clone();
        assert!(shard.ends_with(".vc-tokens"), "{shard}");
        let token_secret = super_api::<Secret>(&tenancy, tenant, "shop").get(&shard).await?;
        let data = token_secret.data.clone().context("token data")?;
        let token_key = data
            .keys()
            .find(|k| k.starts_with("web-1.token"))
            .context("a token")?
            .clone();
        let token = String::from_utf8(data[&token_key].0.clone())?;
        assert_eq!(data.get("namespace").map(|b| b.0.clone()), Some(b"shop".to_vec()));
        let review = Api::<TokenReview>::all(tenant.client())
            .create(
                &PostParams::default(),
                &TokenReview {
                    spec: TokenReviewSpec {
                        token: Some(token),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await?;
        let review = review.status.context("review status")?;
        assert_eq!(review.authenticated, Some(true), "{review:?}");
        let user = review.user.context("the reviewed user")?;
        assert_eq!(
            user.username.as_deref(),
            Some("system:serviceaccount:shop:default")
        );
        // Minted once the tenant pod was bound: since 1.30 the apiserver names the pod's node in it (the
        // vNode, which the tenant sees), as in a kubelet's token.
        let version = tenant.client().apiserver_version().await?;
        if version.minor.trim_end_matches('+').parse::<u32>().unwrap_or(0) >= 30 {
            let extra = user.extra.unwrap_or_default();
            assert_eq!(
                extra.get("authentication.kubernetes.io/node-name"),
                Some(&vec![node.clone()]),
                "{extra:?}"
            );
            assert_eq!(
                extra.get("authentication.kubernetes.io/node-uid"),
                Some(&vec![vnode.metadata.uid.clone().unwrap_or_default()]),
                "{extra:?}"
            );
        }
        // A shared Secret belongs to no pod: it records its members (the tenant pod's uid, which the tokens
        // are bound to), and the patrol removes the keys of gone pods.
        assert!(token_secret.owner_references().is_empty());
        let members = syncer::tokens::records::members_of(&token_secret.metadata);
        assert_eq!(
            members.get("web-1").map(|m| &*m.uid),
            annotation(&super_pod, wellknown::ANNOTATION_UID),
            "{members:?}"
        );
    }

    // Tenants never see each other: the pods in the two super namespaces are each tenant's own.
    let a_pod = super_api::<Pod>(&tenancy, a, "shop").get("web-1").await?;
    let b_pod = super_api::<Pod>(&tenancy, b, "shop").get("web-1").await?;
    assert_ne!(
        annotation(&a_pod, wellknown::ANNOTATION_UID),
        annotation(&b_pod, wellknown::ANNOTATION_UID)
    );

    // Updates flow down: data, labels, images.
    let patch = PatchParams::default();
    Api::<ConfigMap>::namespaced(a.client(), "shop")
        .patch(
            "settings",
            &patch,
            &Patch::Merge(json!({"data": {"owner": "changed"}})),
        )
        .await?;
    until(
        &super_api::<ConfigMap>(&tenancy, a, "shop"),
        "settings",
        "updated ConfigMap",
        |c| {
            c.and_then(|c| c.data.as_ref())
                .and_then(|d| d.get("owner"))
                .map(String::as_str)
                == Some("changed")
        },
    )
    .await?;
    Api::<Pod>::namespaced(a.client(), "shop")
        .patch("web-1", &patch, &Patch::Strategic(json!({"metadata": {"labels": {"tier": "front"}}, "spec": {"containers": [{"name": "main", "image": "nginx:2"}]}})))
        .await?;
    until(
        &super_api::<Pod>(&tenancy, a, "shop"),
        "web-1",
        "updated pod",
        |p| {
            p.is_some_and(|p| {
                p.labels().get("tier").map(String::as_str) == Some("front")
                    && p.spec.as_ref().map(|s| s.containers[0].image.clone()) == Some(Some("nginx:2".into()))
            })
        },
    )
    .await?;
    // ...and tenant b is untouched.
    let b_cm = super_api::<ConfigMap>(&tenancy, b, "shop")
        .get("settings")
        .await?;
    assert_eq!(b_cm.data.as_ref().and_then(|d| d.get("owner")), Some(&b.name));

    // NodePort Services: the node port a tenant sees is the one open on the nodes. A port the tenant asks
    // for is asked of the super cluster; taken there (here by the other tenant), the super cluster picks
    // another and the tenant Service shows that one. A port the tenant apiserver picked works the same way.
    let public = |tenant: &TenantMaster| {
        json!({"metadata": {"name": "public", "labels": {"owner": tenant.name}}, "spec": {"type": "NodePort", "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30555}]}})
    };
    create::<Service>(&a.client(), Some("shop"), public(a)).await?;
    assert_eq!(node_port_copied_up(&tenancy, a, "shop", "public").await?, 30555);
    create::<Service>(&b.client(), Some("shop"), public(b)).await?;
    let b_port = node_port_copied_up(&tenancy, b, "shop", "public").await?;
    assert_ne!(b_port, 30555);
    let b_events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(b.client(), "shop");
    wait::until_true(PATIENCE, "NodePortUnavailable event", || {
        let events = b_events.clone();
        async move {
            events.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items.iter().any(|e| {
                    e.reason.as_deref() == Some("NodePortUnavailable")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("public")
                })
            })
        }
    })
    .await?;
    create::<Service>(&a.client(), Some("shop"), json!({"metadata": {"name": "picked"}, "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 81}]}})).await?;
    let picked = node_port_copied_up(&tenancy, a, "shop", "picked").await?;
    // Changes of the tenant Service go down without its node port, and nobody fights over it: after a few
    // patrols the values are still the same on both sides.
    Api::<Service>::namespaced(b.client(), "shop")
        .patch(
            "public",
            &patch,
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "edge"}}})),
        )
        .await?;
    until(
        &super_api::<Service>(&tenancy, b, "shop"),
        "public",
        "Service label down",
        |s| s.is_some_and(|s| s.labels().get("tier").map(String::as_str) == Some("edge")),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(7)).await;
    for (tenant, name, port) in [(a, "public", 30555), (b, "public", b_port), (a, "picked", picked)] {
        let copy = super_api::<Service>(&tenancy, tenant, "shop").get(name).await?;
        let own = Api::<Service>::namespaced(tenant.client(), "shop")
            .get(name)
            .await?;
        assert_eq!(
            (node_port(&copy), node_port(&own)),
            (Some(port), Some(port)),
            "{}: {name}",
            tenant.name
        );
        assert_eq!(own.labels().get("owner"), copy.labels().get("owner"));
    }

    // A 63-character namespace round-trips through its shortened super name.
    let long = "n".repeat(63);
    seed(a, &long).await?;
    create::<Pod>(&a.client(), Some(&long), pod_json("deep", json!({}), "busybox")).await?;
    let super_long = a.super_namespace(&long);
    assert_eq!(super_long.len(), 63);
    let long_ns = until(
        &Api::<Namespace>::all(tenancy.super_client()),
        &super_long,
        "shortened namespace",
        |n| n.is_some(),
    )
    .await?
    .context("ns")?;
    assert_eq!(
        annotation(&long_ns, wellknown::ANNOTATION_NAMESPACE),
        Some(long.as_str())
    );
    until(
        &Api::<Pod>::namespaced(a.client(), &long),
        "deep",
        "pod in long namespace Running",
        |p| p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Running"),
    )
    .await?;

    // Events about synced pods reach the tenant, with its own names.
    let event = Event {
        metadata: kube::api::ObjectMeta {
            name: Some("web-1.pulled".into()),
            ..Default::default()
        },
        involved_object: k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some("web-1".into()),
            namespace: Some(a.super_namespace("shop")),
            uid: a_pod.uid(),
            ..Default::default()
        },
        reason: Some("Pulled".into()),
        message: Some(format!("image pulled for {}/web-1", a.super_namespace("shop"))),
        type_: Some("Normal".into()),
        ..Default::default()
    };
    Api::<Event>::namespaced(tenancy.super_client(), &a.super_namespace("shop"))
        .create(&PostParams::default(), &event)
        .await?;
    let tenant_events = Api::<Event>::namespaced(a.client(), "shop");
    let copied = until(&tenant_events, "web-1.pulled", "event copied up", |e| e.is_some())
        .await?
        .context("event")?;
    assert_eq!(copied.message.as_deref(), Some("image pulled for shop/web-1"));
    let tenant_pod_uid = Api::<Pod>::namespaced(a.client(), "shop")
        .get("web-1")
        .await?
        .uid();
    assert_eq!(copied.involved_object.uid, tenant_pod_uid);

    // So do events about the other synced kinds: a provisioner's about a claim.
    let super_data = super_api::<PersistentVolumeClaim>(&tenancy, a, "shop")
        .get("data")
        .await?;
    let provisioning = Event {
        metadata: kube::api::ObjectMeta {
            name: Some("data.provisioning".into()),
            ..Default::default()
        },
        involved_object: k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: Some("data".into()),
            namespace: Some(a.super_namespace("shop")),
            uid: super_data.uid(),
            ..Default::default()
        },
        reason: Some("Provisioning".into()),
        message: Some(format!(
            "provisioning a volume for claim \"{}/data\"",
            a.super_namespace("shop")
        )),
        type_: Some("Normal".into()),
        ..Default::default()
    };
    Api::<Event>::namespaced(tenancy.super_client(), &a.super_namespace("shop"))
        .create(&PostParams::default(), &provisioning)
        .await?;
    let copied = until(
        &tenant_events,
        "data.provisioning",
        "claim event copied up",
        |e| e.is_some(),
    )
    .await?
    .context("claim event")?;
    assert_eq!(
        copied.message.as_deref(),
        Some("provisioning a volume for claim \"shop/data\"")
    );
    let tenant_claim_uid = Api::<PersistentVolumeClaim>::namespaced(a.client(), "shop")
        .get("data")
        .await?
        .uid();
    assert_eq!(copied.involved_object.uid, tenant_claim_uid);

    // Public IngressClasses appear in tenants, the platform's default marked default there too.
    create::<IngressClass>(
        &tenancy.super_client(),
        None,
        json!({"metadata": {"name": "shared-nginx", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"},
            "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
            "spec": {"controller": "k8s.io/ingress-nginx"}}),
    )
    .await?;
    create::<IngressClass>(
        &tenancy.super_client(),
        None,
        json!({"metadata": {"name": "internal"}, "spec": {"controller": "example.com/internal"}}),
    )
    .await?;
    let classes = Api::<IngressClass>::all(a.client());
    let copied_class = until(
        &classes,
        "shared-nginx",
        "public IngressClass in the tenant",
        |c| c.is_some(),
    )
    .await?
    .context("class")?;
    assert_eq!(
        copied_class
            .annotations()
            .get("ingressclass.kubernetes.io/is-default-class")
            .map(String::as_str),
        Some("true")
    );
    assert!(
        classes.get_opt("internal").await?.is_none(),
        "an unpublished IngressClass reached a tenant"
    );

    // An ingress goes down; the super ingress controller's address and events come back up.
    create::<Ingress>(
        &a.client(),
        Some("shop"),
        json!({"metadata": {"name": "site"}, "spec": {"rules": [{
            "host": format!("site.{}", INGRESS_HOST_SUFFIX.replace("{key}", &a.cluster_key)),
            "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}),
    )
    .await?;
    let super_ingresses = super_api::<Ingress>(&tenancy, a, "shop");
    let super_site = until(&super_ingresses, "site", "super ingress", |i| i.is_some())
        .await?
        .context("super ingress")?;
    super_ingresses
        .patch_status(
            "site",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}})),
        )
        .await?;
    let tenant_ingresses = Api::<Ingress>::namespaced(a.client(), "shop");
    until(
        &tenant_ingresses,
        "site",
        "tenant ingress with the super address",
        |i| {
            i.and_then(|i| {
                i.status
                    .as_ref()?
                    .load_balancer
                    .as_ref()?
                    .ingress
                    .as_ref()?
                    .first()?
                    .ip
                    .clone()
            })
            .as_deref()
                == Some("192.0.2.7")
        },
    )
    .await?;
    let synced_event = Event {
        metadata: kube::api::ObjectMeta {
            name: Some("site.sync".into()),
            ..Default::default()
        },
        involved_object: k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("networking.k8s.io/v1".into()),
            kind: Some("Ingress".into()),
            name: Some("site".into()),
            namespace: Some(a.super_namespace("shop")),
            uid: super_site.uid(),
            ..Default::default()
        },
        reason: Some("Sync".into()),
        message: Some("Scheduled for sync".into()),
        type_: Some("Normal".into()),
        ..Default::default()
    };
    Api::<Event>::namespaced(tenancy.super_client(), &a.super_namespace("shop"))
        .create(&PostParams::default(), &synced_event)
        .await?;
    until(&tenant_events, "site.sync", "ingress event copied up", |e| {
        e.is_some()
    })
    .await?;

    create::<PriorityClass>(&tenancy.super_client(), None, json!({"metadata": {"name": "important", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}}, "value": 1000})).await?;
    for tenant in [a, b] {
        until(
            &Api::<StorageClass>::all(tenant.client()),
            "fast",
            "public StorageClass",
            |s| s.is_some(),
        )
        .await?;
        until(
            &Api::<PriorityClass>::all(tenant.client()),
            "important",
            "public PriorityClass",
            |p| p.is_some(),
        )
        .await?;
    }

    // A super PV bound to the tenant's claim: the claim is Bound in the tenant, with a PV of its own.
    let super_claim = super_api::<PersistentVolumeClaim>(&tenancy, a, "shop")
        .get("data")
        .await?;
    create::<PersistentVolume>(
        &tenancy.super_client(),
        None,
        json!({"metadata": {"name": "pv-a"}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "hostPath": {"path": "/tmp/pv-a"},
            "claimRef": {"namespace": a.super_namespace("shop"), "name": "data", "uid": super_claim.uid()}
        }}),
    )
    .await?;
    let tenant_claims = Api::<PersistentVolumeClaim>::namespaced(a.client(), "shop");
    until(&tenant_claims, "data", "tenant claim Bound", |c| {
        c.and_then(|c| c.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Bound")
    })
    .await?;
    let tenant_pv = until(
        &Api::<PersistentVolume>::all(a.client()),
        "pv-a",
        "tenant PV",
        |p| p.is_some(),
    )
    .await?
    .context("pv")?;
    let claim_ref = tenant_pv.spec.and_then(|s| s.claim_ref).context("claimRef")?;
    assert_eq!(
        (claim_ref.namespace.as_deref(), claim_ref.name.as_deref()),
        (Some("shop"), Some("data"))
    );
    assert!(
        Api::<PersistentVolume>::all(b.client())
            .get_opt("pv-a")
            .await?
            .is_none(),
        "the other tenant must not see the PV"
    );

    // Deletes flow down, and a deleted pod's deletion completes in the tenant.
    Api::<ConfigMap>::namespaced(a.client(), "shop")
        .delete("settings", &DeleteParams::default())
        .await?;
    until(
        &super_api::<ConfigMap>(&tenancy, a, "shop"),
        "settings",
        "super ConfigMap deleted",
        |c| c.is_none(),
    )
    .await?;
    Api::<Pod>::namespaced(a.client(), "shop")
        .delete("web-1", &DeleteParams::default())
        .await?;
    until(
        &super_api::<Pod>(&tenancy, a, "shop"),
        "web-1",
        "super pod deleted",
        |p| p.is_none(),
    )
    .await?;
    until(
        &Api::<Pod>::namespaced(a.client(), "shop"),
        "web-1",
        "tenant pod gone",
        |p| p.is_none(),
    )
    .await?;
    // The patrol removes the gone pod's keys: its shard, which served no other pod, goes.
    until(
        &super_api::<Secret>(&tenancy, a, "shop"),
        "shard-0.vc-tokens",
        "token Secret collected",
        |s| s.is_none(),
    )
    .await?;
    // b still has its pod.
    assert!(
        super_api::<Pod>(&tenancy, b, "shop")
            .get_opt("web-1")
            .await?
            .is_some()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drift_is_repaired_and_lost_pods_are_replaced() -> anyhow::Result<()> {
    if !local_cluster::require("drift_is_repaired_and_lost_pods_are_replaced", NEEDS) {
        return Ok(());
    }
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        ..Default::default()
    })
    .await?;
    let _syncer = start_syncer(&tenancy, config()).await?;
    tenant_synced(&tenancy, "tenant-0", "True").await?;
    let tenant = tenancy.tenant("tenant-0");
    seed(tenant, "app").await?;
    let client = tenant.client();
    create::<ConfigMap>(
        &client,
        Some("app"),
        json!({"metadata": {"name": "config"}, "data": {"k": "v"}}),
    )
    .await?;
    let config_maps = super_api::<ConfigMap>(&tenancy, tenant, "app");
    until(&config_maps, "config", "super ConfigMap", |c| c.is_some()).await?;

    // Edited behind the syncer's back: restored.
    config_maps
        .patch(
            "config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "tampered"}})),
        )
        .await?;
    until(&config_maps, "config", "ConfigMap restored", |c| {
        c.and_then(|c| c.data.as_ref())
            .and_then(|d| d.get("k"))
            .map(String::as_str)
            == Some("v")
    })
    .await?;
    // Deleted behind its back: recreated.
    config_maps.delete("config", &DeleteParams::default()).await?;
    until(&config_maps, "config", "ConfigMap recreated", |c| c.is_some()).await?;
    // An object claiming to be the tenant's without a tenant counterpart: removed.
    let orphan: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "orphan",
            "labels": {(wellknown::LABEL_VC_NAME): "tenant-0", (wellknown::LABEL_VC_NAMESPACE): "default"},
            "annotations": {(wellknown::ANNOTATION_CLUSTER): tenant.cluster_key, (wellknown::ANNOTATION_NAMESPACE): "app", (wellknown::ANNOTATION_UID): "gone"}
        }
    }))?;
    config_maps.create(&PostParams::default(), &orphan).await?;
    until(&config_maps, "orphan", "orphan removed", |c| c.is_none()).await?;

    // A scheduled pod whose super pod disappears is replaced by its controller.
    create::<Deployment>(
        &client,
        Some("app"),
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}),
    )
    .await?;
    let tenant_pods = Api::<Pod>::namespaced(client.clone(), "app");
    let first = wait::until(PATIENCE, "deployment pod Running", || {
        let api = tenant_pods.clone();
        async move {
            let pods = api.list(&ListParams::default().labels("app=web")).await.ok()?;
            pods.items
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        }
    })
    .await?;
    super_api::<Pod>(&tenancy, tenant, "app")
        .delete(&first.name_any(), &DeleteParams::default().grace_period(0))
        .await?;
    let replacement = wait::until(PATIENCE, "replacement pod Running", || {
        let api = tenant_pods.clone();
        let old = first.name_any();
        async move {
            let pods = api.list(&ListParams::default().labels("app=web")).await.ok()?;
            if pods.items.iter().any(|p| p.name_any() == old) {
                return None;
            }
            pods.items
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        }
    })
    .await?;
    assert_ne!(replacement.name_any(), first.name_any());

    // The vNode goes once the tenant has no pod left on it (grace 3 s in this test).
    let node = replacement
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("bound")?;
    Api::<Deployment>::namespaced(client.clone(), "app")
        .delete("web", &DeleteParams::default())
        .await?;
    until(&Api::<Node>::all(client.clone()), &node, "vNode removed", |n| {
        n.is_none()
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_policies_are_enforced() -> anyhow::Result<()> {
    if !local_cluster::require("tenant_policies_are_enforced", NEEDS) {
        return Ok(());
    }
    let mut tenancy = Tenancy::start(TenancyOptions {
        tenants: 0,
        ..Default::default()
    })
    .await?;
    create::<k8s_openapi::api::node::v1::RuntimeClass>(
        &tenancy.super_client(),
        None,
        // Published: a class a VirtualCluster forces must be (issue 32 item 7).
        json!({"metadata": {"name": "kata", "labels": {"tenancy.x-k8s.io/super.public": "true"}},
            "handler": "kata"}),
    )
    .await?;
    let spec: crds::VirtualClusterSpec = serde_json::from_value(json!({
        "kubeconfigSecretRef": {"name": "x"},
        "quota": {"pods": "2"},
        "runtimeClassName": "kata",
        "rateLimit": {"qps": 5, "burst": 5}
    }))?;
    tenancy.add_tenant("strict", spec).await?;
    // No patrol during the test: pods waiting for quota must be released by the events themselves (a pod
    // ending, the quota changing), not by the patrol's safety net.
    let _syncer = start_syncer(
        &tenancy,
        SyncerConfig {
            patrol_interval: Duration::from_secs(3600),
            ..config()
        },
    )
    .await?;
    tenant_synced(&tenancy, "strict", "True").await?;
    let tenant = tenancy.tenant("strict");
    seed(tenant, "jobs").await?;
    let client = tenant.client();
    let tenant_pods = Api::<Pod>::namespaced(client.clone(), "jobs");
    let super_pods = super_api::<Pod>(&tenancy, tenant, "jobs");

    // Host access beyond the policy, and a preset node name, are refused with an event.
    let mut host = pod_json("host", json!({}), "busybox");
    host["spec"]["hostNetwork"] = json!(true);
    create::<Pod>(&client, Some("jobs"), host).await?;
    let mut pinned = pod_json("pinned", json!({}), "busybox");
    pinned["spec"]["nodeName"] = json!("somewhere");
    create::<Pod>(&client, Some("jobs"), pinned).await?;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "jobs");
    wait::until_true(PATIENCE, "refusal events", || {
        let events = events.clone();
        async move {
            let list = events
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let has = |reason: &str, pod: &str| {
                list.iter().any(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
                })
            };
            has("PodPolicyViolation", "host") && has("NotSupported", "pinned")
        }
    })
    .await?;
    assert!(super_pods.get_opt("host").await?.is_none());
    assert!(super_pods.get_opt("pinned").await?.is_none());

    // Quota: two pods run, the third waits with a condition, and starts when one ends.
    for name in ["q-1", "q-2", "q-3"] {
        create::<Pod>(&client, Some("jobs"), pod_json(name, json!({}), "busybox")).await?;
        // One at a time, so that which pod waits is known.
        until(&tenant_pods, name, "pod admitted or held", |p| {
            p.is_some_and(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    || p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.reason.as_deref() == Some("TenantQuotaExceeded"))
                        })
            })
        })
        .await?;
    }
    let held = tenant_pods.get("q-3").await?;
    let condition = held
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "PodScheduled"))
        .context("PodScheduled condition")?;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_deref()),
        ("False", Some("TenantQuotaExceeded"))
    );
    assert!(condition.message.unwrap_or_default().contains("pods"));
    assert!(super_pods.get_opt("q-3").await?.is_none());
    // The runtime class is forced on what runs.
    let running = super_pods.get("q-1").await?;
    assert_eq!(
        running.spec.and_then(|s| s.runtime_class_name).as_deref(),
        Some("kata")
    );
    tenant_pods.delete("q-1", &DeleteParams::default()).await?;
    let running = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Running")
    };
    until(&tenant_pods, "q-3", "held pod Running after quota frees", running).await?;

    // Raising the quota releases a waiting pod at once, and so does removing it.
    let held = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.reason.as_deref() == Some("TenantQuotaExceeded"))
            })
    };
    let vcs: Api<VirtualCluster> =
        Api::namespaced(tenancy.super_client(), local_cluster::tenancy::VC_NAMESPACE);
    for (pod, quota) in [("q-4", json!({"pods": "3"})), ("q-5", serde_json::Value::Null)] {
        create::<Pod>(&client, Some("jobs"), pod_json(pod, json!({}), "busybox")).await?;
        until(&tenant_pods, pod, "pod held by the quota", held).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(super_pods.get_opt(pod).await?.is_none(), "{pod} must wait");
        vcs.patch(
            "strict",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"quota": quota}})),
        )
        .await?;
        until(
            &tenant_pods,
            pod,
            "held pod Running after the quota changed",
            running,
        )
        .await?;
    }

    // Rate limit: 30 ConfigMaps at 5 writes/s (burst 5) cannot all be in the super cluster within 2 s,
    // and all arrive eventually.
    let started = tokio::time::Instant::now();
    for i in 0..30 {
        create::<ConfigMap>(
            &client,
            Some("jobs"),
            json!({"metadata": {"name": format!("limited-{i}")}}),
        )
        .await?;
    }
    let count = || async {
        Api::<ConfigMap>::namespaced(tenancy.super_client(), &tenant.super_namespace("jobs"))
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|c| c.name_any().starts_with("limited-"))
                    .count()
            })
            .unwrap_or(0)
    };
    tokio::time::sleep_until(started + Duration::from_secs(2)).await;
    let early = count().await;
    let allowed = 5 + 5 * started.elapsed().as_secs_f64().ceil() as usize;
    assert!(
        early <= allowed,
        "{early} ConfigMaps after {:?} exceeds the limit",
        started.elapsed()
    );
    wait::until_true(PATIENCE, "all rate-limited ConfigMaps", || async {
        count().await == 30
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn provisioned_tenants_keep_syncing_while_they_roll_out() -> anyhow::Result<()> {
    if !local_cluster::require("provisioned_tenants_keep_syncing_while_they_roll_out", NEEDS) {
        return Ok(());
    }
    let mut tenancy = Tenancy::start(TenancyOptions {
        tenants: 0,
        ..Default::default()
    })
    .await?;
    // A tenant master registered as vc-manager registers the tenants it provisions: a ClusterVersion, the
    // admin kubeconfig in the root namespace, and the phase in the status, which this test sets as
    // vc-manager would during a rollout. (The master comes with an adopted VirtualCluster, removed first.)
    let super_client = tenancy.super_client();
    let vcs: Api<VirtualCluster> =
        Api::namespaced(super_client.clone(), local_cluster::tenancy::VC_NAMESPACE);
    tenancy.add_tenant("master", Default::default()).await?;
    vcs.delete("master", &DeleteParams::default()).await?;
    until(&vcs, "master", "adopted VirtualCluster gone", |vc| vc.is_none()).await?;
    let master = tenancy.tenant("master");
    let vc = create::<VirtualCluster>(
        &super_client,
        Some(local_cluster::tenancy::VC_NAMESPACE),
        json!({"metadata": {"name": "rolling"}, "spec": {"clusterVersionName": "v1"}}),
    )
    .await?;
    let key = crds::naming::cluster_key_of(&vc).context("cluster key")?;
    // The root namespace is the cluster key (the syncer computes it; it does not read the status).
    let root = key.clone();
    create::<Namespace>(&super_client, None, json!({"metadata": {"name": root}})).await?;
    create::<Secret>(
        &super_client,
        Some(&root),
        json!({"metadata": {"name": "admin-kubeconfig"},
            "stringData": {"admin-kubeconfig": master.control_plane.apiserver().admin_kubeconfig()}}),
    )
    .await?;
    let super_apps = crds::naming::super_namespace(&key, "apps");
    let set_phase = |phase: &'static str| {
        let (vcs, root) = (vcs.clone(), root.clone());
        async move {
            vcs.patch_status(
                "rolling",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase, "clusterNamespace": root}})),
            )
            .await
        }
    };
    set_phase("Pending").await?;

    // Being provisioned, never synced: not attached.
    let syncer = start_syncer(&tenancy, config()).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        syncer.context.tenants.all().is_empty(),
        "a Pending tenant was attached"
    );

    set_phase("Running").await?;
    tenant_synced(&tenancy, "rolling", "True").await?;
    seed(master, "apps").await?;
    let client = master.client();
    let tenant_pods = Api::<Pod>::namespaced(client.clone(), "apps");
    let super_pods = Api::<Pod>::namespaced(super_client.clone(), &super_apps);
    let running = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Running")
    };
    create::<Pod>(&client, Some("apps"), pod_json("before", json!({}), "busybox")).await?;
    until(&tenant_pods, "before", "pod Running", running).await?;

    // A rollout: new pods, deletions and status keep flowing.
    set_phase("Updating").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    create::<Pod>(&client, Some("apps"), pod_json("during", json!({}), "busybox")).await?;
    until(&tenant_pods, "during", "pod Running during the rollout", running).await?;
    tenant_pods.delete("before", &DeleteParams::default()).await?;
    until(
        &super_pods,
        "before",
        "super pod deleted during the rollout",
        |p| p.is_none(),
    )
    .await?;
    until(
        &tenant_pods,
        "before",
        "deletion completed during the rollout",
        |p| p.is_none(),
    )
    .await?;

    // A failed reconcile of a tenant that ran, even across a syncer restart: still synced.
    set_phase("Error").await?;
    drop(syncer);
    let syncer = start_syncer(&tenancy, config()).await?;
    create::<ConfigMap>(&client, Some("apps"), json!({"metadata": {"name": "in-error"}})).await?;
    until(
        &Api::<ConfigMap>::namespaced(super_client.clone(), &super_apps),
        "in-error",
        "ConfigMap synced while the phase is Error",
        |c| c.is_some(),
    )
    .await?;
    assert_eq!(syncer.context.tenants.all().len(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarts_outages_and_deletion_lose_nothing() -> anyhow::Result<()> {
    if !local_cluster::require("restarts_outages_and_deletion_lose_nothing", NEEDS) {
        return Ok(());
    }
    let mut tenancy = Tenancy::start(TenancyOptions::default()).await?;
    let syncer = start_syncer(&tenancy, config()).await?;
    for name in tenancy.names() {
        tenant_synced(&tenancy, &name, "True").await?;
    }
    let tenant = tenancy.tenant("tenant-0");
    seed(tenant, "burst").await?;
    let client = tenant.client();
    // A NodePort Service, whose node port is copied up: a restart rewrites it on neither side.
    create::<Service>(&client, Some("burst"), json!({"metadata": {"name": "edge"}, "spec": {"type": "NodePort", "selector": {"app": "edge"}, "ports": [{"port": 80}]}})).await?;

    // A burst, with the syncer killed in the middle of it.
    let burst = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in 0..60 {
                create::<ConfigMap>(
                    &client,
                    Some("burst"),
                    json!({"metadata": {"name": format!("cm-{i}")}, "data": {"i": i.to_string()}}),
                )
                .await?;
                create::<Pod>(
                    &client,
                    Some("burst"),
                    pod_json(&format!("pod-{i}"), json!({"i": i.to_string()}), "busybox"),
                )
                .await?;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before: Vec<(String, Option<String>)> = super_api::<Pod>(&tenancy, tenant, "burst")
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid()))
        .collect();
    drop(syncer);
    burst.await??;
    let syncer = start_syncer(&tenancy, config()).await?;

    // Everything arrives exactly once; nothing synced before the kill was recreated.
    let super_pods = super_api::<Pod>(&tenancy, tenant, "burst");
    wait::until_true(PATIENCE, "all 60 pods Running in the tenant", || {
        let api = Api::<Pod>::namespaced(client.clone(), "burst");
        async move {
            api.list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                        .count()
                        == 60
                })
                .unwrap_or(false)
        }
    })
    .await?;
    // The restarted syncer says how long each tenant took to list before its work could start.
    let listed = syncer_series(&syncer)?
        .get("syncer_tenant_list_duration_seconds_count")
        .copied()
        .context("no syncer_tenant_list_duration_seconds_count series")?;
    assert!(
        listed >= tenancy.names().len() as f64,
        "tenants whose caches listed after the restart: {listed}"
    );
    let after = super_pods.list(&ListParams::default()).await?.items;
    assert_eq!(after.len(), 60);
    for (name, uid) in before {
        let survivor = after
            .iter()
            .find(|p| p.name_any() == name)
            .with_context(|| format!("{name} lost"))?;
        assert_eq!(survivor.uid(), uid, "{name} was recreated");
    }
    let tenant_uids: std::collections::HashMap<String, Option<String>> =
        Api::<Pod>::namespaced(client.clone(), "burst")
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|p| (p.name_any(), p.uid()))
            .collect();
    for pod in &after {
        assert_eq!(
            annotation(pod, wellknown::ANNOTATION_UID).map(str::to_owned),
            tenant_uids[&pod.name_any()].clone()
        );
    }
    wait::until_true(PATIENCE, "all 60 ConfigMaps", || async {
        super_api::<ConfigMap>(&tenancy, tenant, "burst")
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len() >= 60)
            .unwrap_or(false)
    })
    .await?;

    // Restarting with everything in sync writes nothing to the super cluster.
    node_port_copied_up(&tenancy, tenant, "burst", "edge").await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(syncer);
    let metrics = Arc::new(Metrics::default());
    let syncer = Syncer::start(
        tenancy.super_client(),
        SyncerConfig {
            patrol_interval: Duration::from_secs(3600),
            ..config()
        },
        metrics.clone(),
        Health::new(),
    )
    .await?;
    tenant_synced(&tenancy, "tenant-0", "True").await?;
    wait::until_true(PATIENCE, "initial resync drained", || {
        let ctx = syncer.context.clone();
        async move {
            ctx.tenants.all().len() == 2 && ctx.queues.down.pending() == 0 && ctx.queues.up.pending() == 0
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = metrics.resources.super_writes_total();
    if writes != 0 {
        bail!(
            "restart with everything in sync wrote {writes} times to the super cluster: {:?}",
            metrics.resources.super_write_counts()
        );
    }
    let service_writes = metrics
        .resources
        .tenant_writes
        .get_or_create(&syncer::resources::metrics::WriteLabels {
            resource: "service",
            verb: "apply",
        })
        .get();
    assert_eq!(service_writes, 0, "a restart rewrote tenant Services");

    // One tenant's apiserver stops: the other keeps syncing, and the stopped one recovers.
    tenancy
        .tenant_mut("tenant-1")
        .control_plane
        .apiserver_mut()
        .stop();
    tenant_synced(&tenancy, "tenant-1", "False").await?;
    let tenant = tenancy.tenant("tenant-0");
    create::<ConfigMap>(
        &tenant.client(),
        Some("burst"),
        json!({"metadata": {"name": "during-outage"}}),
    )
    .await?;
    until(
        &super_api::<ConfigMap>(&tenancy, tenant, "burst"),
        "during-outage",
        "sync during the other tenant's outage",
        |c| c.is_some(),
    )
    .await?;
    tenancy
        .tenant_mut("tenant-1")
        .control_plane
        .apiserver_mut()
        .restart()
        .await?;
    tenant_synced(&tenancy, "tenant-1", "True").await?;
    let other = tenancy.tenant("tenant-1");
    seed(other, "after").await?;
    create::<ConfigMap>(
        &other.client(),
        Some("after"),
        json!({"metadata": {"name": "back"}}),
    )
    .await?;
    until(
        &super_api::<ConfigMap>(&tenancy, other, "after"),
        "back",
        "sync after recovery",
        |c| c.is_some(),
    )
    .await?;

    // Deleting a VirtualCluster removes all of its super objects.
    let key = tenancy.tenant("tenant-0").cluster_key.clone();
    Api::<VirtualCluster>::namespaced(tenancy.super_client(), local_cluster::tenancy::VC_NAMESPACE)
        .delete("tenant-0", &DeleteParams::default())
        .await?;
    wait::until_true(PATIENCE, "tenant-0's super namespaces gone", || {
        let api = Api::<Namespace>::all(tenancy.super_client());
        let key = key.clone();
        async move {
            api.list(&ListParams::default())
                .await
                .map(|l| {
                    !l.items
                        .iter()
                        .any(|n| annotation(n, wellknown::ANNOTATION_CLUSTER) == Some(key.as_str()))
                })
                .unwrap_or(false)
        }
    })
    .await?;
    let leftover_pods = Api::<Pod>::all(tenancy.super_client())
        .list(&ListParams::default().labels(&format!("{}={key}", wellknown::LABEL_CLUSTER)))
        .await?;
    assert!(
        leftover_pods.items.is_empty(),
        "{} pods left",
        leftover_pods.items.len()
    );
    // The other tenant is untouched.
    assert!(
        super_api::<ConfigMap>(&tenancy, tenancy.tenant("tenant-1"), "after")
            .get_opt("back")
            .await?
            .is_some()
    );
    drop(syncer);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unusable_kubeconfig_is_reported_and_recovers() -> anyhow::Result<()> {
    if !local_cluster::require("an_unusable_kubeconfig_is_reported_and_recovers", NEEDS) {
        return Ok(());
    }
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        tenant_controller_managers: false,
        ..Default::default()
    })
    .await?;
    let tenant = tenancy.tenant("tenant-0");
    let good = tenant.control_plane.apiserver().admin_kubeconfig();
    // A client certificate from a CA the tenant does not trust: the apiserver treats the caller as
    // anonymous, who may not list anything.
    let stranger = local_cluster::pki::CertificateAuthority::new("stranger")?;
    let intruder = stranger.issue(
        "intruder",
        &["system:masters"],
        &[],
        local_cluster::pki::Usage::Client,
    )?;
    let wrong = local_cluster::kubeconfig_yaml(
        "wrong",
        tenant.control_plane.apiserver().url(),
        tenant.control_plane.apiserver().ca().cert_pem(),
        &intruder,
    );
    tenancy.write_kubeconfig("tenant-0-kubeconfig", &wrong).await?;
    let _syncer = start_syncer(&tenancy, config()).await?;
    let vc = tenant_synced(&tenancy, "tenant-0", "False").await?;
    let condition = vc
        .status
        .context("status")?
        .conditions
        .into_iter()
        .find(|c| c.type_ == wellknown::CONDITION_TENANT_SYNCED)
        .context("condition")?;
    assert!(
        matches!(
            condition.reason.as_str(),
            "TenantUnauthorized" | "TenantUnreachable"
        ),
        "{condition:?}"
    );

    // A missing key is named.
    tenancy.write_kubeconfig("tenant-0-kubeconfig", "").await?;
    let api: Api<Secret> = Api::namespaced(tenancy.super_client(), local_cluster::tenancy::VC_NAMESPACE);
    api.patch(
        "tenant-0-kubeconfig",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": null, "other": "eA=="}})),
    )
    .await?;
    let vcs: Api<VirtualCluster> =
        Api::namespaced(tenancy.super_client(), local_cluster::tenancy::VC_NAMESPACE);
    until(&vcs, "tenant-0", "missing key reported", |vc| {
        vc.and_then(|v| v.status.as_ref()).is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == wellknown::CONDITION_TENANT_SYNCED
                    && c.reason == "KubeconfigMissing"
                    && c.message.contains("\"value\"")
            })
        })
    })
    .await?;

    // Fixing the Secret recovers.
    tenancy.write_kubeconfig("tenant-0-kubeconfig", &good).await?;
    tenant_synced(&tenancy, "tenant-0", "True").await?;
    Ok(())
}
