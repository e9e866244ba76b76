//! The one error type of vc-manager. Each variant says what was being done; [`Error::reason`] gives the
//! stable CamelCase word used in conditions, events and metric labels.

use crds::wellknown::{CONDITION_APISERVER_READY, CONDITION_PKI_READY, CONDITION_READY};

use crate::component::Component;

/// Errors of vc-manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The VirtualCluster has no namespace or uid (it was not read from an apiserver).
    #[error(transparent)]
    MissingIdentity(#[from] crds::Error),

    /// The root namespace could not be applied or read.
    #[error("applying root namespace {namespace}")]
    RootNamespace {
        /// The namespace.
        namespace: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// A namespace with the root namespace's name belongs to another VirtualCluster.
    #[error("namespace {namespace} belongs to VirtualCluster {owner} (uid {owner_uid}), not to this one")]
    RootNamespaceConflict {
        /// The namespace.
        namespace: String,
        /// `namespace/name` of the VirtualCluster named in its annotations.
        owner: String,
        /// The uid in its annotations.
        owner_uid: String,
    },

    /// `spec.clusterVersionName` names no ClusterVersion.
    #[error("ClusterVersion {name} does not exist")]
    ClusterVersionNotFound {
        /// The ClusterVersion name.
        name: String,
    },
    /// The ClusterVersion could not be read.
    #[error("reading ClusterVersion {name}")]
    ClusterVersionRead {
        /// The ClusterVersion name.
        name: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// The ClusterVersion cannot be rendered into a control plane.
    #[error("ClusterVersion {name} is invalid: {problem}")]
    ClusterVersionInvalid {
        /// The ClusterVersion name.
        name: String,
        /// What is wrong with it.
        problem: String,
    },

    /// A control-plane Service could not be applied.
    #[error("applying {component} Service {namespace}/{name}")]
    ServiceApply {
        /// Which component.
        component: Component,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// The Secrets of a root namespace could not be listed.
    #[error("listing Secrets in {namespace}")]
    SecretList {
        /// Namespace.
        namespace: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// A PKI or kubeconfig Secret could not be applied.
    #[error("applying Secret {namespace}/{name}")]
    SecretApply {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// The tenant's PKI: a certificate or key could not be issued, or an adopted tenant's kubeconfig could
    /// not be read.
    #[error(transparent)]
    Pki(#[from] tenant_pki::Error),

    /// A control-plane StatefulSet could not be applied.
    #[error("applying {component} StatefulSet {namespace}/{name}")]
    StatefulSetApply {
        /// Which component.
        component: Component,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },

    /// A status could not be written.
    #[error("writing status of {kind} {name}")]
    StatusApply {
        /// VirtualCluster or ClusterVersion.
        kind: &'static str,
        /// `namespace/name` or `name`.
        name: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// A finalizer could not be added or removed.
    #[error("{action} finalizer of {kind} {name}")]
    Finalizer {
        /// `adding` or `removing`.
        action: &'static str,
        /// VirtualCluster or ClusterVersion.
        kind: &'static str,
        /// `namespace/name` or `name`.
        name: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// Namespaces of a tenant could not be listed or read during deletion.
    #[error("listing namespaces of tenant {cluster_key}")]
    NamespaceList {
        /// The tenant's cluster key.
        cluster_key: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// A namespace could not be deleted.
    #[error("deleting namespace {namespace}")]
    NamespaceDelete {
        /// The namespace.
        namespace: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },

    /// Adopt mode: the kubeconfig asks for more than plain data (a file, a program, a proxy, clear text),
    /// so nothing is built from it.
    #[error("kubeconfig from {origin}: field {field} is refused: {problem}")]
    KubeconfigRefused {
        /// Where it came from (Secret key or annotation).
        origin: String,
        /// The field, e.g. `users[admin].exec`.
        field: String,
        /// Why.
        problem: &'static str,
    },
    /// Adopt mode: no answer from the tenant apiserver.
    #[error("tenant apiserver {server} is unreachable")]
    TenantUnreachable {
        /// The kubeconfig's server URL.
        server: String,
        /// The transport error.
        #[source]
        source: kube::Error,
    },
    /// Adopt mode: the tenant apiserver rejected the kubeconfig's credentials.
    #[error("tenant apiserver {server} rejected the kubeconfig's credentials (401 Unauthorized)")]
    TenantUnauthorized {
        /// The kubeconfig's server URL.
        server: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// Adopt mode: the kubeconfig's user may not read `/version`.
    #[error("tenant apiserver {server} forbids the kubeconfig's user to read /version (403 Forbidden)")]
    TenantForbidden {
        /// The kubeconfig's server URL.
        server: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// Adopt mode: the tenant apiserver answered `/version` with another error.
    #[error("tenant apiserver {server} answered /version with an error")]
    TenantError {
        /// The kubeconfig's server URL.
        server: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },

    /// Process plumbing (clients, admin endpoint, leader election).
    #[error("vc-manager runtime")]
    Runtime(#[source] vc_runtime::Error),
}

impl From<vc_runtime::Error> for Error {
    /// What the runtime reports of its own (the admin endpoint could not listen) ends the run.
    fn from(source: vc_runtime::Error) -> Self {
        Self::Runtime(source)
    }
}

impl Error {
    /// A stable CamelCase word for this failure: the reason of conditions and events, the `result` label of
    /// metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingIdentity(_) => "MissingIdentity",
            Self::RootNamespace { .. } => "RootNamespaceFailed",
            Self::RootNamespaceConflict { .. } => "RootNamespaceConflict",
            Self::ClusterVersionNotFound { .. } => "ClusterVersionNotFound",
            Self::ClusterVersionRead { .. } => "ClusterVersionReadFailed",
            Self::ClusterVersionInvalid { .. } => "ClusterVersionInvalid",
            Self::ServiceApply { .. } => "ServiceApplyFailed",
            Self::SecretList { .. } => "SecretListFailed",
            Self::SecretApply { .. } => "SecretApplyFailed",
            Self::Pki(error) => error.reason(),
            Self::StatefulSetApply { .. } => "StatefulSetApplyFailed",
            Self::StatusApply { .. } => "StatusApplyFailed",
            Self::Finalizer { .. } => "FinalizerFailed",
            Self::NamespaceList { .. } => "NamespaceListFailed",
            Self::NamespaceDelete { .. } => "NamespaceDeleteFailed",
            Self::KubeconfigRefused { .. } => "KubeconfigRefused",
            Self::TenantUnreachable { .. } => "APIServerUnreachable",
            Self::TenantUnauthorized { .. } => "Unauthorized",
            Self::TenantForbidden { .. } => "Forbidden",
            Self::TenantError { .. } => "APIServerError",
            Self::Runtime(_) => "RuntimeFailed",
        }
    }

    /// The VirtualCluster condition this failure is about.
    pub fn condition(&self) -> &'static str {
        match self {
            Self::RootNamespace { .. }
            | Self::RootNamespaceConflict { .. }
            | Self::SecretList { .. }
            | Self::SecretApply { .. } => CONDITION_PKI_READY,
            Self::Pki(error) if error.about_kubeconfig() => CONDITION_APISERVER_READY,
            Self::Pki(_) => CONDITION_PKI_READY,
            Self::StatefulSetApply { component, .. } | Self::ServiceApply { component, .. } => {
                component.condition()
            }
            Self::KubeconfigRefused { .. }
            | Self::TenantUnreachable { .. }
            | Self::TenantUnauthorized { .. }
            | Self::TenantForbidden { .. }
            | Self::TenantError { .. } => CONDITION_APISERVER_READY,
            Self::MissingIdentity(_)
            | Self::ClusterVersionNotFound { .. }
            | Self::ClusterVersionRead { .. }
            | Self::ClusterVersionInvalid { .. }
            | Self::StatusApply { .. }
            | Self::Finalizer { .. }
            | Self::NamespaceList { .. }
            | Self::NamespaceDelete { .. }
            | Self::Runtime(_) => CONDITION_READY,
        }
    }

    /// Whether this failure means the tenant control plane itself cannot be used (adopt mode: the
    /// kubeconfig or the apiserver), as opposed to vc-manager failing to change a working one.
    pub fn tenant_unusable(&self) -> bool {
        if let Self::Pki(error) = self {
            return error.kubeconfig_unusable();
        }
        matches!(
            self,
            Self::KubeconfigRefused { .. }
                | Self::TenantUnreachable { .. }
                | Self::TenantUnauthorized { .. }
                | Self::TenantForbidden { .. }
                | Self::TenantError { .. }
        )
    }

    /// The message and every cause, joined by `: ` (for conditions and events, which have no cause chain).
    pub fn full_message(&self) -> String {
        vc_runtime::error::chain(self)
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use crds::wellknown::{CONDITION_CONTROLLER_MANAGER_READY, CONDITION_ETCD_READY};

    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code,
            message: message.to_owned(),
            reason: "Forbidden".to_owned(),
            ..Default::default()
        }))
    }

    #[test]
    fn full_message_names_every_cause_once() {
        let error = Error::SecretApply {
            namespace: "ns".into(),
            name: "root-ca".into(),
            source: api_error(403, "secrets \"root-ca\" is forbidden"),
        };
        let message = error.full_message();
        assert!(message.starts_with("applying Secret ns/root-ca: "), "{message}");
        assert!(message.contains("secrets \"root-ca\" is forbidden"), "{message}");
        assert!(!message.contains("Status {"), "{message}");
        assert_eq!(error.reason(), "SecretApplyFailed");
        assert_eq!(error.condition(), CONDITION_PKI_READY);
    }

    #[test]
    fn statefulset_failures_name_their_component_condition() {
        for (component, condition) in [
            (Component::Etcd, CONDITION_ETCD_READY),
            (Component::ApiServer, CONDITION_APISERVER_READY),
            (Component::ControllerManager, CONDITION_CONTROLLER_MANAGER_READY),
        ] {
            let error = Error::StatefulSetApply {
                component,
                namespace: "ns".into(),
                name: "x".into(),
                source: api_error(422, "invalid"),
            };
            assert_eq!(error.condition(), condition);
            assert!(!error.tenant_unusable());
        }
    }

    #[test]
    fn adopt_failures_make_the_tenant_unusable() {
        let error = Error::from(tenant_pki::Error::KubeconfigKeyMissing {
            namespace: "ns".into(),
            name: "kc".into(),
            key: "value".into(),
        });
        assert!(error.tenant_unusable());
        assert_eq!(error.condition(), CONDITION_APISERVER_READY);
        assert_eq!(error.to_string(), "kubeconfig Secret ns/kc has no key \"value\"");
    }
}
