//! Certificates for test control planes, issued through the product's own PKI
//! ([`tenant_pki::pki`]), so the harness and the product sign certificates one way. This module only fixes
//! what a test needs no say in: every CA and leaf lives ten years from now.

use std::time::Duration;

use tenant_pki::pki::{self, LeafSpec};
pub use tenant_pki::pki::{CertifiedKey, Usage};

use crate::{Error, Result};

/// Lifetime of every test CA and certificate: longer than any run.
const LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

fn failed(what: String) -> impl FnOnce(tenant_pki::Error) -> Error {
    move |source| Error::Pki {
        what,
        source: Box::new(source),
    }
}

/// A test certificate authority.
pub struct CertificateAuthority(pki::CertificateAuthority);

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority").finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new self-signed CA.
    pub fn new(common_name: &str) -> Result<Self> {
        pki::CertificateAuthority::generate(common_name, "", LIFETIME, vc_runtime::clock::now())
            .map(Self)
            .map_err(failed(format!("{common_name} CA")))
    }

    /// The CA certificate.
    pub fn cert_pem(&self) -> &str {
        self.0.cert_pem()
    }

    /// The CA private key.
    pub fn key_pem(&self) -> &str {
        &self.0.pem().key_pem
    }

    /// Issues a leaf certificate for `common_name` in `organizations`. `names` may mix DNS names and IP
    /// addresses.
    pub fn issue(
        &self,
        common_name: &str,
        organizations: &[&str],
        names: &[&str],
        usage: Usage,
    ) -> Result<CertifiedKey> {
        let spec = LeafSpec {
            organizations: organizations.iter().map(|o| (*o).to_owned()).collect(),
            ..LeafSpec::with_names(common_name, names.iter().copied(), usage)
        };
        self.0
            .issue(&spec, LIFETIME, vc_runtime::clock::now())
            .map_err(failed(format!("{common_name} certificate")))
    }
}

/// A service-account signing key pair (ECDSA P-256), PEM-encoded.
pub type ServiceAccountKey = pki::ServiceAccountKey;

/// A new service-account signing key pair.
pub fn service_account_key() -> Result<ServiceAccountKey> {
    ServiceAccountKey::generate().map_err(failed("service-account key".into()))
}
