//! A small HTTPS client for tests: trusts one CA and optionally presents a client certificate.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use rustls::ClientConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use crate::{Error, Result, pki::CertifiedKey};

/// An HTTPS client with a fixed trust root and identity.
#[derive(Clone)]
pub struct HttpsClient {
    inner: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

fn parse_err(what: &str) -> impl FnOnce(rustls_pki_types::pem::Error) -> Error + '_ {
    move |e| Error::Http {
        context: format!("parsing {what}"),
        source: Box::new(e),
    }
}

/// A rustls client config trusting `ca_pem`, presenting `identity` when given.
pub fn client_tls(ca_pem: &str, identity: Option<&CertifiedKey>) -> Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(parse_err("the CA"))?)
            .map_err(|source| Error::Tls {
                context: "adding the CA".into(),
                source,
            })?;
    }
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::Tls {
            context: "protocol versions".into(),
            source,
        })?
        .with_root_certificates(roots);
    match identity {
        Some(identity) => {
            let certs = CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(parse_err("the client certificate"))?;
            let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
                .map_err(parse_err("the client key"))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|source| Error::Tls {
                    context: "client certificate".into(),
                    source,
                })
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

impl HttpsClient {
    /// A client trusting `ca_pem`, presenting `identity` when given.
    pub fn new(ca_pem: &str, identity: Option<&CertifiedKey>) -> Result<Self> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client_tls(ca_pem, identity)?)
            .https_only()
            .enable_http1()
            .build();
        Ok(Self {
            inner: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Sends a request and returns the status and the whole body as text.
    pub async fn send(&self, request: http::Request<Full<Bytes>>) -> Result<(http::StatusCode, String)> {
        let context = format!("{} {}", request.method(), request.uri());
        let response = self.inner.request(request).await.map_err(|e| Error::Http {
            context: context.clone(),
            source: Box::new(e),
        })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Error::Http {
                context: context.clone(),
                source: Box::new(e),
            })?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// `GET url`.
    pub async fn get(&self, url: &str) -> Result<(http::StatusCode, String)> {
        let request = http::Request::get(url)
            .body(Full::default())
            .map_err(|e| Error::Http {
                context: format!("GET {url}"),
                source: Box::new(e),
            })?;
        self.send(request).await
    }
}
