//! Hard multi-tenancy against a hostile tenant (issue 13: "Shared components"): the syncer is shared by
//! every tenant, so each test is an attack on it by one tenant, against real etcd and kube-apiserver
//! processes with the syncer running in process, and checks that the other tenants do not feel it and that
//! the attacker learns nothing it should not:
//!
//! - `a_tenant_flooding_the_syncer_is_stopped_at_its_limit`: a tenant creating ConfigMaps of nearly 1 MiB
//!   until it passes the syncer's per-tenant cache limit gets `TenantLimitExceeded` on its VirtualCluster,
//!   keeps what it already had in the super cluster, and syncs again once it cleans up; another tenant
//!   keeps syncing in normal time all along.
//! - `an_event_storm_waits_behind_its_own_tenant`: thousands of super events about a tenant's pod, while
//!   that tenant's apiserver does not answer, are held in a bounded inbox (the rest are dropped and
//!   counted) instead of one task each, and another tenant's events are copied up at once.
//! - `a_tenant_sees_no_storage_details_of_its_volumes`: a super PersistentVolume bound to a tenant's claim
//!   reaches the tenant without its CSI handle, volume attributes, secret reference, mount options or node
//!   affinity.
//!
//! - `vn_agent_may_act_on_tenant_pods_only`: vn-agent's rights on pods (logs, exec, attach, port-forward)
//!   are bound by the syncer in each tenant super namespace and nowhere else, as the super apiserver's own
//!   SubjectAccessReview answers; a binding someone widens is taken back.
//!
//! vn-agent's part of the section is proven where vn-agent is set up: `e2e/tests/vn_agent.rs`
//! (`tenants_reach_their_own_pods_through_vn_agent`: an open exec is cut when its tenant's kubelet-client CA
//! is replaced and when its VirtualCluster is deleted; `the_super_apiserver_backend_serves_the_same_requests`:
//! vn-agent works with no access to Secrets, only the CA bundle ConfigMap by name) and `e2e/tests/chart.rs`
//! (the chart grants vn-agent no Secret and only that ConfigMap; its `/metrics` is on the loopback).

use std::{sync::Arc, time::Duration};

use crate::vc_manager_support::{condition, init_logging, wait_vc};
use anyhow::Context as _;
use crds::{VirtualCluster, wellknown::CONDITION_TENANT_SYNCED};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::core::v1::{
        ConfigMap, Event as CoreEvent, Namespace, PersistentVolume, PersistentVolumeClaim, Pod,
        ServiceAccount,
    },
    api::{
        authorization::v1::SubjectAccessReview,
        rbac::v1::{ClusterRole, RoleBinding},
        storage::v1::StorageClass,
    },
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, PostParams},
};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions, TenantMaster, VC_NAMESPACE},
    wait,
};
use serde_json::json;
use syncer::{Metrics, Syncer, SyncerConfig, engine::budget::CacheLimits};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver];
const PATIENCE: Duration = Duration::from_secs(60);
/// How long a tenant object may take to reach the super cluster while another tenant attacks.
const NORMAL_SYNC: Duration = Duration::from_secs(10);

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

async fn start_syncer(client: Client, config: SyncerConfig, metrics: Arc<Metrics>) -> anyhow::Result<Syncer> {
    Ok(Syncer::start(client, config, metrics, Health::new()).await?)
}

async fn two_tenants() -> anyhow::Result<Tenancy> {
    Ok(Tenancy::start(TenancyOptions {
        tenants: 2,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?)
}

fn from_json<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
    serde_json::from_value(value).expect("object")
}

async fn create<K>(api: &Api<K>, object: &K) -> anyhow::Result<K>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object)
        .await
        .with_context(|| format!("creating {}", object.name_any()))
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

/// Waits until the super cluster has object `name` in `super_namespace`, and says how long that took.
async fn synced<K>(
    client: &Client,
    super_namespace: &str,
    name: &str,
    patience: Duration,
) -> anyhow::Result<Duration>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let started = std::time::Instant::now();
    let api: Api<K> = Api::namespaced(client.clone(), super_namespace);
    wait::until(
        patience,
        &format!("{super_namespace}/{name} in the super cluster"),
        || {
            let api = api.clone();
            async move { api.get_opt(name).await.ok().flatten() }
        },
    )
    .await?;
    Ok(started.elapsed())
}

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

/// The attacker creates ConfigMaps of nearly 1 MiB (the apiserver's limit) as fast as its apiserver
/// takes them, to fill the shared syncer's memory. The limits are small here so that the test stays fast;
/// the defaults are 50 000 objects and 128 MiB per tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flooding_the_syncer_is_stopped_at_its_limit() -> anyhow::Result<()> {
    if !local_cluster::require("a_tenant_flooding_the_syncer_is_stopped_at_its_limit", NEEDS) {
        return Ok(());
    }
    init_logging();
    let tenancy = two_tenants().await?;
    let client = tenancy.super_client();
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let (attacker, other) = (tenancy.tenant("tenant-0"), tenancy.tenant("tenant-1"));
    tenant_namespace(attacker, "flood").await?;
    config_map(attacker.client(), "flood", "precious", "kept").await?;
    tenant_namespace(other, "shop").await?;

    let config = SyncerConfig {
        tenant_cache_limits: CacheLimits {
            max_objects: 1_000,
            max_bytes: 6 * 1024 * 1024,
        },
        ..syncer_config()
    };
    let _syncer = start_syncer(client.clone(), config, Arc::new(Metrics::default())).await?;
    synced::<ConfigMap>(&client, &attacker.super_namespace("flood"), "precious", PATIENCE).await?;
    tenant_synced(&vcs, "tenant-0", "TenantAttached").await?;

    // The flood: 12 ConfigMaps of 900 KiB, twice the limit, while the other tenant goes on working.
    let blob = "x".repeat(900 * 1024);
    let flood = futures::stream::iter(0..12)
        .map(|n| {
            let (client, blob) = (attacker.client(), blob.clone());
            async move { config_map(client, "flood", &format!("blob-{n}"), &blob).await }
        })
        .buffer_unordered(4)
        .try_collect::<Vec<_>>();
    let other_work = async {
        let mut slowest = Duration::ZERO;
        for n in 0..5 {
            config_map(other.client(), "shop", &format!("order-{n}"), "1").await?;
            let took = synced::<ConfigMap>(
                &client,
                &other.super_namespace("shop"),
                &format!("order-{n}"),
                NORMAL_SYNC,
            )
            .await
            .with_context(|| format!("the other tenant's order-{n} did not sync within {NORMAL_SYNC:?}"))?;
            slowest = slowest.max(took);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        anyhow::Ok(slowest)
    };
    let (flooded, slowest) = tokio::join!(flood, other_work);
    flooded?;
    let slowest = slowest?;
    tracing::info!(?slowest, "the other tenant's slowest sync during the flood");

    let refused = tenant_synced(&vcs, "tenant-0", "TenantLimitExceeded").await?;
    assert_eq!(refused.status, "False");
    assert!(
        refused.message.contains("configmap flood/blob-"),
        "the condition names what did not fit: {}",
        refused.message
    );
    // Held, not deleted: what the attacker had synced stays, and the rest of the flood is not synced. The
    // condition stays put while the syncer retries (it does not flap back to attached at every attempt).
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let vc = vcs.get("tenant-0").await?;
        let reason = condition(&vc, CONDITION_TENANT_SYNCED).map(|c| c.reason.clone());
        assert_eq!(
            reason.as_deref(),
            Some("TenantLimitExceeded"),
            "while over its limit"
        );
    }
    let super_config_maps: Api<ConfigMap> =
        Api::namespaced(client.clone(), &attacker.super_namespace("flood"));
    assert!(
        super_config_maps.get_opt("precious").await?.is_some(),
        "the attacker's earlier ConfigMap was deleted"
    );
    let copied = super_config_maps
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|c| c.name_any().starts_with("blob-"))
        .count();
    assert!(copied < 12, "all of the flood was synced ({copied} ConfigMaps)");
    // The other tenant still syncs in normal time.
    config_map(other.client(), "shop", "after", "1").await?;
    synced::<ConfigMap>(&client, &other.super_namespace("shop"), "after", NORMAL_SYNC).await?;

    // Cleaned up, the attacker syncs again.
    let tenant_config_maps: Api<ConfigMap> = Api::namespaced(attacker.client(), "flood");
    for n in 0..12 {
        tenant_config_maps
            .delete(&format!("blob-{n}"), &DeleteParams::default())
            .await?;
    }
    config_map(attacker.client(), "flood", "later", "1").await?;
    wait_vc(
        &vcs,
        "tenant-0",
        Duration::from_secs(120),
        "TenantAttached again",
        |vc| condition(vc, CONDITION_TENANT_SYNCED).is_some_and(|c| c.reason == "TenantAttached"),
    )
    .await?;
    synced::<ConfigMap>(&client, &attacker.super_namespace("flood"), "later", PATIENCE).await?;
    Ok(())
}

/// A pod that runs nothing the simulated node cares about.
fn pod(name: &str) -> Pod {
    from_json(json!({
        "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "main", "image": "busybox"}]}
    }))
}

/// A super event about pod `name` in `super_namespace`, as a node would report it.
fn super_event(super_namespace: &str, pod: &str, name: &str) -> CoreEvent {
    from_json(json!({
        "metadata": {"name": name, "namespace": super_namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": super_namespace, "name": pod},
        "reason": "BackOff", "message": "Back-off restarting failed container", "type": "Warning",
        "source": {"component": "kubelet", "host": "node-0"},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1
    }))
}

/// The attacker's pods crash in a loop, so the nodes report event after event about them, and it stops
/// its apiserver from answering, so that every copy the syncer makes of those events hangs or fails.
/// (The test writes the super events itself, as the nodes would.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_storm_waits_behind_its_own_tenant() -> anyhow::Result<()> {
    if !local_cluster::require("an_event_storm_waits_behind_its_own_tenant", NEEDS) {
        return Ok(());
    }
    init_logging();
    let mut tenancy = two_tenants().await?;
    let client = tenancy.super_client();
    for tenant in ["tenant-0", "tenant-1"] {
        let tenant = tenancy.tenant(tenant);
        tenant_namespace(tenant, "app").await?;
        create(&Api::<Pod>::namespaced(tenant.client(), "app"), &pod("web")).await?;
    }
    let metrics = Arc::new(Metrics::default());
    let _syncer = start_syncer(client.clone(), syncer_config(), metrics.clone()).await?;
    let (attacker_ns, other_ns) = (
        tenancy.tenant("tenant-0").super_namespace("app"),
        tenancy.tenant("tenant-1").super_namespace("app"),
    );
    synced::<Pod>(&client, &attacker_ns, "web", PATIENCE).await?;
    synced::<Pod>(&client, &other_ns, "web", PATIENCE).await?;

    tenancy
        .tenant_mut("tenant-0")
        .control_plane
        .apiserver_mut()
        .stop();
    let storm = 1_600;
    let super_events: Api<CoreEvent> = Api::namespaced(client.clone(), &attacker_ns);
    futures::stream::iter(0..storm)
        .map(|n| {
            let (api, namespace) = (super_events.clone(), attacker_ns.clone());
            async move { create(&api, &super_event(&namespace, "web", &format!("web.storm-{n}"))).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;

    // The other tenant's event is copied up at once.
    create(
        &Api::<CoreEvent>::namespaced(client.clone(), &other_ns),
        &super_event(&other_ns, "web", "web.calm"),
    )
    .await?;
    let tenant_events: Api<CoreEvent> = Api::namespaced(tenancy.tenant("tenant-1").client(), "app");
    let copied = wait::until(NORMAL_SYNC, "the other tenant's event copied up", || {
        let api = tenant_events.clone();
        async move { api.get_opt("web.calm").await.ok().flatten() }
    })
    .await?;
    assert_eq!(copied.involved_object.namespace.as_deref(), Some("app"));

    // The storm is held in a bounded inbox (plus the few events the attacker's share of the upward
    // workers is trying to copy): what does not fit is dropped and counted.
    let dropped = metrics.resources.events_dropped.get();
    let held = syncer::engine::events::PENDING_EVENTS_PER_TENANT + syncer_config().upward_workers;
    assert!(
        dropped >= (storm - held) as u64,
        "only {dropped} of {storm} events were dropped while the attacker's apiserver did not answer"
    );
    Ok(())
}

/// The attacker binds a claim and reads the PersistentVolume the syncer copies into its cluster, looking
/// for the storage system's addresses, credentials and volume identifiers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_no_storage_details_of_its_volumes() -> anyhow::Result<()> {
    if !local_cluster::require("a_tenant_sees_no_storage_details_of_its_volumes", NEEDS) {
        return Ok(());
    }
    init_logging();
    let tenancy = two_tenants().await?;
    let client = tenancy.super_client();
    let attacker = tenancy.tenant("tenant-0");
    tenant_namespace(attacker, "data").await?;
    // Claims may only name classes the platform published.
    create(
        &Api::<StorageClass>::all(client.clone()),
        &from_json(json!({"metadata": {"name": "standard",
                "labels": {"tenancy.x-k8s.io/super.public": "true"}},
            "provisioner": "example.com/block", "volumeBindingMode": "Immediate"})),
    )
    .await?;
    create(
        &Api::<PersistentVolumeClaim>::namespaced(attacker.client(), "data"),
        &from_json(json!({"metadata": {"name": "db"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
            "resources": {"requests": {"storage": "1Gi"}}
        }})),
    )
    .await?;
    let _syncer = start_syncer(client.clone(), syncer_config(), Arc::new(Metrics::default())).await?;
    let super_namespace = attacker.super_namespace("data");
    synced::<PersistentVolumeClaim>(&client, &super_namespace, "db", PATIENCE).await?;
    let super_claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &super_namespace)
        .get("db")
        .await?;
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        &from_json(
            json!({"metadata": {"name": "pv-db", "labels": {"rack.example.com/name": "r7"}}, "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                "volumeMode": "Filesystem", "persistentVolumeReclaimPolicy": "Delete",
                "mountOptions": ["nfsvers=4.1"],
                "csi": {"driver": "nfs.csi.k8s.io", "volumeHandle": "10.9.8.7#exports#team-a",
                    "volumeAttributes": {"server": "10.9.8.7", "share": "/exports/team-a"},
                    "nodePublishSecretRef": {"name": "nfs-creds", "namespace": "storage-system"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "rack.example.com/name", "operator": "In", "values": ["r7"]}]}]}},
                "claimRef": {"namespace": super_namespace, "name": "db", "uid": super_claim.uid()}
            }}),
        ),
    )
    .await?;

    let tenant_volumes: Api<PersistentVolume> = Api::all(attacker.client());
    let copy = wait::until(PATIENCE, "the tenant's copy of pv-db", || {
        let api = tenant_volumes.clone();
        async move { api.get_opt("pv-db").await.ok().flatten() }
    })
    .await?;
    let spec = copy.spec.clone().context("spec")?;
    let claim = spec.claim_ref.clone().context("claimRef")?;
    assert_eq!(
        (claim.namespace.as_deref(), claim.name.as_deref()),
        (Some("data"), Some("db"))
    );
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
    assert!(spec.capacity.is_some_and(|c| c.contains_key("storage")));
    let seen = serde_json::to_string(&copy)?;
    for detail in [
        "10.9.8.7",
        "exports",
        "nfs",
        "storage-system",
        "r7",
        "rack.example.com",
    ] {
        assert!(!seen.contains(detail), "the tenant sees {detail:?} in {seen}");
    }
    Ok(())
}

/// Whether the super apiserver lets `user` do `verb` on `pods/<subresource>` in `namespace`.
async fn may(
    client: &Client,
    user: &str,
    verb: &str,
    subresource: &str,
    namespace: &str,
) -> anyhow::Result<bool> {
    let review: SubjectAccessReview = from_json(json!({"spec": {
        "user": user,
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": "pods",
            "subresource": subresource}
    }}));
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// vn-agent (on every node) serves kubelet calls through the super apiserver. A tenant that takes over a
/// node's vn-agent, or the vn-agent of any node, must reach its pods only: the syncer binds vn-agent's
/// pod rights in each tenant super namespace, never cluster-wide, and takes back a binding someone widens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vn_agent_may_act_on_tenant_pods_only() -> anyhow::Result<()> {
    if !local_cluster::require("vn_agent_may_act_on_tenant_pods_only", NEEDS) {
        return Ok(());
    }
    init_logging();
    let tenancy = two_tenants().await?;
    let client = tenancy.super_client();
    // The chart's role, bound by no ClusterRoleBinding.
    create(
        &Api::<ClusterRole>::all(client.clone()),
        &from_json(json!({"metadata": {"name": "vn-agent-tenant-pods"}, "rules": [
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"],
                "verbs": ["get", "create"]}]})),
    )
    .await?;
    let (a, b) = (tenancy.tenant("tenant-0"), tenancy.tenant("tenant-1"));
    tenant_namespace(a, "app").await?;
    tenant_namespace(b, "web").await?;
    let config = SyncerConfig {
        vn_agent_access: Some(syncer::engine::config::VnAgentAccess {
            namespace: "vc-system".into(),
            service_account: "vn-agent".into(),
            cluster_role: "vn-agent-tenant-pods".into(),
        }),
        ..syncer_config()
    };
    let _syncer = start_syncer(client.clone(), config, Arc::new(Metrics::default())).await?;
    let agent = "system:serviceaccount:vc-system:vn-agent";
    let tenant_namespaces = [a.super_namespace("app"), b.super_namespace("web")];
    for namespace in &tenant_namespaces {
        synced::<RoleBinding>(&client, namespace, "vc-vn-agent", PATIENCE).await?;
        for (verb, subresource) in [
            ("get", "log"),
            ("create", "exec"),
            ("get", "attach"),
            ("create", "portforward"),
        ] {
            // The authorizer reads bindings from its own cache, a moment behind the store.
            wait::until_true(
                PATIENCE,
                &format!("vn-agent may {verb} pods/{subresource} in {namespace}"),
                || {
                    let client = client.clone();
                    async move {
                        may(&client, agent, verb, subresource, namespace)
                            .await
                            .unwrap_or(false)
                    }
                },
            )
            .await?;
        }
    }
    for namespace in ["kube-system", "default", &a.cluster_key] {
        for (verb, subresource) in [("get", "log"), ("create", "exec"), ("get", "exec")] {
            assert!(
                !may(&client, agent, verb, subresource, namespace).await?,
                "vn-agent may {verb} pods/{subresource} in {namespace}"
            );
        }
    }

    // Someone adds a subject to a binding: the syncer takes it back.
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &tenant_namespaces[0]);
    let mut widened = bindings.get("vc-vn-agent").await?;
    widened.metadata.managed_fields = None;
    widened
        .subjects
        .get_or_insert_with(Vec::new)
        .push(from_json(json!(
        {"kind": "ServiceAccount", "name": "intruder", "namespace": "default"})));
    bindings
        .replace("vc-vn-agent", &PostParams::default(), &widened)
        .await?;
    wait::until_true(PATIENCE, "the widened binding taken back", || {
        let bindings = bindings.clone();
        async move {
            bindings
                .get_opt("vc-vn-agent")
                .await
                .ok()
                .flatten()
                .is_some_and(|b| {
                    b.subjects
                        .is_some_and(|s| s.len() == 1 && s[0].name == "vn-agent")
                })
        }
    })
    .await?;
    wait::until_true(PATIENCE, "the intruder refused again", || {
        let client = client.clone();
        let namespace = tenant_namespaces[0].clone();
        async move {
            may(
                &client,
                "system:serviceaccount:default:intruder",
                "create",
                "exec",
                &namespace,
            )
            .await
            .is_ok_and(|allowed| !allowed)
        }
    })
    .await?;
    Ok(())
}
