//! vc-manager: turns `VirtualCluster` and `ClusterVersion` objects into tenant control planes.
//!
//! - [`native`]: a control plane provisioned from a ClusterVersion (root namespace, Services, PKI,
//!   StatefulSets, readiness); [`adopt`]: an existing control plane checked through its kubeconfig;
//!   [`cleanup`]: deletion behind the finalizer. [`virtual_cluster`] dispatches between them and handles
//!   failures; [`cluster_version`] guards ClusterVersions in use.
//! - Pure logic: [`pki`] (certificates), [`tenant_pki`] (the tenant's Secrets), [`render`] (ClusterVersion
//!   to StatefulSets and Services), [`status`] (phase and conditions), [`kubeconfig`].
//! - Plumbing: [`context`], [`metrics`], [`finalizer`], [`run`] (watches and controllers on
//!   the shared [`vc_runtime::Runtime`], and what they do with its Lease; retries back off with
//!   [`vc_runtime::backoff`]), [`args`] (flags of the binary).
//! - `fixtures` (tests, and feature `fixtures`): the test tenant of the mocked-apiserver tests.
//!
//! `kubectl vc`, the kubectl plugin, is the `kubectl-vc` crate; it uses [`pki`], [`kubeconfig`] and
//! [`adopt::read_kubeconfig`] from here.

pub mod adopt;
pub mod args;
pub mod ca_bundle;
pub mod cached;
pub mod cleanup;
pub mod cluster_version;
pub mod context;
pub mod error;
pub mod finalizer;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod identity;
pub mod kubeconfig;
pub mod legacy;
pub mod metrics;
pub mod native;
pub mod pki;
pub mod render;
pub mod run;
pub mod status;
pub mod steps;
pub mod tenant_pki;
pub mod virtual_cluster;

pub use context::{Context, NativeReadiness, Settings};
pub use error::{Error, Result};
pub use run::{LEASE_NAME, LeaderElection, Manager};

#[cfg(test)]
mod mock_tests;
