//! What a tenant pod may ask of the super cluster: host access, volumes, placement, priority, scheduler,
//! runtime class and the security profiles of its containers (init and ephemeral ones included).
//!
//! Two layers decide. The platform's flags ([`PlatformPodPolicy`]) hold for every tenant; a
//! VirtualCluster's `podPolicy` widens host access and security profiles for its tenant, and placement
//! (tolerations, node labels) only by keys the platform lets VirtualClusters grant. Whatever podPolicy
//! allows, the Pod Security level of the super namespaces (see [`crate::engine::config::PodSecurityLabels`])
//! still applies in the super apiserver: a VirtualCluster editor cannot lift the platform's backstop.
//!
//! Everything is checked before anything is written; a pod asking for more is not synced, and every
//! violation is named in one event on the tenant pod.

use std::collections::BTreeMap;

use crds::PodPolicy;
use k8s_openapi::api::core::v1::{
    Capabilities, EphemeralContainer, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, SecurityContext,
    Taint, Toleration, Volume,
};

use crate::{engine::config::PlatformPodPolicy, resources::claim};

/// Annotation prefix of the AppArmor profile of a container (before the `appArmorProfile` field).
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
/// Annotation of a pod's seccomp profile (before the `seccompProfile` field).
const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
/// Annotation prefix of a container's seccomp profile (before the `seccompProfile` field).
const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";
/// The node label whose value is the node's name: allowing it allows affinity on `metadata.name`.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// What the policy consults besides the pod.
pub struct PolicyInput<'a> {
    /// The VirtualCluster's `podPolicy`.
    pub tenant: &'a PodPolicy,
    /// The platform's flags.
    pub platform: &'a PlatformPodPolicy,
    /// The RuntimeClass the VirtualCluster forces, if any.
    pub forced_runtime_class: Option<&'a str>,
    /// Whether a PriorityClass is published (a super PriorityClass labelled
    /// `tenancy.x-k8s.io/super.public=true`).
    pub published_priority_class: &'a dyn Fn(&str) -> bool,
    /// Whether the pod's node selection is resolved against the tenant's vNodes ([`super::placement`]):
    /// then it can only reach nodes the tenant sees, whatever labels it names, and they are not judged.
    pub node_selection_resolved: bool,
    /// Whether a StorageClass is published (for generic ephemeral volumes, held to the rules of claims).
    pub published_storage_class: &'a dyn Fn(&str) -> bool,
    /// The published StorageClass marked default, when exactly one is.
    pub published_default_storage_class: Option<&'a str>,
}

/// A container of any kind, with what the policy looks at.
struct ContainerView<'a> {
    kind: &'static str,
    name: &'a str,
    security: Option<&'a SecurityContext>,
    host_ports: Vec<i32>,
}

fn containers(spec: &PodSpec) -> Vec<ContainerView<'_>> {
    let host_ports = |ports: Option<&Vec<k8s_openapi::api::core::v1::ContainerPort>>| -> Vec<i32> {
        ports
            .into_iter()
            .flatten()
            .filter_map(|p| p.host_port.filter(|h| *h != 0))
            .collect()
    };
    let mut all: Vec<ContainerView<'_>> = spec
        .containers
        .iter()
        .map(|c| ContainerView {
            kind: "container",
            name: &c.name,
            security: c.security_context.as_ref(),
            host_ports: host_ports(c.ports.as_ref()),
        })
        .collect();
    all.extend(spec.init_containers.iter().flatten().map(|c| ContainerView {
        kind: "init container",
        name: &c.name,
        security: c.security_context.as_ref(),
        host_ports: host_ports(c.ports.as_ref()),
    }));
    all.extend(spec.ephemeral_containers.iter().flatten().map(|c| ContainerView {
        kind: "ephemeral container",
        name: &c.name,
        security: c.security_context.as_ref(),
        host_ports: host_ports(c.ports.as_ref()),
    }));
    all
}

/// An allow-list of `key` or `key=value` entries.
struct Allowed<'a>(Vec<&'a str>);

impl<'a> Allowed<'a> {
    /// The platform's entries, and the tenant's whose key the platform lets VirtualClusters grant.
    fn of(platform: &'a [String], grantable: &'a [String], tenant: &'a [String]) -> Self {
        let mut entries: Vec<&str> = platform.iter().map(String::as_str).collect();
        entries.extend(
            tenant
                .iter()
                .map(String::as_str)
                .filter(|e| grantable.iter().any(|g| g == key_of(e))),
        );
        Self(entries)
    }

    /// Whether every value of `key` is allowed.
    fn any_value(&self, key: &str) -> bool {
        self.0.contains(&key)
    }

    /// Whether `key=value` is allowed.
    fn value(&self, key: &str, value: &str) -> bool {
        self.any_value(key) || self.0.iter().any(|e| e.split_once('=') == Some((key, value)))
    }
}

fn key_of(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(key, _)| key)
}

/// Everything a pod asks for that the policy does not allow, each naming the field and the setting that
/// would allow it; empty when the pod may be synced.
pub fn violations(
    spec: &PodSpec,
    annotations: Option<&BTreeMap<String, String>>,
    input: &PolicyInput<'_>,
) -> Vec<String> {
    let mut found = Vec::new();
    host_access(spec, input.tenant, &mut found);
    let containers = containers(spec);
    // With the host's network a container's ports are the host's anyway (the apiserver fills hostPort in).
    let host_network_allowed = spec.host_network == Some(true) && input.tenant.host_network;
    if !input.tenant.host_ports && !host_network_allowed {
        for c in &containers {
            for port in &c.host_ports {
                found.push(format!(
                    "hostPort {port} of {} {:?} (podPolicy.hostPorts)",
                    c.kind, c.name
                ));
            }
        }
    }
    volumes(spec, input, &mut found);
    security_profiles(spec, &containers, annotations, input, &mut found);
    if let Some(class) = spec.priority_class_name.as_deref().filter(|c| !c.is_empty())
        && !(input.published_priority_class)(class)
    {
        found.push(format!(
            "priorityClassName {class:?} (only PriorityClasses the platform publishes with label {}=true)",
            crds::wellknown::LABEL_SUPER_PUBLIC
        ));
    }
    if let Some(scheduler) = spec.scheduler_name.as_deref().filter(|s| !s.is_empty())
        && !input.platform.allowed_schedulers.iter().any(|s| s == scheduler)
    {
        found.push(format!(
            "schedulerName {scheduler:?} (the syncer's --pod-allowed-schedulers)"
        ));
    }
    if let (Some(forced), Some(asked)) = (
        input.forced_runtime_class,
        spec.runtime_class_name.as_deref().filter(|r| !r.is_empty()),
    ) && forced != asked
    {
        found.push(format!(
            "runtimeClassName {asked:?} (the VirtualCluster runs every pod with {forced:?})"
        ));
    }
    placement(spec, input, &mut found);
    found
}

fn host_access(spec: &PodSpec, policy: &PodPolicy, found: &mut Vec<String>) {
    if spec.host_network == Some(true) && !policy.host_network {
        found.push("hostNetwork".to_owned());
    }
    if spec.host_pid == Some(true) && !policy.host_pid {
        found.push("hostPID".to_owned());
    }
    if spec.host_ipc == Some(true) && !policy.host_ipc {
        found.push("hostIPC".to_owned());
    }
    if !policy.privileged {
        for c in containers(spec) {
            if c.security.and_then(|s| s.privileged) == Some(true) {
                found.push(format!("privileged {} {:?}", c.kind, c.name));
            }
        }
    }
    if !policy.host_path {
        for volume in spec.volumes.iter().flatten().filter(|v| v.host_path.is_some()) {
            found.push(format!("hostPath volume {:?}", volume.name));
        }
    }
}

/// The volume source types of a volume: the fields it sets besides its name (`configMap`, `nfs`, ...).
/// Read from its JSON, so that every type counts, those a newer Kubernetes adds included.
fn volume_types(volume: &Volume) -> Vec<String> {
    match serde_json::to_value(volume) {
        Ok(serde_json::Value::Object(fields)) => fields
            .into_iter()
            .filter(|(field, value)| field != "name" && !value.is_null())
            .map(|(field, _)| field)
            .collect(),
        _ => Vec::new(),
    }
}

/// Sources a projected volume may combine: the pod's own objects and its token. A `clusterTrustBundle`
/// (the super cluster's trust bundles, cluster-scoped) and whatever a newer Kubernetes adds are not.
const PROJECTED_SOURCES: &[&str] = &["configMap", "secret", "downwardAPI", "serviceAccountToken"];

/// Volume types on the platform's allow-list (`hostPath` is judged with host access, `csi` by driver),
/// projected sources, and generic ephemeral volumes held to the rules of claims.
fn volumes(spec: &PodSpec, input: &PolicyInput<'_>, found: &mut Vec<String>) {
    let platform = input.platform;
    for volume in spec.volumes.iter().flatten() {
        let name = &volume.name;
        for type_ in volume_types(volume) {
            match type_.as_str() {
                "hostPath" => {}
                "csi" => {
                    let driver = volume.csi.as_ref().map_or("", |c| c.driver.as_str());
                    if !platform.allowed_csi_drivers.iter().any(|d| d == driver) {
                        found.push(format!(
                            "csi volume {name:?} of driver {driver:?} (the syncer's --pod-allowed-csi-drivers)"
                        ));
                    }
                }
                other if !platform.allowed_volume_types.iter().any(|t| t == other) => {
                    found.push(format!(
                        "{other} volume {name:?} (the syncer's --pod-allowed-volume-types)"
                    ));
                }
                "projected" => {
                    let sources = volume.projected.iter().flat_map(|p| p.sources.iter().flatten());
                    for source in sources {
                        let types = serde_json::to_value(source).ok();
                        let fields = types.iter().filter_map(|v| v.as_object()).flat_map(|o| o.keys());
                        for field in fields.filter(|f| !PROJECTED_SOURCES.contains(&f.as_str())) {
                            found.push(format!(
                                "{field} source of projected volume {name:?} (a projected volume may hold {})",
                                PROJECTED_SOURCES.join(", ")
                            ));
                        }
                    }
                }
                "ephemeral" => ephemeral_claim(volume, input, found),
                _ => {}
            }
        }
    }
}

/// A generic ephemeral volume's claim template, held to the rules of claims: its claim is the tenant's
/// own (made by the tenant's controller-manager and synced like any claim, counted against the quota), and
/// the super pod mounts that claim.
fn ephemeral_claim(volume: &Volume, input: &PolicyInput<'_>, found: &mut Vec<String>) {
    let name = &volume.name;
    let Some(template) = volume.ephemeral.as_ref().and_then(|e| e.volume_claim_template.as_ref()) else {
        found.push(format!("ephemeral volume {name:?} without a volumeClaimTemplate"));
        return;
    };
    let spec = &template.spec;
    if let Some(why) = claim::class_refusal(
        spec.storage_class_name.as_deref(),
        input.published_storage_class,
        input.published_default_storage_class,
    ) {
        found.push(format!("ephemeral volume {name:?}: {why}"));
    }
    for why in claim::binding_refusals(spec) {
        found.push(format!("ephemeral volume {name:?}: {why}"));
    }
}

/// Seccomp and AppArmor profiles (fields and the annotations older clusters read) and capabilities.
fn security_profiles(
    spec: &PodSpec,
    containers: &[ContainerView<'_>],
    annotations: Option<&BTreeMap<String, String>>,
    input: &PolicyInput<'_>,
    found: &mut Vec<String>,
) {
    let policy = input.tenant;
    let mut profile = |where_: String, kind: &str| match kind {
        "Unconfined" if !policy.unconfined => {
            found.push(format!("{where_} Unconfined (podPolicy.unconfined)"));
        }
        "Localhost" if !policy.localhost_profiles => {
            found.push(format!("{where_} Localhost (podPolicy.localhostProfiles)"));
        }
        _ => {}
    };
    if let Some(pod) = &spec.security_context {
        if let Some(seccomp) = &pod.seccomp_profile {
            profile("pod seccompProfile".to_owned(), &seccomp.type_);
        }
        if let Some(apparmor) = &pod.app_armor_profile {
            profile("pod appArmorProfile".to_owned(), &apparmor.type_);
        }
    }
    for c in containers {
        let Some(security) = c.security else {
            continue;
        };
        if let Some(seccomp) = &security.seccomp_profile {
            profile(
                format!("seccompProfile of {} {:?}", c.kind, c.name),
                &seccomp.type_,
            );
        }
        if let Some(apparmor) = &security.app_armor_profile {
            profile(
                format!("appArmorProfile of {} {:?}", c.kind, c.name),
                &apparmor.type_,
            );
        }
    }
    for (key, value) in annotations.into_iter().flatten() {
        let legacy = key.starts_with(APPARMOR_ANNOTATION_PREFIX)
            || key == SECCOMP_POD_ANNOTATION
            || key.starts_with(SECCOMP_CONTAINER_ANNOTATION_PREFIX);
        if !legacy {
            continue;
        }
        if value == "unconfined" {
            profile(format!("annotation {key}"), "Unconfined");
        } else if value.starts_with("localhost/") {
            profile(format!("annotation {key}"), "Localhost");
        }
    }
    let allowed = |capability: &str| {
        let name = capability
            .strip_prefix("CAP_")
            .unwrap_or(capability)
            .to_ascii_uppercase();
        input
            .platform
            .allowed_capabilities
            .iter()
            .chain(&policy.capabilities)
            .any(|a| a.strip_prefix("CAP_").unwrap_or(a).eq_ignore_ascii_case(&name))
    };
    for c in containers {
        let added = c
            .security
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|Capabilities { add, .. }| add.as_ref());
        for capability in added.into_iter().flatten().filter(|cap| !allowed(cap)) {
            found.push(format!(
                "capability {capability} of {} {:?} (the syncer's --pod-allowed-capabilities or podPolicy.capabilities)",
                c.kind, c.name
            ));
        }
    }
}

/// Tolerations, node selector and node affinity.
fn placement(spec: &PodSpec, input: &PolicyInput<'_>, found: &mut Vec<String>) {
    let platform = input.platform;
    let taints = Allowed::of(
        &platform.allowed_taints,
        &platform.grantable_taints,
        &input.tenant.allowed_taints,
    );
    for toleration in spec.tolerations.iter().flatten() {
        if !tolerable(toleration, &taints) {
            found.push(format!(
                "toleration of {} (the syncer's --pod-allowed-taints, or podPolicy.allowedTaints for keys in --pod-grantable-taints)",
                describe_toleration(toleration)
            ));
        }
    }
    if input.node_selection_resolved {
        return;
    }
    let labels = Allowed::of(
        &platform.allowed_node_labels,
        &platform.grantable_node_labels,
        &input.tenant.allowed_node_labels,
    );
    let hint = "(the syncer's --pod-allowed-node-labels, or podPolicy.allowedNodeLabels for keys in --pod-grantable-node-labels)";
    for (key, value) in spec.node_selector.iter().flatten() {
        if !labels.value(key, value) {
            found.push(format!("nodeSelector {key}={value} {hint}"));
        }
    }
    let Some(node_affinity) = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref()) else {
        return;
    };
    let mut terms: Vec<&NodeSelectorTerm> = node_affinity
        .required_during_scheduling_ignored_during_execution
        .iter()
        .flat_map(|r| &r.node_selector_terms)
        .collect();
    terms.extend(
        node_affinity
            .preferred_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
            .map(|p| &p.preference),
    );
    for term in terms {
        for requirement in term.match_expressions.iter().flatten() {
            if !selectable(requirement, &labels) {
                found.push(format!(
                    "node affinity on label {} {hint}",
                    describe_requirement(requirement)
                ));
            }
        }
        for requirement in term.match_fields.iter().flatten() {
            let by_name = requirement.key == "metadata.name" && labels.any_value(HOSTNAME_LABEL);
            if !by_name {
                found.push(format!(
                    "node affinity on field {} (allowed for metadata.name when {HOSTNAME_LABEL} is an allowed node label)",
                    describe_requirement(requirement)
                ));
            }
        }
    }
}

/// Everything an ephemeral container a tenant adds to its running pod asks for that the policy does not
/// allow, as [`violations`] names it for a pod's own containers; plus references the tenant apiserver
/// should have refused (a volume the pod does not have, a target that is not one of its containers), since
/// whatever the tenant writes is checked here again. Only this container and the annotations about it are
/// looked at: the rest of the pod was judged when it was created.
pub fn ephemeral_container_violations(
    container: &EphemeralContainer,
    pod: &PodSpec,
    annotations: Option<&BTreeMap<String, String>>,
    input: &PolicyInput<'_>,
) -> Vec<String> {
    let alone = PodSpec {
        ephemeral_containers: Some(vec![container.clone()]),
        ..Default::default()
    };
    let own_keys: BTreeMap<String, String> = annotations
        .into_iter()
        .flatten()
        .filter(|(key, _)| {
            [APPARMOR_ANNOTATION_PREFIX, SECCOMP_CONTAINER_ANNOTATION_PREFIX]
                .iter()
                .any(|prefix| key.strip_prefix(prefix) == Some(container.name.as_str()))
        })
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let mut found = violations(&alone, Some(&own_keys), input);
    let volumes: Vec<&str> = pod.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    let mounted = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .chain(container.volume_devices.iter().flatten().map(|d| d.name.as_str()));
    for volume in mounted.filter(|v| !volumes.contains(v)) {
        found.push(format!(
            "volume {volume:?} of ephemeral container {:?}, which the pod does not have",
            container.name
        ));
    }
    if let Some(target) = container.target_container_name.as_deref()
        && !pod.containers.iter().any(|c| c.name == target)
    {
        found.push(format!(
            "targetContainerName {target:?} of ephemeral container {:?}, which is not a container of the pod",
            container.name
        ));
    }
    found
}

/// The tolerations of `tolerations` the policy does not allow, each described as in [`violations`]; what a
/// running pod may add is held to the same rules as what it was created with.
pub fn refused_tolerations<'t>(
    tolerations: impl IntoIterator<Item = &'t Toleration>,
    platform: &PlatformPodPolicy,
    tenant: &PodPolicy,
) -> Vec<(&'t Toleration, String)> {
    let taints = Allowed::of(
        &platform.allowed_taints,
        &platform.grantable_taints,
        &tenant.allowed_taints,
    );
    tolerations
        .into_iter()
        .filter(|t| !tolerable(t, &taints))
        .map(|t| (t, format!("toleration of {}", describe_toleration(t))))
        .collect()
}

/// Whether a tenant's pods may tolerate `taint`: whether a node with it is one they may use.
pub fn may_tolerate(platform: &PlatformPodPolicy, tenant: &PodPolicy, taint: &Taint) -> bool {
    let allowed = Allowed::of(
        &platform.allowed_taints,
        &platform.grantable_taints,
        &tenant.allowed_taints,
    );
    allowed.value(&taint.key, taint.value.as_deref().unwrap_or_default())
}

fn tolerable(toleration: &Toleration, allowed: &Allowed<'_>) -> bool {
    let key = toleration.key.as_deref().unwrap_or_default();
    // An empty key with Exists tolerates every taint: no allow-list entry stands for that.
    if key.is_empty() {
        return false;
    }
    match toleration.operator.as_deref() {
        Some("Exists") => allowed.any_value(key),
        _ => allowed.value(key, toleration.value.as_deref().unwrap_or_default()),
    }
}

fn describe_toleration(toleration: &Toleration) -> String {
    match (toleration.key.as_deref(), toleration.operator.as_deref()) {
        (None | Some(""), _) => "every taint".to_owned(),
        (Some(key), Some("Exists")) => format!("taint {key}"),
        (Some(key), _) => format!("taint {key}={}", toleration.value.as_deref().unwrap_or_default()),
    }
}

fn selectable(requirement: &NodeSelectorRequirement, allowed: &Allowed<'_>) -> bool {
    match requirement.operator.as_str() {
        "In" => requirement
            .values
            .iter()
            .flatten()
            .all(|v| allowed.value(&requirement.key, v)),
        _ => allowed.any_value(&requirement.key),
    }
}

fn describe_requirement(requirement: &NodeSelectorRequirement) -> String {
    match &requirement.values {
        Some(values) if !values.is_empty() => format!(
            "{} {} [{}]",
            requirement.key,
            requirement.operator,
            values.join(", ")
        ),
        _ => format!("{} {}", requirement.key, requirement.operator),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(value: serde_json::Value) -> PodSpec {
        serde_json::from_value(value).expect("spec")
    }

    fn check(spec: &PodSpec, annotations: serde_json::Value, tenant: &PodPolicy) -> Vec<String> {
        let platform = PlatformPodPolicy {
            grantable_taints: vec!["dedicated".into()],
            grantable_node_labels: vec!["pool".into()],
            ..Default::default()
        };
        let annotations: BTreeMap<String, String> = serde_json::from_value(annotations).expect("map");
        let published = |name: &str| name == "tenant-high";
        let input = PolicyInput {
            tenant,
            platform: &platform,
            forced_runtime_class: Some("kata"),
            published_priority_class: &published,
            node_selection_resolved: false,
            published_storage_class: &|class| class == "shared",
            published_default_storage_class: None,
        };
        violations(spec, Some(&annotations), &input)
    }

    /// What a pod usually carries: the apiserver's default tolerations, DaemonSet-style affinity on the
    /// node's name, well-known node labels, runtime-default profiles, baseline capabilities.
    #[test]
    fn an_ordinary_pod_passes() {
        let pod = spec(json!({
            "containers": [{"name": "web", "ports": [{"containerPort": 80}],
                "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"}}}],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
            ]}}},
            "schedulerName": "default-scheduler",
            "runtimeClassName": "kata",
            "priorityClassName": "tenant-high"
        }));
        let annotations = json!({"container.apparmor.security.beta.kubernetes.io/web": "runtime/default"});
        assert_eq!(
            check(&pod, annotations, &PodPolicy::default()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_escape_is_named() {
        let pod = spec(json!({
            "containers": [{"name": "web", "ports": [{"containerPort": 80, "hostPort": 80}],
                "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "CAP_NET_RAW"]},
                    "seccompProfile": {"type": "Unconfined"}}}],
            "initContainers": [{"name": "setup", "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "x"}}}],
            "ephemeralContainers": [{"name": "debug", "securityContext": {"privileged": true}}],
            "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
            "tolerations": [{"operator": "Exists"}, {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference":
                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}]}},
            "schedulerName": "my-scheduler",
            "runtimeClassName": "runc",
            "priorityClassName": "system-node-critical"
        }));
        let annotations = json!({"container.apparmor.security.beta.kubernetes.io/web": "unconfined"});
        let found = check(&pod, annotations, &PodPolicy::default());
        let expected = [
            "privileged ephemeral container \"debug\"",
            "hostPort 80 of container \"web\"",
            "pod seccompProfile Localhost",
            "seccompProfile of container \"web\" Unconfined",
            "appArmorProfile of init container \"setup\" Localhost",
            "annotation container.apparmor.security.beta.kubernetes.io/web Unconfined",
            "capability SYS_ADMIN of container \"web\"",
            "capability CAP_NET_RAW of container \"web\"",
            "priorityClassName \"system-node-critical\"",
            "schedulerName \"my-scheduler\"",
            "runtimeClassName \"runc\"",
            "toleration of every taint",
            "toleration of taint node-role.kubernetes.io/control-plane ",
            "nodeSelector node-role.kubernetes.io/control-plane=",
            "node affinity on label gpu Exists",
        ];
        for want in expected {
            assert!(
                found.iter().any(|f| f.starts_with(want)),
                "{want} not in {found:#?}"
            );
        }
        assert_eq!(found.len(), expected.len(), "{found:#?}");
    }

    #[test]
    fn pod_policy_widens_within_what_the_platform_lets_it_grant() {
        let pod = spec(json!({
            "containers": [{"name": "web", "ports": [{"containerPort": 80, "hostPort": 8080}],
                "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}, "seccompProfile": {"type": "Unconfined"}}}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "team-a", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "team-a"}
        }));
        let policy = PodPolicy {
            host_ports: true,
            capabilities: vec!["NET_ADMIN".into()],
            unconfined: true,
            allowed_taints: vec!["dedicated=team-a".into()],
            allowed_node_labels: vec!["pool=team-a".into()],
            ..Default::default()
        };
        assert_eq!(check(&pod, json!({}), &policy), Vec::<String>::new());
        // Another value than granted is still refused.
        let other = spec(
            json!({"containers": [{"name": "web"}], "nodeSelector": {"pool": "team-b"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}]}),
        );
        assert_eq!(check(&other, json!({}), &policy).len(), 2);
        // Keys the platform does not let VirtualClusters grant stay refused whatever podPolicy says.
        let control_plane = spec(json!({"containers": [{"name": "web"}],
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}));
        let greedy = PodPolicy {
            allowed_taints: vec!["node-role.kubernetes.io/control-plane".into()],
            allowed_node_labels: vec!["node-role.kubernetes.io/control-plane".into()],
            ..Default::default()
        };
        assert_eq!(check(&control_plane, json!({}), &greedy).len(), 2);
    }

    /// Volume types: the allow-list, CSI by driver, projected sources, hostPath left to host access.
    #[test]
    fn only_allowed_volume_types_pass() {
        let volumes = json!([
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "creds", "secret": {"secretName": "creds"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}, {"configMap": {"name": "cfg"}}]}},
            {"name": "nfs", "nfs": {"server": "10.0.0.5", "path": "/exports/other-tenant"}},
            {"name": "iscsi", "iscsi": {"targetPortal": "10.0.0.6:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}},
            {"name": "rbd", "rbd": {"monitors": ["10.0.0.7:6789"], "image": "other"}},
            {"name": "ceph", "cephfs": {"monitors": ["10.0.0.7:6789"]}},
            {"name": "gluster", "glusterfs": {"endpoints": "gluster", "path": "vol"}},
            {"name": "fc", "fc": {"wwids": ["3600508b400105e210000900000490000"]}},
            {"name": "flex", "flexVolume": {"driver": "example.com/lvm"}},
            {"name": "repo", "gitRepo": {"repository": "https://example.com/x.git"}},
            {"name": "csi-ok", "csi": {"driver": "secrets-store.csi.k8s.io"}},
            {"name": "csi-no", "csi": {"driver": "ebs.csi.aws.com", "volumeAttributes": {"volumeID": "vol-1"}}},
            {"name": "bundle", "projected": {"sources": [{"clusterTrustBundle": {"signerName": "example.com/x", "path": "ca.pem"}}]}},
            {"name": "host", "hostPath": {"path": "/"}}
        ]);
        let pod = spec(json!({"containers": [{"name": "web"}], "volumes": volumes}));
        let platform = PlatformPodPolicy {
            allowed_csi_drivers: vec!["secrets-store.csi.k8s.io".into()],
            ..Default::default()
        };
        let input = PolicyInput {
            tenant: &PodPolicy::default(),
            platform: &platform,
            forced_runtime_class: None,
            published_priority_class: &|_| false,
            node_selection_resolved: false,
            published_storage_class: &|_| false,
            published_default_storage_class: None,
        };
        let found = violations(&pod, None, &input);
        let expected = [
            "hostPath volume \"host\"",
            "nfs volume \"nfs\" (the syncer's --pod-allowed-volume-types)",
            "iscsi volume \"iscsi\"",
            "rbd volume \"rbd\"",
            "cephfs volume \"ceph\"",
            "glusterfs volume \"gluster\"",
            "fc volume \"fc\"",
            "flexVolume volume \"flex\"",
            "gitRepo volume \"repo\"",
            "csi volume \"csi-no\" of driver \"ebs.csi.aws.com\" (the syncer's --pod-allowed-csi-drivers)",
            "clusterTrustBundle source of projected volume \"bundle\"",
        ];
        for want in expected {
            assert!(found.iter().any(|f| f.starts_with(want)), "{want} not in {found:#?}");
        }
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        // More types by the platform's flag; hostPath stays podPolicy's.
        let wider = PlatformPodPolicy {
            allowed_volume_types: vec!["nfs".into()],
            ..Default::default()
        };
        let nfs = spec(json!({"containers": [{"name": "web"}], "volumes": [
            {"name": "nfs", "nfs": {"server": "10.0.0.5", "path": "/x"}},
            {"name": "cfg", "configMap": {"name": "cfg"}}]}));
        let found = violations(&nfs, None, &PolicyInput { platform: &wider, ..input });
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].starts_with("configMap volume \"cfg\""), "{found:#?}");
    }

    #[test]
    fn host_network_allowed_brings_its_host_ports() {
        let pod = spec(json!({"hostNetwork": true,
            "containers": [{"name": "web", "ports": [{"containerPort": 80, "hostPort": 80}]}]}));
        let allowed = PodPolicy {
            host_network: true,
            ..Default::default()
        };
        assert_eq!(check(&pod, json!({}), &allowed), Vec::<String>::new());
        assert_eq!(check(&pod, json!({}), &PodPolicy::default()).len(), 2);
    }

    #[test]
    fn an_ephemeral_container_is_judged_alone_as_a_pods_own_would_be() {
        let pod = spec(json!({
            "hostNetwork": true,
            "containers": [{"name": "web"}],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }));
        let container = |value: serde_json::Value| -> EphemeralContainer {
            serde_json::from_value(value).expect("ephemeral container")
        };
        let platform = PlatformPodPolicy::default();
        let input = PolicyInput {
            tenant: &PodPolicy::default(),
            platform: &platform,
            forced_runtime_class: None,
            published_priority_class: &|_| false,
            node_selection_resolved: false,
            published_storage_class: &|_| false,
            published_default_storage_class: None,
        };
        let annotations: BTreeMap<String, String> = serde_json::from_value(json!({
            "container.apparmor.security.beta.kubernetes.io/web": "unconfined",
            "container.apparmor.security.beta.kubernetes.io/dbg": "unconfined"
        }))
        .expect("annotations");
        // What `kubectl debug --target=web` writes: the pod's hostNetwork and the other container's
        // annotation were judged at creation and are not this container's.
        let debug = container(json!({"name": "debugger", "image": "busybox", "targetContainerName": "web",
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}));
        assert_eq!(
            ephemeral_container_violations(&debug, &pod, Some(&annotations), &input),
            Vec::<String>::new()
        );
        let hostile = container(json!({"name": "dbg", "image": "busybox", "targetContainerName": "other",
            "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN"]}},
            "volumeMounts": [{"name": "host-root", "mountPath": "/host"}]}));
        let found = ephemeral_container_violations(&hostile, &pod, Some(&annotations), &input);
        let expected = [
            "privileged ephemeral container \"dbg\"",
            "annotation container.apparmor.security.beta.kubernetes.io/dbg Unconfined",
            "capability SYS_ADMIN of ephemeral container \"dbg\"",
            "volume \"host-root\" of ephemeral container \"dbg\"",
            "targetContainerName \"other\" of ephemeral container \"dbg\"",
        ];
        for want in expected {
            assert!(found.iter().any(|f| f.starts_with(want)), "{want} not in {found:#?}");
        }
        assert_eq!(found.len(), expected.len(), "{found:#?}");
    }
}
