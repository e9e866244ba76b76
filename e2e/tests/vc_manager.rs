//! vc-manager on a real super cluster (kube-apiserver, etcd, kube-controller-manager; StatefulSet pods run
//! on simulated nodes): a provisioned tenant reaches Running with every object and certificate in place,
//! deleted or edited children come back, an upgrade keeps the CA and service-account key, a ClusterVersion
//! in use cannot be deleted, deletion leaves nothing behind, and two replicas elect one leader.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::vc_manager_support::*;
use anyhow::Context as _;
use crds::{
    ClusterPhase, ClusterVersion, VirtualCluster, VirtualClusterSpec,
    wellknown::{
        CONDITION_APISERVER_READY, CONDITION_CONTROLLER_MANAGER_READY, CONDITION_ETCD_READY,
        CONDITION_PKI_READY, CONDITION_READY,
    },
};
use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    coordination::v1::Lease,
    core::v1::{Namespace, Secret, Service},
    events::v1::Event,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, NodeSimulator, NodeSimulatorOptions, apply, wait,
};
use vc_manager::LeaderElection;

const TENANTS: &str = "tenants";
const CV_CLUSTER_IP: &str = "cv-v1-33-clusterip";
const CV_NODE_PORT: &str = "cv-v1-33-nodeport";

fn example(path: &str) -> String {
    let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

async fn create_namespace(
    client: &Client,
    name: &str,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;
    Ok(())
}

fn virtual_cluster(name: &str, cluster_version: &str) -> VirtualCluster {
    let mut vc = VirtualCluster::new(
        name,
        VirtualClusterSpec {
            cluster_version_name: Some(cluster_version.into()),
            service_cidr: Some("10.32.0.0/16".into()),
            pki_expire_days: 90,
            ..Default::default()
        },
    );
    vc.metadata.labels = Some(
        [(
            crds::wellknown::LABEL_EXTERNAL_APISERVER_DOMAIN.to_owned(),
            format!("{name}.tenants.example.com"),
        )]
        .into(),
    );
    vc
}

fn running(vc: &VirtualCluster) -> bool {
    phase_is(vc, ClusterPhase::Running)
        && vc.status.as_ref().and_then(|s| s.observed_generation) == vc.metadata.generation
}

/// Every phase the VirtualCluster goes through, as seen by a watch.
fn record_phases(
    api: Api<VirtualCluster>,
    name: &str,
) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let phases = Arc::new(Mutex::new(Vec::new()));
    let seen = phases.clone();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, config).default_backoff().applied_objects().boxed();
        // A watch error (a timed-out or expired watch) is retried by the backoff; stopping at the first
        // one would leave the record silently empty.
        while let Some(event) = stream.next().await {
            let Ok(vc) = event else { continue };
            let phase = vc.phase().map(|p| p.to_string()).unwrap_or_default();
            let mut seen = seen.lock().expect("lock");
            if seen.last() != Some(&phase) {
                seen.push(phase);
            }
        }
    });
    (phases, task)
}

async fn secrets_of(client: &Client, namespace: &str) -> anyhow::Result<BTreeMap<String, Secret>> {
    Ok(Api::<Secret>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|s| (s.name_any(), s))
        .collect())
}

/// The Secrets of a running tenant: exactly the architecture table, with valid certificates for their
/// names.
async fn check_pki(client: &Client, root: &str, cluster_ip: &str, vc_name: &str) -> anyhow::Result<()> {
    let secrets = secrets_of(client, root).await?;
    let expected: [(&str, &[&str]); 12] = [
        ("root-ca", &["tls.crt", "tls.key"]),
        ("apiserver-ca", &["ca.crt", "tls.crt", "tls.key"]),
        ("etcd-ca", &["tls.crt", "tls.key"]),
        ("etcd-server", &["ca.crt", "tls.crt", "tls.key"]),
        ("etcd-client", &["ca.crt", "tls.crt", "tls.key"]),
        ("front-proxy-ca", &["tls.crt", "tls.key"]),
        ("front-proxy-client", &["ca.crt", "tls.crt", "tls.key"]),
        ("serviceaccount-rsa", &["tls.crt", "tls.key"]),
        ("kubelet-client-ca", &["tls.crt", "tls.key"]),
        ("kubelet-client", &["ca.crt", "tls.crt", "tls.key"]),
        ("admin-kubeconfig", &["admin-kubeconfig"]),
        (
            "controller-manager-kubeconfig",
            &["controller-manager-kubeconfig"],
        ),
    ];
    for (name, keys) in expected {
        let secret = secrets.get(name).with_context(|| format!("Secret {name}"))?;
        let have: Vec<&str> = secret
            .data
            .as_ref()
            .context("data")?
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(have, keys, "keys of {name}");
        assert_eq!(secret.labels()["app.kubernetes.io/managed-by"], "vc-manager");
        assert_eq!(secret.annotations()["tenancy.x-k8s.io/cluster"], root);
    }
    let text = |name: &str, key: &str| secret_text(&secrets[name], key);
    let root_ca = text("root-ca", "tls.crt")?;

    // The apiserver serving certificate, for every name the tenant's clients use.
    let serving = text("apiserver-ca", "tls.crt")?;
    assert_eq!(text("apiserver-ca", "ca.crt")?, root_ca);
    for name in [
        "apiserver-svc".to_owned(),
        format!("apiserver-svc.{root}"),
        format!("apiserver-svc.{root}.svc"),
        format!("apiserver-svc.{root}.svc.cluster.local"),
        "kubernetes.default.svc.cluster.local".to_owned(),
        format!("{vc_name}.tenants.example.com"),
        cluster_ip.to_owned(),
        "10.32.0.1".to_owned(),
        "127.0.0.1".to_owned(),
    ] {
        verify_server_certificate(&serving, &root_ca, &name)?;
    }
    assert!(verify_server_certificate(&serving, &root_ca, "elsewhere.example.com").is_err());
    assert!(verify_server_certificate(&serving, &text("etcd-ca", "tls.crt")?, "apiserver-svc").is_err());

    // etcd: members under the peer Service, the client Service; the apiserver's client certificate.
    let etcd_ca = text("etcd-ca", "tls.crt")?;
    for name in [
        "etcd-0.etcd".to_owned(),
        format!("etcd.{root}.svc"),
        format!("etcd-0.etcd.{root}.svc.cluster.local"),
    ] {
        verify_server_certificate(&text("etcd-server", "tls.crt")?, &etcd_ca, &name)?;
    }
    verify_client_certificate(&text("etcd-server", "tls.crt")?, &etcd_ca)?;
    verify_client_certificate(&text("etcd-client", "tls.crt")?, &etcd_ca)?;
    verify_client_certificate(
        &text("front-proxy-client", "tls.crt")?,
        &text("front-proxy-ca", "tls.crt")?,
    )?;
    assert_eq!(
        subject(&text("front-proxy-client", "tls.crt")?)?.0,
        "front-proxy-client"
    );

    // The kubelet-client certificate vn-agent checks: CN = cluster key, from the tenant's own CA.
    let kubelet_client = &secrets["kubelet-client"];
    assert_eq!(kubelet_client.labels()["tenancy.x-k8s.io/kubelet-client"], "true");
    for key in [
        "tenancy.x-k8s.io/vcname",
        "tenancy.x-k8s.io/vcnamespace",
        "tenancy.x-k8s.io/vcuid",
    ] {
        assert!(kubelet_client.annotations().contains_key(key), "{key}");
    }
    assert_eq!(
        text("kubelet-client", "ca.crt")?,
        text("kubelet-client-ca", "tls.crt")?
    );
    verify_client_certificate(
        &text("kubelet-client", "tls.crt")?,
        &text("kubelet-client", "ca.crt")?,
    )?;
    assert_eq!(subject(&text("kubelet-client", "tls.crt")?)?.0, root);

    // Kubeconfigs: cluster-admin and the controller-manager, on the apiserver Service, trusting the root CA.
    let (admin_cert, _, server) = kubeconfig_client(&text("admin-kubeconfig", "admin-kubeconfig")?)?;
    assert_eq!(server, format!("https://apiserver-svc.{root}.svc:6443"));
    verify_client_certificate(&admin_cert, &root_ca)?;
    assert_eq!(subject(&admin_cert)?.1, ["system:masters"]);
    let (manager_cert, _, _) = kubeconfig_client(&text(
        "controller-manager-kubeconfig",
        "controller-manager-kubeconfig",
    )?)?;
    assert_eq!(subject(&manager_cert)?.0, "system:kube-controller-manager");
    assert!(text("serviceaccount-rsa", "tls.crt")?.starts_with("-----BEGIN PUBLIC KEY-----"));
    Ok(())
}

async fn statefulset(client: &Client, namespace: &str, name: &str) -> anyhow::Result<StatefulSet> {
    Ok(Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get(name)
        .await?)
}

fn container_image(sts: &StatefulSet) -> String {
    sts.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers[0].image.clone())
        .unwrap_or_default()
}

fn container_args(sts: &StatefulSet) -> Vec<String> {
    sts.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers[0].args.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn native_tenant_runs_heals_upgrades_and_leaves_nothing_behind() -> anyhow::Result<()> {
    if !local_cluster::require(
        "native_tenant_runs_heals_upgrades_and_leaves_nothing_behind",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager],
    ) {
        return Ok(());
    }
    // A long scenario: its future lives on the heap, not on the test thread's stack.
    Box::pin(native_lifecycle()).await
}

async fn native_lifecycle() -> anyhow::Result<()> {
    init_logging();
    let started = std::time::Instant::now();
    let cluster = ControlPlane::start(ControlPlaneOptions::super_cluster()).await?;
    let client = cluster.client();
    local_cluster::install_crds(&client).await?;
    let _nodes = NodeSimulator::start(
        &cluster,
        NodeSimulatorOptions {
            kubelet: false,
            ..Default::default()
        },
    )
    .await?;
    for file in [
        "examples/clusterversion-clusterip.yaml",
        "examples/clusterversion-nodeport.yaml",
    ] {
        apply::apply_yaml(&client, &example(file), "default").await?;
    }
    create_namespace(&client, TENANTS, BTreeMap::new(), BTreeMap::new()).await?;
    let manager = RunningManager::start(client.clone(), fast_settings(), None).await?;

    // Provisioning.
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), TENANTS);
    let (phases, _watch) = record_phases(vcs.clone(), "alpha");
    vcs.create(&PostParams::default(), &virtual_cluster("alpha", CV_CLUSTER_IP))
        .await?;
    let vc = wait_vc(&vcs, "alpha", Duration::from_secs(120), "Running", running).await?;
    let provisioned_in = started.elapsed();
    let root = crds::naming::cluster_key_of(&vc).context("cluster key")?;
    let status = vc.status.clone().context("status")?;
    assert_eq!(status.cluster_namespace.as_deref(), Some(root.as_str()));
    for type_ in [
        CONDITION_PKI_READY,
        CONDITION_ETCD_READY,
        CONDITION_APISERVER_READY,
        CONDITION_CONTROLLER_MANAGER_READY,
        CONDITION_READY,
    ] {
        let c = condition(&vc, type_).with_context(|| format!("condition {type_}"))?;
        assert_eq!(c.status, "True", "{type_}: {c:?}");
    }
    assert!(
        vc.finalizers()
            .contains(&crds::wellknown::FINALIZER_VIRTUAL_CLUSTER.to_owned())
    );

    // The root namespace and its contents.
    let namespace = Api::<Namespace>::all(client.clone()).get(&root).await?;
    let annotations = namespace.annotations();
    assert_eq!(annotations["tenancy.x-k8s.io/vcname"], "alpha");
    assert_eq!(annotations["tenancy.x-k8s.io/vcnamespace"], TENANTS);
    assert_eq!(annotations["tenancy.x-k8s.io/vcuid"], vc.uid().context("uid")?);
    assert_eq!(annotations["tenancy.x-k8s.io/vcrootns"], "true");
    assert_eq!(annotations["tenancy.x-k8s.io/cluster"], root);
    assert_eq!(namespace.labels()["app.kubernetes.io/managed-by"], "vc-manager");
    let apiserver_service = Api::<Service>::namespaced(client.clone(), &root)
        .get("apiserver-svc")
        .await?;
    let cluster_ip = apiserver_service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .context("cluster IP")?;
    Api::<Service>::namespaced(client.clone(), &root)
        .get("etcd")
        .await?;
    check_pki(&client, &root, &cluster_ip, "alpha").await?;
    for (name, component) in [
        ("etcd", "etcd"),
        ("apiserver", "apiserver"),
        ("controller-manager", "controller-manager"),
    ] {
        let sts = statefulset(&client, &root, name).await?;
        assert_eq!(sts.labels()["app.kubernetes.io/component"], component);
        assert_eq!(
            sts.annotations()["tenancy.x-k8s.io/cluster-version"],
            CV_CLUSTER_IP
        );
        let pod_annotations = sts
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default();
        assert!(
            pod_annotations
                .keys()
                .any(|k| k.starts_with("checksum.tenancy.x-k8s.io/")),
            "{name}: {pod_annotations:?}"
        );
        assert_eq!(
            sts.status.as_ref().and_then(|s| s.ready_replicas),
            Some(1),
            "{name}"
        );
    }
    let etcd = statefulset(&client, &root, "etcd").await?;
    assert!(container_args(&etcd).contains(&"--initial-cluster=etcd-0=https://etcd-0.etcd:2380".to_owned()));
    let apiserver = statefulset(&client, &root, "apiserver").await?;
    assert!(container_args(&apiserver).contains(&"--service-cluster-ip-range=10.32.0.0/16".to_owned()));

    // The ClusterVersion lists its user.
    let cvs: Api<ClusterVersion> = Api::all(client.clone());
    wait::until_true(Duration::from_secs(30), "ClusterVersion lists alpha", || {
        let cvs = cvs.clone();
        async move {
            cvs.get(CV_CLUSTER_IP)
                .await
                .ok()
                .and_then(|cv| cv.status)
                .is_some_and(|s| {
                    s.virtual_cluster_count == Some(1)
                        && s.virtual_clusters
                            .iter()
                            .any(|u| u.name == "alpha" && u.namespace == TENANTS)
                })
        }
    })
    .await?;

    // Metrics and health.
    let (code, _) = manager.admin_get("/readyz").await?;
    assert_eq!(code, 200);
    assert_eq!(manager.admin_get("/healthz").await?.0, 200);
    let (_, metrics) = manager.admin_get("/metrics").await?;
    assert!(
        metrics.contains("vc_manager_virtual_clusters{phase=\"Running\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "vc_manager_certificate_expiry_seconds{{namespace=\"{TENANTS}\",name=\"alpha\",secret=\"apiserver-ca\"}}"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("vc_manager_reconcile_total{controller=\"virtualcluster\",result=\"success\"}"));
    assert!(metrics.contains("vc_manager_reconcile_duration_seconds_bucket"));

    // Drift: a deleted StatefulSet comes back.
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), &root);
    let old_uid = sts_api.get("apiserver").await?.uid();
    sts_api.delete("apiserver", &DeleteParams::default()).await?;
    wait::until_true(Duration::from_secs(60), "apiserver StatefulSet restored", || {
        let api = sts_api.clone();
        let old_uid = old_uid.clone();
        async move {
            api.get_opt("apiserver")
                .await
                .ok()
                .flatten()
                .is_some_and(|s| s.uid() != old_uid)
        }
    })
    .await?;
    wait_vc(
        &vcs,
        "alpha",
        Duration::from_secs(60),
        "Running after restore",
        running,
    )
    .await?;

    // Drift: an edited StatefulSet is put back.
    let original_image = container_image(&sts_api.get("etcd").await?);
    let edit = serde_json::json!({"spec": {"template": {"spec": {"containers": [{"name": "etcd", "image": "tampered:1"}]}}}});
    sts_api
        .patch("etcd", &PatchParams::default(), &Patch::Strategic(&edit))
        .await?;
    wait::until_true(Duration::from_secs(60), "etcd image restored", || {
        let api = sts_api.clone();
        let image = original_image.clone();
        async move { api.get("etcd").await.is_ok_and(|s| container_image(&s) == image) }
    })
    .await?;

    // Drift: a deleted Secret comes back from the same CA.
    let before = secrets_of(&client, &root).await?;
    Api::<Secret>::namespaced(client.clone(), &root)
        .delete("etcd-client", &DeleteParams::default())
        .await?;
    wait::until_true(Duration::from_secs(60), "etcd-client restored", || {
        let client = client.clone();
        let root = root.clone();
        async move {
            secrets_of(&client, &root)
                .await
                .is_ok_and(|s| s.contains_key("etcd-client"))
        }
    })
    .await?;
    let after = secrets_of(&client, &root).await?;
    assert_eq!(
        after["etcd-ca"].data, before["etcd-ca"].data,
        "the etcd CA is reused"
    );
    verify_client_certificate(
        &secret_text(&after["etcd-client"], "tls.crt")?,
        &secret_text(&before["etcd-ca"], "tls.crt")?,
    )?;
    wait_vc(
        &vcs,
        "alpha",
        Duration::from_secs(60),
        "Running after the Secret",
        running,
    )
    .await?;

    // Upgrade: a changed ClusterVersion rolls the control plane; CA and service-account key stay.
    let keys_before = secrets_of(&client, &root).await?;
    phases.lock().expect("lock").clear();
    let new_image = "registry.k8s.io/kube-apiserver:v1.33.6";
    let mut cv = cvs.get(CV_CLUSTER_IP).await?;
    if let Some(pod) = cv
        .spec
        .api_server
        .statefulset
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
    {
        pod.containers[0].image = Some(new_image.into());
    }
    cv.metadata.managed_fields = None;
    cvs.replace(CV_CLUSTER_IP, &PostParams::default(), &cv).await?;
    wait::until_true(
        Duration::from_secs(60),
        "apiserver rolled to the new image",
        || {
            let api = sts_api.clone();
            async move {
                api.get("apiserver").await.is_ok_and(|s| {
                    container_image(&s) == new_image
                        && s.status
                            .as_ref()
                            .is_some_and(|st| st.updated_replicas == Some(1) && st.ready_replicas == Some(1))
                })
            }
        },
    )
    .await?;
    wait_vc(
        &vcs,
        "alpha",
        Duration::from_secs(60),
        "Running after the upgrade",
        running,
    )
    .await?;
    // The tenant stays usable through the upgrade: Updating while vc-manager sees the roll (on simulated
    // nodes the new pod can be ready before its next status pass, so it may see none), never Pending or
    // Error.
    let seen = phases.lock().expect("lock").clone();
    assert!(
        seen.iter().all(|p| p == "Running" || p == "Updating"),
        "phases during the upgrade: {seen:?}"
    );
    let keys_after = secrets_of(&client, &root).await?;
    for name in [
        "serviceaccount-rsa",
        "root-ca",
        "etcd-ca",
        "front-proxy-ca",
        "kubelet-client-ca",
    ] {
        assert_eq!(
            keys_after[name].data, keys_before[name].data,
            "{name} kept across the upgrade"
        );
    }

    // Upgrade: another clusterVersionName (NodePort apiserver), same keys.
    let switch = serde_json::json!({"spec": {"clusterVersionName": CV_NODE_PORT}});
    vcs.patch("alpha", &PatchParams::default(), &Patch::Merge(&switch))
        .await?;
    wait::until_true(
        Duration::from_secs(60),
        "apiserver Service became NodePort",
        || {
            let api = Api::<Service>::namespaced(client.clone(), &root);
            async move {
                api.get("apiserver-svc")
                    .await
                    .is_ok_and(|s| s.spec.and_then(|s| s.type_).as_deref() == Some("NodePort"))
            }
        },
    )
    .await?;
    let vc = wait_vc(
        &vcs,
        "alpha",
        Duration::from_secs(60),
        "Running on the new ClusterVersion",
        |vc| running(vc) && vc.status.as_ref().and_then(|s| s.observed_generation) == Some(2),
    )
    .await?;
    assert_eq!(
        statefulset(&client, &root, "apiserver").await?.annotations()["tenancy.x-k8s.io/cluster-version"],
        CV_NODE_PORT
    );
    let keys_after = secrets_of(&client, &root).await?;
    assert_eq!(
        keys_after["serviceaccount-rsa"].data,
        keys_before["serviceaccount-rsa"].data
    );
    assert_eq!(keys_after["root-ca"].data, keys_before["root-ca"].data);

    // A ClusterVersion in use cannot be deleted; an unused one can.
    wait::until_true(
        Duration::from_secs(30),
        "the old ClusterVersion has no users",
        || {
            let cvs = cvs.clone();
            async move {
                cvs.get(CV_CLUSTER_IP)
                    .await
                    .ok()
                    .and_then(|cv| cv.status)
                    .is_some_and(|s| s.virtual_cluster_count == Some(0))
            }
        },
    )
    .await?;
    cvs.delete(CV_CLUSTER_IP, &DeleteParams::default()).await?;
    wait::until_true(Duration::from_secs(30), "unused ClusterVersion deleted", || {
        let cvs = cvs.clone();
        async move { cvs.get_opt(CV_CLUSTER_IP).await.is_ok_and(|cv| cv.is_none()) }
    })
    .await?;
    cvs.delete(CV_NODE_PORT, &DeleteParams::default()).await?;
    let blocked = wait::until(Duration::from_secs(30), "deletion blocked", || {
        let cvs = cvs.clone();
        async move {
            let cv = cvs.get(CV_NODE_PORT).await.ok()?;
            let condition = cv
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == "InUse")?
                .clone();
            (cv.metadata.deletion_timestamp.is_some() && condition.reason == "DeletionBlocked")
                .then_some(condition)
        }
    })
    .await?;
    assert!(
        blocked.message.contains(&format!("{TENANTS}/alpha")),
        "{}",
        blocked.message
    );
    // vc-manager writes the condition first and the event after it: wait for the event, not just look.
    let events = Api::<Event>::namespaced(client.clone(), "default");
    wait::until_true(Duration::from_secs(30), "DeletionBlocked event", || {
        let events = events.clone();
        async move {
            events.list(&ListParams::default()).await.is_ok_and(|list| {
                list.items.iter().any(|e| {
                    e.reason.as_deref() == Some("DeletionBlocked")
                        && e.note.as_deref().is_some_and(|n| n.contains("tenants/alpha"))
                })
            })
        }
    })
    .await?;

    // Events tell the story.
    let events = Api::<Event>::namespaced(client.clone(), TENANTS)
        .list(&ListParams::default())
        .await?;
    let reasons: Vec<&str> = events.items.iter().filter_map(|e| e.reason.as_deref()).collect();
    for reason in [
        "Provisioning",
        "CertificatesIssued",
        "EtcdCreated",
        "APIServerCreated",
        "ControllerManagerCreated",
        "Running",
        "APIServerRestored",
        "Upgrading",
    ] {
        assert!(reasons.contains(&reason), "event {reason} in {reasons:?}");
    }

    // Deletion: the root namespace and the syncer's tenant namespaces go, and only those.
    let uid = vc.uid().context("uid")?;
    let syncer_labels: BTreeMap<String, String> = [
        ("tenancy.x-k8s.io/vcname".to_owned(), "alpha".to_owned()),
        ("tenancy.x-k8s.io/vcnamespace".to_owned(), TENANTS.to_owned()),
    ]
    .into();
    let tenant_namespace = crds::naming::super_namespace(&root, "default");
    create_namespace(
        &client,
        &tenant_namespace,
        syncer_labels.clone(),
        // As the syncer annotates its namespaces: the tenant and the tenant namespace.
        [
            ("tenancy.x-k8s.io/cluster".to_owned(), root.clone()),
            ("tenancy.x-k8s.io/namespace".to_owned(), "default".to_owned()),
        ]
        .into(),
    )
    .await?;
    let earlier_incarnation = crds::naming::super_namespace(
        &crds::naming::cluster_key(TENANTS, "an-old-uid", "alpha"),
        "default",
    );
    create_namespace(
        &client,
        &earlier_incarnation,
        syncer_labels,
        [
            (
                "tenancy.x-k8s.io/cluster".to_owned(),
                crds::naming::cluster_key(TENANTS, "an-old-uid", "alpha"),
            ),
            ("tenancy.x-k8s.io/namespace".to_owned(), "default".to_owned()),
        ]
        .into(),
    )
    .await?;
    vcs.delete("alpha", &DeleteParams::default()).await?;
    wait::until_true(Duration::from_secs(120), "VirtualCluster alpha gone", || {
        let vcs = vcs.clone();
        async move { vcs.get_opt("alpha").await.is_ok_and(|v| v.is_none()) }
    })
    .await?;
    let namespaces = Api::<Namespace>::all(client.clone());
    assert!(namespaces.get_opt(&root).await?.is_none(), "root namespace gone");
    assert!(
        namespaces.get_opt(&tenant_namespace).await?.is_none(),
        "tenant namespace gone"
    );
    assert!(
        namespaces.get_opt(&earlier_incarnation).await?.is_some(),
        "another incarnation's namespace stays"
    );
    let managed = ListParams::default().labels("app.kubernetes.io/managed-by=vc-manager");
    assert!(
        Api::<StatefulSet>::all(client.clone())
            .list(&managed)
            .await?
            .items
            .is_empty()
    );
    assert!(
        Api::<Secret>::all(client.clone())
            .list(&managed)
            .await?
            .items
            .is_empty()
    );
    assert!(
        Api::<Service>::all(client.clone())
            .list(&managed)
            .await?
            .items
            .is_empty()
    );
    assert!(namespaces.list(&managed).await?.items.is_empty());
    assert!(
        namespaces
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .all(|n| n.annotations().get("tenancy.x-k8s.io/vcuid") != Some(&uid)),
        "no namespace of the deleted tenant"
    );
    // Its last user gone, the ClusterVersion is released.
    wait::until_true(
        Duration::from_secs(30),
        "ClusterVersion deleted after its last user",
        || {
            let cvs = cvs.clone();
            async move { cvs.get_opt(CV_NODE_PORT).await.is_ok_and(|cv| cv.is_none()) }
        },
    )
    .await?;
    let (_, metrics) = manager.admin_get("/metrics").await?;
    assert!(
        !metrics.contains("name=\"alpha\",secret="),
        "expiry series of a deleted tenant are dropped"
    );
    manager.stop().await?;
    eprintln!(
        "native tenant: Running {:.1} s after the super cluster started; whole test {:.1} s",
        provisioned_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_fail_over() -> anyhow::Result<()> {
    if !local_cluster::require(
        "two_replicas_elect_one_leader_and_fail_over",
        &[Binary::Etcd, Binary::KubeApiserver],
    ) {
        return Ok(());
    }
    Box::pin(leader_election()).await
}

async fn leader_election() -> anyhow::Result<()> {
    init_logging();
    let cluster = ControlPlane::start(ControlPlaneOptions::bare("leader-election")).await?;
    let client = cluster.client();
    local_cluster::install_crds(&client).await?;
    let election = |identity: &str| LeaderElection {
        namespace: "default".into(),
        lease_duration: Duration::from_secs(3),
        identity: Some(identity.into()),
    };
    let a = RunningManager::start(client.clone(), fast_settings(), Some(election("replica-a"))).await?;
    let b = RunningManager::start(client.clone(), fast_settings(), Some(election("replica-b"))).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = wait::until(Duration::from_secs(30), "Lease vc-manager held", || {
        let leases = leases.clone();
        async move { leases.get("vc-manager").await.ok()?.spec?.holder_identity }
    })
    .await?;
    // Both keep warm caches and are ready; exactly one leads.
    for replica in [&a, &b] {
        wait::until_true(Duration::from_secs(30), "replica ready", || async move {
            replica
                .admin_get("/readyz")
                .await
                .is_ok_and(|(code, _)| code == 200)
        })
        .await?;
    }
    let leading = |replica: &RunningManager| {
        let admin = replica.admin;
        async move {
            let (_, metrics) = crate::vc_manager_support::http_get(admin.expect("admin"), "/metrics")
                .await
                .unwrap_or_default();
            metrics.lines().any(|line| line == "vc_manager_leader 1")
        }
    };
    let (leader, standby, standby_identity) = if holder == "replica-a" {
        (a, b, "replica-b")
    } else {
        (b, a, "replica-a")
    };
    wait::until_true(Duration::from_secs(30), "the Lease holder leads", || {
        leading(&leader)
    })
    .await?;
    assert!(!leading(&standby).await, "exactly one replica leads");

    // The leader reconciles: a new ClusterVersion gets its finalizer.
    let cvs: Api<ClusterVersion> = Api::all(client.clone());
    let mut first: ClusterVersion =
        serde_saphyr::from_str(&example("examples/clusterversion-clusterip.yaml"))?;
    first.metadata.name = Some("cv-first".into());
    cvs.create(&PostParams::default(), &first).await?;
    let guarded = |name: &'static str| {
        let cvs = cvs.clone();
        async move {
            cvs.get(name).await.is_ok_and(|cv| {
                cv.finalizers()
                    .contains(&crds::wellknown::FINALIZER_CLUSTER_VERSION.to_owned())
            })
        }
    };
    wait::until_true(Duration::from_secs(30), "cv-first guarded", || {
        guarded("cv-first")
    })
    .await?;
    assert_eq!(
        standby.metrics.reconcile_count("clusterversion", "success"),
        0,
        "the standby does not reconcile"
    );

    // The leader stops; the standby takes over within the lease duration and reconciles everything.
    leader.stop().await?;
    wait::until_true(Duration::from_secs(30), "standby holds the Lease", || {
        let leases = leases.clone();
        async move {
            leases
                .get("vc-manager")
                .await
                .ok()
                .and_then(|l| l.spec?.holder_identity)
                .as_deref()
                == Some(standby_identity)
        }
    })
    .await?;
    let mut second = first.clone();
    second.metadata = ObjectMeta {
        name: Some("cv-second".into()),
        ..Default::default()
    };
    cvs.create(&PostParams::default(), &second).await?;
    wait::until_true(
        Duration::from_secs(30),
        "cv-second guarded by the new leader",
        || guarded("cv-second"),
    )
    .await?;
    assert!(leading(&standby).await);
    assert!(standby.metrics.reconcile_count("clusterversion", "success") > 0);
    standby.stop().await?;
    Ok(())
}
