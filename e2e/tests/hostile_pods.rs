//! Hard multi-tenancy against a hostile tenant and a hostile VirtualCluster editor (issue 13: "Pods").
//! Each test is written as the attacker would try it, against real etcd and kube-apiserver processes with
//! the syncer running in process, and checks that the attack is refused with an event naming what was
//! refused and that nothing of it reaches the super cluster:
//!
//! - `a_tenant_pod_cannot_ask_for_more_than_the_pod_policy_allows`: host ports, a system PriorityClass,
//!   tolerating the control plane's or every taint, selecting unlisted node labels, another scheduler,
//!   another RuntimeClass than the forced one, capabilities beyond baseline (in an init container),
//!   seccomp `Unconfined` and AppArmor `unconfined` (annotation) are refused with `PodPolicyViolation`;
//!   an ordinary pod with a published PriorityClass runs, with the forced RuntimeClass.
//! - `super_namespaces_hold_the_platform_pod_security_level`: the tenant labels its namespace
//!   `pod-security.kubernetes.io/enforce=privileged`, and the VirtualCluster's editor allows privileged
//!   pods and hostPath in `podPolicy`; the super namespace keeps the platform's `baseline`/`restricted`
//!   labels, and the super apiserver's own admission refuses the privileged pod (`PodPolicyViolation`).
//! - `claims_use_only_published_storage_classes`: claims naming an unpublished StorageClass, the empty
//!   class (pre-made volumes), or no class while the super default is unpublished are refused with
//!   `StorageClassNotPublished` and not synced; a claim of a published class is.
//! - `pods_run_only_with_published_runtime_classes`: a pod naming an unpublished super RuntimeClass, or a
//!   RuntimeClass of the tenant's own with an unpublished handler, is refused with `PodPolicyViolation`;
//!   published classes appear in the tenant, and a tenant class with a published handler runs as the
//!   published class, with its overhead rather than the tenant's.
//! - `quotas_cannot_be_escaped`: pods that leave out a resource the quota limits are refused
//!   (`ResourcesRequired`); Services, node ports, load balancers, claims and claimed storage beyond the
//!   quota are refused with `TenantQuotaExceeded`, also when an existing Service is changed to a NodePort
//!   one; freeing room lets a refused Service through.

use crate::object_support::{create, until};
use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use crds::{VirtualClusterSpec, wellknown};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolumeClaim, Pod, Service, ServiceAccount},
    events::v1::Event,
    node::v1::RuntimeClass,
    scheduling::v1::PriorityClass,
    storage::v1::StorageClass,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
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

fn config() -> SyncerConfig {
    SyncerConfig {
        patrol_interval: Duration::from_secs(5),
        vnode_grace: Duration::from_secs(3),
        tenant_health_period: Duration::from_secs(2),
        downward_workers: 4,
        upward_workers: 4,
        token_ttl_seconds: 600,
        ..SyncerConfig::for_tests()
    }
}

/// A super cluster with simulated nodes and the syncer, and one tenant with `spec`.
async fn tenancy(spec: serde_json::Value) -> anyhow::Result<(Tenancy, Syncer)> {
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let mut tenancy = Tenancy::start(TenancyOptions {
        tenants: 0,
        nodes: 1,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let mut spec = spec;
    spec["kubeconfigSecretRef"] = json!({"name": "x"});
    let spec: VirtualClusterSpec = serde_json::from_value(spec)?;
    tenancy.add_tenant("attacker", spec).await?;
    let syncer = Syncer::start(
        tenancy.super_client(),
        config(),
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?;
    let vcs: Api<crds::VirtualCluster> =
        Api::namespaced(tenancy.super_client(), local_cluster::tenancy::VC_NAMESPACE);
    until(&vcs, "attacker", "attacker TenantSynced=True", |vc| {
        vc.and_then(|vc| vc.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == wellknown::CONDITION_TENANT_SYNCED && c.status == "True")
        })
    })
    .await?;
    Ok((tenancy, syncer))
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

/// Merges `patch` into `object` as a JSON merge patch does (objects merged key by key, the rest replaced).
fn merge(object: &mut serde_json::Value, patch: &serde_json::Value) {
    match (object, patch) {
        (serde_json::Value::Object(object), serde_json::Value::Object(patch)) => {
            for (key, value) in patch {
                merge(
                    object.entry(key.clone()).or_insert(serde_json::Value::Null),
                    value,
                );
            }
        }
        (object, patch) => *object = patch.clone(),
    }
}

/// Sleeps long enough for the syncer to have acted on what was just written (used before asserting that
/// something did not happen, after a positive wait has shown the syncer is working).
async fn settle() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// The attack: every way a pod spec reaches past the tenant's share of the super cluster's nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_pod_cannot_ask_for_more_than_the_pod_policy_allows() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_tenant_pod_cannot_ask_for_more_than_the_pod_policy_allows",
        NEEDS,
    ) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({"runtimeClassName": "kata"})).await?;
    let super_client = tenancy.super_client();
    // The class a VirtualCluster forces must be published (issue 32).
    create::<RuntimeClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "kata", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}}, "handler": "kata"}),
    )
    .await?;
    create::<PriorityClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "tenant-high", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}}, "value": 1000}),
    )
    .await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(tenant, "apps", json!({})).await?;
    // What the attacker's own apiserver needs to accept the pods: its RuntimeClass, and the published
    // PriorityClass copied in by the syncer.
    create::<RuntimeClass>(
        &client,
        None,
        json!({"metadata": {"name": "runc"}, "handler": "runc"}),
    )
    .await?;
    until(
        &Api::<PriorityClass>::all(client.clone()),
        "tenant-high",
        "published PriorityClass in the tenant",
        |pc| pc.is_some(),
    )
    .await?;

    let attacks: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "host-port",
            json!({"spec": {"containers": [{"name": "main", "image": "busybox", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}}),
            "hostPort 8080 of container \"main\"",
        ),
        (
            "system-priority",
            json!({"spec": {"priorityClassName": "system-node-critical"}}),
            "priorityClassName \"system-node-critical\"",
        ),
        (
            "control-plane",
            json!({"spec": {
                "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
                "nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}}),
            "toleration of taint node-role.kubernetes.io/control-plane",
        ),
        (
            "tolerate-all",
            json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
            "toleration of every taint",
        ),
        (
            "gpu-nodes",
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}]}}}}}),
            "node affinity on label gpu In [yes]",
        ),
        (
            "own-scheduler",
            json!({"spec": {"schedulerName": "my-scheduler"}}),
            "schedulerName \"my-scheduler\"",
        ),
        (
            "other-runtime",
            json!({"spec": {"runtimeClassName": "runc"}}),
            "runtimeClassName \"runc\"",
        ),
        (
            "sys-admin",
            json!({"spec": {"initContainers": [{"name": "setup", "image": "busybox",
                "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}}),
            "capability SYS_ADMIN of init container \"setup\"",
        ),
        (
            "no-seccomp",
            json!({"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}}),
            "pod seccompProfile Unconfined",
        ),
        (
            "no-apparmor",
            json!({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}}}),
            "annotation container.apparmor.security.beta.kubernetes.io/main Unconfined",
        ),
    ];
    for (name, patch, _) in &attacks {
        let mut object = pod(name);
        merge(&mut object, patch);
        create::<Pod>(&client, Some("apps"), object).await?;
    }
    // An ordinary pod (the apiserver's default tolerations, a published PriorityClass) runs.
    let mut ordinary = pod("ordinary");
    ordinary["spec"]["priorityClassName"] = json!("tenant-high");
    ordinary["spec"]["nodeSelector"] = json!({"kubernetes.io/os": "linux"});
    create::<Pod>(&client, Some("apps"), ordinary).await?;

    for (name, _, says) in &attacks {
        event(&client, "apps", name, "PodPolicyViolation", says).await?;
    }
    let super_pods = super_api::<Pod>(&tenancy, tenant, "apps");
    let running = until(
        &super_pods,
        "ordinary",
        "the ordinary pod in the super cluster",
        |p| p.is_some(),
    )
    .await?
    .context("ordinary super pod")?;
    assert_eq!(
        running.spec.and_then(|s| s.runtime_class_name).as_deref(),
        Some("kata")
    );
    settle().await;
    for (name, _, _) in &attacks {
        assert!(
            super_pods.get_opt(name).await?.is_none(),
            "{name} reached the super cluster"
        );
    }
    Ok(())
}

/// The attack: the tenant asks its own namespace for the privileged Pod Security level, and the
/// VirtualCluster's editor allows privileged pods; the platform's level still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn super_namespaces_hold_the_platform_pod_security_level() -> anyhow::Result<()> {
    if !local_cluster::require("super_namespaces_hold_the_platform_pod_security_level", NEEDS) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({"podPolicy": {"privileged": true, "hostPath": true}})).await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(
        tenant,
        "apps",
        json!({"pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/warn": "privileged"}),
    )
    .await?;
    let mut privileged = pod("root");
    privileged["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    privileged["spec"]["volumes"] = json!([{"name": "host", "hostPath": {"path": "/"}}]);
    create::<Pod>(&client, Some("apps"), privileged).await?;
    event(&client, "apps", "root", "PodPolicyViolation", "PodSecurity").await?;

    let super_namespaces: Api<Namespace> = Api::all(tenancy.super_client());
    let super_name = tenant.super_namespace("apps");
    let level = |ns: &Namespace, mode: &str| {
        ns.labels()
            .get(&format!("pod-security.kubernetes.io/{mode}"))
            .cloned()
    };
    let namespace = super_namespaces.get(&super_name).await?;
    assert_eq!(level(&namespace, "enforce").as_deref(), Some("baseline"));
    assert_eq!(level(&namespace, "enforce-version").as_deref(), Some("latest"));
    assert_eq!(level(&namespace, "warn").as_deref(), Some("restricted"));
    assert!(
        super_api::<Pod>(&tenancy, tenant, "apps")
            .get_opt("root")
            .await?
            .is_none()
    );

    // Relabelling the tenant namespace later changes the super namespace's other labels, never these.
    Api::<Namespace>::all(client.clone())
        .patch(
            "apps",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "team": "red", "pod-security.kubernetes.io/enforce-version": "v1.25"}}})),
        )
        .await?;
    // Tenant namespace labels are copied encoded (issue 32).
    let relabelled = until(&super_namespaces, &super_name, "tenant label copied", |ns| {
        ns.is_some_and(|ns| ns.labels().get("label.tenancy.x-k8s.io/team").map(String::as_str) == Some("red"))
    })
    .await?
    .context("super namespace")?;
    assert_eq!(level(&relabelled, "enforce").as_deref(), Some("baseline"));
    assert_eq!(level(&relabelled, "enforce-version").as_deref(), Some("latest"));
    Ok(())
}

/// The attack: claims that would get storage the platform keeps to itself — an unpublished class, the
/// empty class that binds pre-made volumes, or the super cluster's own default class.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_use_only_published_storage_classes() -> anyhow::Result<()> {
    if !local_cluster::require("claims_use_only_published_storage_classes", NEEDS) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({})).await?;
    let super_client = tenancy.super_client();
    create::<StorageClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "platform-ssd", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "example.com/none"}),
    )
    .await?;
    create::<StorageClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "shared", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}},
            "provisioner": "example.com/none"}),
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
    let claim = |name: &str, class: serde_json::Value| {
        let mut claim = json!({"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}});
        if !class.is_null() {
            claim["spec"]["storageClassName"] = class;
        }
        claim
    };
    let attacks = [
        (
            "unpublished",
            json!("platform-ssd"),
            "StorageClass \"platform-ssd\" is not published",
        ),
        ("premade", json!(""), "binds pre-made volumes"),
        ("default", serde_json::Value::Null, "no published StorageClass"),
    ];
    for (name, class, _) in &attacks {
        create::<PersistentVolumeClaim>(&client, Some("apps"), claim(name, class.clone())).await?;
    }
    create::<PersistentVolumeClaim>(&client, Some("apps"), claim("data", json!("shared"))).await?;
    for (name, _, says) in &attacks {
        event(&client, "apps", name, "StorageClassNotPublished", says).await?;
    }
    let super_claims = super_api::<PersistentVolumeClaim>(&tenancy, tenant, "apps");
    until(&super_claims, "data", "the published class's claim synced", |c| {
        c.is_some()
    })
    .await?;
    settle().await;
    for (name, _, _) in &attacks {
        assert!(
            super_claims.get_opt(name).await?.is_none(),
            "{name} reached the super cluster"
        );
    }
    Ok(())
}

/// The attack: pods naming a RuntimeClass the platform keeps to itself, directly or through a RuntimeClass
/// of the tenant's own with its handler, or with a tiny overhead for a sandboxed runtime. Published
/// classes reach the tenant; a tenant class with a published handler runs as the published class, with
/// the published class's overhead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_run_only_with_published_runtime_classes() -> anyhow::Result<()> {
    if !local_cluster::require("pods_run_only_with_published_runtime_classes", NEEDS) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({})).await?;
    let super_client = tenancy.super_client();
    create::<RuntimeClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "platform-privileged"}, "handler": "runc-privileged"}),
    )
    .await?;
    create::<RuntimeClass>(
        &super_client,
        None,
        json!({"metadata": {"name": "sandboxed", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}},
            "handler": "runsc", "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}}}),
    )
    .await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(tenant, "apps", json!({})).await?;
    let copy = until(
        &Api::<RuntimeClass>::all(client.clone()),
        "sandboxed",
        "published RuntimeClass in the tenant",
        |rc| rc.is_some(),
    )
    .await?
    .context("the tenant's copy")?;
    assert_eq!(copy.handler, "runsc");
    // The attacker's own classes: the platform's privileged handler under a name of its own, and the
    // published handler with a tiny overhead.
    for (name, handler) in [
        ("platform-privileged", "runc-privileged"),
        ("mine", "runc-privileged"),
    ] {
        create::<RuntimeClass>(
            &client,
            None,
            json!({"metadata": {"name": name}, "handler": handler}),
        )
        .await?;
    }
    create::<RuntimeClass>(
        &client,
        None,
        json!({"metadata": {"name": "cheap-sandbox"}, "handler": "runsc", "overhead": {"podFixed": {"cpu": "1m"}}}),
    )
    .await?;
    let attacks = [
        (
            "by-name",
            "platform-privileged",
            "runtimeClassName \"platform-privileged\" (handler \"runc-privileged\"",
        ),
        (
            "by-handler",
            "mine",
            "runtimeClassName \"mine\" (handler \"runc-privileged\"",
        ),
    ];
    for (name, class, _) in &attacks {
        let mut object = pod(name);
        object["spec"]["runtimeClassName"] = json!(class);
        create::<Pod>(&client, Some("apps"), object).await?;
    }
    for (name, class) in [("published", "sandboxed"), ("own", "cheap-sandbox")] {
        let mut object = pod(name);
        object["spec"]["runtimeClassName"] = json!(class);
        create::<Pod>(&client, Some("apps"), object).await?;
    }
    for (name, _, says) in &attacks {
        let note = event(&client, "apps", name, "PodPolicyViolation", says).await?;
        assert!(note.contains("published: sandboxed (runsc)"), "{note}");
    }
    let super_pods = super_api::<Pod>(&tenancy, tenant, "apps");
    for name in ["published", "own"] {
        let copy = until(&super_pods, name, &format!("super copy of {name}"), |p| {
            p.is_some()
        })
        .await?
        .context("super pod")?;
        let spec = copy.spec.context("spec")?;
        assert_eq!(spec.runtime_class_name.as_deref(), Some("sandboxed"), "{name}");
        let overhead = spec.overhead.unwrap_or_default();
        assert_eq!(
            overhead.get("cpu").map(|q| q.0.as_str()),
            Some("250m"),
            "{name}: {overhead:?}"
        );
    }
    settle().await;
    for (name, _, _) in &attacks {
        assert!(
            super_pods.get_opt(name).await?.is_none(),
            "{name} reached the super cluster"
        );
    }
    Ok(())
}

/// The attack: leaving resources out of pods to run outside the quota, and creating or changing
/// Services and claims past the object quotas.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quotas_cannot_be_escaped() -> anyhow::Result<()> {
    if !local_cluster::require("quotas_cannot_be_escaped", NEEDS) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy(json!({"quota": {
        "limits.memory": "1Gi", "services": "4", "services.nodeports": "1", "services.loadbalancers": "0",
        "persistentvolumeclaims": "2", "requests.storage": "1Gi"}}))
    .await?;
    create::<StorageClass>(
        &tenancy.super_client(),
        None,
        json!({"metadata": {"name": "shared", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}},
            "provisioner": "example.com/none"}),
    )
    .await?;
    let tenant = tenancy.tenant("attacker");
    let client = tenant.client();
    seed(tenant, "apps", json!({})).await?;

    // Pods: a container without a memory limit would not count against limits.memory.
    let mut unlimited = pod("unlimited");
    unlimited["spec"]["initContainers"] = json!([{"name": "setup", "image": "busybox"}]);
    unlimited["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "100Mi"}});
    create::<Pod>(&client, Some("apps"), unlimited).await?;
    let mut limited = pod("limited");
    limited["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "100Mi"}});
    create::<Pod>(&client, Some("apps"), limited).await?;
    event(
        &client,
        "apps",
        "unlimited",
        "ResourcesRequired",
        "limits.memory of init container \"setup\"",
    )
    .await?;
    let super_pods = super_api::<Pod>(&tenancy, tenant, "apps");
    until(&super_pods, "limited", "the limited pod synced", |p| p.is_some()).await?;

    // Services: four (the tenant's own default/kubernetes Service is one of them), one node port, no
    // load balancer.
    let service = |name: &str, type_: &str| {
        json!({"metadata": {"name": name}, "spec": {"type": type_, "selector": {"app": name},
            "ports": [{"port": 80}]}})
    };
    let super_services = super_api::<Service>(&tenancy, tenant, "apps");
    let synced = |name: &str| {
        let name = name.to_owned();
        let api = super_services.clone();
        async move { until(&api, &name, &format!("Service {name} synced"), |s| s.is_some()).await }
    };
    for (name, type_) in [("a", "ClusterIP"), ("np-1", "NodePort")] {
        create::<Service>(&client, Some("apps"), service(name, type_)).await?;
        synced(name).await?;
    }
    let mut balancer = service("lb", "LoadBalancer");
    balancer["spec"]["allocateLoadBalancerNodePorts"] = json!(false);
    for object in [service("np-2", "NodePort"), balancer, service("c", "ClusterIP")] {
        create::<Service>(&client, Some("apps"), object).await?;
    }
    synced("c").await?;
    create::<Service>(&client, Some("apps"), service("d", "ClusterIP")).await?;
    for (name, says) in [
        ("np-2", "tenant quota services.nodeports exceeded"),
        ("lb", "tenant quota services.loadbalancers exceeded"),
        ("d", "tenant quota services exceeded"),
    ] {
        event(&client, "apps", name, "TenantQuotaExceeded", says).await?;
    }
    // Changing a counted ClusterIP Service into a NodePort one is refused the same way; its copy stays.
    Api::<Service>::namespaced(client.clone(), "apps")
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "NodePort"}})),
        )
        .await?;
    event(
        &client,
        "apps",
        "a",
        "TenantQuotaExceeded",
        "tenant quota services.nodeports exceeded",
    )
    .await?;

    // Claims: two, 1Gi in all.
    let claim = |name: &str, size: &str| {
        json!({"metadata": {"name": name}, "spec": {"storageClassName": "shared", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}}}})
    };
    create::<PersistentVolumeClaim>(&client, Some("apps"), claim("small", "600Mi")).await?;
    let super_claims = super_api::<PersistentVolumeClaim>(&tenancy, tenant, "apps");
    until(&super_claims, "small", "claim small synced", |c| c.is_some()).await?;
    create::<PersistentVolumeClaim>(&client, Some("apps"), claim("big", "600Mi")).await?;
    event(
        &client,
        "apps",
        "big",
        "TenantQuotaExceeded",
        "tenant quota requests.storage exceeded",
    )
    .await?;

    settle().await;
    for name in ["np-2", "lb", "d"] {
        assert!(
            super_services.get_opt(name).await?.is_none(),
            "{name} reached the super cluster"
        );
    }
    let a = super_services.get("a").await?;
    assert_eq!(
        a.spec.and_then(|s| s.type_).as_deref(),
        Some("ClusterIP"),
        "the refused change reached the super cluster"
    );
    assert!(super_pods.get_opt("unlimited").await?.is_none());
    assert!(super_claims.get_opt("big").await?.is_none());

    // Room freed: without a and np-1, the refused NodePort Service and the fourth Service fit; the load
    // balancer still does not.
    for name in ["a", "np-1"] {
        Api::<Service>::namespaced(client.clone(), "apps")
            .delete(name, &DeleteParams::default())
            .await?;
    }
    synced("np-2").await?;
    synced("d").await?;
    settle().await;
    assert!(super_services.get_opt("lb").await?.is_none());
    Ok(())
}
