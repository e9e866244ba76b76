//! Turning a ClusterVersion into the StatefulSets and Services of one tenant's control plane. Pure: the
//! same inputs always give the same objects, which are then server-side applied.
//!
//! What is added to the templates:
//! - the root namespace, the `app.kubernetes.io/managed-by` and `app.kubernetes.io/component` labels (also
//!   on the pod template), and the tenant identity annotations;
//! - the ClusterVersion name and generation the objects were rendered from (annotations);
//! - etcd's `--initial-cluster`, built from the replica count and the peer URL the template advertises;
//! - `--service-cluster-ip-range` of the apiserver and controller-manager from `spec.serviceCidr`;
//! - a `checksum.tenancy.x-k8s.io/<secret>` pod-template annotation per mounted Secret, so pods roll when
//!   something they load only at start changes (an authority, a kubeconfig, a key); a renewed leaf
//!   certificate that reaches the pod as files does not roll it, because kube-apiserver, etcd and
//!   kube-controller-manager reload those from disk (see [`restart_checksum`]).

use std::collections::{BTreeMap, BTreeSet};

use crds::{ClusterVersion, VirtualCluster};
use k8s_openapi::{
    ByteString,
    api::{
        apps::v1::StatefulSet,
        core::v1::{Container, PodSpec, Secret, Service},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::ResourceExt;
use sha2::{Digest, Sha256};

use crate::{
    component::{ApiServerEndpoint, Component, main_container},
    container_flags::{flag_value, set_flag},
    identity::{TenantIdentity, managed_labels},
    legacy,
};
use tenant_pki::secrets;

/// Label naming the control-plane component of a StatefulSet, Service or pod.
pub use crds::wellknown::LABEL_COMPONENT;
pub use crds::wellknown::{ANNOTATION_CLUSTER_VERSION, ANNOTATION_CLUSTER_VERSION_GENERATION};
/// Prefix of the pod-template annotations holding the SHA-256 of each mounted Secret.
pub const SECRET_CHECKSUM_PREFIX: &str = "checksum.tenancy.x-k8s.io/";

/// Checks that a ClusterVersion can be rendered; the error says what to fix.
pub fn validate(cv: &ClusterVersion) -> Result<(), String> {
    let mut names = BTreeSet::new();
    for component in Component::ALL {
        let bundle = component.bundle(cv);
        let sts = &bundle.statefulset;
        let name = sts
            .metadata
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("the {component} StatefulSet has no metadata.name"))?;
        if !names.insert(name.to_owned()) {
            return Err(format!("two components use the StatefulSet name {name}"));
        }
        let spec = sts
            .spec
            .as_ref()
            .ok_or_else(|| format!("the {component} StatefulSet has no spec"))?;
        let pod = spec
            .template
            .spec
            .as_ref()
            .ok_or_else(|| format!("the {component} StatefulSet has no pod template spec"))?;
        if pod.containers.is_empty() {
            return Err(format!("the {component} StatefulSet has no containers"));
        }
        if spec.replicas.is_some_and(|r| r < 0) {
            return Err(format!(
                "the {component} StatefulSet has a negative replica count"
            ));
        }
        if let Some(service) = &bundle.service
            && service.metadata.name.as_deref().is_none_or(str::is_empty)
        {
            return Err(format!("the {component} Service has no metadata.name"));
        }
    }
    apiserver_endpoint(cv).map(|_| ())
}

/// The apiserver Service and port from a ClusterVersion (the port named `https` or `api`, else the first).
pub fn apiserver_endpoint(cv: &ClusterVersion) -> Result<ApiServerEndpoint, String> {
    let service = cv
        .spec
        .api_server
        .service
        .as_ref()
        .ok_or("the apiserver bundle has no Service; the admin kubeconfig needs one")?;
    let name = service
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or("the apiserver Service has no metadata.name")?;
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .filter(|p| !p.is_empty())
        .ok_or("the apiserver Service has no ports")?;
    let port = ports
        .iter()
        .find(|p| matches!(p.name.as_deref(), Some("https" | "api")))
        .unwrap_or(&ports[0]);
    Ok(ApiServerEndpoint {
        service: name,
        port: port.port,
    })
}

/// Names of the etcd Services: the client Service and the StatefulSet's governing (peer) Service.
pub fn etcd_service_names(cv: &ClusterVersion) -> (String, String) {
    cv.spec.etcd_service_names()
}

fn clean_metadata(
    meta: &ObjectMeta,
    identity: &TenantIdentity,
    component: Component,
    cv: &ClusterVersion,
) -> ObjectMeta {
    let mut labels = meta.labels.clone().unwrap_or_default();
    labels.extend(managed_labels());
    labels.insert(LABEL_COMPONENT.to_owned(), component.name().to_owned());
    let mut annotations = meta.annotations.clone().unwrap_or_default();
    annotations.extend(identity.annotations());
    annotations.insert(ANNOTATION_CLUSTER_VERSION.to_owned(), cv.name_any());
    annotations.insert(
        ANNOTATION_CLUSTER_VERSION_GENERATION.to_owned(),
        cv.metadata.generation.unwrap_or_default().to_string(),
    );
    ObjectMeta {
        name: meta.name.clone(),
        namespace: Some(identity.root_namespace().to_owned()),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    }
}

/// The Service of a component, if its bundle has one.
pub fn render_service(
    component: Component,
    cv: &ClusterVersion,
    identity: &TenantIdentity,
) -> Option<Service> {
    let template = component.bundle(cv).service.as_ref()?;
    let mut service = template.clone();
    legacy::adapt_service(&mut service);
    Some(Service {
        metadata: clean_metadata(&template.metadata, identity, component, cv),
        spec: service.spec,
        status: None,
    })
}

/// What rendering changes in a ClusterVersion written for the original project ([`legacy`]), one line
/// per change, prefixed with the component; empty for templates that need nothing.
pub fn adaptations(cv: &ClusterVersion) -> Vec<String> {
    let mut lines = Vec::new();
    for component in Component::ALL {
        let bundle = component.bundle(cv);
        if let Some(mut pod) = bundle.statefulset.spec.clone().and_then(|s| s.template.spec) {
            lines.extend(legacy::adapt_pod(component, &mut pod));
        }
        if let Some(mut service) = bundle.service.clone() {
            lines.extend(
                legacy::adapt_service(&mut service)
                    .into_iter()
                    .map(|line| format!("{} Service: {line}", component.name())),
            );
        }
    }
    lines
}

/// SHA-256 of a Secret's data (keys in order), hex.
pub fn secret_checksum(secret: &Secret) -> String {
    checksum_of(secret, |_| true)
}

/// SHA-256 of the Secret's data that a restart must follow. A leaf certificate and its key, delivered to
/// the pod only as files, are left out when the components reload them from disk
/// ([`secrets::reloaded_in_place`]): the kubelet rewrites the files within its sync period, and rolling
/// a one-replica apiserver for a renewal would drop every client's connection. Everything else counts.
pub fn restart_checksum(secret: &Secret, delivery: Delivery) -> String {
    let reloaded = delivery == Delivery::Files && secrets::reloaded_in_place(&secret.name_any());
    checksum_of(secret, |key| !(reloaded && secrets::is_certificate_or_key(key)))
}

fn checksum_of(secret: &Secret, counts: impl Fn(&str) -> bool) -> String {
    let mut hasher = Sha256::new();
    for (key, ByteString(value)) in secret.data.iter().flatten() {
        if !counts(key) {
            continue;
        }
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key.as_bytes());
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value);
    }
    hex::encode(hasher.finalize())
}

/// How a pod receives a Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Delivery {
    /// Only as files of whole secret or projected volumes, which the kubelet rewrites when it changes.
    Files,
    /// Also somewhere fixed when the container starts: an environment variable or a `subPath` mount.
    Frozen,
}

/// Secrets a pod spec mounts or reads, and how: secret volumes, projected secret sources, `envFrom` and
/// `env` references.
pub fn referenced_secrets(pod: &PodSpec) -> BTreeMap<String, Delivery> {
    let mut names: BTreeMap<String, Delivery> = BTreeMap::new();
    let mut note = |name: &str, delivery: Delivery| {
        if !name.is_empty() {
            let entry = names.entry(name.to_owned()).or_insert(delivery);
            *entry = (*entry).max(delivery);
        }
    };
    let containers: Vec<&Container> = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .collect();
    for volume in pod.volumes.iter().flatten() {
        // A subPath mount is a bind mount of one file taken at start: the kubelet never updates it.
        let sub_path = containers
            .iter()
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .any(|m| {
                m.name == volume.name
                    && (m.sub_path.as_deref().is_some_and(|p| !p.is_empty())
                        || m.sub_path_expr.as_deref().is_some_and(|p| !p.is_empty()))
            });
        let delivery = if sub_path {
            Delivery::Frozen
        } else {
            Delivery::Files
        };
        if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()) {
            note(name, delivery);
        }
        for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(secret) = &source.secret {
                note(&secret.name, delivery);
            }
        }
    }
    for container in containers {
        for from in container.env_from.iter().flatten() {
            if let Some(secret) = &from.secret_ref {
                note(&secret.name, Delivery::Frozen);
            }
        }
        for env in container.env.iter().flatten() {
            if let Some(secret) = env.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()) {
                note(&secret.name, Delivery::Frozen);
            }
        }
    }
    names
}

/// What a rendered StatefulSet depends on besides its template.
#[derive(Clone, Debug, Default)]
pub struct RenderInputs<'a> {
    /// `spec.serviceCidr` of the VirtualCluster.
    pub service_cidr: Option<&'a str>,
    /// Secrets of the root namespace by name (only data is read), for the checksum annotations.
    pub secrets: BTreeMap<String, &'a Secret>,
}

impl<'a> RenderInputs<'a> {
    /// Inputs from a VirtualCluster and the Secrets in its root namespace.
    pub fn new(vc: &'a VirtualCluster, secrets: impl IntoIterator<Item = &'a Secret>) -> Self {
        Self {
            service_cidr: vc.spec.service_cidr.as_deref().filter(|c| !c.is_empty()),
            secrets: secrets.into_iter().map(|s| (s.name_any(), s)).collect(),
        }
    }
}

/// The StatefulSet of a component.
pub fn render_statefulset(
    component: Component,
    cv: &ClusterVersion,
    identity: &TenantIdentity,
    inputs: &RenderInputs<'_>,
) -> StatefulSet {
    let template = &component.bundle(cv).statefulset;
    let mut spec = template.spec.clone().unwrap_or_default();
    let sts_name = template.metadata.name.clone().unwrap_or_default();

    let pod_meta = spec.template.metadata.get_or_insert_with(Default::default);
    let pod_labels = pod_meta.labels.get_or_insert_with(Default::default);
    pod_labels.extend(managed_labels());
    pod_labels.insert(LABEL_COMPONENT.to_owned(), component.name().to_owned());

    let mut checksums = BTreeMap::new();
    if let Some(pod) = spec.template.spec.as_mut() {
        legacy::adapt_pod(component, pod);
        let main = main_container(pod, component);
        match component {
            Component::Etcd => {
                let replicas = spec.replicas.unwrap_or(1).max(0);
                let peer_service = spec
                    .service_name
                    .clone()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| etcd_service_names(cv).1);
                if let Some(container) = pod.containers.get_mut(main) {
                    let value = initial_cluster(container, &sts_name, &peer_service, replicas);
                    set_flag(container, "--initial-cluster", &value);
                }
            }
            Component::ApiServer | Component::ControllerManager => {
                if let (Some(cidr), Some(container)) = (inputs.service_cidr, pod.containers.get_mut(main)) {
                    set_flag(container, "--service-cluster-ip-range", cidr);
                }
            }
        }
        for (name, delivery) in referenced_secrets(pod) {
            if let Some(secret) = inputs.secrets.get(&name) {
                checksums.insert(
                    format!("{SECRET_CHECKSUM_PREFIX}{name}"),
                    restart_checksum(secret, delivery),
                );
            }
        }
    }
    let pod_meta = spec.template.metadata.get_or_insert_with(Default::default);
    pod_meta
        .annotations
        .get_or_insert_with(Default::default)
        .extend(checksums);

    StatefulSet {
        metadata: clean_metadata(&template.metadata, identity, component, cv),
        spec: Some(spec),
        status: None,
    }
}

/// The tenant's service range(s): `spec.serviceCidr`, else the apiserver template's
/// `--service-cluster-ip-range`.
pub fn apiserver_service_range(vc: &VirtualCluster, cv: &ClusterVersion) -> Option<String> {
    if let Some(cidr) = vc.spec.service_cidr.as_deref().filter(|c| !c.is_empty()) {
        return Some(cidr.to_owned());
    }
    let pod = cv
        .spec
        .api_server
        .statefulset
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?;
    let container = pod.containers.get(main_container(pod, Component::ApiServer))?;
    flag_value(container, "--service-cluster-ip-range")
}

/// Environment variables bound to the pod name (`fieldRef: metadata.name`), as `$(NAME)` references.
fn pod_name_variables(container: &Container) -> Vec<String> {
    container
        .env
        .iter()
        .flatten()
        .filter(|e| {
            e.value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .is_some_and(|f| f.field_path == "metadata.name")
        })
        .map(|e| format!("$({})", e.name))
        .collect()
}

/// etcd's `--initial-cluster`: `<pod>=<peer URL>` for every replica. The peer URL is the template's
/// `--initial-advertise-peer-urls` with the pod-name variable replaced, else `https://<pod>.<peer service>:2380`.
fn initial_cluster(container: &Container, sts_name: &str, peer_service: &str, replicas: i32) -> String {
    let advertised = flag_value(container, "--initial-advertise-peer-urls")
        .and_then(|urls| urls.split(',').next().map(str::to_owned));
    let variables = pod_name_variables(container);
    (0..replicas)
        .map(|i| {
            let pod = format!("{sts_name}-{i}");
            let url = match &advertised {
                Some(template) if variables.iter().any(|v| template.contains(v.as_str())) => {
                    variables.iter().fold(template.clone(), |url, variable| {
                        url.replace(variable.as_str(), &pod)
                    })
                }
                _ => format!("https://{pod}.{peer_service}:2380"),
            };
            format!("{pod}={url}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(name: &str) -> ClusterVersion {
        let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
        let yaml = std::fs::read_to_string(&path).expect("example");
        serde_saphyr::from_str(&yaml).expect("ClusterVersion")
    }

    fn identity() -> TenantIdentity {
        TenantIdentity {
            cluster_key: "team-abc123-vc".into(),
            vc_name: "vc".into(),
            vc_namespace: "team".into(),
            vc_uid: "uid-1".into(),
        }
    }

    fn args(sts: &StatefulSet) -> Vec<String> {
        let pod = sts
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod");
        pod.containers[0].args.clone().unwrap_or_default()
    }

    fn secret(name: &str, value: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some([("tls.crt".to_owned(), ByteString(value.as_bytes().to_vec()))].into()),
            ..Default::default()
        }
    }

    #[test]
    fn examples_are_valid() {
        for name in ["clusterversion-nodeport.yaml", "clusterversion-clusterip.yaml"] {
            assert_eq!(validate(&example(name)), Ok(()), "{name}");
        }
        let original = format!(
            "{}/../e2e/fixtures/original-style-clusterversion.yaml",
            env!("CARGO_MANIFEST_DIR")
        );
        let cv: ClusterVersion =
            serde_saphyr::from_str(&std::fs::read_to_string(original).expect("fixture")).expect("parse");
        assert_eq!(validate(&cv), Ok(()));
        assert_eq!(
            apiserver_endpoint(&cv),
            Ok(ApiServerEndpoint {
                service: "apiserver-svc".into(),
                port: 6443
            })
        );
    }

    #[test]
    fn invalid_cluster_versions_are_explained() {
        let mut cv = example("clusterversion-clusterip.yaml");
        cv.spec.api_server.service = None;
        assert_eq!(
            validate(&cv),
            Err("the apiserver bundle has no Service; the admin kubeconfig needs one".into())
        );
        let mut cv = example("clusterversion-clusterip.yaml");
        cv.spec.controller_manager.statefulset.metadata.name = Some("etcd".into());
        assert_eq!(
            validate(&cv),
            Err("two components use the StatefulSet name etcd".into())
        );
        let mut cv = example("clusterversion-clusterip.yaml");
        cv.spec.etcd.statefulset.spec = None;
        assert_eq!(validate(&cv), Err("the etcd StatefulSet has no spec".into()));
        let mut cv = example("clusterversion-clusterip.yaml");
        if let Some(pod) = cv
            .spec
            .api_server
            .statefulset
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
        {
            pod.containers.clear();
        }
        assert_eq!(
            validate(&cv),
            Err("the apiserver StatefulSet has no containers".into())
        );
    }

    #[test]
    fn namespace_labels_and_identity_are_injected() {
        let mut cv = example("clusterversion-clusterip.yaml");
        cv.metadata.generation = Some(4);
        for component in Component::ALL {
            let sts = render_statefulset(component, &cv, &identity(), &RenderInputs::default());
            assert_eq!(sts.metadata.namespace.as_deref(), Some("team-abc123-vc"));
            let labels = sts.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels["app.kubernetes.io/managed-by"], "vc-manager");
            assert_eq!(labels[LABEL_COMPONENT], component.name());
            let annotations = sts.metadata.annotations.clone().unwrap_or_default();
            assert_eq!(annotations["tenancy.x-k8s.io/vcuid"], "uid-1");
            assert_eq!(annotations["tenancy.x-k8s.io/cluster"], "team-abc123-vc");
            assert_eq!(annotations[ANNOTATION_CLUSTER_VERSION], "cv-v1-33-clusterip");
            assert_eq!(annotations[ANNOTATION_CLUSTER_VERSION_GENERATION], "4");
            assert!(sts.metadata.resource_version.is_none());
            let spec = sts.spec.as_ref().expect("spec");
            // The selector is left alone (it is immutable); the pod template gains the labels.
            assert_eq!(
                spec.selector.match_labels.as_ref().map(BTreeMap::len),
                Some(1),
                "{component}"
            );
            let pod_labels = spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            assert_eq!(pod_labels[LABEL_COMPONENT], component.name());
            assert_eq!(pod_labels["component-name"], component.name());

            let service = render_service(component, &cv, &identity());
            match component {
                Component::ControllerManager => assert!(service.is_none()),
                _ => {
                    let service = service.expect("service");
                    assert_eq!(service.metadata.namespace.as_deref(), Some("team-abc123-vc"));
                    assert_eq!(
                        service
                            .metadata
                            .labels
                            .as_ref()
                            .map(|l| l[LABEL_COMPONENT].clone()),
                        Some(component.name().to_owned())
                    );
                }
            }
        }
    }

    #[test]
    fn etcd_initial_cluster_follows_the_replica_count_and_advertised_url() {
        let mut cv = example("clusterversion-clusterip.yaml");
        if let Some(spec) = cv.spec.etcd.statefulset.spec.as_mut() {
            spec.replicas = Some(3);
        }
        let sts = render_statefulset(Component::Etcd, &cv, &identity(), &RenderInputs::default());
        let args = args(&sts);
        let initial: Vec<&String> = args
            .iter()
            .filter(|a| a.starts_with("--initial-cluster="))
            .collect();
        assert_eq!(
            initial,
            [
                "--initial-cluster=etcd-0=https://etcd-0.etcd:2380,etcd-1=https://etcd-1.etcd:2380,etcd-2=https://etcd-2.etcd:2380"
            ]
        );
        // Flags that merely start the same way are untouched.
        assert!(args.contains(&"--initial-cluster-state=new".to_owned()));
        assert!(args.contains(&"--initial-cluster-token=vc-etcd".to_owned()));

        // Rendering again replaces the flag rather than adding a second one.
        let mut again = cv.clone();
        again.spec.etcd.statefulset = sts.clone();
        if let Some(spec) = again.spec.etcd.statefulset.spec.as_mut() {
            spec.replicas = Some(1);
        }
        let args = self::args(&render_statefulset(
            Component::Etcd,
            &again,
            &identity(),
            &RenderInputs::default(),
        ));
        let initial: Vec<&String> = args
            .iter()
            .filter(|a| a.starts_with("--initial-cluster="))
            .collect();
        assert_eq!(initial, ["--initial-cluster=etcd-0=https://etcd-0.etcd:2380"]);
    }

    #[test]
    fn etcd_without_advertised_url_uses_the_peer_service() {
        let mut cv = example("clusterversion-clusterip.yaml");
        if let Some(spec) = cv.spec.etcd.statefulset.spec.as_mut() {
            spec.replicas = Some(2);
            spec.service_name = Some("etcd-peers".into());
            if let Some(pod) = spec.template.spec.as_mut() {
                pod.containers[0].args = Some(vec!["--name=$(HOSTNAME)".into()]);
            }
        }
        let args = args(&render_statefulset(
            Component::Etcd,
            &cv,
            &identity(),
            &RenderInputs::default(),
        ));
        assert_eq!(
            args.last().map(String::as_str),
            Some(
                "--initial-cluster=etcd-0=https://etcd-0.etcd-peers:2380,etcd-1=https://etcd-1.etcd-peers:2380"
            )
        );
    }

    #[test]
    fn service_cidr_replaces_the_template_range() {
        let cv = example("clusterversion-clusterip.yaml");
        let mut vc = VirtualCluster::new("vc", Default::default());
        vc.spec.service_cidr = Some("10.100.0.0/16".into());
        let inputs = RenderInputs::new(&vc, []);
        for component in [Component::ApiServer, Component::ControllerManager] {
            let args = args(&render_statefulset(component, &cv, &identity(), &inputs));
            let ranges: Vec<&String> = args
                .iter()
                .filter(|a| a.starts_with("--service-cluster-ip-range"))
                .collect();
            assert_eq!(
                ranges,
                ["--service-cluster-ip-range=10.100.0.0/16"],
                "{component}"
            );
        }
        // etcd has no such flag and gets none.
        let etcd = args(&render_statefulset(Component::Etcd, &cv, &identity(), &inputs));
        assert!(!etcd.iter().any(|a| a.contains("service-cluster-ip-range")));
        // Without spec.serviceCidr the template's range stays.
        let args = args(&render_statefulset(
            Component::ApiServer,
            &cv,
            &identity(),
            &RenderInputs::default(),
        ));
        assert!(args.contains(&"--service-cluster-ip-range=10.32.0.0/16".to_owned()));
    }

    #[test]
    fn the_service_range_comes_from_the_virtual_cluster_or_the_template() {
        let cv = example("clusterversion-clusterip.yaml");
        let mut vc = VirtualCluster::new("vc", Default::default());
        assert_eq!(apiserver_service_range(&vc, &cv).as_deref(), Some("10.32.0.0/16"));
        vc.spec.service_cidr = Some("10.200.0.0/16".into());
        assert_eq!(
            apiserver_service_range(&vc, &cv).as_deref(),
            Some("10.200.0.0/16")
        );
    }

    #[test]
    fn checksums_of_mounted_secrets_roll_the_pods() {
        let cv = example("clusterversion-clusterip.yaml");
        let root = secret("root-ca", "one");
        let apiserver = secret("apiserver-ca", "cert");
        let unrelated = secret("etcd-ca", "x");
        let mut inputs = RenderInputs::default();
        for s in [&root, &apiserver, &unrelated] {
            inputs.secrets.insert(s.name_any(), s);
        }
        let annotations = |inputs: &RenderInputs<'_>| {
            render_statefulset(Component::ApiServer, &cv, &identity(), inputs)
                .spec
                .and_then(|s| s.template.metadata)
                .and_then(|m| m.annotations)
                .unwrap_or_default()
        };
        let before = annotations(&inputs);
        assert_eq!(
            before["checksum.tenancy.x-k8s.io/root-ca"],
            secret_checksum(&root)
        );
        assert!(before.contains_key("checksum.tenancy.x-k8s.io/apiserver-ca"));
        // Not mounted by the apiserver.
        assert!(!before.contains_key("checksum.tenancy.x-k8s.io/etcd-ca"));
        // Mounted but not (yet) present: no annotation rather than a wrong one.
        assert!(!before.contains_key("checksum.tenancy.x-k8s.io/kubelet-client"));

        let renewed = secret("root-ca", "two");
        inputs.secrets.insert("root-ca".into(), &renewed);
        let after = annotations(&inputs);
        assert_ne!(
            after["checksum.tenancy.x-k8s.io/root-ca"],
            before["checksum.tenancy.x-k8s.io/root-ca"]
        );
        assert_eq!(
            after["checksum.tenancy.x-k8s.io/apiserver-ca"],
            before["checksum.tenancy.x-k8s.io/apiserver-ca"]
        );
    }

    #[test]
    fn referenced_secrets_cover_volumes_projections_and_environment() {
        let pod: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{
                "name": "c",
                "envFrom": [{"secretRef": {"name": "from-env"}}],
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "key-ref", "key": "k"}}}]
            }],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-env"}}]}],
            "volumes": [
                {"name": "a", "secret": {"secretName": "volume"}},
                {"name": "b", "projected": {"sources": [{"secret": {"name": "projected"}}]}},
                {"name": "c", "configMap": {"name": "not-a-secret"}}
            ]
        }))
        .expect("pod");
        let frozen = ["from-env", "init-env", "key-ref"].map(|n| (n.to_owned(), Delivery::Frozen));
        let files = ["projected", "volume"].map(|n| (n.to_owned(), Delivery::Files));
        assert_eq!(
            referenced_secrets(&pod),
            frozen.into_iter().chain(files).collect::<BTreeMap<_, _>>()
        );
    }

    #[test]
    fn a_secret_also_read_at_start_counts_as_frozen() {
        let pod: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{
                "name": "c",
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "both", "key": "k"}}}],
                "volumeMounts": [
                    {"name": "a", "mountPath": "/a"},
                    {"name": "one-file", "mountPath": "/b/tls.crt", "subPath": "tls.crt"}
                ]
            }],
            "volumes": [
                {"name": "a", "secret": {"secretName": "both"}},
                {"name": "one-file", "secret": {"secretName": "sub-path"}}
            ]
        }))
        .expect("pod");
        assert_eq!(
            referenced_secrets(&pod),
            [
                ("both".to_owned(), Delivery::Frozen),
                ("sub-path".to_owned(), Delivery::Frozen)
            ]
            .into()
        );
    }

    #[test]
    fn renewed_leaf_files_do_not_roll_but_authorities_bundles_and_kubeconfigs_do() {
        let with = |name: &str, data: &[(&str, &str)]| Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        };
        let leaf = with(
            "etcd-server",
            &[("ca.crt", "ca"), ("tls.crt", "a"), ("tls.key", "k1")],
        );
        let renewed = with(
            "etcd-server",
            &[("ca.crt", "ca"), ("tls.crt", "b"), ("tls.key", "k2")],
        );
        let new_bundle = with(
            "etcd-server",
            &[("ca.crt", "ca2"), ("tls.crt", "b"), ("tls.key", "k2")],
        );
        let files = Delivery::Files;
        assert_eq!(restart_checksum(&leaf, files), restart_checksum(&renewed, files));
        assert_ne!(
            restart_checksum(&renewed, files),
            restart_checksum(&new_bundle, files)
        );
        // Read at start (env, subPath): a renewal must restart.
        assert_ne!(
            restart_checksum(&leaf, Delivery::Frozen),
            restart_checksum(&renewed, Delivery::Frozen)
        );
        // Authorities and kubeconfigs are loaded once.
        for name in [
            "root-ca",
            "etcd-ca",
            "controller-manager-kubeconfig",
            "serviceaccount-rsa",
        ] {
            let (a, b) = (with(name, &[("tls.crt", "a")]), with(name, &[("tls.crt", "b")]));
            assert_ne!(restart_checksum(&a, files), restart_checksum(&b, files), "{name}");
        }
    }

    #[test]
    fn checksums_are_stable_and_key_sensitive() {
        let a = secret("s", "v");
        assert_eq!(secret_checksum(&a), secret_checksum(&a.clone()));
        let mut b = a.clone();
        b.data = Some([("tls.key".to_owned(), ByteString(b"v".to_vec()))].into());
        assert_ne!(secret_checksum(&a), secret_checksum(&b));
    }

    #[test]
    fn etcd_service_names_come_from_the_bundle() {
        let cv = example("clusterversion-nodeport.yaml");
        assert_eq!(etcd_service_names(&cv), ("etcd".into(), "etcd".into()));
        assert_eq!(
            apiserver_endpoint(&cv),
            Ok(ApiServerEndpoint {
                service: "apiserver-svc".into(),
                port: 6443
            })
        );
    }
}
