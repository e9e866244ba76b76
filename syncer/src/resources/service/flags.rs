//! Flags of tenant Services: ExternalName Services and load-balancer classes.

use crate::engine::config::values;

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
    #[arg(long, env = "EXTERNAL_NAME_SERVICES", value_enum, default_value_t = ExternalNameServices::default())]
    pub external_name_services: ExternalNameServices,
    /// `loadBalancerClass`es tenant Services may name (default none: only the super cluster's default load
    /// balancer).
    #[arg(long, env = "ALLOWED_LOAD_BALANCER_CLASSES", value_delimiter = ',', value_parser = values::trimmed)]
    pub allowed_load_balancer_classes: Vec<String>,
}

