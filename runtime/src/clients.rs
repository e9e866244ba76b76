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
            source,
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
pub fn multiplexed_client(mut config: Config, timeouts: ClientTimeouts) -> Result<Client, Error> {
    use kube::client::ConfigExt;
    use tower::{ServiceBuilder, ServiceExt};

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
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().map_err(Error::Client)?)
        .layer(config.extra_headers_layer().map_err(Error::Client)?)
        .service(client);
    Ok(Client::new(service, config.default_namespace))
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
