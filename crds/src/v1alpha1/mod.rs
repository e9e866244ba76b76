//! `tenancy.x-k8s.io/v1alpha1`.

mod cluster_version;
mod embedded;
mod virtual_cluster;

pub use cluster_version::{
    ClusterVersion, ClusterVersionSpec, ClusterVersionStatus, StatefulSetSvcBundle, VirtualClusterRef,
};
pub use virtual_cluster::{
    Adoption, AttachBackoff, ClusterPhase, ControlPlaneMode, KubeconfigSecretRef, PodPolicy, RateLimit,
    SnapshotSchedule, SnapshotStatus, TenantQuota, TenantUsage, VirtualCluster, VirtualClusterSpec,
    VirtualClusterStatus,
};
