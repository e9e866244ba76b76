//! TLS: the serving certificate (from files, reloaded when they change, or generated), the server
//! configuration that asks clients for certificates, and the client configuration towards the kubelet.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
    time::{Duration, SystemTime},
};

use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme,
    client::{
        ResolvesClientCert,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use tokio_util::sync::CancellationToken;

use crate::{
    Error, Result,
    identity::RequestClientCertificate,
    settings::{KubeletServerCa, ServingCertificate},
};

/// The crypto provider used everywhere (ring, as the rest of the workspace).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    let metadata = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
    })
}

fn read_chain(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|source| Error::PemFile {
            what,
            path: path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(Error::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

fn load_key_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey> {
    let chain = read_chain(cert, "certificate")?;
    let private_key = PrivateKeyDer::from_pem_file(key).map_err(|source| Error::PemFile {
        what: "private key",
        path: key.to_owned(),
        source,
    })?;
    CertifiedKey::from_der(chain, private_key, provider).map_err(|source| Error::Tls {
        context: format!("certificate {} with key {}", cert.display(), key.display()),
        source,
    })
}

/// A certificate and key, either fixed or read from files and re-read when they change (Secret volumes
/// are updated in place when cert-manager or an operator rotates them).
#[derive(Debug)]
pub struct KeyPairSource {
    current: RwLock<Arc<CertifiedKey>>,
    files: Option<(PathBuf, PathBuf)>,
    stamps: Mutex<Option<(FileStamp, FileStamp)>>,
    provider: Arc<CryptoProvider>,
}

impl KeyPairSource {
    /// Reads `cert` and `key`.
    pub fn from_files(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<Arc<Self>> {
        let stamps = stamp(cert).zip(stamp(key));
        let pair = load_key_pair(cert, key, &provider)?;
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::new(pair)),
            files: Some((cert.to_owned(), key.to_owned())),
            stamps: Mutex::new(stamps),
            provider,
        }))
    }

    /// A self-signed serving certificate for `names`, generated now.
    pub fn self_signed(names: &[String], provider: Arc<CryptoProvider>) -> Result<Arc<Self>> {
        let key = rcgen::KeyPair::generate().map_err(Error::GenerateCertificate)?;
        let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(Error::GenerateCertificate)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "vn-agent");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).map_err(Error::GenerateCertificate)?;
        let private_key =
            PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| Error::Settings(e.into()))?;
        let pair =
            CertifiedKey::from_der(vec![cert.der().clone()], private_key, &provider).map_err(|source| {
                Error::Tls {
                    context: "the generated serving certificate".into(),
                    source,
                }
            })?;
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::new(pair)),
            files: None,
            stamps: Mutex::new(None),
            provider,
        }))
    }

    /// The source the serving settings ask for.
    pub fn serving(settings: &ServingCertificate, provider: Arc<CryptoProvider>) -> Result<Arc<Self>> {
        match settings {
            ServingCertificate::Files { cert, key } => Self::from_files(cert, key, provider),
            ServingCertificate::SelfSigned { names } => Self::self_signed(names, provider),
        }
    }

    /// The certificate chain served now.
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.get().cert.clone()
    }

    fn get(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Re-reads the files when they changed. Returns whether a new pair is in use; a pair that does not
    /// load is reported and the old one kept.
    pub fn reload_if_changed(&self) -> Result<bool> {
        let Some((cert, key)) = &self.files else {
            return Ok(false);
        };
        let now = stamp(cert).zip(stamp(key));
        let mut stamps = self.stamps.lock().unwrap_or_else(|e| e.into_inner());
        if now.is_none() || now == *stamps {
            return Ok(false);
        }
        let pair = load_key_pair(cert, key, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
        *stamps = now;
        Ok(true)
    }

    /// Checks the files every `interval` until `cancel`.
    pub fn watch(self: Arc<Self>, what: &'static str, interval: Duration, cancel: CancellationToken) {
        if self.files.is_none() {
            return;
        }
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                match self.reload_if_changed() {
                    Ok(true) => tracing::info!(certificate = what, "reloaded certificate"),
                    Ok(false) => {}
                    Err(error) => tracing::error!(
                        certificate = what,
                        error = &error as &dyn std::error::Error,
                        "certificate files changed but do not load; keeping the previous certificate"
                    ),
                }
            }
        });
    }
}

impl ResolvesServerCert for KeyPairSource {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

impl ResolvesClientCert for KeyPairSource {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The server side: the serving certificate, client certificates requested (and checked per request),
/// HTTP/2 and HTTP/1.1 (upgrades need the latter).
pub fn server_config(serving: Arc<KeyPairSource>, provider: Arc<CryptoProvider>) -> Result<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls {
            context: "server protocol versions".into(),
            source,
        })?
        .with_client_cert_verifier(Arc::new(RequestClientCertificate::new(provider)))
        .with_cert_resolver(serving);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepts any kubelet certificate, still checking handshake signatures. Only with
/// `--kubelet-insecure-skip-tls-verify`.
#[derive(Debug)]
struct SkipKubeletVerification {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SkipKubeletVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
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

/// The client side towards the kubelet: vn-agent's certificate, the kubelet's checked against its CA
/// (unless told not to). ALPN is left to the connector, which offers HTTP/1.1 only so upgrades work.
pub fn kubelet_client_config(
    identity: Arc<KeyPairSource>,
    server_ca: &KubeletServerCa,
    provider: Arc<CryptoProvider>,
) -> Result<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls {
            context: "kubelet client protocol versions".into(),
            source,
        })?;
    let config = match server_ca {
        KubeletServerCa::File(path) => {
            let mut roots = RootCertStore::empty();
            for cert in read_chain(path, "kubelet CA")? {
                roots.add(cert).map_err(|source| Error::Tls {
                    context: format!("kubelet CA {}", path.display()),
                    source,
                })?;
            }
            builder
                .with_root_certificates(roots)
                .with_client_cert_resolver(identity)
        }
        KubeletServerCa::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipKubeletVerification { provider }))
            .with_client_cert_resolver(identity),
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str, cn: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = params.self_signed(&key).expect("cert");
        let cert_path = dir.join(format!("{name}.crt"));
        let key_path = dir.join(format!("{name}.key"));
        std::fs::write(&cert_path, cert.pem()).expect("write");
        std::fs::write(&key_path, key.serialize_pem()).expect("write");
        (cert_path, key_path)
    }

    fn common_name(source: &KeyPairSource) -> String {
        let chain = source.chain();
        let (_, cert) = x509_parser::parse_x509_certificate(chain[0].as_ref()).expect("parse");
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn files_are_reloaded_when_they_change_and_bad_files_keep_the_old_pair() {
        let dir = tempfile::tempdir().expect("dir");
        let (cert, key) = write_pair(dir.path(), "serving", "first");
        let source = KeyPairSource::from_files(&cert, &key, provider()).expect("load");
        assert_eq!(common_name(&source), "first");
        assert!(!source.reload_if_changed().expect("unchanged"));

        let (new_cert, new_key) = write_pair(dir.path(), "next", "second-with-a-longer-name");
        std::fs::rename(&new_cert, &cert).expect("rename");
        std::fs::rename(&new_key, &key).expect("rename");
        assert!(source.reload_if_changed().expect("changed"));
        assert_eq!(common_name(&source), "second-with-a-longer-name");

        std::fs::write(&cert, "garbage that is long enough to change the size").expect("write");
        assert!(source.reload_if_changed().is_err());
        assert_eq!(common_name(&source), "second-with-a-longer-name");
    }

    #[test]
    fn missing_or_empty_files_are_reported_with_their_path() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("missing.crt");
        let error = KeyPairSource::from_files(&missing, &missing, provider()).expect_err("missing");
        assert!(error.to_string().contains("missing.crt"), "{error}");
        let empty = dir.path().join("empty.crt");
        std::fs::write(&empty, "").expect("write");
        let error = KeyPairSource::from_files(&empty, &empty, provider()).expect_err("empty");
        assert!(error.to_string().contains("no certificate"), "{error}");
    }

    #[test]
    fn a_generated_certificate_names_the_node() {
        let source =
            KeyPairSource::self_signed(&["node-1".into(), "127.0.0.1".into()], provider()).expect("gen");
        assert_eq!(common_name(&source), "vn-agent");
        let chain = source.chain();
        let (_, cert) = x509_parser::parse_x509_certificate(chain[0].as_ref()).expect("parse");
        let sans = format!(
            "{:?}",
            cert.subject_alternative_name().expect("ext").expect("sans").value
        );
        assert!(
            sans.contains("node-1") && sans.contains("[127, 0, 0, 1]"),
            "{sans}"
        );
        assert!(server_config(source, provider()).is_ok());
    }
}
