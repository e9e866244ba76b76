//! Process plumbing shared by vc-manager, syncer and vn-agent.
//!
//! - [`runtime`]: the one shape of every component's `main` ([`Runtime::builder`]): logging, the
//!   super-cluster client, the admin endpoint, leader election and shutdown on signals, wired once.
//! - [`logging`]: tracing setup (text or JSON, `RUST_LOG` filter).
//! - [`backoff`]: per-key exponential backoff after failures (vc-manager's reconciles, the syncer's items).
//! - [`cleanup`]: deleting super-cluster objects pinned to their uid (a tenant's namespaces and objects).
//! - [`admin`]: the `/metrics`, `/healthz` and `/readyz` endpoints.
//! - [`leader`]: leader election on a `coordination.k8s.io` Lease.
//! - [`clients`]: the super-cluster client and clients built from kubeconfig Secrets.
//! - [`limits`]: bounds on what a tenant apiserver's responses may hold in memory.
//! - [`kubeconfig`]: the check that a tenant kubeconfig is plain data (no files, programs or proxies).
//! - [`shutdown`]: SIGTERM / SIGINT.
//! - [`error`]: the runtime's error, and [`error::chain`], the one way components put an error and its causes
//!   on one line; [`clock`]: now, in Unix seconds.

pub mod admin;
pub mod backoff;
pub mod cleanup;
pub mod clients;
pub mod clock;
pub mod error;
pub mod kubeconfig;
pub mod leader;
pub mod limits;
pub mod logging;
pub mod runtime;
pub mod shutdown;

pub use error::Error;
pub use runtime::{Builder, Lease, Runtime, Shutdown};
