//! vc-manager: turns `VirtualCluster` and `ClusterVersion` objects into tenant control planes.
//!
//! - [`native`]: a control plane provisioned from a ClusterVersion (root namespace, Services, PKI,
//!   StatefulSets, readiness); [`adopt`]: an existing control plane checked through its kubeconfig;
//!   [`cleanup`]: deletion behind the finalizer. [`virtual_cluster`] dispatches between them and handles
//!   failures; [`cluster_version`] guards ClusterVersions in use. [`steps`] holds what native and adopted
//!   tenants share (root namespace, PKI Secrets, status).
//! - Pure logic: [`restore`] (what a snapshot restore holds back), [`pki`] (certificates), [`tenant_pki`] (the tenant's Secrets, named in [`secret_names`]),
//!   [`render`] (ClusterVersion to StatefulSets and Services, adapting [`legacy`] templates), [`component`]
//!   and [`container_flags`] (what rendering and adaptation share), [`status`] (phase and conditions),
//!   [`kubeconfig`].
//! - Plumbing: [`context`], [`probe`] (is a tenant apiserver answering), [`leader`], [`metrics`],
//!   [`finalizer`], [`run`] (watches and controllers on the shared [`vc_runtime::Runtime`], and what they do
//!   with its Lease; retries back off with [`vc_runtime::backoff`]), [`args`] (flags of the binary).
//! - `fixtures` (tests, and feature `fixtures`): the test tenant of the mocked-apiserver tests.
//!
//! The modules form layers without import cycles: names, components and the pure logic at the bottom;
//! the probe, the leader flag and the CA bundle below the [`Context`]; the steps above it, the native and
//! adopted reconciles above those, and [`virtual_cluster`] and [`run`] on top.
//!
//! `kubectl vc`, the kubectl plugin, is the `kubectl-vc` crate; it uses [`pki`], [`kubeconfig`],
//! [`secret_names`] and [`adopt::read_kubeconfig`] from here.
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
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod identity;
pub mod kubeconfig;
pub mod leader;
pub mod legacy;
pub mod metrics;
pub mod native;
pub mod pki;
pub mod probe;
pub mod render;
pub mod restore;
pub mod run;
pub mod secret_names;
pub mod status;
pub mod steps;
pub mod tenant_pki;
pub mod virtual_cluster;

pub use context::{Context, NativeReadiness, Settings};
pub use error::{Error, Result};
pub use run::{LEASE_NAME, LeaderElection, Manager};

#[cfg(test)]
mod mock_tests;
