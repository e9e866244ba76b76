//! Templates written for the original VirtualCluster project (Kubernetes 1.16 and its Secret layout) run on
//! today's components and our Secrets. Each rule fires only on its own pattern, which none of our
//! `examples/` contain, and every change is reported (the ClusterVersion's `TemplatesAdapted` condition),
//! so a template that needs none is rendered as written:
//!
//! - flags that current kube-apiserver and kube-controller-manager refuse are dropped or renamed;
//! - the original's `etcd-ca` Secret was etcd's serving certificate (ours is the etcd CA, key included), and
//!   the original trusted `root-ca` everywhere; etcd gets `etcd-server` and trusts the etcd CA instead, and
//!   the apiserver uses its own `etcd-client` and `kubelet-client` certificates rather than presenting its
//!   serving certificate as a client;
//! - the service-account public key is read from `tls.crt`, the signing key and issuer that current
//!   apiservers require are added;
//! - probes that need what current images lack (a shell and etcdctl in etcd's distroless image, the
//!   controller-manager's plain-HTTP port 10252) become HTTP(S) probes;
//! - what vNodes need and the original's templates lacked: the node lifecycle controllers off, kubelets
//!   reached by address, and `publishNotReadyAddresses` for the removed tolerate-unready annotation.

use k8s_openapi::{
    api::core::v1::{
        Container, HTTPGetAction, KeyToPath, PodSpec, Probe, ProjectedVolumeSource, SecretProjection,
        SecretVolumeSource, Service, Volume, VolumeMount, VolumeProjection,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};

use crate::{
    component::{Component, main_container},
    container_flags::{flag_value, set_flag},
};
use crds::wellknown::SECRET_KUBELET_CLIENT;
use tenant_pki::names::{
    SECRET_APISERVER, SECRET_ETCD_CA, SECRET_ETCD_CLIENT, SECRET_ETCD_SERVER, SECRET_ROOT_CA,
    SECRET_SERVICE_ACCOUNT,
};

/// Flags removed from kube-apiserver by 1.25 that the original project's templates used.
const REMOVED_APISERVER_FLAGS: &[&str] = &[
    "--kubelet-https",
    "--insecure-port",
    "--insecure-bind-address",
    "--enable-swagger-ui",
    "--basic-auth-file",
    "--repair-malformed-updates",
    "--deserialization-cache-size",
];
/// Flags removed from kube-controller-manager by 1.25 (its insecure port).
const REMOVED_CONTROLLER_MANAGER_FLAGS: &[&str] = &["--port", "--address"];
/// The annotation Kubernetes replaced with `publishNotReadyAddresses`.
const TOLERATE_UNREADY: &str = "service.alpha.kubernetes.io/tolerate-unready-endpoints";
/// What vNodes need from a tenant controller-manager: no node lifecycle, IPAM or routes of its own.
const VNODE_CONTROLLERS: &str = "*,-nodelifecycle,-nodeipam,-route,-cloud-node-lifecycle";
/// Where added Secret volumes are mounted.
const ADDED_MOUNTS: &str = "/etc/kubernetes/vc";
/// etcd's plain-HTTP health endpoint, for probes that replace etcdctl.
const ETCD_METRICS_PORT: i32 = 2381;

/// Adapts a component's pod; returns what it changed, one sentence each.
pub fn adapt_pod(component: Component, pod: &mut PodSpec) -> Vec<String> {
    let main = main_container(pod, component);
    let mut changes = Vec::new();
    match component {
        Component::Etcd => adapt_etcd(pod, main, &mut changes),
        Component::ApiServer => adapt_apiserver(pod, main, &mut changes),
        Component::ControllerManager => adapt_controller_manager(pod, main, &mut changes),
    }
    changes
}

/// Adapts a component's Service; returns what it changed.
pub fn adapt_service(service: &mut Service) -> Vec<String> {
    let tolerant = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOLERATE_UNREADY))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    match service.spec.as_mut() {
        Some(spec) if tolerant && spec.publish_not_ready_addresses.is_none() => {
            spec.publish_not_ready_addresses = Some(true);
            vec![format!(
                "annotation {TOLERATE_UNREADY} became publishNotReadyAddresses: true"
            )]
        }
        _ => Vec::new(),
    }
}

fn adapt_etcd(pod: &mut PodSpec, main: usize, changes: &mut Vec<String>) {
    for volume in pod.volumes.iter_mut().flatten() {
        let Some(secret) = volume.secret.as_mut() else {
            continue;
        };
        match secret.secret_name.as_deref() {
            // The original's etcd-ca held etcd's serving certificate; ours is the CA and its key.
            Some(SECRET_ETCD_CA) => {
                secret.secret_name = Some(SECRET_ETCD_SERVER.to_owned());
                changes.push(format!(
                    "etcd volume {} mounts Secret {SECRET_ETCD_SERVER} instead of {SECRET_ETCD_CA}",
                    volume.name
                ));
            }
            // Its clients and peers hold certificates of the etcd CA: trust that under the same file name.
            Some(SECRET_ROOT_CA) => {
                volume.secret = None;
                volume.projected = Some(ProjectedVolumeSource {
                    default_mode: Some(0o444),
                    sources: Some(vec![VolumeProjection {
                        secret: Some(SecretProjection {
                            name: SECRET_ETCD_SERVER.to_owned(),
                            items: Some(vec![KeyToPath {
                                key: "ca.crt".into(),
                                path: "tls.crt".into(),
                                mode: None,
                            }]),
                            optional: None,
                        }),
                        ..Default::default()
                    }]),
                });
                changes.push(format!(
                    "etcd volume {} holds the etcd CA ({SECRET_ETCD_SERVER} ca.crt as tls.crt) instead of {SECRET_ROOT_CA}",
                    volume.name
                ));
            }
            _ => {}
        }
    }
    let Some(container) = pod.containers.get_mut(main) else {
        return;
    };
    let runs_etcdctl = |probe: &Option<Probe>| {
        probe
            .as_ref()
            .and_then(|p| p.exec.as_ref())
            .and_then(|e| e.command.as_ref())
            .is_some_and(|c| {
                let line = c.join(" ");
                line.contains("etcdctl") && line.contains("endpoint health")
            })
    };
    if runs_etcdctl(&container.liveness_probe) || runs_etcdctl(&container.readiness_probe) {
        let port = match flag_value(container, "--listen-metrics-urls") {
            Some(urls) => urls
                .split(',')
                .find_map(|u| u.strip_prefix("http://"))
                .and_then(|rest| rest.rsplit(':').next())
                .and_then(|p| p.trim_end_matches('/').parse().ok()),
            None => {
                set_flag(
                    container,
                    "--listen-metrics-urls",
                    &format!("http://0.0.0.0:{ETCD_METRICS_PORT}"),
                );
                changes.push(format!(
                    "etcd serves /health on --listen-metrics-urls=http://0.0.0.0:{ETCD_METRICS_PORT}"
                ));
                Some(ETCD_METRICS_PORT)
            }
        };
        if let Some(port) = port {
            for (which, probe) in [
                ("liveness", &mut container.liveness_probe),
                ("readiness", &mut container.readiness_probe),
            ] {
                if runs_etcdctl(probe) {
                    to_http(probe, "/health?serializable=true", port, "HTTP");
                    changes.push(format!(
                        "etcd {which} probe asks /health on port {port} (the etcd image has no shell)"
                    ));
                }
            }
        }
    }
}

fn adapt_apiserver(pod: &mut PodSpec, main: usize, changes: &mut Vec<String>) {
    if pod.containers.get(main).is_none() {
        return;
    }
    drop_flags(&mut pod.containers[main], REMOVED_APISERVER_FLAGS, changes);
    if flag_value(&pod.containers[main], "--runtime-config").as_deref() == Some("api/all") {
        remove_flag(&mut pod.containers[main], "--runtime-config");
        changes.push("dropped --runtime-config=api/all (it would enable every alpha API)".into());
    }
    // The original presented the apiserver's serving certificate to etcd and kubelets.
    for (flag, from, to) in [
        (
            "--etcd-certfile",
            (SECRET_APISERVER, "tls.crt"),
            (SECRET_ETCD_CLIENT, "tls.crt"),
        ),
        (
            "--etcd-keyfile",
            (SECRET_APISERVER, "tls.key"),
            (SECRET_ETCD_CLIENT, "tls.key"),
        ),
        (
            "--etcd-cafile",
            (SECRET_ROOT_CA, "tls.crt"),
            (SECRET_ETCD_CLIENT, "ca.crt"),
        ),
        (
            "--kubelet-client-certificate",
            (SECRET_APISERVER, "tls.crt"),
            (SECRET_KUBELET_CLIENT, "tls.crt"),
        ),
        (
            "--kubelet-client-key",
            (SECRET_APISERVER, "tls.key"),
            (SECRET_KUBELET_CLIENT, "tls.key"),
        ),
    ] {
        let Some(path) = flag_value(&pod.containers[main], flag) else {
            continue;
        };
        if secret_file(pod, main, &path)
            .as_ref()
            .map(|(s, k)| (s.as_str(), k.as_str()))
            == Some(from)
        {
            let dir = mount_secret(pod, main, to.0);
            let new = format!("{dir}/{}", to.1);
            set_flag(&mut pod.containers[main], flag, &new);
            changes.push(format!("apiserver {flag}={new} (was {path})"));
        }
    }
    // Current apiservers sign tokens themselves and read the public key from a public-key file.
    if let Some(path) = flag_value(&pod.containers[main], "--service-account-key-file")
        && secret_file(pod, main, &path).is_some_and(|(s, k)| s == SECRET_SERVICE_ACCOUNT && k == "tls.key")
    {
        let public = format!("{}tls.crt", path.trim_end_matches("tls.key"));
        let container = &mut pod.containers[main];
        set_flag(container, "--service-account-key-file", &public);
        changes.push(format!(
            "apiserver --service-account-key-file={public} (was {path})"
        ));
        if flag_value(container, "--service-account-signing-key-file").is_none() {
            set_flag(container, "--service-account-signing-key-file", &path);
            changes.push(format!("apiserver --service-account-signing-key-file={path}"));
        }
    }
    let container = &mut pod.containers[main];
    if flag_value(container, "--service-account-issuer").is_none() {
        set_flag(
            container,
            "--service-account-issuer",
            "https://kubernetes.default.svc",
        );
        changes.push("apiserver --service-account-issuer=https://kubernetes.default.svc".into());
    }
    // vNodes are reached at their addresses; their names resolve nowhere.
    if flag_value(container, "--kubelet-preferred-address-types").is_none() {
        set_flag(
            container,
            "--kubelet-preferred-address-types",
            "InternalIP,ExternalIP,Hostname",
        );
        changes.push("apiserver --kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into());
    }
}

fn adapt_controller_manager(pod: &mut PodSpec, main: usize, changes: &mut Vec<String>) {
    let Some(container) = pod.containers.get_mut(main) else {
        return;
    };
    drop_flags(container, REMOVED_CONTROLLER_MANAGER_FLAGS, changes);
    if let Some(value) = flag_value(container, "--experimental-cluster-signing-duration") {
        remove_flag(container, "--experimental-cluster-signing-duration");
        if flag_value(container, "--cluster-signing-duration").is_none() {
            set_flag(container, "--cluster-signing-duration", &value);
        }
        changes.push(format!(
            "controller-manager --experimental-cluster-signing-duration became --cluster-signing-duration={value}"
        ));
    }
    if flag_value(container, "--controllers").is_none() {
        set_flag(container, "--controllers", VNODE_CONTROLLERS);
        changes.push(format!(
            "controller-manager --controllers={VNODE_CONTROLLERS} (vNodes carry no kubelet lease)"
        ));
    }
    // The plain-HTTP port 10252 is gone; the secure port serves /healthz to anyone.
    for (which, probe) in [
        ("liveness", &mut container.liveness_probe),
        ("readiness", &mut container.readiness_probe),
    ] {
        let insecure = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .is_some_and(|h| h.port == IntOrString::Int(10252));
        if insecure {
            let path = probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .and_then(|h| h.path.clone())
                .unwrap_or_else(|| "/healthz".into());
            to_http(probe, &path, 10257, "HTTPS");
            changes.push(format!(
                "controller-manager {which} probe asks https port 10257 (10252 was removed)"
            ));
        }
    }
}

fn to_http(probe: &mut Option<Probe>, path: &str, port: i32, scheme: &str) {
    if let Some(probe) = probe.as_mut() {
        probe.exec = None;
        probe.http_get = Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(port),
            scheme: Some(scheme.to_owned()),
            ..Default::default()
        });
    }
}

fn drop_flags(container: &mut Container, flags: &[&str], changes: &mut Vec<String>) {
    for flag in flags {
        if remove_flag(container, flag) {
            changes.push(format!("dropped {flag} (removed from Kubernetes)"));
        }
    }
}

/// Removes `--flag` and `--flag=value` words; returns whether there were any.
fn remove_flag(container: &mut Container, flag: &str) -> bool {
    let prefix = format!("{flag}=");
    let matches = |word: &str| word == flag || word.starts_with(&prefix);
    let mut found = false;
    for list in [container.command.as_mut(), container.args.as_mut()]
        .into_iter()
        .flatten()
    {
        list.retain_mut(|arg| {
            if !arg.split_whitespace().any(matches) {
                return true;
            }
            found = true;
            let kept: Vec<&str> = arg.split(' ').filter(|w| !matches(w)).collect();
            *arg = kept.join(" ");
            !arg.trim().is_empty()
        });
    }
    found
}

/// The Secret and key a file path of container `main` reads, through a secret volume mounted whole.
fn secret_file(pod: &PodSpec, main: usize, path: &str) -> Option<(String, String)> {
    let container = pod.containers.get(main)?;
    container.volume_mounts.iter().flatten().find_map(|mount| {
        let file = path
            .strip_prefix(mount.mount_path.trim_end_matches('/'))?
            .strip_prefix('/')?;
        if mount.sub_path.as_deref().is_some_and(|p| !p.is_empty()) {
            return None;
        }
        let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name)?;
        let secret = volume.secret.as_ref()?;
        let key = match &secret.items {
            Some(items) => items.iter().find(|i| i.path == file)?.key.clone(),
            None => file.to_owned(),
        };
        Some((secret.secret_name.clone()?, key))
    })
}

/// Where container `main` sees Secret `name` whole: an existing mount of it, else a new volume and mount.
fn mount_secret(pod: &mut PodSpec, main: usize, name: &str) -> String {
    let existing = pod.volumes.iter().flatten().find_map(|v| {
        let secret = v.secret.as_ref()?;
        (secret.secret_name.as_deref() == Some(name) && secret.items.is_none()).then(|| v.name.clone())
    });
    if let Some(volume) = &existing
        && let Some(mount) = pod.containers[main]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| &m.name == volume && m.sub_path.as_deref().is_none_or(str::is_empty))
    {
        return mount.mount_path.trim_end_matches('/').to_owned();
    }
    let volume = existing.unwrap_or_else(|| {
        let volume = format!("vc-{name}");
        pod.volumes.get_or_insert_with(Default::default).push(Volume {
            name: volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(name.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        });
        volume
    });
    let path = format!("{ADDED_MOUNTS}/{name}");
    pod.containers[main]
        .volume_mounts
        .get_or_insert_with(Default::default)
        .push(VolumeMount {
            name: volume,
            mount_path: path.clone(),
            read_only: Some(true),
            ..Default::default()
        });
    path
}

#[cfg(test)]
mod tests {
    use crds::ClusterVersion;

    use super::*;

    fn load(path: &str) -> ClusterVersion {
        let path = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
        let yaml = std::fs::read_to_string(&path).expect("fixture");
        serde_saphyr::from_str(&yaml).expect("ClusterVersion")
    }

    fn adapted(cv: &ClusterVersion, component: Component) -> (PodSpec, Vec<String>) {
        let mut pod = component
            .bundle(cv)
            .statefulset
            .spec
            .clone()
            .and_then(|s| s.template.spec)
            .expect("pod");
        let changes = adapt_pod(component, &mut pod);
        (pod, changes)
    }

    fn args(pod: &PodSpec) -> Vec<String> {
        pod.containers[0].args.clone().unwrap_or_default()
    }

    #[test]
    fn our_examples_need_nothing() {
        for example in [
            "examples/clusterversion-clusterip.yaml",
            "examples/clusterversion-nodeport.yaml",
        ] {
            let cv = load(example);
            for component in [
                Component::Etcd,
                Component::ApiServer,
                Component::ControllerManager,
            ] {
                let (pod, changes) = adapted(&cv, component);
                assert_eq!(changes, Vec::<String>::new(), "{example} {component:?}");
                let original = component
                    .bundle(&cv)
                    .statefulset
                    .spec
                    .clone()
                    .and_then(|s| s.template.spec);
                assert_eq!(Some(pod), original);
                if let Some(mut service) = component.bundle(&cv).service.clone() {
                    assert!(adapt_service(&mut service).is_empty());
                }
            }
        }
    }

    const ORIGINAL: &str = "e2e/fixtures/original-clusterversion-v1-nodeport.yaml";

    #[test]
    fn the_original_etcd_serves_etcd_server_trusts_the_etcd_ca_and_is_probed_over_http() {
        let (pod, changes) = adapted(&load(ORIGINAL), Component::Etcd);
        let volumes = pod.volumes.clone().unwrap_or_default();
        let by_name = |n: &str| volumes.iter().find(|v| v.name == n).expect(n).clone();
        assert_eq!(
            by_name("etcd-ca").secret.and_then(|s| s.secret_name).as_deref(),
            Some("etcd-server")
        );
        let root = by_name("root-ca").projected.expect("projected");
        let source = root.sources.expect("sources")[0].secret.clone().expect("secret");
        assert_eq!(source.name, "etcd-server");
        assert_eq!(source.items.expect("items")[0].path, "tls.crt");
        assert!(args(&pod).contains(&"--listen-metrics-urls=http://0.0.0.0:2381".to_owned()));
        for probe in [
            &pod.containers[0].liveness_probe,
            &pod.containers[0].readiness_probe,
        ] {
            let probe = probe.as_ref().expect("probe");
            assert!(probe.exec.is_none());
            assert_eq!(
                probe.http_get.as_ref().expect("http").port,
                IntOrString::Int(2381)
            );
        }
        assert_eq!(changes.len(), 5, "{changes:#?}");
    }

    #[test]
    fn the_original_apiserver_gets_its_own_client_certificates_and_current_flags() {
        let (pod, changes) = adapted(&load(ORIGINAL), Component::ApiServer);
        let args = args(&pod);
        for gone in ["--kubelet-https=true", "--runtime-config=api/all"] {
            assert!(!args.contains(&gone.to_owned()), "{gone} dropped");
        }
        for wanted in [
            "--etcd-certfile=/etc/kubernetes/vc/etcd-client/tls.crt",
            "--etcd-keyfile=/etc/kubernetes/vc/etcd-client/tls.key",
            "--etcd-cafile=/etc/kubernetes/vc/etcd-client/ca.crt",
            "--kubelet-client-certificate=/etc/kubernetes/vc/kubelet-client/tls.crt",
            "--kubelet-client-key=/etc/kubernetes/vc/kubelet-client/tls.key",
            "--service-account-key-file=/etc/kubernetes/pki/service-account/tls.crt",
            "--service-account-signing-key-file=/etc/kubernetes/pki/service-account/tls.key",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
            // Its serving certificate stays.
            "--tls-cert-file=/etc/kubernetes/pki/apiserver/tls.crt",
        ] {
            assert!(args.contains(&wanted.to_owned()), "{wanted} in {args:#?}");
        }
        let mounted: Vec<_> = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert!(mounted.contains(&"/etc/kubernetes/vc/etcd-client"));
        assert!(mounted.contains(&"/etc/kubernetes/vc/kubelet-client"));
        assert_eq!(changes.len(), 11, "{changes:#?}");
        // Adapting twice changes nothing more.
        let mut again = pod.clone();
        assert!(adapt_pod(Component::ApiServer, &mut again).is_empty());
        assert_eq!(again, pod);
    }

    #[test]
    fn the_original_controller_manager_uses_current_flags_and_the_secure_port() {
        let (pod, changes) = adapted(&load(ORIGINAL), Component::ControllerManager);
        let args = args(&pod);
        assert!(args.contains(&"--cluster-signing-duration=87600h".to_owned()));
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--experimental-cluster-signing-duration"))
        );
        assert!(args.contains(&format!("--controllers={VNODE_CONTROLLERS}")));
        let probe = pod.containers[0].readiness_probe.as_ref().expect("probe");
        let http = probe.http_get.as_ref().expect("http");
        assert_eq!(
            (http.port.clone(), http.scheme.as_deref()),
            (IntOrString::Int(10257), Some("HTTPS"))
        );
        assert_eq!(changes.len(), 4, "{changes:#?}");
    }

    #[test]
    fn the_tolerate_unready_annotation_publishes_not_ready_addresses() {
        let cv = load(ORIGINAL);
        let mut service = Component::Etcd.bundle(&cv).service.clone().expect("service");
        assert_eq!(adapt_service(&mut service).len(), 1);
        assert_eq!(
            service.spec.and_then(|s| s.publish_not_ready_addresses),
            Some(true)
        );
    }

    #[test]
    fn flags_are_removed_from_shell_lines_and_lists() {
        let mut container = Container {
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                "exec kube-apiserver --kubelet-https --v=2".into(),
            ]),
            args: Some(vec!["--kubelet-https=true".into(), "--v=2".into()]),
            ..Default::default()
        };
        assert!(remove_flag(&mut container, "--kubelet-https"));
        assert_eq!(
            container.command.as_ref().expect("command")[2],
            "exec kube-apiserver --v=2"
        );
        assert_eq!(container.args, Some(vec!["--v=2".to_owned()]));
        assert!(!remove_flag(&mut container, "--kubelet-https"));
    }
}
