//! Kubernetes clients: the super cluster's, and tenants' from kubeconfig Secrets.

use std::time::Duration;

use kube::{Client, Config, config::KubeConfigOptions};

use crate::Error;

/// The super-cluster client: from `KUBECONFIG` (or `~/.kube/config`) out of cluster, from the pod's service
/// account in cluster (kube's `Config::infer`).
pub async fn super_cluster() -> Result<Client, Error> {
    let config = Config::infer().await.map_err(Error::SuperClusterConfig)?;
    Client::try_from(config).map_err(Error::Client)
}

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
