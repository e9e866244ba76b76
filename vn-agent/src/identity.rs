//! Who is calling: the tenant whose kubelet-client CA signed the client certificate and whose cluster key
//! is its common name.
//!
//! The trust set is rebuilt from the live VirtualClusters and their `kubelet-client` Secrets whenever either
//! changes ([`TrustSet::build`]). Certificates are checked per request against the current set
//! ([`TrustSet::authenticate`]), so a deleted tenant's certificate stops working at once, also on
//! connections that were opened before.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::Arc,
};

use crds::{TenantIdentity, VirtualCluster, wellknown::KUBELET_CLIENT_CA_KEY};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    crypto::CryptoProvider,
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};
use rustls_pki_types::{CertificateDer, UnixTime, pem::PemObject};
use x509_parser::prelude::{FromDer, ParsedExtension, X509Certificate};

struct TrustedTenant {
    tenant: Arc<TenantIdentity>,
    verifier: Arc<dyn ClientCertVerifier>,
}

/// The kubelet-client CAs of the live tenants, indexed by CA subject.
pub struct TrustSet {
    generation: u64,
    tenants: Vec<TrustedTenant>,
    by_subject: HashMap<Vec<u8>, Vec<usize>>,
    by_key_id: HashMap<Vec<u8>, Vec<usize>>,
}

impl fmt::Debug for TrustSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustSet")
            .field("generation", &self.generation)
            .field("tenants", &self.tenant_keys())
            .finish()
    }
}

/// Why an entry of the kubelet-client CA bundle does not make its tenant trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Untrusted {
    /// The entry's key (a cluster key, if vc-manager wrote it).
    pub entry: String,
    /// Why.
    pub reason: String,
}

/// Why a client is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuthFailureKind {
    /// No client certificate was presented.
    NoCertificate,
    /// The certificate could not be parsed.
    Malformed,
    /// No live tenant's CA has the certificate's issuer as subject.
    UnknownIssuer,
    /// A candidate CA did not verify the certificate (signature, validity, usage).
    Invalid,
    /// A tenant's CA signed it, but its common name is not that tenant's cluster key.
    CommonNameMismatch,
}

impl AuthFailureKind {
    /// A stable label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoCertificate => "no_certificate",
            Self::Malformed => "malformed_certificate",
            Self::UnknownIssuer => "unknown_issuer",
            Self::Invalid => "invalid_certificate",
            Self::CommonNameMismatch => "common_name_mismatch",
        }
    }

    /// 401 when the caller is not authenticated, 403 when an authentic certificate claims another tenant.
    pub fn status(self) -> http::StatusCode {
        match self {
            Self::CommonNameMismatch => http::StatusCode::FORBIDDEN,
            _ => http::StatusCode::UNAUTHORIZED,
        }
    }
}

/// A refused client: the kind and a sentence for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthFailure {
    /// The kind.
    pub kind: AuthFailureKind,
    /// What exactly was wrong.
    pub detail: String,
}

impl AuthFailure {
    fn new(kind: AuthFailureKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

impl TrustSet {
    /// A set that trusts nobody.
    pub fn empty() -> Self {
        Self {
            generation: 0,
            tenants: Vec::new(),
            by_subject: HashMap::new(),
            by_key_id: HashMap::new(),
        }
    }

    /// Builds the set from the VirtualClusters and the entries (cluster key, CA PEM) of the kubelet-client
    /// CA bundle vc-manager keeps. An entry counts only while a VirtualCluster computes to its key (same
    /// namespace, name and uid) and is not being deleted, and its CA is usable. Everything else is
    /// returned with the reason.
    pub fn build<'a>(
        generation: u64,
        virtual_clusters: impl IntoIterator<Item = &'a VirtualCluster>,
        bundle: impl IntoIterator<Item = &'a (String, String)>,
        provider: &Arc<CryptoProvider>,
    ) -> (Self, Vec<Untrusted>) {
        let live: BTreeMap<String, (TenantIdentity, &VirtualCluster)> = virtual_clusters
            .into_iter()
            .filter_map(|vc| {
                let tenant = TenantIdentity::of(vc).ok()?;
                Some((tenant.cluster_key.clone(), (tenant, vc)))
            })
            .collect();
        let mut set = Self {
            generation,
            ..Self::empty()
        };
        let mut untrusted = Vec::new();
        let mut entries: Vec<&(String, String)> = bundle.into_iter().collect();
        entries.sort();
        for (key, ca_pem) in entries {
            match trusted_tenant(key, ca_pem.as_bytes(), &live, provider) {
                Ok((tenant, names)) => {
                    let index = set.tenants.len();
                    for (subject, key_id) in names {
                        set.by_subject.entry(subject).or_default().push(index);
                        if let Some(key_id) = key_id {
                            set.by_key_id.entry(key_id).or_default().push(index);
                        }
                    }
                    set.tenants.push(tenant);
                }
                Err(reason) => untrusted.push(Untrusted {
                    entry: key.clone(),
                    reason,
                }),
            }
        }
        (set, untrusted)
    }

    /// Increases with every rebuild, so per-connection results can be cached until the set changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The cluster keys of the trusted tenants.
    pub fn tenant_keys(&self) -> Vec<&str> {
        self.tenants
            .iter()
            .map(|t| t.tenant.cluster_key.as_str())
            .collect()
    }

    /// How many tenants are trusted.
    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    /// Whether no tenant is trusted.
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The tenant a client certificate chain (end entity first) authenticates.
    pub fn authenticate(
        &self,
        chain: &[CertificateDer<'static>],
        now: UnixTime,
    ) -> Result<Arc<TenantIdentity>, AuthFailure> {
        let (end_entity, intermediates) = chain
            .split_first()
            .ok_or_else(|| AuthFailure::new(AuthFailureKind::NoCertificate, "no client certificate"))?;
        let (_, certificate) = X509Certificate::from_der(end_entity.as_ref()).map_err(|error| {
            AuthFailure::new(
                AuthFailureKind::Malformed,
                format!("unparsable certificate: {error}"),
            )
        })?;
        let common_name = certificate
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or("")
            .to_owned();

        // Candidates: tenants whose CA the certificate names by key identifier, and tenants whose CA
        // subject is the issuer of a certificate in the chain (several CAs may share a subject).
        let mut by_key_id: Vec<usize> = Vec::new();
        if let Some(key_id) = key_identifier(&certificate, KeyId::Authority) {
            by_key_id.extend(self.by_key_id.get(&key_id).into_iter().flatten());
        }
        let mut by_issuer: Vec<usize> = Vec::new();
        let mut issuers = vec![certificate.issuer().as_raw().to_vec()];
        for intermediate in intermediates {
            if let Ok((_, parsed)) = X509Certificate::from_der(intermediate.as_ref()) {
                issuers.push(parsed.issuer().as_raw().to_vec());
            }
        }
        for issuer in &issuers {
            by_issuer.extend(self.by_subject.get(issuer).into_iter().flatten());
        }
        if by_key_id.is_empty() && by_issuer.is_empty() {
            return Err(AuthFailure::new(
                AuthFailureKind::UnknownIssuer,
                format!(
                    "certificate {common_name:?} issued by {:?} is not signed by the kubelet-client CA of any live VirtualCluster",
                    certificate.issuer().to_string()
                ),
            ));
        }
        let verify = |index: usize| {
            self.tenants[index]
                .verifier
                .verify_client_cert(end_entity, intermediates, now)
        };

        // The tenant the certificate claims to be: one signature check on the usual path.
        let claimed = by_key_id
            .iter()
            .chain(&by_issuer)
            .copied()
            .find(|i| self.tenants[*i].tenant.cluster_key == common_name);
        let mut last_error = None;
        if let Some(index) = claimed {
            match verify(index) {
                Ok(_) => return Ok(self.tenants[index].tenant.clone()),
                Err(error) => last_error = Some((index, error)),
            }
        }

        // Otherwise: is it an authentic certificate of another tenant claiming this key (403), or not
        // signed by a live tenant at all (401)? Bounded, so that certificates from impostor CAs sharing a
        // common subject cannot make vn-agent try every tenant's CA.
        let mut others: Vec<usize> = Vec::new();
        for index in by_key_id.iter().chain(&by_issuer).copied() {
            if Some(index) != claimed && !others.contains(&index) {
                others.push(index);
            }
        }
        for index in others.into_iter().take(MAX_OTHER_VERIFICATIONS) {
            match verify(index) {
                Ok(_) => {
                    return Err(AuthFailure::new(
                        AuthFailureKind::CommonNameMismatch,
                        format!(
                            "certificate common name {common_name:?} is not the cluster key of the VirtualCluster whose CA signed it ({})",
                            self.tenants[index].tenant.cluster_key
                        ),
                    ));
                }
                Err(error) => last_error = Some((index, error)),
            }
        }
        let detail = match last_error {
            Some((index, error)) => format!(
                "certificate {common_name:?} does not verify against the kubelet-client CA of {}: {error}",
                self.tenants[index].tenant.cluster_key
            ),
            None => format!("certificate {common_name:?} is not signed by the kubelet-client CA it names"),
        };
        Err(AuthFailure::new(AuthFailureKind::Invalid, detail))
    }
}

/// How many CAs besides the claimed tenant's are tried to tell a forged common name (403) from an unknown
/// signer (401).
const MAX_OTHER_VERIFICATIONS: usize = 4;

#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyId {
    /// The certificate's own key (subject key identifier), for CAs.
    Subject,
    /// The signer's key (authority key identifier), for leaves.
    Authority,
}

fn key_identifier(certificate: &X509Certificate<'_>, which: KeyId) -> Option<Vec<u8>> {
    certificate
        .extensions()
        .iter()
        .find_map(|extension| match (extension.parsed_extension(), which) {
            (ParsedExtension::SubjectKeyIdentifier(id), KeyId::Subject) => Some(id.0.to_vec()),
            (ParsedExtension::AuthorityKeyIdentifier(aki), KeyId::Authority) => {
                aki.key_identifier.as_ref().map(|id| id.0.to_vec())
            }
            _ => None,
        })
}

/// How a CA is looked up: its raw subject and, when it has one, its subject key identifier.
type CaNames = (Vec<u8>, Option<Vec<u8>>);

fn trusted_tenant(
    key: &str,
    ca_pem: &[u8],
    live: &BTreeMap<String, (TenantIdentity, &VirtualCluster)>,
    provider: &Arc<CryptoProvider>,
) -> Result<(TrustedTenant, Vec<CaNames>), String> {
    let (tenant, vc) = live.get(key).ok_or_else(|| {
        format!("no VirtualCluster has cluster key {key} (it was deleted, or recreated with another uid)")
    })?;
    if vc.metadata.deletion_timestamp.is_some() {
        return Err(format!("VirtualCluster {} is being deleted", tenant.vc_ref()));
    }
    let mut roots = RootCertStore::empty();
    let mut subjects = Vec::new();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("{KUBELET_CLIENT_CA_KEY} is not PEM: {e}"))?;
        let (_, parsed) = X509Certificate::from_der(cert.as_ref())
            .map_err(|e| format!("{KUBELET_CLIENT_CA_KEY} holds an unparsable certificate: {e}"))?;
        subjects.push((
            parsed.subject().as_raw().to_vec(),
            key_identifier(&parsed, KeyId::Subject),
        ));
        roots
            .add(cert)
            .map_err(|e| format!("{KUBELET_CLIENT_CA_KEY} holds an unusable CA: {e}"))?;
    }
    if subjects.is_empty() {
        return Err(format!("{KUBELET_CLIENT_CA_KEY} holds no certificate"));
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("{KUBELET_CLIENT_CA_KEY} cannot verify clients: {e}"))?;
    Ok((
        TrustedTenant {
            tenant: Arc::new(tenant.clone()),
            verifier,
        },
        subjects,
    ))
}

/// The TLS side of client authentication: ask every client for a certificate and check that it holds the
/// certificate's private key, but leave the chain to [`TrustSet::authenticate`], which runs per request
/// against the current trust set and answers 401/403 with a reason instead of a bare handshake failure.
///
/// No CA names are hinted: Go clients (the tenant apiservers) then always send their certificate.
#[derive(Debug)]
pub struct RequestClientCertificate {
    provider: Arc<CryptoProvider>,
}

impl RequestClientCertificate {
    /// A verifier using `provider`'s signature algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Self {
        Self { provider }
    }
}

impl ClientCertVerifier for RequestClientCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        // A request without a certificate gets a 401 (and a log line) rather than a handshake alert.
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Deferred to TrustSet::authenticate, on every request.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
pub(crate) mod tests {

    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };

    use super::*;

    /// A test CA.
    pub(crate) struct TestCa {
        pub(crate) pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    impl TestCa {
        pub(crate) fn new(name: &str) -> Self {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::default();
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
            let cert = params.self_signed(&key).expect("CA");
            Self {
                pem: cert.pem(),
                issuer: Issuer::new(params, key),
            }
        }

        /// A client certificate for `common_name`, DER.
        pub(crate) fn client(&self, common_name: &str) -> CertificateDer<'static> {
            self.client_with(common_name, ExtendedKeyUsagePurpose::ClientAuth)
        }

        pub(crate) fn client_with(
            &self,
            common_name: &str,
            usage: ExtendedKeyUsagePurpose,
        ) -> CertificateDer<'static> {
            self.leaf(common_name, usage, true)
        }

        /// A client certificate without an authority key identifier, as some tools issue them.
        pub(crate) fn client_without_key_id(&self, common_name: &str) -> CertificateDer<'static> {
            self.leaf(common_name, ExtendedKeyUsagePurpose::ClientAuth, false)
        }

        fn leaf(
            &self,
            common_name: &str,
            usage: ExtendedKeyUsagePurpose,
            key_id: bool,
        ) -> CertificateDer<'static> {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::default();
            params.distinguished_name.push(DnType::CommonName, common_name);
            params.extended_key_usages = vec![usage];
            params.use_authority_key_identifier_extension = key_id;
            params.signed_by(&key, &self.issuer).expect("leaf").der().clone()
        }
    }

    pub(crate) fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    pub(crate) fn virtual_cluster(namespace: &str, name: &str, uid: &str) -> VirtualCluster {
        let mut vc: VirtualCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1",
            "kind": "VirtualCluster",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"clusterVersionName": "cv"}
        }))
        .expect("vc");
        vc.metadata.uid = Some(uid.to_owned());
        vc
    }

    /// The CA bundle entry vc-manager writes for a VirtualCluster's kubelet-client CA.
    pub(crate) fn bundle_entry(vc: &VirtualCluster, ca_pem: &str) -> (String, String) {
        (crds::naming::cluster_key_of(vc).expect("key"), ca_pem.to_owned())
    }

    fn now() -> UnixTime {
        UnixTime::now()
    }

    struct World {
        a: VirtualCluster,
        b: VirtualCluster,
        ca_a: TestCa,
        ca_b: TestCa,
    }

    fn world() -> World {
        World {
            a: virtual_cluster("team-a", "dev", "uid-a"),
            b: virtual_cluster("team-b", "dev", "uid-b"),
            ca_a: TestCa::new("kubelet-client-ca"),
            ca_b: TestCa::new("kubelet-client-ca"),
        }
    }

    fn key(vc: &VirtualCluster) -> String {
        crds::naming::cluster_key_of(vc).expect("key")
    }

    #[test]
    fn each_tenant_is_identified_by_its_own_ca_and_cluster_key() {
        let w = world();
        let secrets = [bundle_entry(&w.a, &w.ca_a.pem), bundle_entry(&w.b, &w.ca_b.pem)];
        let (set, untrusted) = TrustSet::build(7, [&w.a, &w.b], &secrets, &provider());
        assert!(untrusted.is_empty(), "{untrusted:?}");
        assert_eq!(set.len(), 2);
        assert_eq!(set.generation(), 7);

        // Both CAs have the same subject: the right one is found by trying both.
        let tenant = set.authenticate(&[w.ca_a.client(&key(&w.a))], now()).expect("a");
        assert_eq!(tenant.cluster_key, key(&w.a));
        assert_eq!(
            (tenant.vc_namespace.as_str(), tenant.vc_uid.as_str()),
            ("team-a", "uid-a")
        );
        let tenant = set.authenticate(&[w.ca_b.client(&key(&w.b))], now()).expect("b");
        assert_eq!(tenant.cluster_key, key(&w.b));
    }

    #[test]
    fn a_forged_common_name_is_forbidden() {
        let w = world();
        let secrets = [bundle_entry(&w.a, &w.ca_a.pem), bundle_entry(&w.b, &w.ca_b.pem)];
        let (set, _) = TrustSet::build(1, [&w.a, &w.b], &secrets, &provider());
        // Signed by A's CA, claiming to be B.
        let failure = set
            .authenticate(&[w.ca_a.client(&key(&w.b))], now())
            .expect_err("forged");
        assert_eq!(failure.kind, AuthFailureKind::CommonNameMismatch);
        assert_eq!(failure.kind.status(), http::StatusCode::FORBIDDEN);
        assert!(failure.detail.contains(&key(&w.a)), "{}", failure.detail);
    }

    #[test]
    fn unknown_cas_missing_and_wrong_usage_certificates_are_unauthorized() {
        let w = world();
        let (set, _) = TrustSet::build(1, [&w.a], &[bundle_entry(&w.a, &w.ca_a.pem)], &provider());
        let stranger = TestCa::new("somebody else");
        let failure = set
            .authenticate(&[stranger.client(&key(&w.a))], now())
            .expect_err("unknown CA");
        assert_eq!(failure.kind, AuthFailureKind::UnknownIssuer);
        assert_eq!(failure.kind.status(), http::StatusCode::UNAUTHORIZED);

        // Same subject as A's CA but another key: the signature does not verify.
        let impostor = TestCa::new("kubelet-client-ca");
        let failure = set
            .authenticate(&[impostor.client(&key(&w.a))], now())
            .expect_err("impostor CA");
        assert_eq!(failure.kind, AuthFailureKind::Invalid);

        let failure = set
            .authenticate(
                &[w.ca_a
                    .client_with(&key(&w.a), ExtendedKeyUsagePurpose::ServerAuth)],
                now(),
            )
            .expect_err("server certificate");
        assert_eq!(failure.kind, AuthFailureKind::Invalid);

        let failure = set.authenticate(&[], now()).expect_err("none");
        assert_eq!(failure.kind, AuthFailureKind::NoCertificate);
        let failure = set
            .authenticate(&[CertificateDer::from(vec![1, 2, 3])], now())
            .expect_err("garbage");
        assert_eq!(failure.kind, AuthFailureKind::Malformed);
    }

    #[test]
    fn only_entries_of_live_tenants_are_trusted() {
        let w = world();
        let good = bundle_entry(&w.a, &w.ca_a.pem);

        let mut deleting = w.a.clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        let (set, untrusted) = TrustSet::build(1, [&deleting], [&good], &provider());
        assert!(set.is_empty());
        assert!(untrusted[0].reason.contains("being deleted"), "{untrusted:?}");

        let (set, untrusted) = TrustSet::build(1, [&w.b], [&good], &provider());
        assert!(set.is_empty());
        assert!(untrusted[0].reason.contains("no VirtualCluster"), "{untrusted:?}");

        // Recreated under the same name: another uid, another key; the old entry grants nothing.
        let recreated = virtual_cluster("team-a", "dev", "uid-a2");
        let (set, untrusted) = TrustSet::build(1, [&recreated], [&good], &provider());
        assert!(set.is_empty());
        assert!(untrusted[0].reason.contains("recreated"), "{untrusted:?}");

        let not_pem = (good.0.clone(), "not pem".to_owned());
        let (set, untrusted) = TrustSet::build(1, [&w.a], [&not_pem], &provider());
        assert!(set.is_empty());
        assert!(untrusted[0].reason.contains("no certificate"), "{untrusted:?}");
        assert_eq!(untrusted[0].entry, good.0);
    }

    #[test]
    fn many_tenants_sharing_a_ca_subject_stay_apart() {
        let vcs: Vec<VirtualCluster> = (0..20)
            .map(|i| virtual_cluster("tenants", &format!("vc-{i}"), &format!("uid-{i}")))
            .collect();
        let cas: Vec<TestCa> = (0..20).map(|_| TestCa::new("kubelet-client-ca")).collect();
        let secrets: Vec<(String, String)> = vcs
            .iter()
            .zip(&cas)
            .map(|(vc, ca)| bundle_entry(vc, &ca.pem))
            .collect();
        let (set, untrusted) = TrustSet::build(1, &vcs, &secrets, &provider());
        assert!(untrusted.is_empty());
        for (vc, ca) in vcs.iter().zip(&cas) {
            assert_eq!(
                set.authenticate(&[ca.client(&key(vc))], now())
                    .expect("own")
                    .cluster_key,
                key(vc)
            );
            // Without a key identifier the certificate is still matched, by subject.
            assert!(
                set.authenticate(&[ca.client_without_key_id(&key(vc))], now())
                    .is_ok()
            );
        }
        // Tenant 3's CA vouching for tenant 17: found through the key identifier, refused as forged.
        let forged = set
            .authenticate(&[cas[3].client(&key(&vcs[17]))], now())
            .expect_err("forged");
        assert_eq!(forged.kind, AuthFailureKind::CommonNameMismatch);
        // An impostor CA with the shared subject: unauthorized, after a bounded number of checks.
        let impostor = TestCa::new("kubelet-client-ca");
        let failure = set
            .authenticate(&[impostor.client_without_key_id(&key(&vcs[5]))], now())
            .expect_err("impostor");
        assert_eq!(failure.kind, AuthFailureKind::Invalid);
    }

    #[test]
    fn a_deleted_tenant_is_no_longer_trusted() {
        let w = world();
        let secrets = [bundle_entry(&w.a, &w.ca_a.pem), bundle_entry(&w.b, &w.ca_b.pem)];
        let cert_b = w.ca_b.client(&key(&w.b));
        let (set, _) = TrustSet::build(1, [&w.a, &w.b], &secrets, &provider());
        assert!(set.authenticate(std::slice::from_ref(&cert_b), now()).is_ok());
        let (set, untrusted) = TrustSet::build(2, [&w.a], &secrets, &provider());
        assert_eq!(untrusted.len(), 1);
        // B's CA has the same subject as A's, so A's CA is tried, and does not verify it.
        let failure = set.authenticate(&[cert_b], now()).expect_err("gone");
        assert_eq!(failure.kind, AuthFailureKind::Invalid);
        assert_eq!(failure.kind.status(), http::StatusCode::UNAUTHORIZED);
    }
}
