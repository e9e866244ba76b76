//! Kubernetes clients: the super cluster's, and tenants' from kubeconfig Secrets.

use std::time::Duration;

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

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

/// Parses a kubeconfig (YAML) into a client config for its current context.
pub async fn config_from_kubeconfig_yaml(yaml: &str, timeouts: ClientTimeouts) -> Result<Config, Error> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|source| Error::Kubeconfig {
        what: "is not valid YAML",
        source,
    })?;
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

/// A client for the current context of a kubeconfig (YAML).
pub async fn from_kubeconfig_yaml(yaml: &str, timeouts: ClientTimeouts) -> Result<Client, Error> {
    Client::try_from(config_from_kubeconfig_yaml(yaml, timeouts).await?).map_err(Error::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

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
