//! Flags of the kinds besides pods: which kinds are synced, vNodes, Services, the network isolation,
//! vn-agent's rights on tenant pods and the labels and annotations copied. Pods' flags are
//! [`crate::resources::pod::flags`] and [`crate::resources::pod::token_flags`].
//!
//! A module of its own, needing no `Context`, so that the config (below the `Context`) can hold them.

use std::time::Duration;

use ipnet::IpNet;

use crate::engine::config::values::{self, Blank};

/// Flags of which kinds are synced.
#[derive(Clone, Debug, clap::Args)]
pub struct KindFlags {
    /// Also sync Ingresses down.
    #[arg(long, default_value_t = false)]
    pub sync_ingresses: bool,
    /// Copy tenants' PodDisruptionBudgets to the super cluster, so that evictions there (node drains)
    /// respect them. `false` keeps them in the tenants (and removes the copies): a tenant can then not hold
    /// up a drain with a budget that allows no disruption.
    #[arg(long, env = "SYNC_DISRUPTION_BUDGETS", default_value_t = true, action = clap::ArgAction::Set)]
    pub sync_disruption_budgets: bool,
    /// A namespaced custom resource kind to sync (repeatable): `<plural>.<group>`, then optionally, each
    /// after a `;`, `tenants=key=value[,...]` (VirtualCluster labels a tenant needs; default every
    /// tenant), `secrets=path[,...]` and `configmaps=path[,...]` (fields naming Secrets and ConfigMaps,
    /// e.g. `spec.credentials` or `spec.volumes[].secretName`). Its super CRD is published into the
    /// tenants, their objects copied down and their status up. Checked together (each kind once, at most
    /// a few) by [`crate::engine::config::custom_kinds::parse_all`].
    #[arg(long)]
    pub custom_resources: Vec<String>,
}

/// Flags of vNodes.
#[derive(Clone, Debug, clap::Args)]
pub struct VNodeFlags {
    /// Port vNodes advertise as their kubelet port: vn-agent's port.
    #[arg(long, env = "VN_AGENT_PORT", default_value_t = crds::wellknown::DEFAULT_VN_AGENT_PORT)]
    pub vn_agent_port: u16,
    /// Advertise this vn-agent Service's ClusterIP (`namespace/name`) as every vNode's address instead of
    /// the super node's addresses.
    #[arg(long, value_parser = values::namespaced_name)]
    pub vn_agent_service: Option<Blank<crds::NamespacedName>>,
    /// Seconds a vNode stays after its tenant's last pod left the node.
    #[arg(long = "vnode-grace-seconds", default_value = "120", value_parser = values::seconds)]
    pub vnode_grace: Duration,
    /// Which super nodes tenants see: `pods` (those their pods run on, unschedulable), `usable` (every
    /// node their pods may use, from the start, schedulable) or `selected:key=value[,...]` (the usable
    /// nodes with those labels).
    #[arg(long, env = "VNODE_MODE", default_value = "pods", value_parser = vnode_mode)]
    pub vnode_mode: VNodeMode,
}

impl VNodeFlags {
    /// Where vNodes say their kubelet is.
    pub fn addresses(&self) -> VNodeAddresses {
        match Blank::of(self.vn_agent_service.clone()) {
            None => VNodeAddresses::Node,
            Some(service) => VNodeAddresses::Service {
                namespace: service.namespace,
                name: service.name,
            },
        }
    }
}

/// Where vNodes say their kubelet (vn-agent) is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VNodeAddresses {
    /// The super node's own addresses (vn-agent runs with hostNetwork).
    Node,
    /// The ClusterIP of this vn-agent Service (`namespace/name`), for every vNode.
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
    },
}

/// Which super nodes a tenant sees as vNodes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum VNodeMode {
    /// Only those its pods run on, unschedulable, removed a grace period after its last pod left (the
    /// original project's behaviour: fewest objects).
    #[default]
    Pods,
    /// Every super node its pods may use (each NoSchedule/NoExecute taint one the tenant may tolerate),
    /// from attach on, schedulable: a tenant sees ready nodes before it runs anything, and DaemonSets get
    /// one pod per node.
    Usable,
    /// The usable super nodes that carry these labels (`key=value`, all of them).
    Selected(Vec<(String, String)>),
}

impl std::str::FromStr for VNodeMode {
    type Err = String;

    /// `pods`, `usable`, or `selected:key=value[,key=value...]`.
    fn from_str(value: &str) -> Result<Self, String> {
        vnode_mode(value)
    }
}

impl std::fmt::Display for VNodeMode {
    /// As the flag takes it, so that it round-trips through [`std::str::FromStr`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pods => f.write_str("pods"),
            Self::Usable => f.write_str("usable"),
            Self::Selected(labels) => {
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "selected:{}", labels.join(","))
            }
        }
    }
}

fn vnode_mode(value: &str) -> Result<VNodeMode, String> {
    match value.trim() {
        "pods" => Ok(VNodeMode::Pods),
        "usable" => Ok(VNodeMode::Usable),
        other => {
            let Some(labels) = other.strip_prefix("selected:") else {
                return Err(format!(
                    "--vnode-mode must be pods, usable or selected:key=value[,key=value], got {other:?}"
                ));
            };
            let labels = labels
                .split(',')
                .map(|pair| match pair.split_once('=') {
                    Some((key, value)) if !key.trim().is_empty() => {
                        Ok((key.trim().to_owned(), value.trim().to_owned()))
                    }
                    _ => Err(format!(
                        "--vnode-mode selected: {pair:?} is not a key=value label"
                    )),
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(VNodeMode::Selected(labels))
        }
    }
}

/// What the super cluster gets of a tenant's ExternalName Service. Either way the target must be a host
/// name (`crds::naming::external_name_target`); otherwise nothing is synced and the tenant Service gets a
/// Warning `ExternalNameRefused` event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ExternalNameServices {
    /// A stub nothing in the super cluster follows: a selector-less headless Service without endpoints,
    /// with the target in an annotation only vc-dns reads, so the name is a CNAME inside the tenant's pods
    /// and nowhere else. Super-cluster ingress controllers and gateways follow real ExternalName Services
    /// with their own network position, so a real one would let a tenant aim them at any name, the super
    /// apiserver and other namespaces' Services included (CVE-2021-25740). `refused` is the old name.
    #[default]
    #[value(name = "dns-only", alias = "refused")]
    DnsOnly,
    /// A real ExternalName Service, which super-cluster controllers follow. `allowed` is the old name.
    #[value(name = "synced", alias = "allowed")]
    Synced,
}

/// Flags of tenant Services.
#[derive(Clone, Debug, clap::Args)]
pub struct ServiceFlags {
    /// What the super cluster gets of tenants' ExternalName Services: `dns-only` (an inert stub; the name
    /// resolves only through vc-dns) or `synced` (a real ExternalName Service). `refused` and `allowed`
    /// are accepted as their old names.
    #[arg(long, env = "EXTERNAL_NAME_SERVICES", value_enum, default_value_t = ExternalNameServices::DnsOnly)]
    pub external_name_services: ExternalNameServices,
    /// `loadBalancerClass`es tenant Services may name (default none: only the super cluster's default load
    /// balancer).
    #[arg(long, env = "ALLOWED_LOAD_BALANCER_CLASSES", value_delimiter = ',', value_parser = values::trimmed)]
    pub allowed_load_balancer_classes: Vec<String>,
}

/// The instance metadata service of the public clouds, which hands out the node's own credentials.
pub const INSTANCE_METADATA: &str = "169.254.169.254/32";

/// Flags of the network isolation and of the addresses tenants may name.
#[derive(Clone, Debug, clap::Args)]
pub struct NetworkFlags {
    /// CIDRs tenants may name in selector-less Endpoints (besides their own pods' addresses) and in
    /// NetworkPolicy ipBlocks; anything else is refused. Default: none.
    #[arg(long, env = "TENANT_ALLOWED_CIDRS", value_delimiter = ',', value_parser = values::cidr)]
    pub tenant_allowed_cidrs: Vec<Option<IpNet>>,
    /// Keep a NetworkPolicy in every super namespace of a tenant that lets in only that tenant's pods and
    /// what the two flags below list (`false` deletes them).
    #[arg(long, env = "NETWORK_ISOLATION", default_value_t = true, action = clap::ArgAction::Set)]
    pub network_isolation: bool,
    /// Namespaces whose pods may reach every tenant's pods despite the isolation, as `key=value` labels
    /// (each one selector), e.g. `kubernetes.io/metadata.name=ingress-nginx`. Tenants cannot copy these
    /// labels onto their namespaces.
    #[arg(long, env = "NETWORK_ISOLATION_ALLOW_NAMESPACES", value_delimiter = ',', value_parser = values::label)]
    pub network_isolation_allow_namespaces: Vec<Option<(String, String)>>,
    /// Addresses (CIDRs) that may reach every tenant's pods despite the isolation, e.g. the nodes'.
    #[arg(long, env = "NETWORK_ISOLATION_ALLOW_CIDRS", value_delimiter = ',', value_parser = values::cidr)]
    pub network_isolation_allow_cidrs: Vec<Option<IpNet>>,
    /// The super cluster's DNS Service (`namespace/name`), which the isolation keeps tenants' pods from
    /// (its answers name every tenant's Services; tenants have vc-dns): its cluster IPs and endpoint
    /// addresses, and every pod of its namespace. Empty leaves it reachable.
    #[arg(
        long,
        env = "NETWORK_ISOLATION_PLATFORM_DNS",
        default_value = "kube-system/kube-dns",
        value_parser = values::namespaced_name
    )]
    pub network_isolation_platform_dns: Blank<crds::NamespacedName>,
    /// Addresses (CIDRs) the isolation keeps tenants' pods from, besides the platform DNS; by default the
    /// clouds' instance metadata service (it hands out the node's credentials). Empty: none.
    #[arg(long, env = "NETWORK_ISOLATION_DENY_EGRESS_CIDRS", value_delimiter = ',', default_value = INSTANCE_METADATA, value_parser = values::cidr)]
    pub network_isolation_deny_egress_cidrs: Vec<Option<IpNet>>,
}

impl NetworkFlags {
    /// The CIDRs tenants may name.
    pub fn tenant_allowed_cidrs(&self) -> Vec<IpNet> {
        self.tenant_allowed_cidrs.iter().flatten().copied().collect()
    }

    /// The isolating NetworkPolicy.
    pub fn isolation(&self) -> NetworkIsolation {
        NetworkIsolation {
            enabled: self.network_isolation,
            allow_namespaces: self.network_isolation_allow_namespaces.iter().flatten().cloned().collect(),
            allow_cidrs: self.network_isolation_allow_cidrs.iter().flatten().copied().collect(),
            platform_dns: self
                .network_isolation_platform_dns
                .0
                .clone()
                .map(|service| (service.namespace, service.name)),
            deny_egress: self.network_isolation_deny_egress_cidrs.iter().flatten().copied().collect(),
        }
    }
}

/// The NetworkPolicy the syncer keeps in every super namespace of a tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkIsolation {
    /// Whether it is kept at all (when not, existing ones are deleted).
    pub enabled: bool,
    /// Namespaces (label `key=value`) whose pods may reach every tenant's pods.
    pub allow_namespaces: Vec<(String, String)>,
    /// Addresses that may reach every tenant's pods.
    pub allow_cidrs: Vec<IpNet>,
    /// The super cluster's own DNS Service (`namespace`, `name`), which tenants' pods may not reach: its
    /// records name every tenant's Services. Its namespace's pods are out of their reach too.
    pub platform_dns: Option<(String, String)>,
    /// Addresses tenants' pods may not reach (a cloud's instance metadata service, the platform's own).
    pub deny_egress: Vec<IpNet>,
}

impl NetworkIsolation {
    /// Whether tenants' pods' egress is isolated too.
    pub fn isolates_egress(&self) -> bool {
        self.platform_dns.is_some() || !self.deny_egress.is_empty()
    }
}

/// Flags of vn-agent's rights on tenant pods.
#[derive(Clone, Debug, clap::Args)]
pub struct VnAgentAccessFlags {
    /// vn-agent's ServiceAccount (`namespace/name`), bound in every super namespace of a tenant to
    /// `--vn-agent-cluster-role`: vn-agent's super-apiserver backend may read logs of, exec into, attach
    /// to and port-forward to tenant pods only, never the platform's. Empty binds nothing (and removes
    /// the bindings made before).
    #[arg(long, env = "VN_AGENT_SERVICE_ACCOUNT", value_parser = values::namespaced_name)]
    pub vn_agent_service_account: Option<Blank<crds::NamespacedName>>,
    /// The ClusterRole those bindings grant (the chart's `<release>-vn-agent-tenant-pods`).
    #[arg(long, env = "VN_AGENT_CLUSTER_ROLE", value_parser = values::trimmed)]
    pub vn_agent_cluster_role: Option<String>,
}

impl VnAgentAccessFlags {
    /// vn-agent's rights: both flags or neither.
    pub fn access(&self) -> Result<Option<VnAgentAccess>, String> {
        let account = Blank::of(self.vn_agent_service_account.clone());
        let role = self.vn_agent_cluster_role.clone().filter(|role| !role.is_empty());
        match (account, role) {
            (None, None) => Ok(None),
            (Some(account), Some(cluster_role)) => Ok(Some(VnAgentAccess {
                namespace: account.namespace,
                service_account: account.name,
                cluster_role,
            })),
            _ => Err("--vn-agent-service-account and --vn-agent-cluster-role go together".into()),
        }
    }
}

/// Whom the syncer lets act on the pods of every tenant super namespace, by a RoleBinding there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VnAgentAccess {
    /// Namespace of vn-agent's ServiceAccount.
    pub namespace: String,
    /// Name of vn-agent's ServiceAccount.
    pub service_account: String,
    /// The ClusterRole bound.
    pub cluster_role: String,
}

/// Flags of the labels and annotations copied onto super objects.
#[derive(Clone, Debug, clap::Args)]
pub struct MetaFlags {
    /// Label and annotation prefixes that are super-owned for every tenant, besides each VirtualCluster's
    /// `opaqueMetaPrefixes`.
    #[arg(long, env = "OPAQUE_META_PREFIXES", value_delimiter = ',')]
    pub opaque_meta_prefixes: Vec<String>,
    /// Label and annotation keys (or prefixes ending in `/`) copied from tenant objects onto their super
    /// copies as they are, besides keys without a prefix and the built-in list (`app.kubernetes.io/`, the
    /// workload controllers' pod labels, ...). Other tenant labels are copied encoded (under
    /// `label.tenancy.x-k8s.io`, where the tenant's own selectors still find them), other annotations not
    /// at all. Naming a platform-owned prefix (e.g. `cert-manager.io/`) itself lets it through.
    #[arg(long, env = "COPIED_META_KEYS", value_delimiter = ',', value_parser = meta_key)]
    pub copied_meta_keys: Vec<String>,
    /// Namespace label keys (or prefixes ending in `/`) copied onto super namespaces as they are. Every
    /// other tenant namespace label is copied encoded, so that admission webhooks, policy engines, meshes
    /// and NetworkPolicies of the platform that select namespaces by label never select a tenant's.
    #[arg(long, env = "COPIED_NAMESPACE_LABEL_KEYS", value_delimiter = ',', value_parser = meta_key)]
    pub copied_namespace_label_keys: Vec<String>,
}

/// A key or prefix (ending in `/`) of an allow-list of labels and annotations; keys in the syncer's own
/// domain are refused. Empty is dropped by [`values::listed`].
fn meta_key(value: &str) -> Result<String, String> {
    let entry = value.trim();
    let prefix = entry.split_once('/').map(|(p, _)| p).unwrap_or_default();
    if prefix == "tenancy.x-k8s.io" || prefix.ends_with(".tenancy.x-k8s.io") {
        return Err(format!(
            "{entry:?} is in the syncer's own domain (tenancy.x-k8s.io)"
        ));
    }
    if entry.matches('/').count() > 1 || entry.starts_with('/') {
        return Err(format!(
            "{entry:?} is neither a label key nor a prefix ending in /"
        ));
    }
    Ok(entry.to_owned())
}
