//! The test tenant, for the mocked-apiserver tests of vc-manager and of `kubectl vc` (feature `fixtures`):
//! one native VirtualCluster, its ClusterVersion (the `examples/` ClusterIP one), its network and a valid
//! set of its Secrets, planned by [`crate::secrets::plan`].

use std::collections::BTreeMap;

use crds::{ClusterPhase, ClusterVersion, VirtualCluster, VirtualClusterSpec, VirtualClusterStatus};
use k8s_openapi::{
    api::core::v1::Secret,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

use crds::TenantIdentity;

use crate::secrets::{self, ApiServerEndpoint, Lifetimes, Network, PkiInput, Scope};

/// Namespace of the test VirtualCluster.
pub const VC_NAMESPACE: &str = "team";
/// Name of the test VirtualCluster.
pub const VC_NAME: &str = "vc-1";
/// Uid of the test VirtualCluster.
pub const VC_UID: &str = "0b5c7f59-1111-4a4a-9c9c-123456789abc";
/// The ClusterVersion the test VirtualCluster uses.
pub const CV_NAME: &str = "cv-v1-33-clusterip";

/// The cluster key (root namespace) of the test VirtualCluster.
pub fn root() -> String {
    crds::naming::cluster_key(VC_NAMESPACE, VC_UID, VC_NAME)
}

/// The test VirtualCluster (native), with finalizer, generation 2.
pub fn native_vc() -> VirtualCluster {
    let mut vc = VirtualCluster::new(
        VC_NAME,
        VirtualClusterSpec {
            cluster_version_name: Some(CV_NAME.into()),
            service_cidr: Some("10.32.0.0/16".into()),
            ..Default::default()
        },
    );
    vc.metadata.namespace = Some(VC_NAMESPACE.into());
    vc.metadata.uid = Some(VC_UID.into());
    vc.metadata.generation = Some(2);
    vc.metadata.resource_version = Some("100".into());
    vc.metadata.finalizers = Some(vec![crds::wellknown::FINALIZER_VIRTUAL_CLUSTER.into()]);
    vc
}

/// The VirtualCluster as it is once Running with every condition true.
pub fn running(mut vc: VirtualCluster) -> VirtualCluster {
    let owned: &[&str] = match vc.adoption() {
        Some(_) => &crds::wellknown::ADOPTED_CONDITIONS,
        None => &crds::wellknown::NATIVE_CONDITIONS,
    };
    let conditions = owned
        .iter()
        .map(|type_| Condition {
            type_: (*type_).into(),
            status: "True".into(),
            reason: "Fine".into(),
            message: "fine".into(),
            observed_generation: Some(2),
            last_transition_time: Time(Timestamp::from_second(1_700_000_000).expect("time")),
        })
        .collect();
    vc.status = Some(VirtualClusterStatus {
        phase: Some(ClusterPhase::Running),
        cluster_namespace: Some(root()),
        conditions,
        observed_generation: Some(2),
        ..Default::default()
    });
    vc
}

/// The ClusterVersion example with the ClusterIP apiserver.
pub fn cluster_version() -> ClusterVersion {
    let path = format!(
        "{}/../examples/clusterversion-clusterip.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut cv: ClusterVersion =
        serde_saphyr::from_str(&std::fs::read_to_string(path).expect("example")).expect("ClusterVersion");
    cv.metadata.generation = Some(1);
    cv.metadata.resource_version = Some("7".into());
    cv.metadata.uid = Some("cv-uid".into());
    cv
}

/// A complete, valid set of Secrets for the test VirtualCluster (as a previous reconcile left them).
pub fn stored_secrets(scope: &Scope) -> Vec<Secret> {
    let identity = TenantIdentity::of(&native_vc()).expect("identity");
    let plan = secrets::plan(
        &BTreeMap::new(),
        &PkiInput {
            identity: &identity,
            lifetimes: Lifetimes::for_days(365),
            now: Timestamp::now().as_second(),
            scope,
        },
    )
    .expect("plan");
    plan.secrets.into_iter().map(|p| p.secret).collect()
}

/// The network the test ClusterVersion gives when the apiserver Service gets `10.96.0.50`.
pub fn network() -> Network {
    Network {
        apiserver: ApiServerEndpoint {
            service: "apiserver-svc".into(),
            port: 6443,
        },
        apiserver_ips: vec!["10.96.0.50".parse().expect("ip")],
        apiserver_hostnames: vec![],
        etcd_service: "etcd".into(),
        etcd_peer_service: "etcd".into(),
        etcd_members: vec!["etcd-0".into()],
        cluster_domain: "cluster.local".into(),
        super_cluster_domain: "cluster.local".into(),
        tenant_service_ips: vec!["10.32.0.1".parse().expect("ip")],
    }
}
