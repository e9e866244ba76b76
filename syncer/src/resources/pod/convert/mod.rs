//! Turning a tenant pod into its super pod (pure: everything it needs is passed in): [`to_super`] here, with
//! the pod's DNS and the tenant's apiserver as a super pod reaches them ([`dns`]), its affinity scoped to
//! its tenant ([`affinity`]), what of a running pod flows down later ([`running`]) and the ephemeral
//! containers added to it ([`ephemeral`]). What it mounts of its tokens is [`crate::tokens::mounts`].

mod affinity;
mod dns;
mod ephemeral;
mod running;

pub use ephemeral::{EphemeralChanges, EphemeralConversion, ephemeral_changes, ephemeral_to_super};
use affinity::{map_keys, scope_affinity};
use dns::{keep_off_super_dns, literal_downward_env, rewrite_dns, set_apiserver_env};
pub use running::{missing_tolerations, mutable_view, resize_patch, resized_containers};

use crds::{PodPolicy, wellknown::ANNOTATION_DISABLE_DNS_MUTATION};
use k8s_openapi::api::core::v1::{HostAlias, PersistentVolumeClaimVolumeSource, Pod, SecurityContext};

use crate::{
    cache::pods::CachedPodSpec,
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

/// The cached view of a full pod's spec.
pub fn cached_spec(pod: &Pod) -> CachedPodSpec {
    pod.spec
        .as_ref()
        .and_then(|spec| serde_json::to_value(spec).ok())
        .and_then(|value| serde_json::from_value(value).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
