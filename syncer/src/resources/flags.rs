//! Flags of the kinds as a whole: which kinds are synced, and which labels and annotations every kind copies
//! as they are. The flags of one kind are beside it: [`crate::resources::pod::flags`],
//! [`crate::tokens::flags`], [`crate::resources::vnode::flags`],
//! [`crate::resources::service::flags`], [`crate::resources::isolation::flags`],
//! [`crate::resources::access::flags`].

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
/// domain are refused. Empty is dropped by [`crate::engine::config::values::listed`].
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
