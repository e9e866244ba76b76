//! A tenant's PKI, shared by vc-manager (which keeps it), `kubectl vc` (which mints user certificates,
//! hands out kubeconfigs and snapshots and restores authorities) and the local harness (which signs its
//! own certificates the same way).
//!
//! - [`pki`]: certificates and keys, issued with rcgen and read back with x509-parser.
//! - [`secrets`]: the Secrets of a tenant's root namespace, planned from what is stored (kept, renewed or
//!   issued), named in [`names`].
//! - [`kubeconfig`]: kubeconfigs rendered deterministically and read back.
//! - [`adopted`]: an adopted tenant's kubeconfig, from its annotation or a Secret labelled for it.
//! - `fixtures` (feature `fixtures`): the test tenant of vc-manager's and `kubectl vc`'s mocked-apiserver
//!   tests.
//!
//! Pure but for [`adopted::read_kubeconfig`], which reads one Secret: no controller, no runtime.
//! The modules form layers: [`names`] and [`pki`] at the bottom, [`kubeconfig`] on [`pki`], [`secrets`]
//! on those, [`adopted`] beside them.

pub mod adopted;
#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod kubeconfig;
pub mod names;
pub mod pki;
pub mod secrets;

mod error;

pub use error::{Error, Result};
pub use secrets::ApiServerEndpoint;
