//! Flags of vn-agent's rights on tenant pods, bound in every tenant super namespace.

use crate::engine::config::values::{self, Blank};

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
