//! Certificates for test control planes, generated in process with rcgen.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};

use crate::{Error, Result};

/// A certificate and its private key, PEM-encoded.
#[derive(Clone, Debug)]
pub struct CertifiedKey {
    /// The certificate.
    pub cert_pem: String,
    /// The PKCS#8 private key.
    pub key_pem: String,
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// TLS server.
    Server,
    /// TLS client.
    Client,
    /// Both.
    ServerAndClient,
}

/// A test certificate authority.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority").finish_non_exhaustive()
    }
}

fn name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    for org in organizations {
        dn.push(DnType::OrganizationName, *org);
    }
    dn
}

impl CertificateAuthority {
    /// A new self-signed CA.
    pub fn new(common_name: &str) -> Result<Self> {
        let key = KeyPair::generate().map_err(Error::pki(format!("{common_name} key")))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(Error::pki(format!("{common_name} certificate")))?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
            key_pem,
        })
    }

    /// The CA certificate.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issues a leaf certificate. `names` may mix DNS names and IP addresses.
    pub fn issue(
        &self,
        common_name: &str,
        organizations: &[&str],
        names: &[&str],
        usage: Usage,
    ) -> Result<CertifiedKey> {
        let key = KeyPair::generate().map_err(Error::pki(format!("{common_name} key")))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, organizations);
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => (*n).to_owned().try_into().map(SanType::DnsName),
            })
            .collect::<Result<_, _>>()
            .map_err(Error::pki(format!("{common_name} names")))?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(Error::pki(format!("{common_name} certificate")))?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A service-account signing key pair (ECDSA P-256), PEM-encoded.
#[derive(Clone, Debug)]
pub struct ServiceAccountKey {
    /// PKCS#8 private key.
    pub private_pem: String,
    /// SubjectPublicKeyInfo public key.
    pub public_pem: String,
}

impl ServiceAccountKey {
    /// A new key pair.
    pub fn generate() -> Result<Self> {
        let key = KeyPair::generate().map_err(Error::pki("service-account key"))?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }
}
