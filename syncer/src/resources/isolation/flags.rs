//! Flags of the network isolation of tenants' super namespaces, and of the addresses tenants may name in
//! Endpoints and NetworkPolicies.

use ipnet::IpNet;

use crate::engine::config::values::{self, Blank};

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
            allow_namespaces: self
                .network_isolation_allow_namespaces
                .iter()
                .flatten()
                .cloned()
                .collect(),
            allow_cidrs: self
                .network_isolation_allow_cidrs
                .iter()
                .flatten()
                .copied()
                .collect(),
            platform_dns: self
                .network_isolation_platform_dns
                .0
                .clone()
                .map(|service| (service.namespace, service.name)),
            deny_egress: self
                .network_isolation_deny_egress_cidrs
                .iter()
                .flatten()
                .copied()
                .collect(),
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
