//! The `tenancy.x-k8s.io` API shared by every virtualcluster-rs component.
//!
//! - [`v1alpha1`]: the `VirtualCluster` and `ClusterVersion` custom resources, YAML-compatible with the
//!   original Go VirtualCluster project and extended with our optional fields.
//! - [`naming`]: how tenant objects are named in the super cluster (cluster keys, namespace mapping).
//! - [`tenant`]: the tenant identity every component uses ([`TenantIdentity`]) and the one rule that says
//!   which tenant a super-cluster object belongs to ([`Owner`]).
//! - [`kubelet_client`]: the bundle of tenants' kubelet-client CAs vc-manager keeps for vn-agent.
//! - [`wellknown`]: label, annotation, Secret, condition and field-manager names that cross a process
//!   boundary (one component writes them, another or a person reads them).
//! - [`meta`]: reading metadata by key whatever holds it ([`Tagged`]), which the ownership rule
//!   ([`tenant::Owner`]) reads through.
//! - [`namespaced_name`]: `namespace/name` in flags ([`NamespacedName`]).
//! - [`addresses`]: which addresses are a super pod's own (vc-dns and the syncer apply the same rule).
//! - [`quantity`]: Kubernetes resource quantities as integers (quota accounting).
//! - [`generate`]: rendering the CRDs to YAML (used by the `crdgen` binary and the drift test).

pub mod addresses;
pub mod generate;
pub mod kubelet_client;
pub mod meta;
pub mod namespaced_name;
pub mod naming;
pub mod quantity;
pub mod tenant;
pub mod usage;
pub mod v1alpha1;
pub mod wellknown;

mod error;
mod schema;

pub use error::Error;
pub use meta::Tagged;
pub use namespaced_name::NamespacedName;
pub use tenant::{Owner, TenantIdentity};
pub use v1alpha1::{
    AttachBackoff, ClusterPhase, ClusterVersion, ClusterVersionSpec, ClusterVersionStatus, ControlPlaneMode,
    KubeconfigSecretRef, PodPolicy, RateLimit, SnapshotSchedule, SnapshotStatus, StatefulSetSvcBundle,
    TenantQuota, TenantUsage, VirtualCluster, VirtualClusterRef, VirtualClusterSpec, VirtualClusterStatus,
};

/// The API group of every resource in this crate.
pub const GROUP: &str = "tenancy.x-k8s.io";
/// The only served and stored version.
pub const VERSION: &str = "v1alpha1";
