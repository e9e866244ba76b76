//! The components of a tenant control plane (etcd, kube-apiserver, kube-controller-manager): their names,
//! conditions and ClusterVersion bundles, which container of a pod runs each, and where the apiserver is
//! reached. Rendering, the tenant PKI, legacy adaptation, status and errors all name components, so this
//! module imports none of them.

use crds::{ClusterVersion, StatefulSetSvcBundle};
use k8s_openapi::api::core::v1::PodSpec;

/// A component of a tenant control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    ApiServer,
    /// kube-controller-manager.
    ControllerManager,
}

impl Component {
    /// In start order: each waits for the one before it to be ready when first created.
    pub const ALL: [Self; 3] = [Self::Etcd, Self::ApiServer, Self::ControllerManager];

    /// The value of the `app.kubernetes.io/component` label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::ApiServer => crds::wellknown::COMPONENT_APISERVER,
            Self::ControllerManager => "controller-manager",
        }
    }

    /// The component in CamelCase, for condition and event reasons.
    pub fn camel(self) -> &'static str {
        match self {
            Self::Etcd => "Etcd",
            Self::ApiServer => "APIServer",
            Self::ControllerManager => "ControllerManager",
        }
    }

    /// The VirtualCluster condition reporting this component.
    pub fn condition(self) -> &'static str {
        use crds::wellknown::{
            CONDITION_APISERVER_READY, CONDITION_CONTROLLER_MANAGER_READY, CONDITION_ETCD_READY,
        };
        match self {
            Self::Etcd => CONDITION_ETCD_READY,
            Self::ApiServer => CONDITION_APISERVER_READY,
            Self::ControllerManager => CONDITION_CONTROLLER_MANAGER_READY,
        }
    }

    /// This component's bundle in a ClusterVersion.
    pub fn bundle(self, cv: &ClusterVersion) -> &StatefulSetSvcBundle {
        match self {
            Self::Etcd => &cv.spec.etcd,
            Self::ApiServer => &cv.spec.api_server,
            Self::ControllerManager => &cv.spec.controller_manager,
        }
    }

    /// Substrings that identify this component's main container by name or command.
    fn binary(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::ApiServer => "apiserver",
            Self::ControllerManager => "controller-manager",
        }
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the tenant apiserver is reached inside the super cluster (for its certificate's names too).
pub use tenant_pki::ApiServerEndpoint;

/// Index of the container running the component: named after it or running its binary, else the first.
pub(crate) fn main_container(pod: &PodSpec, component: Component) -> usize {
    let binary = component.binary();
    pod.containers
        .iter()
        .position(|c| {
            c.name.contains(binary)
                || c.command
                    .iter()
                    .flatten()
                    .chain(c.args.iter().flatten())
                    .any(|a| {
                        a.split_whitespace()
                            .next()
                            .is_some_and(|word| word.rsplit('/').next().is_some_and(|b| b.contains(binary)))
                    })
        })
        .unwrap_or(0)
}
