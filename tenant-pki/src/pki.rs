//! Certificates and keys: issuing them with rcgen, reading stored ones back with x509-parser, and deciding
//! whether a stored one can stay.
//!
//! Keys are ECDSA P-256. A certificate is renewed once less than a fifth of its lifetime remains. A
//! certificate authority is renewed the same way but keeps its key and subject, so certificates it signed
//! before stay valid and nothing that trusts it has to change.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::{
    certificate::X509Certificate,
    der_parser::asn1_rs::Tag,
    extensions::{GeneralName, ParsedExtension},
    pem::parse_x509_pem,
    prelude::FromDer,
    x509::X509Name,
};

use crate::{Error, Result};

/// Certificates start this long before they are issued, so that clocks a little behind accept them.
const BACKDATE_SECONDS: i64 = 5 * 60;

/// What a leaf certificate may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// TLS server.
    Server,
    /// TLS client.
    Client,
    /// Both (etcd peers).
    ServerAndClient,
}

/// The identity and names a leaf certificate must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafSpec {
    /// Subject common name.
    pub common_name: String,
    /// Subject organizations (Kubernetes groups for client certificates).
    pub organizations: BTreeSet<String>,
    /// DNS subject alternative names.
    pub dns_names: BTreeSet<String>,
    /// IP subject alternative names.
    pub ip_addresses: BTreeSet<IpAddr>,
    /// Extended key usage.
    pub usage: Usage,
}

impl LeafSpec {
    /// A client certificate for `common_name` in `groups`.
    pub fn client(common_name: &str, groups: &[&str]) -> Self {
        Self {
            common_name: common_name.to_owned(),
            organizations: groups.iter().map(|g| (*g).to_owned()).collect(),
            dns_names: BTreeSet::new(),
            ip_addresses: BTreeSet::new(),
            usage: Usage::Client,
        }
    }

    /// A certificate for `common_name` with subject alternative names, which may mix DNS names and IPs.
    pub fn with_names<'a>(common_name: &str, names: impl IntoIterator<Item = &'a str>, usage: Usage) -> Self {
        let mut spec = Self {
            usage,
            ..Self::client(common_name, &[])
        };
        for name in names {
            match name.parse::<IpAddr>() {
                Ok(ip) => spec.ip_addresses.insert(ip),
                Err(_) => spec.dns_names.insert(name.to_owned()),
            };
        }
        spec
    }
}

/// A certificate and its private key, PEM-encoded, exactly as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertifiedKey {
    /// The certificate.
    pub cert_pem: String,
    /// The PKCS#8 private key.
    pub key_pem: String,
}

/// What vc-manager needs to know about a stored certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateInfo {
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// Subject common name.
    pub common_name: Option<String>,
    /// Subject organizations.
    pub organizations: BTreeSet<String>,
    /// DNS subject alternative names.
    pub dns_names: BTreeSet<String>,
    /// IP subject alternative names.
    pub ip_addresses: BTreeSet<IpAddr>,
    /// Whether basic constraints say CA.
    pub is_ca: bool,
    /// DER SubjectPublicKeyInfo.
    pub public_key: Vec<u8>,
}

impl CertificateInfo {
    /// Lifetime in seconds.
    pub fn lifetime(&self) -> i64 {
        self.not_after - self.not_before
    }

    /// When the certificate enters the last fifth of its life and should be renewed (Unix seconds).
    pub fn renew_at(&self) -> i64 {
        self.not_after - self.lifetime() / 5
    }

    /// Whether it must be renewed at `now`.
    pub fn needs_renewal(&self, now: i64) -> bool {
        now >= self.renew_at()
    }
}

/// Reads the first certificate of a PEM string.
pub fn inspect(cert_pem: &str) -> std::result::Result<CertificateInfo, String> {
    let der = certificate_der(cert_pem)?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    info_of(&cert)
}

fn certificate_der(cert_pem: &str) -> std::result::Result<Vec<u8>, String> {
    let (_, pem) = parse_x509_pem(cert_pem.as_bytes()).map_err(|e| format!("not PEM: {e}"))?;
    if pem.label != "CERTIFICATE" {
        return Err(format!("PEM block is {:?}, not CERTIFICATE", pem.label));
    }
    Ok(pem.contents)
}

fn info_of(cert: &X509Certificate<'_>) -> std::result::Result<CertificateInfo, String> {
    let subject = cert.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned);
    let organizations = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_owned)
        .collect();
    let mut dns_names = BTreeSet::new();
    let mut ip_addresses = BTreeSet::new();
    if let Some(san) = cert
        .subject_alternative_name()
        .map_err(|e| format!("unreadable subject alternative names: {e}"))?
    {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => {
                    dns_names.insert((*dns).to_owned());
                }
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(*bytes).map_err(|e| e.to_string())?),
                        16 => IpAddr::from(<[u8; 16]>::try_from(*bytes).map_err(|e| e.to_string())?),
                        n => return Err(format!("IP address SAN of {n} bytes")),
                    };
                    ip_addresses.insert(ip);
                }
                _ => {}
            }
        }
    }
    let validity = cert.validity();
    Ok(CertificateInfo {
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        common_name,
        organizations,
        dns_names,
        ip_addresses,
        is_ca: cert.is_ca(),
        public_key: cert.public_key().raw.to_vec(),
    })
}

/// Whether `cert_pem`'s signature verifies with the public key of `ca_cert_pem`.
pub fn is_signed_by(cert_pem: &str, ca_cert_pem: &str) -> bool {
    let (Ok(cert_der), Ok(ca_der)) = (certificate_der(cert_pem), certificate_der(ca_cert_pem)) else {
        return false;
    };
    let (Ok((_, cert)), Ok((_, ca))) = (
        X509Certificate::from_der(&cert_der),
        X509Certificate::from_der(&ca_der),
    ) else {
        return false;
    };
    cert.issuer() == ca.subject() && cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// Whether `key_pem` is the private key of the public key `public_key` (DER SubjectPublicKeyInfo).
pub fn key_matches(key_pem: &str, public_key: &[u8]) -> bool {
    KeyPair::from_pem(key_pem).is_ok_and(|key| key.subject_public_key_info() == public_key)
}

fn timestamp(what: &str, unix: i64) -> Result<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(unix).map_err(|source| Error::CertificateValidity {
        what: what.to_owned(),
        source,
    })
}

/// A serial number unique per key and issuing time: the SHA-256 of both, cut to 16 bytes and kept positive.
/// A renewed CA certificate has the same key and subject, so its serial must differ by time.
fn serial_number(public_key: &[u8], not_before: i64, common_name: &str) -> SerialNumber {
    let mut hasher = Sha256::new();
    hasher.update(public_key);
    hasher.update(not_before.to_be_bytes());
    hasher.update(common_name.as_bytes());
    hasher.update(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .to_be_bytes(),
    );
    let mut bytes: [u8; 16] = hasher.finalize()[..16].try_into().unwrap_or([1; 16]);
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

fn generate_key(what: &str) -> Result<KeyPair> {
    KeyPair::generate().map_err(|source| Error::Certificate {
        what: format!("{what} key"),
        source,
    })
}

/// The subject of a stored certificate as rcgen parameters, with each value in its original string type so
/// that the encoded name stays byte-for-byte the same.
fn copy_name(name: &X509Name<'_>) -> std::result::Result<DistinguishedName, rcgen::Error> {
    let mut copy = DistinguishedName::new();
    for rdn in name.iter() {
        let mut attributes = rdn.iter();
        let (Some(attribute), None) = (attributes.next(), attributes.next()) else {
            return Err(rcgen::Error::CouldNotParseCertificate);
        };
        let oid: Vec<u64> = attribute
            .attr_type()
            .iter()
            .ok_or(rcgen::Error::CouldNotParseCertificate)?
            .collect();
        let data = attribute.attr_value().data;
        let text = std::str::from_utf8(data).map_err(|_| rcgen::Error::CouldNotParseCertificate)?;
        let value = match attribute.attr_value().header.tag() {
            Tag::PrintableString => DnValue::PrintableString(text.try_into()?),
            Tag::Ia5String => DnValue::Ia5String(text.try_into()?),
            Tag::Utf8String => DnValue::Utf8String(text.to_owned()),
            _ => return Err(rcgen::Error::CouldNotParseCertificate),
        };
        copy.push(DnType::from_oid(&oid), value);
    }
    Ok(copy)
}

/// Organizations a leaf may carry beyond the first (placeholder OIDs `2.5.100.0` to `2.5.127.127`).
const MAX_EXTRA_ORGANIZATIONS: usize = 28 * 128;

/// The placeholder attribute type of the `i`-th organization after the first: `2.5.(100 + i / 128).(i %
/// 128)`, whose DER (`06 03 55 xx yy`) is as long as organizationName's (`06 03 55 04 0A`).
fn placeholder_oid(i: usize) -> Vec<u64> {
    vec![2, 5, 100 + (i / 128) as u64, (i % 128) as u64]
}

/// Header length and content length of the DER element at the start of `der`.
fn der_header(der: &[u8]) -> Option<(usize, usize)> {
    let first = *der.get(1)?;
    if first < 0x80 {
        return Some((2, usize::from(first)));
    }
    let count = usize::from(first & 0x7f);
    if count == 0 || count > 4 {
        return None;
    }
    let length = der
        .get(2..2 + count)?
        .iter()
        .fold(0usize, |n, b| (n << 8) | usize::from(*b));
    Some((2 + count, length))
}

/// A DER element with `tag` around `content`.
fn der_element(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let length = content.len();
    if length < 0x80 {
        out.push(length as u8);
    } else {
        let bytes: Vec<u8> = length.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// Renames the `count` placeholder attribute types in a certificate's subject to organizationName and
/// signs it again with `signer` (the issuer's key; the signature algorithm stays).
fn rename_placeholders(
    cert_der: &[u8],
    count: usize,
    signer: &KeyPair,
) -> std::result::Result<Vec<u8>, rcgen::Error> {
    let unparsable = || rcgen::Error::CouldNotParseCertificate;
    let (header, length) = der_header(cert_der).ok_or_else(unparsable)?;
    let content = cert_der.get(header..header + length).ok_or_else(unparsable)?;
    let (tbs_header, tbs_length) = der_header(content).ok_or_else(unparsable)?;
    let tbs_end = tbs_header + tbs_length;
    let (alg_header, alg_length) =
        der_header(content.get(tbs_end..).ok_or_else(unparsable)?).ok_or_else(unparsable)?;
    let algorithm = content
        .get(tbs_end..tbs_end + alg_header + alg_length)
        .ok_or_else(unparsable)?;
    let mut tbs = content.get(..tbs_end).ok_or_else(unparsable)?.to_vec();
    let (_, parsed) = X509Certificate::from_der(cert_der).map_err(|_| unparsable())?;
    let subject = parsed.subject().as_raw();
    let start = tbs
        .windows(subject.len())
        .position(|w| w == subject)
        .ok_or_else(unparsable)?;
    let organization_name = [0x06, 0x03, 0x55, 0x04, 0x0a];
    for i in 0..count {
        let oid = placeholder_oid(i);
        let needle = [0x06, 0x03, 0x55, oid[2] as u8, oid[3] as u8];
        let range = start..start + subject.len();
        let at = tbs[range]
            .windows(needle.len())
            .position(|w| w == needle)
            .ok_or_else(unparsable)?;
        tbs[start + at..start + at + needle.len()].copy_from_slice(&organization_name);
    }
    let signature = rcgen::SigningKey::sign(signer, &tbs)?;
    let mut bits = vec![0u8];
    bits.extend(signature);
    let mut body = tbs;
    body.extend_from_slice(algorithm);
    body.extend(der_element(0x03, &bits));
    Ok(der_element(0x30, &body))
}

/// A DER certificate as PEM.
fn to_pem(der: &[u8]) -> String {
    use base64::{Engine, engine::general_purpose::STANDARD};
    let encoded = STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// A certificate authority loaded from, or stored as, PEM.
pub struct CertificateAuthority {
    cert: CertifiedKey,
    info: CertificateInfo,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("common_name", &self.info.common_name)
            .field("not_after", &self.info.not_after)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new self-signed CA valid for `lifetime` from `now` (Unix seconds).
    pub fn generate(common_name: &str, organization: &str, lifetime: Duration, now: i64) -> Result<Self> {
        let key = generate_key(common_name)?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, common_name);
        if !organization.is_empty() {
            name.push(DnType::OrganizationName, organization);
        }
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Self::self_sign(params, key, common_name, lifetime, now)
    }

    fn self_sign(
        mut params: CertificateParams,
        key: KeyPair,
        what: &str,
        lifetime: Duration,
        now: i64,
    ) -> Result<Self> {
        let not_before = now - BACKDATE_SECONDS;
        let not_after = now.saturating_add(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX / 2));
        params.not_before = timestamp(what, not_before)?;
        params.not_after = timestamp(what, not_after)?;
        params.serial_number = Some(serial_number(&key.subject_public_key_info(), now, what));
        let cert = params.self_signed(&key).map_err(|source| Error::Certificate {
            what: what.to_owned(),
            source,
        })?;
        let pem = CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        let info = inspect(&pem.cert_pem).map_err(|_| Error::Certificate {
            what: what.to_owned(),
            source: rcgen::Error::CouldNotParseCertificate,
        })?;
        Ok(Self {
            cert: pem,
            info,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a stored CA. Fails (with a reason for the event) when the certificate is unreadable, not a
    /// CA, expired, or the key does not belong to it.
    pub fn load(cert_pem: &str, key_pem: &str, now: i64) -> std::result::Result<Self, String> {
        let info = inspect(cert_pem)?;
        if !info.is_ca {
            return Err("the certificate is not a certificate authority".into());
        }
        if info.not_after <= now {
            return Err("the certificate authority has expired".into());
        }
        let key = KeyPair::from_pem(key_pem).map_err(|e| format!("unreadable private key: {e}"))?;
        if key.subject_public_key_info() != info.public_key {
            return Err("the private key does not belong to the certificate".into());
        }
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| format!("unusable as an issuer: {e}"))?;
        Ok(Self {
            cert: CertifiedKey {
                cert_pem: cert_pem.to_owned(),
                key_pem: key_pem.to_owned(),
            },
            info,
            issuer,
        })
    }

    /// A new certificate for the same key and subject, valid for `lifetime` from `now`. Certificates signed
    /// by the old one verify against the new one and vice versa.
    pub fn renewed(&self, lifetime: Duration, now: i64) -> Result<Self> {
        let what = self
            .info
            .common_name
            .clone()
            .unwrap_or_else(|| "certificate authority".into());
        let unusable = |source| Error::Certificate {
            what: what.clone(),
            source,
        };
        let der = certificate_der(&self.cert.cert_pem)
            .map_err(|_| unusable(rcgen::Error::CouldNotParseCertificate))?;
        let (_, old) =
            X509Certificate::from_der(&der).map_err(|_| unusable(rcgen::Error::CouldNotParseCertificate))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = copy_name(old.subject()).map_err(unusable)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        // Keep the subject key identifier: leaves name it as their authority key identifier.
        if let Some(id) = old.extensions().iter().find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
            _ => None,
        }) {
            params.key_identifier_method = KeyIdMethod::PreSpecified(id);
        }
        let key = KeyPair::from_pem(&self.cert.key_pem).map_err(unusable)?;
        let renewed = Self::self_sign(params, key, &what, lifetime, now)?;
        // Leaves chain by the exact bytes of the subject; refuse a renewal that would change them.
        let new_der = certificate_der(&renewed.cert.cert_pem)
            .map_err(|_| unusable(rcgen::Error::CouldNotParseCertificate))?;
        let (_, new) = X509Certificate::from_der(&new_der)
            .map_err(|_| unusable(rcgen::Error::CouldNotParseCertificate))?;
        if new.subject().as_raw() != old.subject().as_raw() {
            return Err(unusable(rcgen::Error::UnsupportedExtension));
        }
        Ok(renewed)
    }

    /// The certificate and key as stored.
    pub fn pem(&self) -> &CertifiedKey {
        &self.cert
    }

    /// The CA certificate.
    pub fn cert_pem(&self) -> &str {
        &self.cert.cert_pem
    }

    /// Validity and names.
    pub fn info(&self) -> &CertificateInfo {
        &self.info
    }

    /// Issues a leaf certificate with a fresh key, valid for `lifetime` from `now` but never beyond this CA.
    pub fn issue(&self, spec: &LeafSpec, lifetime: Duration, now: i64) -> Result<CertifiedKey> {
        let what = spec.common_name.as_str();
        let key = generate_key(what)?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, spec.common_name.as_str());
        // rcgen keeps one value per attribute type: organizations after the first go under placeholder
        // types, renamed to organizationName below.
        let mut organizations = spec.organizations.iter();
        if let Some(first) = organizations.next() {
            name.push(DnType::OrganizationName, first.as_str());
        }
        let extra_organizations = spec.organizations.len().saturating_sub(1);
        if extra_organizations > MAX_EXTRA_ORGANIZATIONS {
            return Err(Error::Certificate {
                what: format!("{what} ({} organizations)", spec.organizations.len()),
                source: rcgen::Error::UnsupportedExtension,
            });
        }
        for (i, organization) in organizations.enumerate() {
            name.push(DnType::CustomDnType(placeholder_oid(i)), organization.as_str());
        }
        params.distinguished_name = name;
        let mut sans = Vec::new();
        for dns in &spec.dns_names {
            let dns = dns.clone().try_into().map_err(|source| Error::Certificate {
                what: format!("{what} (name {dns:?})"),
                source,
            })?;
            sans.push(SanType::DnsName(dns));
        }
        sans.extend(spec.ip_addresses.iter().copied().map(SanType::IpAddress));
        params.subject_alt_names = sans;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match spec.usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        params.use_authority_key_identifier_extension = true;
        let not_after = now
            .saturating_add(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX / 2))
            .min(self.info.not_after);
        params.not_before = timestamp(what, now - BACKDATE_SECONDS)?;
        params.not_after = timestamp(what, not_after)?;
        params.serial_number = Some(serial_number(&key.subject_public_key_info(), now, what));
        let failed = |source| Error::Certificate {
            what: what.to_owned(),
            source,
        };
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;
        let cert_pem = if extra_organizations == 0 {
            cert.pem()
        } else {
            let der =
                rename_placeholders(cert.der(), extra_organizations, self.issuer.key()).map_err(failed)?;
            to_pem(&der)
        };
        Ok(CertifiedKey {
            cert_pem,
            key_pem: key.serialize_pem(),
        })
    }

    /// Why a stored leaf must be replaced, or `None` when it can stay: it must be readable, match its key,
    /// be signed by this CA, carry exactly the names of `spec`, not be in the last fifth of its life, and
    /// not outlive the lifetime now configured.
    pub fn leaf_problem(
        &self,
        leaf: &CertifiedKey,
        spec: &LeafSpec,
        lifetime: Duration,
        now: i64,
    ) -> Option<String> {
        let info = match inspect(&leaf.cert_pem) {
            Ok(info) => info,
            Err(problem) => return Some(problem),
        };
        if !key_matches(&leaf.key_pem, &info.public_key) {
            return Some("its private key does not belong to it".into());
        }
        if !is_signed_by(&leaf.cert_pem, &self.cert.cert_pem) {
            return Some("it is not signed by the current certificate authority".into());
        }
        if info.common_name.as_deref() != Some(spec.common_name.as_str())
            || info.organizations != spec.organizations
        {
            return Some("its subject changed".into());
        }
        if info.dns_names != spec.dns_names || info.ip_addresses != spec.ip_addresses {
            return Some("its names changed".into());
        }
        if info.needs_renewal(now) {
            return Some("less than a fifth of its lifetime remains".into());
        }
        let allowed = i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX / 2) + BACKDATE_SECONDS + 86_400;
        if info.lifetime() > allowed {
            return Some("it lives longer than pkiExpireDays now allows".into());
        }
        None
    }
}

/// A service-account signing key pair (ECDSA P-256), PEM-encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountKey {
    /// PKCS#8 private key.
    pub private_pem: String,
    /// SubjectPublicKeyInfo public key.
    pub public_pem: String,
}

impl ServiceAccountKey {
    /// A new key pair.
    pub fn generate() -> Result<Self> {
        let key = generate_key("service-account")?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }

    /// Loads a stored private key; the public key is derived from it (so a damaged public half is repaired
    /// without changing the key, and existing tokens stay valid).
    pub fn load(private_pem: &str) -> std::result::Result<Self, String> {
        let key = KeyPair::from_pem(private_pem).map_err(|e| format!("unreadable private key: {e}"))?;
        Ok(Self {
            private_pem: private_pem.to_owned(),
            public_pem: key.public_key_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;
    const NOW: i64 = 1_800_000_000;

    fn ca() -> CertificateAuthority {
        CertificateAuthority::generate("kubernetes", "ns-abc123-vc", Duration::from_secs(3650 * DAY), NOW)
            .expect("CA")
    }

    fn server_spec() -> LeafSpec {
        LeafSpec::with_names(
            "kube-apiserver",
            [
                "apiserver-svc",
                "apiserver-svc.ns",
                "10.96.0.10",
                "127.0.0.1",
                "::1",
            ],
            Usage::Server,
        )
    }

    #[test]
    fn leaf_chains_to_its_ca_and_carries_its_names() {
        let ca = ca();
        let leaf = ca
            .issue(&server_spec(), Duration::from_secs(365 * DAY), NOW)
            .expect("leaf");
        assert!(is_signed_by(&leaf.cert_pem, ca.cert_pem()));
        let info = inspect(&leaf.cert_pem).expect("readable");
        assert_eq!(info.common_name.as_deref(), Some("kube-apiserver"));
        assert_eq!(
            info.dns_names,
            ["apiserver-svc", "apiserver-svc.ns"].map(String::from).into()
        );
        assert_eq!(
            info.ip_addresses,
            ["10.96.0.10", "127.0.0.1", "::1"]
                .map(|ip| ip.parse::<IpAddr>().expect("ip"))
                .into()
        );
        assert!(!info.is_ca);
        assert_eq!(info.not_after, NOW + 365 * DAY as i64);
        assert!(key_matches(&leaf.key_pem, &info.public_key));
        assert_eq!(
            ca.leaf_problem(&leaf, &server_spec(), Duration::from_secs(365 * DAY), NOW),
            None
        );
    }

    #[test]
    fn another_ca_does_not_verify() {
        let leaf = ca()
            .issue(&server_spec(), Duration::from_secs(DAY), NOW)
            .expect("leaf");
        let other = ca();
        assert!(!is_signed_by(&leaf.cert_pem, other.cert_pem()));
        assert_eq!(
            other
                .leaf_problem(&leaf, &server_spec(), Duration::from_secs(DAY), NOW)
                .as_deref(),
            Some("it is not signed by the current certificate authority")
        );
    }

    #[test]
    fn client_certificates_carry_groups() {
        let leaf = ca()
            .issue(
                &LeafSpec::client("admin", &["system:masters"]),
                Duration::from_secs(DAY),
                NOW,
            )
            .expect("leaf");
        let info = inspect(&leaf.cert_pem).expect("readable");
        assert_eq!(info.common_name.as_deref(), Some("admin"));
        assert_eq!(info.organizations, ["system:masters".to_owned()].into());
        assert!(info.dns_names.is_empty());
    }

    #[test]
    fn client_certificates_carry_every_group() {
        let ca = ca();
        let groups: Vec<String> = (0..200).map(|i| format!("group-{i:03}")).collect();
        let spec = LeafSpec::client("alice", &groups.iter().map(String::as_str).collect::<Vec<_>>());
        let leaf = ca.issue(&spec, Duration::from_secs(DAY), NOW).expect("leaf");
        assert!(is_signed_by(&leaf.cert_pem, ca.cert_pem()));
        let info = inspect(&leaf.cert_pem).expect("readable");
        assert_eq!(info.common_name.as_deref(), Some("alice"));
        assert_eq!(info.organizations, groups.iter().cloned().collect());
        assert!(key_matches(&leaf.key_pem, &info.public_key));
        assert_eq!(ca.leaf_problem(&leaf, &spec, Duration::from_secs(DAY), NOW), None);
        // Only organizationName attributes: no placeholder type is left.
        let der = certificate_der(&leaf.cert_pem).expect("der");
        let (_, cert) = X509Certificate::from_der(&der).expect("parse");
        for attribute in cert.subject().iter_attributes() {
            let oid = attribute.attr_type().to_id_string();
            assert!(oid == "2.5.4.3" || oid == "2.5.4.10", "{oid}");
        }
        let two = LeafSpec::client("bob", &["dev", "ops"]);
        let leaf = ca.issue(&two, Duration::from_secs(DAY), NOW).expect("leaf");
        assert_eq!(
            inspect(&leaf.cert_pem).expect("readable").organizations,
            ["dev".to_owned(), "ops".to_owned()].into()
        );
    }

    #[test]
    fn renewal_starts_in_the_last_fifth() {
        let ca = ca();
        let lifetime = Duration::from_secs(100 * DAY);
        let leaf = ca.issue(&server_spec(), lifetime, NOW).expect("leaf");
        let day = DAY as i64;
        assert_eq!(
            ca.leaf_problem(&leaf, &server_spec(), lifetime, NOW + 79 * day),
            None
        );
        assert_eq!(
            ca.leaf_problem(&leaf, &server_spec(), lifetime, NOW + 81 * day)
                .as_deref(),
            Some("less than a fifth of its lifetime remains")
        );
        let info = inspect(&leaf.cert_pem).expect("readable");
        // Backdated by five minutes: the fifth is of the whole validity period.
        assert_eq!(info.renew_at(), info.not_after - info.lifetime() / 5);
    }

    #[test]
    fn changed_names_subject_key_or_policy_need_a_new_leaf() {
        let ca = ca();
        let lifetime = Duration::from_secs(365 * DAY);
        let leaf = ca.issue(&server_spec(), lifetime, NOW).expect("leaf");
        let mut more_names = server_spec();
        more_names.dns_names.insert("vc.example.com".into());
        assert_eq!(
            ca.leaf_problem(&leaf, &more_names, lifetime, NOW).as_deref(),
            Some("its names changed")
        );
        let mut renamed = server_spec();
        renamed.common_name = "other".into();
        assert_eq!(
            ca.leaf_problem(&leaf, &renamed, lifetime, NOW).as_deref(),
            Some("its subject changed")
        );
        let other_key = ca.issue(&server_spec(), lifetime, NOW).expect("leaf");
        let mixed = CertifiedKey {
            cert_pem: leaf.cert_pem.clone(),
            key_pem: other_key.key_pem,
        };
        assert_eq!(
            ca.leaf_problem(&mixed, &server_spec(), lifetime, NOW).as_deref(),
            Some("its private key does not belong to it")
        );
        assert_eq!(
            ca.leaf_problem(&leaf, &server_spec(), Duration::from_secs(30 * DAY), NOW)
                .as_deref(),
            Some("it lives longer than pkiExpireDays now allows")
        );
        let garbage = CertifiedKey {
            cert_pem: "not a certificate".into(),
            key_pem: leaf.key_pem,
        };
        assert!(ca.leaf_problem(&garbage, &server_spec(), lifetime, NOW).is_some());
    }

    #[test]
    fn leaves_never_outlive_their_ca() {
        let ca = CertificateAuthority::generate("short", "", Duration::from_secs(10 * DAY), NOW).expect("CA");
        let leaf = ca
            .issue(&server_spec(), Duration::from_secs(365 * DAY), NOW)
            .expect("leaf");
        assert_eq!(
            inspect(&leaf.cert_pem).expect("readable").not_after,
            ca.info().not_after
        );
    }

    #[test]
    fn a_renewed_ca_keeps_key_and_subject_so_old_and_new_leaves_verify() {
        let ca = ca();
        let old_leaf = ca
            .issue(&server_spec(), Duration::from_secs(DAY), NOW)
            .expect("leaf");
        let renewed = ca
            .renewed(Duration::from_secs(3650 * DAY), NOW + 3000 * DAY as i64)
            .expect("renewed");
        assert_ne!(renewed.cert_pem(), ca.cert_pem());
        assert_eq!(renewed.pem().key_pem, ca.pem().key_pem);
        assert_eq!(renewed.info().public_key, ca.info().public_key);
        assert!(renewed.info().not_after > ca.info().not_after);
        assert!(is_signed_by(&old_leaf.cert_pem, renewed.cert_pem()));
        let new_leaf = renewed
            .issue(&server_spec(), Duration::from_secs(DAY), NOW)
            .expect("leaf");
        assert!(is_signed_by(&new_leaf.cert_pem, ca.cert_pem()));
        assert!(is_signed_by(&new_leaf.cert_pem, renewed.cert_pem()));
        // Distinct serial numbers for the two CA certificates.
        let serial = |pem: &str| {
            let der = certificate_der(pem).expect("der");
            let (_, cert) = X509Certificate::from_der(&der).expect("parse");
            cert.raw_serial().to_vec()
        };
        assert_ne!(serial(ca.cert_pem()), serial(renewed.cert_pem()));
    }

    #[test]
    fn stored_cas_are_checked_when_loaded() {
        let ca = ca();
        let loaded = CertificateAuthority::load(ca.cert_pem(), &ca.pem().key_pem, NOW).expect("loads");
        assert_eq!(loaded.info(), ca.info());
        let leaf = loaded
            .issue(&server_spec(), Duration::from_secs(DAY), NOW)
            .expect("leaf");
        assert!(is_signed_by(&leaf.cert_pem, ca.cert_pem()));

        let other = self::ca();
        assert_eq!(
            CertificateAuthority::load(ca.cert_pem(), &other.pem().key_pem, NOW)
                .err()
                .as_deref(),
            Some("the private key does not belong to the certificate")
        );
        assert_eq!(
            CertificateAuthority::load(&leaf.cert_pem, &leaf.key_pem, NOW)
                .err()
                .as_deref(),
            Some("the certificate is not a certificate authority")
        );
        assert_eq!(
            CertificateAuthority::load(ca.cert_pem(), &ca.pem().key_pem, NOW + 3651 * DAY as i64)
                .err()
                .as_deref(),
            Some("the certificate authority has expired")
        );
        assert!(CertificateAuthority::load("garbage", "garbage", NOW).is_err());
    }

    #[test]
    fn service_account_public_key_is_derived_from_the_private_key() {
        let key = ServiceAccountKey::generate().expect("key");
        assert!(key.public_pem.starts_with("-----BEGIN PUBLIC KEY-----"));
        assert_eq!(ServiceAccountKey::load(&key.private_pem).expect("loads"), key);
        assert!(ServiceAccountKey::load("garbage").is_err());
    }
}
