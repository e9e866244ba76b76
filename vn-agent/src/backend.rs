//! Where requests go: the node's kubelet, or the super apiserver.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use rustls::crypto::CryptoProvider;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use crate::{
    Error, Result,
    response::ProxyBody,
    settings::{BackendSettings, KubeletSettings},
    tls::{self, KeyPairSource},
};

/// How long a backend may take to send the response head.
const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// The backend requests go to.
#[derive(Clone)]
pub enum Backend {
    /// The node's kubelet.
    Kubelet(Box<KubeletBackend>),
    /// The super apiserver.
    SuperApiserver(ApiserverBackend),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Backend {
    /// The backend the settings ask for; the super-apiserver backend uses `client`.
    pub fn new(
        settings: &BackendSettings,
        client: kube::Client,
        provider: Arc<CryptoProvider>,
        cancel: &CancellationToken,
    ) -> Result<Self> {
        match settings {
            BackendSettings::Kubelet(kubelet) => Ok(Self::Kubelet(Box::new(KubeletBackend::new(
                kubelet, provider, cancel,
            )?))),
            BackendSettings::SuperApiserver => Ok(Self::SuperApiserver(ApiserverBackend { client })),
        }
    }

    /// `kubelet` or `super apiserver`, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Kubelet(_) => "kubelet",
            Self::SuperApiserver(_) => "super apiserver",
        }
    }

    /// Sends `request` (its URI a path and query) and returns the response head with the body streaming.
    /// An upgrade stays attached to the response (see `hyper::upgrade::on`).
    pub async fn send(&self, request: Request<Bytes>) -> Result<Response<ProxyBody>> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let backend = self.name();
        let fail = |source: Box<dyn std::error::Error + Send + Sync>| Error::Backend {
            backend,
            method: method.clone(),
            path: path.clone(),
            source,
        };
        let sent = async {
            match self {
                Self::Kubelet(kubelet) => kubelet.send(request).await,
                Self::SuperApiserver(apiserver) => apiserver.send(request).await,
            }
        };
        match tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, sent).await {
            Ok(result) => result.map_err(fail),
            Err(elapsed) => Err(fail(Box::new(elapsed))),
        }
    }
}

/// The node's kubelet over HTTPS with vn-agent's client certificate.
#[derive(Clone)]
pub struct KubeletBackend {
    base: Uri,
    client: HttpClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl KubeletBackend {
    /// A client for `settings.url`; the client certificate is re-read when its files change.
    pub fn new(
        settings: &KubeletSettings,
        provider: Arc<CryptoProvider>,
        cancel: &CancellationToken,
    ) -> Result<Self> {
        let identity = KeyPairSource::from_files(
            &settings.client_certificate,
            &settings.client_key,
            provider.clone(),
        )?;
        identity
            .clone()
            .watch("kubelet client", Duration::from_secs(30), cancel.clone());
        let config = tls::kubelet_client_config(identity, &settings.server_ca, provider)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        Ok(Self {
            base: settings.url.clone(),
            client: HttpClient::builder(TokioExecutor::new()).build(connector),
        })
    }

    async fn send(
        &self,
        request: Request<Bytes>,
    ) -> Result<Response<ProxyBody>, Box<dyn std::error::Error + Send + Sync>> {
        let (mut parts, body) = request.into_parts();
        let path_and_query = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let mut uri = self.base.clone().into_parts();
        uri.path_and_query = Some(path_and_query.parse()?);
        parts.uri = Uri::from_parts(uri)?;
        let response = self
            .client
            .request(Request::from_parts(parts, Full::new(body)))
            .await?;
        Ok(response.map(|body| body.map_err(Into::into).boxed_unsync()))
    }
}

/// The super apiserver, with vn-agent's own credentials (its service account in a cluster).
#[derive(Clone)]
pub struct ApiserverBackend {
    client: kube::Client,
}

impl ApiserverBackend {
    async fn send(
        &self,
        request: Request<Bytes>,
    ) -> Result<Response<ProxyBody>, Box<dyn std::error::Error + Send + Sync>> {
        let response = self
            .client
            .send(request.map(|body| kube::client::Body::from(body.to_vec())))
            .await?;
        Ok(response.map(|body| body.map_err(Into::into).boxed_unsync()))
    }

    /// The kubelet's `run`: executes `command` in a container through `pods/exec` (WebSocket) and returns
    /// what it printed, stdout then stderr.
    pub async fn run(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        command: Vec<String>,
    ) -> Result<Vec<u8>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = AttachParams::default()
            .container(container)
            .stdin(false)
            .stdout(true)
            .stderr(true);
        let fail = |source: kube::Error| Error::Kube {
            context: format!("running a command in {namespace}/{pod}/{container}"),
            source,
        };
        let mut process = api.exec(pod, command, &params).await.map_err(fail)?;
        let mut stdout = process.stdout();
        let mut stderr = process.stderr();
        let read_all = |reader: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>| async move {
            let mut out = Vec::new();
            if let Some(mut reader) = reader {
                let _ = reader.read_to_end(&mut out).await;
            }
            out
        };
        let (mut out, err) = tokio::join!(read_all(stdout.take()), read_all(stderr.take()));
        process.join().await.map_err(|source| Error::Backend {
            backend: "super apiserver",
            method: http::Method::GET,
            path: format!("/api/v1/namespaces/{namespace}/pods/{pod}/exec"),
            source: Box::new(source),
        })?;
        out.extend(err);
        Ok(out)
    }
}
