use std::path::Path;

use base64::{Engine, engine::general_purpose::STANDARD};
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::{Error, Result, pki::CertifiedKey};

/// A kubeconfig with one cluster, one client-certificate user and one current context, all named `name`.
pub fn kubeconfig_yaml(name: &str, server: &str, ca_pem: &str, user: &CertifiedKey) -> String {
    let credentials = format!(
        "client-certificate-data: {}\n    client-key-data: {}",
        STANDARD.encode(&user.cert_pem),
        STANDARD.encode(&user.key_pem)
    );
    single_user(name, server, ca_pem, &credentials)
}

/// A kubeconfig like [`kubeconfig_yaml`] whose user authenticates with a bearer token.
pub fn token_kubeconfig_yaml(name: &str, server: &str, ca_pem: &str, token: &str) -> String {
    single_user(name, server, ca_pem, &format!("token: {token}"))
}

fn single_user(name: &str, server: &str, ca_pem: &str, credentials: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {name}
  user:
    {credentials}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {name}
current-context: {name}
",
        ca = STANDARD.encode(ca_pem),
    )
}

/// A client for the current context of a kubeconfig file.
pub async fn client_from_kubeconfig_file(path: &Path) -> Result<Client> {
    let config = config_from_kubeconfig_file(path).await?;
    Client::try_from(config).map_err(Error::kube(format!("building a client from {}", path.display())))
}

/// A client for the current context of a kubeconfig file over one HTTP/2 connection, as the syncer reaches
/// the super cluster with `--super-http2`.
pub async fn multiplexed_client_from_kubeconfig_file(path: &Path) -> Result<Client> {
    let config = config_from_kubeconfig_file(path).await?;
    vc_runtime::clients::multiplexed_client(config, vc_runtime::clients::ClientTimeouts::default()).map_err(
        |e| Error::Kubeconfig {
            context: format!("building an HTTP/2 client from {}", path.display()),
            source: Box::new(e),
        },
    )
}

async fn config_from_kubeconfig_file(path: &Path) -> Result<Config> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig {
        context: format!("reading {}", path.display()),
        source: Box::new(e),
    })?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig {
            context: format!("loading {}", path.display()),
            source: Box::new(e),
        })
}
