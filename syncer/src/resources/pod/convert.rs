//! Turning a tenant pod into its super pod (pure: everything it needs is passed in).

use std::collections::BTreeMap;

use crds::{
    PodPolicy,
    wellknown::ANNOTATION_DISABLE_DNS_MUTATION,
};
use k8s_openapi::{
    api::core::v1::{
        Affinity, EnvVar, EphemeralContainer, HostAlias, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm,
        PodDNSConfig, PodDNSConfigOption, PodSpec, SecurityContext, Toleration,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement},
};

use crate::{
    cache::pods::{CachedPodSpec, ContainerImage},
    engine::config::PlatformPodPolicy,
    resources::runtime_class::RuntimeClassChoice,
    tenancy::identity::{self, TenantIdentity},
    tokens::mounts::{self, TokenNeed},
};

use super::placement::Resolved;

/// Where a tenant's own apiserver and DNS are reachable from super pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantEndpoints {
    /// The tenant's DNS: the cluster IP of the tenant DNS Service (vc-dns) when the syncer names one, else
    /// the super cluster IP of the tenant's `kube-system/kube-dns` Service, when the tenant has one.
    pub dns_ip: Option<String>,
    /// Super cluster IP and port of the tenant's `default/kubernetes` Service.
    pub apiserver: Option<(String, i32)>,
}

/// Everything a pod conversion depends on.
pub struct PodConversion<'a> {
    /// Whose pod.
    pub identity: &'a TenantIdentity,
    /// Which of the pod's labels and annotations the copy carries (and how its selectors name them).
    pub meta: &'a identity::MetaPolicy,
    /// The pod's super namespace.
    pub super_namespace: &'a str,
    /// The tenant's DNS domain.
    pub cluster_domain: &'a str,
    /// RuntimeClass to force.
    pub runtime_class_name: Option<&'a str>,
    /// The published RuntimeClass the pod's own choice leads to ([`crate::resources::runtime_class::choose`]).
    pub runtime_class: &'a RuntimeClassChoice,
    /// The pod's node selection resolved against the tenant's vNodes ([`super::placement`]); `None` in
    /// `--vnode-mode pods` or when the pod selects no node.
    pub node_selection: Option<&'a Resolved>,
    /// The VirtualCluster's `podPolicy`.
    pub pod_policy: &'a PodPolicy,
    /// What the platform allows every tenant.
    pub platform_policy: &'a PlatformPodPolicy,
    /// Whether a PriorityClass is published to tenants.
    pub published_priority_class: &'a dyn Fn(&str) -> bool,
    /// Whether a StorageClass is published to tenants (generic ephemeral volumes).
    pub published_storage_class: &'a dyn Fn(&str) -> bool,
    /// The published StorageClass marked default, when exactly one is.
    pub published_default_storage_class: Option<&'a str>,
    /// How containers are hardened on shared nodes.
    pub hardening: Hardening,
    /// Tenant services as seen from the super cluster.
    pub endpoints: &'a TenantEndpoints,
    /// `ndots` for pod DNS.
    pub ndots: u32,
    /// Nameservers of pods that opt out of the DNS rewrite but ask for cluster DNS (empty: the node's).
    pub upstream_nameservers: &'a [String],
    /// Name of the pod's token Secret in the super namespace.
    pub token_secret: &'a str,
    /// Prefix of the pod's own keys in that Secret (its tokens and uid; the CA and namespace are shared).
    pub token_key_prefix: &'a str,
}

/// The converted pod and what its token Secret must hold.
#[derive(Clone, Debug)]
pub struct Converted {
    /// The pod to create.
    pub pod: Pod,
    /// Tokens to mint (empty: the pod needs no token).
    pub tokens: Vec<TokenNeed>,
    /// Whether the token Secret is needed at all (tokens, CA, namespace or uid files).
    pub needs_secret: bool,
}

/// Why a pod is not synced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `spec.nodeName` was set by the tenant.
    NodeNameSet(String),
    /// Host access, placement or security profiles beyond the pod policy (see [`super::policy`]).
    Policy(Vec<String>),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NodeNameSet(node) => write!(
                f,
                "spec.nodeName is set to {node:?}: pods are placed by the super cluster's scheduler, so a pod with a node name is not synced"
            ),
            Refusal::Policy(violations) => write!(
                f,
                "the pod policy does not allow {}; the pod is not synced",
                violations.join("; ")
            ),
        }
    }
}

/// The super pod for a tenant pod.
pub fn to_super(tenant: &Pod, cx: &PodConversion<'_>) -> Result<Converted, Refusal> {
    let mut spec = tenant.spec.clone().unwrap_or_default();
    // A node name is honoured as a selection of that vNode; otherwise (`pods` mode, a node the tenant may
    // not use) the super scheduler would be bypassed.
    if let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty())
        && !cx
            .node_selection
            .is_some_and(|resolved| resolved.required.iter().any(|c| &c.name == node))
    {
        return Err(Refusal::NodeNameSet(node.clone()));
    }
    // The apiserver refuses ephemeral containers in a new pod. A pod that has some (one recreated after a
    // pause) gets them through the super pod's subresource once it exists, each judged on its own
    // ([`ephemeral_to_super`]), so that one the policy refuses does not keep the whole pod from running.
    spec.ephemeral_containers = None;
    let input = super::policy::PolicyInput {
        tenant: cx.pod_policy,
        platform: cx.platform_policy,
        forced_runtime_class: cx.runtime_class_name,
        published_priority_class: cx.published_priority_class,
        node_selection_resolved: cx.node_selection.is_some(),
        published_storage_class: cx.published_storage_class,
        published_default_storage_class: cx.published_default_storage_class,
    };
    let mut violations = super::policy::violations(&spec, tenant.metadata.annotations.as_ref(), &input);
    violations.extend(mounts::reserved_secret_references(&spec));
    match cx.runtime_class {
        RuntimeClassChoice::Published(class) => {
            // The super cluster's admission adds the class's tolerations to the pod.
            let refused =
                super::policy::refused_tolerations(&class.tolerations, cx.platform_policy, cx.pod_policy);
            violations.extend(refused.into_iter().map(|(_, what)| {
                format!(
                    "{what} of RuntimeClass {:?}, which the super cluster adds to its pods (the syncer's --pod-allowed-taints, or podPolicy.allowedTaints for keys in --pod-grantable-taints)",
                    class.name
                )
            }));
        }
        RuntimeClassChoice::Refused(why) => violations.push(why.clone()),
        RuntimeClassChoice::Unnamed => {
            if let Some(asked) = cx
                .runtime_class_name
                .or(spec.runtime_class_name.as_deref())
                .filter(|r| !r.is_empty())
            {
                violations.push(format!("runtimeClassName {asked:?} (not looked up)"));
            }
        }
    }
    if !violations.is_empty() {
        return Err(Refusal::Policy(violations));
    }
    let tenant_namespace = tenant.metadata.namespace.clone().unwrap_or_default();
    let tenant_uid = tenant.metadata.uid.clone().unwrap_or_default();

    // The super cluster's admission sets priority and overhead from its own classes.
    spec.priority = None;
    spec.preemption_policy = None;
    spec.overhead = None;
    if let Some(resolved) = cx.node_selection {
        super::placement::rewrite(&mut spec, resolved);
    }
    // Tokens come from the tenant, through the token Secret.
    spec.automount_service_account_token = Some(false);
    if let RuntimeClassChoice::Published(class) = cx.runtime_class {
        spec.runtime_class_name = Some(class.name.clone());
    }
    // A generic ephemeral volume's claim is the tenant's: its controller-manager makes it, named
    // `<pod>-<volume>`, and the syncer copies it like any claim (class, quota). The super pod mounts that
    // copy; the super cluster's own ephemeral-volume controller would make a claim of its own from the
    // template, outside every rule the copy is held to.
    let pod_name = tenant.metadata.name.as_deref().unwrap_or_default();
    for volume in spec.volumes.iter_mut().flatten() {
        if volume.ephemeral.take().is_some() {
            volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                claim_name: format!("{pod_name}-{}", volume.name),
                read_only: None,
            });
        }
        if let Some(image) = &mut volume.image
            && cx.hardening.always_pull
        {
            image.pull_policy = Some(PULL_ALWAYS.to_owned());
        }
    }
    for container in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        cx.hardening
            .apply(&mut container.image_pull_policy, &mut container.security_context);
    }

    let (tokens, needs_secret) = mounts::rewrite_volumes(&mut spec, cx.token_secret, cx.token_key_prefix);

    let opted_out = tenant
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_DISABLE_DNS_MUTATION))
        .is_some_and(|v| v == "true");
    match opted_out {
        false => rewrite_dns(&mut spec, &tenant_namespace, cx),
        true => keep_off_super_dns(&mut spec, cx.upstream_nameservers),
    }

    if let Some((ip, port)) = &cx.endpoints.apiserver {
        let hostnames = vec![
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            format!("kubernetes.default.svc.{}", cx.cluster_domain),
        ];
        spec.host_aliases.get_or_insert_with(Vec::new).push(HostAlias {
            ip: ip.clone(),
            hostnames: Some(hostnames),
        });
        for container in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            set_apiserver_env(&mut container.env, ip, *port);
        }
    }
    for container in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        literal_downward_env(&mut container.env, &tenant_namespace, &tenant_uid);
    }

    if let Some(affinity) = &mut spec.affinity {
        scope_affinity(affinity, cx.identity, cx.meta);
    }
    for constraint in spec.topology_spread_constraints.iter_mut().flatten() {
        if let Some(selector) = &mut constraint.label_selector {
            *selector = identity::map_selector(selector, cx.meta, false);
        }
        map_keys(&mut constraint.match_label_keys, cx.meta);
    }

    let metadata = identity::super_metadata(
        &tenant.metadata,
        cx.identity,
        cx.meta,
        Some(cx.super_namespace.to_owned()),
        true,
    );
    Ok(Converted {
        pod: Pod {
            metadata,
            spec: Some(spec),
            status: None,
        },
        tokens,
        needs_secret,
    })
}

/// `imagePullPolicy` of a pull on every start.
const PULL_ALWAYS: &str = "Always";

/// How a tenant's containers are hardened on nodes other tenants share (the platform's flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hardening {
    /// Pull every image on every start (`imagePullPolicy: Always`), so that the registry checks the pod's
    /// credentials: a node's cache holds other tenants' private images, which any pod naming them could
    /// otherwise run. Off where the super cluster checks credentials itself
    /// (`--super-enforces-image-credentials`).
    pub always_pull: bool,
    /// Drop `NET_RAW` from containers that do not add it themselves (`--pod-allow-net-raw=false`).
    pub drop_net_raw: bool,
}

impl Hardening {
    /// The hardening the syncer's flags ask for.
    pub fn of(config: &crate::engine::config::SyncerConfig) -> Self {
        Self {
            always_pull: !config.super_enforces_image_credentials,
            drop_net_raw: !config.pod_policy.allow_net_raw,
        }
    }

    /// Hardens one container: its pull policy and its capabilities. A container that adds `NET_RAW` (or
    /// `ALL`) itself keeps it: the capability policy has judged that already.
    pub fn apply(&self, pull_policy: &mut Option<String>, security: &mut Option<SecurityContext>) {
        if self.always_pull {
            *pull_policy = Some(PULL_ALWAYS.to_owned());
        }
        if !self.drop_net_raw {
            return;
        }
        let capabilities = security
            .get_or_insert_with(Default::default)
            .capabilities
            .get_or_insert_with(Default::default);
        let named = |list: &Option<Vec<String>>, wanted: &[&str]| {
            list.iter().flatten().any(|c| {
                let c = c.strip_prefix("CAP_").unwrap_or(c);
                wanted.iter().any(|w| c.eq_ignore_ascii_case(w))
            })
        };
        if named(&capabilities.add, &["NET_RAW", "ALL"]) || named(&capabilities.drop, &["NET_RAW", "ALL"]) {
            return;
        }
        capabilities
            .drop
            .get_or_insert_with(Vec::new)
            .push("NET_RAW".to_owned());
    }
}

/// Whether the kubelet would give a pod the cluster's DNS: `ClusterFirstWithHostNet` always,
/// `ClusterFirst` (the default) unless the pod uses the host network, where it means the node's resolver.
fn wants_cluster_dns(spec: &PodSpec) -> bool {
    match spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => spec.host_network != Some(true),
        _ => false,
    }
}

/// A pod that opted out of the rewrite keeps its DNS settings, except that cluster DNS can never mean the
/// super cluster's (which would answer with other tenants' and the platform's Services): it gets the
/// platform's upstream nameservers with its own `dnsConfig`, or the node's resolver.
fn keep_off_super_dns(spec: &mut PodSpec, upstream: &[String]) {
    if !wants_cluster_dns(spec) {
        return;
    }
    if upstream.is_empty() {
        // `Default` merges the pod's dnsConfig with the node's resolv.conf, as ClusterFirst would have.
        spec.dns_policy = Some("Default".to_owned());
        return;
    }
    let mut config = spec.dns_config.take().unwrap_or_default();
    let mut nameservers = upstream.to_vec();
    for own in config.nameservers.take().unwrap_or_default() {
        if nameservers.len() < 3 && !nameservers.contains(&own) {
            nameservers.push(own);
        }
    }
    config.nameservers = Some(nameservers);
    spec.dns_policy = Some("None".to_owned());
    spec.dns_config = Some(config);
}

/// ClusterFirst DNS becomes the tenant's own DNS; without a tenant DNS the node's resolver is used, never
/// the super cluster's, which would answer with super-cluster services.
fn rewrite_dns(spec: &mut PodSpec, tenant_namespace: &str, cx: &PodConversion<'_>) {
    if !wants_cluster_dns(spec) {
        return;
    }
    let Some(dns_ip) = &cx.endpoints.dns_ip else {
        spec.dns_policy = Some("Default".to_owned());
        return;
    };
    let domain = cx.cluster_domain;
    let existing = spec.dns_config.take().unwrap_or_default();
    let mut nameservers = vec![dns_ip.clone()];
    nameservers.extend(existing.nameservers.unwrap_or_default());
    let mut searches = vec![
        format!("{tenant_namespace}.svc.{domain}"),
        format!("svc.{domain}"),
        domain.to_owned(),
    ];
    searches.extend(existing.searches.unwrap_or_default());
    let mut options = existing.options.unwrap_or_default();
    if !options.iter().any(|o| o.name.as_deref() == Some("ndots")) {
        options.insert(
            0,
            PodDNSConfigOption {
                name: Some("ndots".into()),
                value: Some(cx.ndots.to_string()),
            },
        );
    }
    spec.dns_policy = Some("None".to_owned());
    spec.dns_config = Some(PodDNSConfig {
        nameservers: Some(nameservers),
        searches: Some(searches),
        options: Some(options),
    });
}

/// The host in-cluster clients connect to: a name in every tenant apiserver's certificate, which the pod's
/// host alias maps to the super cluster IP of the tenant's `kubernetes` Service. That IP is in no tenant
/// apiserver's certificate, so a client that connected to it by address would fail TLS verification.
const APISERVER_HOST: &str = "kubernetes.default.svc";

/// The variables a kubelet sets for the `kubernetes` Service, pointing at the tenant's apiserver. Explicit
/// container variables win over the kubelet's, so these replace the super cluster's.
fn set_apiserver_env(env: &mut Option<Vec<EnvVar>>, ip: &str, port: i32) {
    let url = format!("tcp://{ip}:{port}");
    let values = [
        ("KUBERNETES_SERVICE_HOST".to_owned(), APISERVER_HOST.to_owned()),
        ("KUBERNETES_SERVICE_PORT".to_owned(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_owned(), port.to_string()),
        ("KUBERNETES_PORT".to_owned(), url.clone()),
        (format!("KUBERNETES_PORT_{port}_TCP"), url),
        (format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".to_owned()),
        (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
        (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), ip.to_owned()),
    ];
    let env = env.get_or_insert_with(Vec::new);
    for (name, value) in values {
        if !env.iter().any(|e| e.name == name) {
            env.push(EnvVar {
                name,
                value: Some(value),
                value_from: None,
            });
        }
    }
}

/// Downward-API variables whose value differs in the super cluster become literals.
fn literal_downward_env(env: &mut Option<Vec<EnvVar>>, tenant_namespace: &str, tenant_uid: &str) {
    for var in env.iter_mut().flatten() {
        let field = var
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        let literal = match field {
            Some("metadata.namespace") => tenant_namespace,
            Some("metadata.uid") => tenant_uid,
            _ => continue,
        };
        var.value = Some(literal.to_owned());
        var.value_from = None;
    }
}

/// Label keys a pod names (`matchLabelKeys`), as the super pods carry them.
fn map_keys(keys: &mut Option<Vec<String>>, meta: &identity::MetaPolicy) {
    for key in keys.iter_mut().flatten() {
        *key = identity::selector_key(key, meta, false).into_owned();
    }
}

/// Pod (anti-)affinity terms only ever match pods of the same tenant, by the keys the super pods and
/// namespaces carry.
fn scope_affinity(affinity: &mut Affinity, identity: &TenantIdentity, meta: &identity::MetaPolicy) {
    let mut terms: Vec<&mut PodAffinityTerm> = Vec::new();
    if let Some(a) = &mut affinity.pod_affinity {
        terms.extend(
            a.required_during_scheduling_ignored_during_execution
                .iter_mut()
                .flatten(),
        );
        terms.extend(
            a.preferred_during_scheduling_ignored_during_execution
                .iter_mut()
                .flatten()
                .map(|w| &mut w.pod_affinity_term),
        );
    }
    if let Some(a) = &mut affinity.pod_anti_affinity {
        terms.extend(
            a.required_during_scheduling_ignored_during_execution
                .iter_mut()
                .flatten(),
        );
        terms.extend(
            a.preferred_during_scheduling_ignored_during_execution
                .iter_mut()
                .flatten()
                .map(|w| &mut w.pod_affinity_term),
        );
    }
    for term in terms {
        if let Some(selector) = &mut term.label_selector {
            *selector = crate::tenancy::identity::map_selector(selector, meta, false);
            require_cluster(selector, identity);
        }
        map_keys(&mut term.match_label_keys, meta);
        map_keys(&mut term.mismatch_label_keys, meta);
        if let Some(namespaces) = &mut term.namespaces {
            for namespace in namespaces.iter_mut() {
                *namespace = identity.super_namespace(namespace);
            }
        }
        if let Some(selector) = &mut term.namespace_selector {
            *selector = crate::tenancy::identity::map_selector(selector, meta, true);
            require_cluster(selector, identity);
        }
    }
}

fn require_cluster(selector: &mut LabelSelector, identity: &TenantIdentity) {
    selector
        .match_expressions
        .get_or_insert_with(Vec::new)
        .push(LabelSelectorRequirement {
            key: crds::wellknown::LABEL_CLUSTER.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![identity.cluster_key.clone()]),
        });
}

/// The fields of a pod that may change after creation and flow down on update.
pub fn mutable_view(spec: &CachedPodSpec) -> serde_json::Value {
    let images = |containers: &[ContainerImage]| -> BTreeMap<String, Option<String>> {
        containers
            .iter()
            .map(|c| (c.name.clone(), c.image.clone()))
            .collect()
    };
    serde_json::json!({
        "images": images(&spec.containers),
        "initImages": images(&spec.init_containers),
        "activeDeadlineSeconds": spec.active_deadline_seconds,
    })
}

/// The strategic-merge patch of a super pod's `resize` subresource that gives its containers the tenant
/// pod's requests and limits, or `None` when the super pod has them. Only the keys the tenant states count:
/// the super cluster's admission (a LimitRange) may have added defaults of its own, and a resize cannot
/// remove a key anyway. Containers the super pod lacks are left out: a pod's containers never change.
pub fn resize_patch(tenant: &CachedPodSpec, super_spec: &CachedPodSpec) -> Option<serde_json::Value> {
    let changes = |tenant: &[ContainerImage], super_containers: &[ContainerImage]| -> Vec<serde_json::Value> {
        tenant
            .iter()
            .filter_map(|wanted| {
                let have = super_containers.iter().find(|c| c.name == wanted.name)?;
                let (want, have) = (&wanted.resources, &have.resources);
                if want.requests.covered_by(&have.requests) && want.limits.covered_by(&have.limits) {
                    return None;
                }
                Some(serde_json::json!({
                    "name": wanted.name,
                    "resources": {"requests": want.requests.to_json(), "limits": want.limits.to_json()},
                }))
            })
            .collect()
    };
    let containers = changes(&tenant.containers, &super_spec.containers);
    let init_containers = changes(&tenant.init_containers, &super_spec.init_containers);
    if containers.is_empty() && init_containers.is_empty() {
        return None;
    }
    let mut spec = serde_json::Map::new();
    if !containers.is_empty() {
        spec.insert("containers".into(), containers.into());
    }
    if !init_containers.is_empty() {
        spec.insert("initContainers".into(), init_containers.into());
    }
    Some(serde_json::json!({ "spec": spec }))
}

/// The names of the containers a resize patch changes, for messages.
pub fn resized_containers(patch: &serde_json::Value) -> Vec<String> {
    ["containers", "initContainers"]
        .into_iter()
        .flat_map(|list| {
            patch["spec"][list]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |c| format!("spec.{list}[{}].resources", c["name"].as_str().unwrap_or_default()))
        })
        .collect()
}

/// The tenant's tolerations the super pod lacks (the super cluster's admission may have added more of its
/// own; a running pod's tolerations can only grow).
pub fn missing_tolerations<'t>(tenant: &'t CachedPodSpec, super_spec: &CachedPodSpec) -> Vec<&'t Toleration> {
    tenant
        .tolerations
        .iter()
        .filter(|t| !super_spec.tolerations.contains(t))
        .collect()
}

/// Everything an ephemeral container's conversion depends on.
pub struct EphemeralConversion<'a> {
    /// The VirtualCluster's `podPolicy`.
    pub pod_policy: &'a PodPolicy,
    /// What the platform allows every tenant.
    pub platform_policy: &'a PlatformPodPolicy,
    /// Super cluster IP and port of the tenant's `default/kubernetes` Service.
    pub apiserver: Option<(&'a str, i32)>,
    /// How containers are hardened on shared nodes.
    pub hardening: Hardening,
}

/// The ephemeral container a tenant added to its running pod, as the super pod gets it: translated as the
/// pod's own containers were when it was created (the tenant's apiserver in the `KUBERNETES_*` variables,
/// downward-API namespace and uid as the tenant's values; volumes, ConfigMaps and Secrets keep their names
/// in the super namespace, and a mounted token volume is already the tenant's), or what the pod policy
/// refuses in it.
pub fn ephemeral_to_super(
    tenant: &Pod,
    container: &EphemeralContainer,
    cx: &EphemeralConversion<'_>,
) -> Result<EphemeralContainer, Vec<String>> {
    let spec = tenant.spec.clone().unwrap_or_default();
    let input = super::policy::PolicyInput {
        tenant: cx.pod_policy,
        platform: cx.platform_policy,
        // Placement, priority and runtime class are the pod's, fixed at creation.
        forced_runtime_class: None,
        published_priority_class: &|_| false,
        node_selection_resolved: false,
        published_storage_class: &|_| false,
        published_default_storage_class: None,
    };
    let mut violations = super::policy::ephemeral_container_violations(
        container,
        &spec,
        tenant.metadata.annotations.as_ref(),
        &input,
    );
    violations.extend(mounts::reserved_env_references(
        container.env.as_deref(),
        container.env_from.as_deref(),
    ));
    if !violations.is_empty() {
        return Err(violations);
    }
    let mut converted = container.clone();
    cx.hardening
        .apply(&mut converted.image_pull_policy, &mut converted.security_context);
    if let Some((ip, port)) = cx.apiserver {
        set_apiserver_env(&mut converted.env, ip, port);
    }
    literal_downward_env(
        &mut converted.env,
        tenant.metadata.namespace.as_deref().unwrap_or_default(),
        tenant.metadata.uid.as_deref().unwrap_or_default(),
    );
    Ok(converted)
}

/// How a tenant pod's ephemeral containers stand against its super pod's.
#[derive(Debug, Default, PartialEq)]
pub struct EphemeralChanges<'t> {
    /// The tenant's the super pod lacks: to be added.
    pub missing: Vec<&'t ContainerImage>,
    /// The tenant's that the super pod has under the same name with another image: ephemeral containers
    /// can never change, so these stay as the super pod has them.
    pub changed: Vec<&'t ContainerImage>,
}

impl EphemeralChanges<'_> {
    /// Whether the super pod has every ephemeral container of the tenant's, as the tenant has it.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.changed.is_empty()
    }
}

/// Compares ephemeral containers by name and image. Those only the super pod has are left alone: they
/// cannot be removed, and one the platform added to debug the super pod is not the tenant's.
pub fn ephemeral_changes<'t>(tenant: &'t CachedPodSpec, super_spec: &CachedPodSpec) -> EphemeralChanges<'t> {
    let mut changes = EphemeralChanges::default();
    for wanted in &tenant.ephemeral_containers {
        match super_spec
            .ephemeral_containers
            .iter()
            .find(|have| have.name == wanted.name)
        {
            None => changes.missing.push(wanted),
            Some(have) if have.image != wanted.image => changes.changed.push(wanted),
            Some(_) => {}
        }
    }
    changes
}

/// The cached view of a full pod's spec.
pub fn cached_spec(pod: &Pod) -> CachedPodSpec {
    pod.spec
        .as_ref()
        .and_then(|spec| serde_json::to_value(spec).ok())
        .and_then(|value| serde_json::from_value(value).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Volume;
    use serde_json::json;

    use super::*;

    fn identity() -> TenantIdentity {
        TenantIdentity {
            cluster_key: "default-abc123-team".into(),
            vc_name: "team".into(),
            vc_namespace: "default".into(),
            vc_uid: "vc-uid".into(),
        }
    }

    /// A pod as a tenant apiserver stores it: admission added the kube-api-access volume and priority.
    fn tenant_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "pod-uid", "labels": {"app": "web"}},
            "spec": {
                "priority": 0,
                "serviceAccountName": "default",
                "containers": [{
                    "name": "web", "image": "nginx:1",
                    "env": [
                        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                    ],
                    "volumeMounts": [{"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
                }],
                "volumes": [{"name": "kube-api-access-x1", "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                ]}}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"app": "web"}},
                    "namespaces": ["shop"],
                    "topologyKey": "kubernetes.io/hostname"
                }]}}
            }
        }))
        .expect("pod")
    }

    fn convert(pod: &Pod, policy: &PodPolicy, endpoints: &TenantEndpoints) -> Result<Converted, Refusal> {
        convert_with_runtime(pod, policy, endpoints, Some("kata"), &published("kata", json!([])))
    }

    /// A published (or forcible) RuntimeClass with these scheduling tolerations.
    fn published(name: &str, tolerations: serde_json::Value) -> RuntimeClassChoice {
        RuntimeClassChoice::Published(crate::resources::runtime_class::ChosenClass {
            name: name.to_owned(),
            tolerations: serde_json::from_value(tolerations).expect("tolerations"),
        })
    }

    /// [`convert`], with the VirtualCluster's forced RuntimeClass and the pod's own choice.
    fn convert_with_runtime(
        pod: &Pod,
        policy: &PodPolicy,
        endpoints: &TenantEndpoints,
        forced: Option<&str>,
        chosen: &RuntimeClassChoice,
    ) -> Result<Converted, Refusal> {
        let identity = identity();
        let platform = PlatformPodPolicy::default();
        let cx = PodConversion {
            identity: &identity,
            meta: &Default::default(),
            super_namespace: "default-abc123-team-shop",
            cluster_domain: "cluster.local",
            runtime_class_name: forced,
            runtime_class: chosen,
            node_selection: None,
            pod_policy: policy,
            platform_policy: &platform,
            published_priority_class: &|_| false,
            published_storage_class: &|class| class == "shared",
            published_default_storage_class: None,
            hardening: Hardening {
                always_pull: true,
                drop_net_raw: true,
            },
            endpoints,
            ndots: 5,
            upstream_nameservers: &[],
            token_secret: "shard-0.vc-tokens",
            token_key_prefix: "web-1",
        };
        to_super(pod, &cx)
    }

    fn endpoints() -> TenantEndpoints {
        TenantEndpoints {
            dns_ip: Some("10.96.0.10".into()),
            apiserver: Some(("10.96.0.1".into(), 443)),
        }
    }

    #[test]
    fn a_typical_pod_is_rewritten_for_the_super_cluster() {
        let converted = convert(&tenant_pod(), &PodPolicy::default(), &endpoints()).expect("converted");
        let pod = converted.pod;
        assert_eq!(
            pod.metadata.namespace.as_deref(),
            Some("default-abc123-team-shop")
        );
        assert_eq!(
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crds::wellknown::LABEL_CLUSTER))
                .map(String::as_str),
            Some("default-abc123-team")
        );
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.priority, None);
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("kata"));

        // DNS: the tenant's kube-dns and search paths.
        assert_eq!(spec.dns_policy.as_deref(), Some("None"));
        let dns = spec.dns_config.expect("dns config");
        assert_eq!(dns.nameservers, Some(vec!["10.96.0.10".to_owned()]));
        assert_eq!(
            dns.searches.expect("searches")[..3],
            ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"]
        );

        // The tenant apiserver, by env and host alias.
        let env = spec.containers[0].env.clone().expect("env");
        let value = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
        // By a name every tenant apiserver's certificate holds, aliased to the super cluster IP.
        assert_eq!(
            value("KUBERNETES_SERVICE_HOST").as_deref(),
            Some("kubernetes.default.svc")
        );
        assert_eq!(
            value("KUBERNETES_PORT_443_TCP_ADDR").as_deref(),
            Some("10.96.0.1")
        );
        // Downward namespace becomes the tenant's; the name is the same on both sides.
        assert_eq!(value("MY_NS").as_deref(), Some("shop"));
        assert!(env.iter().any(|e| e.name == "MY_NAME" && e.value_from.is_some()));
        let aliases = spec.host_aliases.expect("host aliases");
        assert!(
            aliases[0]
                .hostnames
                .as_ref()
                .expect("names")
                .contains(&"kubernetes.default.svc.cluster.local".to_owned())
        );

        // The kube-api-access volume reads token, CA and namespace from the token Secret.
        let sources = spec.volumes.expect("volumes")[0]
            .projected
            .clone()
            .expect("projected")
            .sources
            .expect("sources");
        assert_eq!(sources.len(), 3);
        for (source, key) in sources.iter().zip(["web-1.token-", "ca.crt", "namespace"]) {
            let secret = source.secret.as_ref().expect("secret source");
            assert_eq!(secret.name, "shard-0.vc-tokens");
            assert!(
                secret.items.as_ref().expect("items")[0].key.starts_with(key),
                "{key}"
            );
        }
        assert!(converted.needs_secret);
        assert_eq!(converted.tokens.len(), 1);
        assert_eq!(converted.tokens[0].expiration_seconds, Some(3607));

        // Anti-affinity stays within the tenant.
        let term = &spec
            .affinity
            .expect("affinity")
            .pod_anti_affinity
            .expect("anti")
            .required_during_scheduling_ignored_during_execution
            .expect("terms")[0];
        assert_eq!(term.namespaces, Some(vec!["default-abc123-team-shop".to_owned()]));
        let requirement = &term
            .label_selector
            .as_ref()
            .expect("selector")
            .match_expressions
            .as_ref()
            .expect("expressions")[0];
        assert_eq!(requirement.key, crds::wellknown::LABEL_CLUSTER);
        assert_eq!(requirement.values, Some(vec!["default-abc123-team".to_owned()]));
    }

    #[test]
    fn without_tenant_dns_pods_use_the_node_resolver_not_the_super_dns() {
        let converted =
            convert(&tenant_pod(), &PodPolicy::default(), &TenantEndpoints::default()).expect("converted");
        let spec = converted.pod.spec.expect("spec");
        assert_eq!(spec.dns_policy.as_deref(), Some("Default"));
        assert!(spec.host_aliases.is_none());
    }

    #[test]
    fn an_opted_out_pod_keeps_its_dns_but_never_gets_the_super_clusters() {
        let mut pod = tenant_pod();
        pod.metadata.annotations =
            Some([(ANNOTATION_DISABLE_DNS_MUTATION.to_owned(), "true".to_owned())].into());
        // ClusterFirst (the default) would be the super cluster's DNS: the node's resolver instead.
        let spec = convert(&pod, &PodPolicy::default(), &endpoints())
            .expect("converted")
            .pod
            .spec
            .expect("spec");
        assert_eq!(spec.dns_policy.as_deref(), Some("Default"));
        assert!(spec.dns_config.is_none());

        // With the platform's upstream nameservers: those, then the pod's own, and its own searches.
        pod.spec.as_mut().expect("spec").dns_config = Some(PodDNSConfig {
            nameservers: Some(vec!["192.0.2.53".into()]),
            searches: Some(vec!["corp.example".into()]),
            options: None,
        });
        let identity = identity();
        let platform = PlatformPodPolicy::default();
        let endpoints = endpoints();
        let upstream = ["10.0.0.2".to_owned()];
        // (Host networking allowed, for the last case below.)
        let policy = PodPolicy {
            host_network: true,
            ..Default::default()
        };
        let cx = PodConversion {
            identity: &identity,
            meta: &Default::default(),
            super_namespace: "default-abc123-team-shop",
            cluster_domain: "cluster.local",
            runtime_class_name: None,
            runtime_class: &RuntimeClassChoice::Unnamed,
            node_selection: None,
            pod_policy: &policy,
            platform_policy: &platform,
            published_priority_class: &|_| false,
            published_storage_class: &|_| false,
            published_default_storage_class: None,
            hardening: Hardening::default(),
            endpoints: &endpoints,
            ndots: 5,
            upstream_nameservers: &upstream,
            token_secret: "shard-0.vc-tokens",
            token_key_prefix: "web-1",
        };
        let spec = to_super(&pod, &cx).expect("converted").pod.spec.expect("spec");
        assert_eq!(spec.dns_policy.as_deref(), Some("None"));
        let config = spec.dns_config.expect("dns config");
        assert_eq!(
            config.nameservers,
            Some(vec!["10.0.0.2".to_owned(), "192.0.2.53".to_owned()])
        );
        assert_eq!(config.searches, Some(vec!["corp.example".to_owned()]));

        // Policies that never meant cluster DNS stay as written.
        for (policy, host_network) in [("Default", false), ("None", false), ("ClusterFirst", true)] {
            let mut pod = pod.clone();
            let spec = pod.spec.as_mut().expect("spec");
            spec.dns_policy = Some(policy.into());
            spec.host_network = Some(host_network);
            let converted = to_super(&pod, &cx).expect("converted").pod.spec.expect("spec");
            assert_eq!(converted.dns_policy.as_deref(), Some(policy));
        }
    }

    #[test]
    fn cluster_first_with_host_net_means_cluster_dns_also_without_the_host_network() {
        // The kubelet gives such a pod the cluster's DNS: it must be the tenant's.
        let mut pod = tenant_pod();
        pod.spec.as_mut().expect("spec").dns_policy = Some("ClusterFirstWithHostNet".into());
        let spec = convert(&pod, &PodPolicy::default(), &endpoints())
            .expect("converted")
            .pod
            .spec
            .expect("spec");
        assert_eq!(spec.dns_policy.as_deref(), Some("None"));
        assert_eq!(
            spec.dns_config.and_then(|c| c.nameservers),
            Some(vec!["10.96.0.10".to_owned()])
        );
    }

    #[test]
    fn node_names_and_host_access_are_refused() {
        let mut pod = tenant_pod();
        pod.spec.as_mut().expect("spec").node_name = Some("node-1".into());
        assert_eq!(
            convert(&pod, &PodPolicy::default(), &endpoints()).expect_err("refused"),
            Refusal::NodeNameSet("node-1".into())
        );

        let mut pod = tenant_pod();
        let spec = pod.spec.as_mut().expect("spec");
        spec.host_network = Some(true);
        spec.containers[0].security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        spec.volumes.as_mut().expect("volumes").push(Volume {
            name: "root".into(),
            host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                path: "/".into(),
                type_: None,
            }),
            ..Default::default()
        });
        let Refusal::Policy(violations) =
            convert(&pod, &PodPolicy::default(), &endpoints()).expect_err("refused")
        else {
            panic!("wrong refusal")
        };
        assert_eq!(violations.len(), 3, "{violations:?}");
        // Allowed by policy: synced.
        let allowed = PodPolicy {
            host_network: true,
            privileged: true,
            host_path: true,
            ..Default::default()
        };
        assert!(convert(&pod, &allowed, &endpoints()).is_ok());
    }

    #[test]
    fn a_pod_runs_with_the_published_runtime_class_its_own_leads_to_or_is_refused() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "sandboxed", "namespace": "shop", "uid": "u"},
            "spec": {"runtimeClassName": "my-gvisor", "overhead": {"cpu": "1m"},
                "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod");
        let policy = PodPolicy::default();
        let published = published("gvisor", json!([]));
        let spec = convert_with_runtime(&pod, &policy, &endpoints(), None, &published)
            .expect("converted")
            .pod
            .spec
            .expect("spec");
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        // The super cluster's admission sets the published class's overhead; the tenant's is not sent.
        assert_eq!(spec.overhead, None);

        let refused = RuntimeClassChoice::Refused("runtimeClassName \"my-gvisor\" (handler \"x\")".into());
        match convert_with_runtime(&pod, &policy, &endpoints(), None, &refused) {
            Err(Refusal::Policy(violations)) => assert!(violations.iter().any(|v| v.contains("my-gvisor")), "{violations:?}"),
            other => panic!("{:?}", other.map(|c| c.pod.spec)),
        }
        // A class never looked up is not passed through.
        match convert_with_runtime(&pod, &policy, &endpoints(), None, &RuntimeClassChoice::Unnamed) {
            Err(Refusal::Policy(violations)) => assert!(violations.iter().any(|v| v.contains("my-gvisor")), "{violations:?}"),
            other => panic!("{:?}", other.map(|c| c.pod.spec)),
        }
        // A forced class is what `choose` resolves the choice to (the policy compares the names).
        let mut forced_pod = pod.clone();
        forced_pod.spec.as_mut().expect("spec").runtime_class_name = Some("kata".into());
        let kata = super::tests::published("kata", json!([]));
        let spec = convert_with_runtime(&forced_pod, &policy, &endpoints(), Some("kata"), &kata)
            .expect("converted")
            .pod
            .spec
            .expect("spec");
        assert_eq!(spec.runtime_class_name.as_deref(), Some("kata"));
    }

    /// The attack of a VirtualCluster editor: forcing a class whose scheduling tolerates the control plane's
    /// taint (the super cluster's admission would add it to every pod), or one the platform does not offer.
    #[test]
    fn a_runtime_class_is_held_to_the_pods_toleration_policy() {
        let pod = tenant_pod();
        let policy = PodPolicy::default();
        let tolerant = published(
            "platform-nodes",
            json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
                   {"operator": "Exists"}]),
        );
        match convert_with_runtime(&pod, &policy, &endpoints(), Some("platform-nodes"), &tolerant) {
            Err(Refusal::Policy(violations)) => {
                assert_eq!(violations.len(), 2, "{violations:#?}");
                assert!(violations[0].starts_with(
                    "toleration of taint node-role.kubernetes.io/control-plane of RuntimeClass \"platform-nodes\""
                ));
                assert!(violations[1].starts_with("toleration of every taint of RuntimeClass"));
            }
            other => panic!("{:?}", other.map(|c| c.pod.spec)),
        }
        // Node-condition tolerations (allowed to every pod) are fine.
        let ordinary = published(
            "sandboxed",
            json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]),
        );
        assert!(convert_with_runtime(&pod, &policy, &endpoints(), Some("sandboxed"), &ordinary).is_ok());
        let refused = RuntimeClassChoice::Refused(
            "the VirtualCluster's spec.runtimeClassName \"privileged\", which the platform neither publishes".into(),
        );
        match convert_with_runtime(&pod, &policy, &endpoints(), Some("privileged"), &refused) {
            Err(Refusal::Policy(violations)) => assert!(violations[0].contains("neither publishes"), "{violations:?}"),
            other => panic!("{:?}", other.map(|c| c.pod.spec)),
        }
    }

    /// Generic ephemeral volumes mount the tenant's own claim (made by its controller-manager, synced and
    /// counted like any claim), never a template the super cluster would make a claim of by itself.
    #[test]
    fn an_ephemeral_volume_mounts_the_tenants_claim() {
        let mut pod = tenant_pod();
        pod.metadata.name = Some("db-0".into());
        pod.spec.as_mut().expect("spec").volumes = Some(
            serde_json::from_value(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                "metadata": {"labels": {"tenancy.x-k8s.io/cluster": "someone-else"}},
                "spec": {"storageClassName": "shared", "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}}}]))
            .expect("volumes"),
        );
        let spec = convert(&pod, &PodPolicy::default(), &endpoints())
            .expect("converted")
            .pod
            .spec
            .expect("spec");
        let volume = &spec.volumes.expect("volumes")[0];
        assert!(volume.ephemeral.is_none());
        assert_eq!(
            volume.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()),
            Some("db-0-scratch")
        );
        // Held to the rules of claims.
        for (template, says) in [
            (json!({"storageClassName": "platform-ssd"}), "StorageClass \"platform-ssd\" is not published"),
            (json!({"storageClassName": ""}), "binds pre-made volumes"),
            (json!({}), "names no StorageClass"),
            (json!({"storageClassName": "shared", "selector": {"matchLabels": {"disk": "fast"}}}), "selector"),
            (
                json!({"storageClassName": "shared", "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "db", "namespace": "other"}}),
                "dataSourceRef.namespace \"other\"",
            ),
        ] {
            let mut template = template;
            template["accessModes"] = json!(["ReadWriteOnce"]);
            template["resources"] = json!({"requests": {"storage": "1Gi"}});
            pod.spec.as_mut().expect("spec").volumes = Some(
                serde_json::from_value(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": template}}}]))
                    .expect("volumes"),
            );
            match convert(&pod, &PodPolicy::default(), &endpoints()) {
                Err(Refusal::Policy(violations)) => assert!(
                    violations.iter().any(|v| v.starts_with("ephemeral volume \"scratch\"") && v.contains(says)),
                    "{says}: {violations:#?}"
                ),
                other => panic!("{says}: {:?}", other.map(|c| c.pod.spec)),
            }
        }
    }

    /// Every container (init and ephemeral ones too) is pulled on every start and loses `NET_RAW`, unless
    /// the platform says otherwise or the container adds it itself (which the capability policy judged).
    #[test]
    fn containers_are_hardened_for_shared_nodes() {
        let spec = convert(&tenant_pod(), &PodPolicy::default(), &endpoints())
            .expect("converted")
            .pod
            .spec
            .expect("spec");
        let container = &spec.containers[0];
        assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(
            container
                .security_context
                .as_ref()
                .and_then(|s| s.capabilities.as_ref())
                .and_then(|c| c.drop.clone()),
            Some(vec!["NET_RAW".to_owned()])
        );
        let harden = |hardening: Hardening, security: serde_json::Value| {
            let mut pull = Some("IfNotPresent".to_owned());
            let mut security: Option<SecurityContext> = serde_json::from_value(security).expect("security");
            hardening.apply(&mut pull, &mut security);
            let dropped = security
                .and_then(|s| s.capabilities)
                .and_then(|c| c.drop)
                .unwrap_or_default();
            (pull.unwrap_or_default(), dropped)
        };
        let both = Hardening {
            always_pull: true,
            drop_net_raw: true,
        };
        let table = [
            (both, json!(null), ("Always", vec!["NET_RAW"])),
            (both, json!({"capabilities": {"drop": ["ALL"]}}), ("Always", vec!["ALL"])),
            (both, json!({"capabilities": {"drop": ["CHOWN"]}}), ("Always", vec!["CHOWN", "NET_RAW"])),
            (both, json!({"capabilities": {"add": ["CAP_NET_RAW"]}}), ("Always", vec![])),
            (Hardening::default(), json!(null), ("IfNotPresent", vec![])),
        ];
        for (hardening, security, (pull, dropped)) in table {
            assert_eq!(harden(hardening, security.clone()), (pull.to_owned(), dropped.iter().map(|d| d.to_string()).collect::<Vec<_>>()), "{security}");
        }
    }

    #[test]
    fn a_pod_naming_a_token_secret_of_the_syncer_is_refused() {
        for (reference, name) in [
            (json!({"volumes": [{"name": "v", "secret": {"secretName": "shard-0.vc-tokens"}}]}), "shard-0.vc-tokens"),
            (
                json!({"volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "web-1.vc-token"}}]}}]}),
                "web-1.vc-token",
            ),
            (json!({"imagePullSecrets": [{"name": "a.vc-tokens"}]}), "a.vc-tokens"),
        ] {
            let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
            for (key, value) in reference.as_object().expect("object") {
                spec[key] = value.clone();
            }
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "thief", "namespace": "shop", "uid": "u"}, "spec": spec
            }))
            .expect("pod");
            match convert(&pod, &PodPolicy::default(), &endpoints()) {
                Err(Refusal::Policy(violations)) => {
                    assert!(violations.iter().any(|v| v.contains(name)), "{violations:?}")
                }
                other => panic!("{name}: {:?}", other.map(|c| c.pod.metadata.name)),
            }
        }
        let env = json!({"metadata": {"name": "thief", "namespace": "shop", "uid": "u"}, "spec": {"containers": [
            {"name": "c", "image": "busybox",
             "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "shard-1.vc-tokens", "key": "web-1.token"}}}],
             "envFrom": [{"secretRef": {"name": "web-1.vc-token"}}]}]}});
        let pod: Pod = serde_json::from_value(env).expect("pod");
        let Err(Refusal::Policy(violations)) = convert(&pod, &PodPolicy::default(), &endpoints()) else {
            panic!("refused");
        };
        assert_eq!(violations.len(), 2, "{violations:?}");
        // The tenant's own Secrets are fine.
        let own: Pod = serde_json::from_value(json!({"metadata": {"name": "ok", "namespace": "shop", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "v", "secret": {"secretName": "vc-tokens"}}]}}))
        .expect("pod");
        assert!(convert(&own, &PodPolicy::default(), &endpoints()).is_ok());
    }

    #[test]
    fn pods_without_tokens_need_no_secret() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "plain", "namespace": "shop", "uid": "u"},
            "spec": {"automountServiceAccountToken": false, "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod");
        let converted = convert(&pod, &PodPolicy::default(), &endpoints()).expect("converted");
        assert!(!converted.needs_secret);
        assert!(converted.tokens.is_empty());
    }

    #[test]
    fn mutable_views_follow_images_and_deadlines_only() {
        let pod = tenant_pod();
        let mut changed = pod.clone();
        changed.spec.as_mut().expect("spec").containers[0].image = Some("nginx:2".into());
        assert_ne!(
            mutable_view(&cached_spec(&pod)),
            mutable_view(&cached_spec(&changed))
        );
        let mut relabelled = pod.clone();
        relabelled.metadata.labels = None;
        assert_eq!(
            mutable_view(&cached_spec(&pod)),
            mutable_view(&cached_spec(&relabelled))
        );
    }

    #[test]
    fn an_ephemeral_container_gets_the_tenants_apiserver_and_downward_values() {
        let mut pod = tenant_pod();
        let debug: EphemeralContainer = serde_json::from_value(serde_json::json!({
            "name": "debugger", "image": "busybox", "targetContainerName": "web",
            "command": ["sh"], "stdin": true, "tty": true,
            "env": [{"name": "MY_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
            "volumeMounts": [{"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
        }))
        .expect("ephemeral container");
        pod.spec.as_mut().expect("spec").ephemeral_containers = Some(vec![debug.clone()]);
        let platform = PlatformPodPolicy::default();
        let policy = PodPolicy::default();
        let cx = EphemeralConversion {
            pod_policy: &policy,
            platform_policy: &platform,
            apiserver: Some(("10.96.0.1", 443)),
            hardening: Hardening {
                always_pull: true,
                drop_net_raw: true,
            },
        };
        let converted = ephemeral_to_super(&pod, &debug, &cx).expect("allowed");
        assert_eq!(converted.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(converted.target_container_name.as_deref(), Some("web"));
        assert_eq!(converted.stdin, Some(true));
        assert_eq!(converted.volume_mounts, debug.volume_mounts);
        let env = converted.env.expect("env");
        let value = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
        assert_eq!(value("MY_UID").as_deref(), Some("pod-uid"));
        assert_eq!(
            value("KUBERNETES_SERVICE_HOST").as_deref(),
            Some("kubernetes.default.svc")
        );
        assert_eq!(
            value("KUBERNETES_PORT_443_TCP_ADDR").as_deref(),
            Some("10.96.0.1")
        );

        // Privileged: refused, named.
        let mut privileged = debug.clone();
        privileged.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        let refused = ephemeral_to_super(&pod, &privileged, &cx).expect_err("refused");
        assert_eq!(refused, ["privileged ephemeral container \"debugger\""]);

        // A pod created with ephemeral containers (recreated after a pause) gets them afterwards.
        let created = convert(&pod, &PodPolicy::default(), &endpoints()).expect("converted");
        assert_eq!(created.pod.spec.expect("spec").ephemeral_containers, None);
    }

    #[test]
    fn ephemeral_containers_are_compared_by_name_and_image() {
        let spec = |containers: serde_json::Value| -> CachedPodSpec {
            serde_json::from_value(serde_json::json!({"ephemeralContainers": containers})).expect("spec")
        };
        let tenant = spec(serde_json::json!([
            {"name": "dbg", "image": "busybox"},
            {"name": "new", "image": "busybox"},
            {"name": "moved", "image": "busybox:2"}
        ]));
        let super_spec = spec(serde_json::json!([
            {"name": "dbg", "image": "busybox"},
            {"name": "moved", "image": "busybox:1"},
            {"name": "platform-debugger", "image": "netshoot"}
        ]));
        let changes = ephemeral_changes(&tenant, &super_spec);
        let names = |list: &[&ContainerImage]| list.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&changes.missing), ["new"]);
        assert_eq!(names(&changes.changed), ["moved"]);
        assert!(ephemeral_changes(&super_spec, &super_spec).is_empty());
    }
}
