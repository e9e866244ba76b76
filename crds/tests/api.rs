//! The API types against the committed YAML: generated CRDs, examples, and the original project's shape.

use std::path::PathBuf;

use crds::{ClusterVersion, VirtualCluster, v1alpha1::Adoption};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

#[test]
fn committed_crd_yaml_matches_the_rust_types() {
    let drifted = crds::generate::drifted(
        &workspace().join(crds::generate::YAML_DIR),
        crds::generate::Form::Plain,
    )
    .expect("comparing");
    assert!(
        drifted.is_empty(),
        "stale CRD YAML {drifted:?}: run `cargo run -p crds --bin crdgen`"
    );
}

#[test]
fn examples_parse_into_the_api_types() {
    for file in [
        "examples/clusterversion-nodeport.yaml",
        "examples/clusterversion-clusterip.yaml",
    ] {
        let cv: ClusterVersion = serde_saphyr::from_str(&read(file)).expect(file);
        let sts = cv.spec.etcd.statefulset.spec.expect("etcd statefulset spec");
        assert_eq!(sts.replicas, Some(1), "{file}");
        assert!(cv.spec.api_server.service.is_some(), "{file}");
    }
    let native: VirtualCluster =
        serde_saphyr::from_str(&read("examples/virtualcluster-native.yaml")).expect("native");
    assert_eq!(
        native.spec.cluster_version_name.as_deref(),
        Some("cv-v1-33-nodeport")
    );
    assert_eq!(native.adoption(), None);
    assert_eq!(
        native.spec.rate_limit.as_ref().map(|r| r.effective_burst()),
        Some(100)
    );
    let adopt: VirtualCluster =
        serde_saphyr::from_str(&read("examples/virtualcluster-adopt.yaml")).expect("adopt");
    assert!(
        matches!(adopt.adoption(), Some(Adoption::Secret(r)) if r.name == "team-b-kubeconfig" && r.key == "value")
    );
}

#[test]
fn original_style_yaml_parses_despite_its_quirks() {
    // The apiserver Service claims apps/v1 and the controllerManager bundle carries apiVersion/kind itself.
    let cv: ClusterVersion =
        serde_saphyr::from_str(&read("e2e/fixtures/original-style-clusterversion.yaml")).expect("cv");
    let service = cv.spec.api_server.service.expect("apiserver service");
    assert_eq!(service.spec.and_then(|s| s.type_).as_deref(), Some("NodePort"));
    assert_eq!(cv.spec.controller_manager.kind.as_deref(), Some("StatefulSet"));
    assert!(cv.spec.controller_manager.service.is_none());

    let vc: VirtualCluster =
        serde_saphyr::from_str(&read("e2e/fixtures/original-style-virtualcluster.yaml")).expect("vc");
    // Fields the original never had take their defaults.
    assert_eq!(vc.spec.cluster_domain, "cluster.local");
    assert_eq!(vc.spec.weight, 1);
    assert_eq!(vc.spec.pod_policy, None);
}

#[test]
fn the_original_adopt_annotations_are_honoured() {
    let with_annotation = |key: &str, value: &str| {
        let mut vc: VirtualCluster = serde_saphyr::from_str(
            "metadata: {name: t, namespace: default}\nspec: {clusterVersionName: cv}\n",
        )
        .expect("vc");
        vc.metadata.annotations = Some([(key.to_owned(), value.to_owned())].into());
        vc
    };
    let inline = with_annotation(
        crds::wellknown::ANNOTATION_ADMIN_KUBECONFIG,
        "YXBpVmVyc2lvbjogdjE=",
    );
    assert_eq!(
        inline.adoption(),
        Some(Adoption::InlineBase64("YXBpVmVyc2lvbjogdjE=".into()))
    );
    let by_secret = with_annotation(
        crds::wellknown::ANNOTATION_SECRET_ADMIN_KUBECONFIG,
        "tenant-kubeconfig",
    );
    assert!(
        matches!(by_secret.adoption(), Some(Adoption::Secret(r)) if r.name == "tenant-kubeconfig" && r.key == "value")
    );
    let empty = with_annotation(crds::wellknown::ANNOTATION_SECRET_ADMIN_KUBECONFIG, "");
    assert_eq!(empty.adoption(), None);
}

#[test]
fn adopt_annotations_added_to_a_provisioned_virtual_cluster_change_nothing() {
    use crds::{ControlPlaneMode, VirtualClusterStatus, wellknown::ANNOTATION_ADMIN_KUBECONFIG};
    let mut vc: VirtualCluster =
        serde_saphyr::from_str("metadata: {name: t, namespace: default}\nspec: {clusterVersionName: cv}\n")
            .expect("vc");
    assert_eq!(vc.mode(), ControlPlaneMode::Provisioned);
    // vc-manager fixed the mode; then someone who may edit the VirtualCluster adds the annotation.
    vc.status = Some(VirtualClusterStatus {
        mode: Some(ControlPlaneMode::Provisioned),
        ..Default::default()
    });
    vc.metadata.annotations = Some([(ANNOTATION_ADMIN_KUBECONFIG.to_owned(), "eA==".to_owned())].into());
    assert_eq!(vc.mode(), ControlPlaneMode::Provisioned);
    assert_eq!(vc.adoption(), None);
    assert_eq!(vc.ignored_adopt_annotation(), Some(ANNOTATION_ADMIN_KUBECONFIG));
    // Provisioned by a vc-manager that did not record the mode yet: its conditions tell.
    vc.status = serde_saphyr::from_str(
        "conditions: [{type: EtcdReady, status: 'True', reason: R, message: m, lastTransitionTime: '2026-01-01T00:00:00Z'}]",
    )
    .expect("status");
    assert_eq!(vc.mode(), ControlPlaneMode::Provisioned);
    assert_eq!(vc.adoption(), None);
    // A new VirtualCluster with the annotation is adopted, and stays so once vc-manager recorded it.
    vc.status = None;
    assert_eq!(vc.mode(), ControlPlaneMode::Adopted);
    assert_eq!(vc.ignored_adopt_annotation(), None);
    vc.status = Some(VirtualClusterStatus {
        mode: Some(ControlPlaneMode::Adopted),
        ..Default::default()
    });
    assert_eq!(vc.adoption(), Some(Adoption::InlineBase64("eA==".into())));
}

#[test]
fn status_round_trips_with_standard_conditions() {
    let yaml = "
metadata: {name: t, namespace: default}
spec: {clusterVersionName: cv}
status:
  phase: Running
  clusterNamespace: default-abcdef-t
  observedGeneration: 3
  conditions:
  - type: Ready
    status: 'True'
    reason: TenantControlPlaneRunning
    message: all components ready
    lastTransitionTime: '2026-01-01T00:00:00Z'
    observedGeneration: 3
";
    let vc: VirtualCluster = serde_saphyr::from_str(yaml).expect("vc");
    let status = vc.status.clone().expect("status");
    assert_eq!(vc.phase(), Some(crds::ClusterPhase::Running));
    assert_eq!(status.conditions[0].type_, "Ready");
    assert_eq!(status.conditions[0].observed_generation, Some(3));
    let back: VirtualCluster =
        serde_json::from_value(serde_json::to_value(&vc).expect("json")).expect("parse");
    assert_eq!((back.spec, back.status), (vc.spec, vc.status));
}
