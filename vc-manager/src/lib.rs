//! vc-manager: turns `VirtualCluster` and `ClusterVersion` objects into tenant control planes.
//!
//! - [`native`]: a control plane provisioned from a ClusterVersion (root namespace, Services, PKI,
//!   StatefulSets, readiness); [`adopt`]: an existing control plane checked through its kubeconfig;
//!   [`cleanup`]: deletion behind the finalizer. [`virtual_cluster`] dispatches between them and handles
//!   failures; [`cluster_version`] guards ClusterVersions in use. [`steps`] holds what native and adopted
//!   tenants share (root namespace, PKI Secrets, status).
//! - Pure logic: [`restore`] (what a snapshot restore holds back), [`render`] (ClusterVersion to
//!   StatefulSets and Services, adapting [`legacy`] templates), [`component`] and [`container_flags`] (what
//!   rendering and adaptation share), [`status`] (phase and conditions). The tenant's PKI, its Secrets and
//!   kubeconfigs, and an adopted tenant's kubeconfig are the `tenant-pki` crate's ([`tenant_pki`]), which
//!   `kubectl vc` and the harness share.
//! - Plumbing: [`context`], [`probe`] (is a tenant apiserver answering), [`leader`], [`metrics`],
//!   [`finalizer`], [`run`] (watches and controllers on the shared [`vc_runtime::Runtime`], and what they do
//!   with its Lease; retries back off with [`vc_runtime::backoff`]), [`args`] (flags of the binary).
//! - The test tenant of the mocked-apiserver tests is `tenant_pki::fixtures`.
//!
//! The modules form layers without import cycles: components and the pure logic at the bottom;
//! the probe, the leader flag and the CA bundle below the [`Context`]; the steps above it, the native and
//! adopted reconciles above those, and [`virtual_cluster`] and [`run`] on top.
//!
//! `kubectl vc`, the kubectl plugin, is the `kubectl-vc` crate; it does not depend on this one.
pub mod adopt;
pub mod applied;
pub mod args;
pub mod ca_bundle;
pub mod cached;
pub mod cleanup;
pub mod cluster_version;
pub mod component;
pub mod container_flags;
pub mod context;
pub mod error;
pub mod finalizer;
#[cfg(test)]
pub(crate) use tenant_pki::fixtures;
pub mod identity;
pub mod leader;
pub mod legacy;
pub mod metrics;
pub mod native;
pub mod probe;
pub mod render;
pub mod restore;
pub mod run;
pub mod status;
pub mod steps;
pub mod virtual_cluster;

pub use context::{Context, NativeReadiness, Settings};
pub use error::{Error, Result};
pub use run::{LEASE_NAME, LeaderElection, Manager};

#[cfg(test)]
mod mock_tests;
