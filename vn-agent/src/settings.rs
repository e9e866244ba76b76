//! Flags and the settings they make.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use vc_runtime::logging::LogFormat;

use crate::{Error, Result};

/// vn-agent's command line.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "vn-agent",
    version,
    about = "Per-node kubelet proxy for virtualcluster-rs: each tenant apiserver reaches its own pods on this node, and nothing else"
)]
pub struct Args {
    /// Address of the kubelet API that tenant apiservers call (vNodes advertise its port).
    #[arg(long, env = "VN_AGENT_LISTEN_ADDRESS", default_value_t = default_listen_address())]
    pub listen_address: SocketAddr,
    /// Address of `/healthz` and `/readyz` (and of `/metrics` when `--metrics-address` is the same).
    #[arg(long, env = "VN_AGENT_ADMIN_ADDRESS", default_value = "0.0.0.0:10551")]
    pub admin_address: SocketAddr,
    /// Address of `/metrics`. Loopback by default: the metrics name tenants and count their requests, and
    /// with the host network an address of the node is open to every pod on it. The same address as
    /// `--admin-address` serves them there.
    #[arg(long, env = "VN_AGENT_METRICS_ADDRESS", default_value = "127.0.0.1:10552")]
    pub metrics_address: SocketAddr,
    /// Serving certificate (PEM, may include intermediates). Without it, a self-signed one is generated at
    /// start. Reloaded when the file changes.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of the serving certificate (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Extra names (DNS or IP) for the generated serving certificate, comma-separated or repeated. The node
    /// names, `localhost` and `127.0.0.1` are always included.
    #[arg(long = "tls-san", env = "VN_AGENT_TLS_SANS", value_delimiter = ',')]
    pub tls_sans: Vec<String>,
    /// The node(s) whose pods this agent serves (comma-separated or repeated); in a DaemonSet, the node it
    /// runs on (from the downward API).
    #[arg(long, env = "NODE_NAME", value_delimiter = ',', conflicts_with = "all_nodes")]
    pub node_name: Vec<String>,
    /// Serve the pods of every node (one agent for a whole cluster whose kubelets share one address, as in
    /// test setups).
    #[arg(long)]
    pub all_nodes: bool,
    /// Where requests go: the node's kubelet, or the super apiserver's pod subresources.
    #[arg(long, value_enum, env = "VN_AGENT_BACKEND", default_value_t = BackendKind::SuperApiserver)]
    pub backend: BackendKind,
    /// The kubelet's address (kubelet backend).
    #[arg(long, default_value = "https://127.0.0.1:10250")]
    pub kubelet_url: http::Uri,
    /// Client certificate vn-agent presents to the kubelet (kubelet backend). Reloaded when it changes.
    #[arg(long, requires = "kubelet_client_key")]
    pub kubelet_client_certificate: Option<PathBuf>,
    /// Key of the kubelet client certificate.
    #[arg(long, requires = "kubelet_client_certificate")]
    pub kubelet_client_key: Option<PathBuf>,
    /// CA that signed the kubelet's serving certificate (kubelet backend).
    #[arg(long, conflicts_with = "kubelet_insecure_skip_tls_verify")]
    pub kubelet_certificate_authority: Option<PathBuf>,
    /// Do not verify the kubelet's serving certificate (kubelet backend). Only for kubelets with
    /// self-signed certificates; anyone who can intercept node-local traffic then sees tenant streams.
    #[arg(long)]
    pub kubelet_insecure_skip_tls_verify: bool,
    /// Seconds to let open requests and streams finish after SIGTERM before they are cut.
    #[arg(long, default_value_t = 20)]
    pub shutdown_grace_period_seconds: u64,
    /// Connections open at once (from every tenant apiserver and anyone else); more are closed at once.
    #[arg(long, env = "VN_AGENT_MAX_CONNECTIONS", default_value_t = crate::limits::Limits::default().connections)]
    pub max_connections: usize,
    /// Connections open at once from one source address; more from it are closed at once.
    #[arg(long, env = "VN_AGENT_MAX_CONNECTIONS_PER_SOURCE", default_value_t = crate::limits::Limits::default().connections_per_source)]
    pub max_connections_per_source: usize,
    /// Streams (exec, attach, port-forward) one tenant may have open on this node at once; more get 429.
    #[arg(long, env = "VN_AGENT_MAX_STREAMS_PER_TENANT", default_value_t = crate::limits::Limits::default().streams_per_tenant)]
    pub max_streams_per_tenant: usize,
    /// The ConfigMap (`namespace/name`) vc-manager keeps every tenant's public kubelet-client CA in (its
    /// `--kubelet-client-ca-bundle`). vn-agent reads only this ConfigMap to know the tenants' CAs, never a
    /// Secret.
    #[arg(long, env = "VN_AGENT_KUBELET_CLIENT_CA_BUNDLE")]
    pub kubelet_client_ca_bundle: Option<String>,
    /// Log format.
    #[arg(long, value_enum, env = "LOG_FORMAT", default_value_t)]
    pub log_format: LogFormat,
}

fn default_listen_address() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], crds::wellknown::DEFAULT_VN_AGENT_PORT))
}

/// Where requests go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The node's kubelet, with vn-agent's own client certificate.
    Kubelet,
    /// The super apiserver's `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward` subresources
    /// (and `nodes/proxy` for stats), with vn-agent's service account.
    SuperApiserver,
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServingCertificate {
    /// PEM files, reloaded when they change.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// Generated at start, self-signed, for these DNS names and IP addresses.
    SelfSigned {
        /// Subject alternative names.
        names: Vec<String>,
    },
}

/// Whose pods are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeScope {
    /// Pods bound to these nodes.
    Named(Vec<String>),
    /// Pods on every node.
    All,
}

impl NodeScope {
    /// Whether pods bound to `node` are served.
    pub fn contains(&self, node: &str) -> bool {
        match self {
            Self::Named(nodes) => nodes.iter().any(|n| n == node),
            Self::All => true,
        }
    }
}

/// How the kubelet's serving certificate is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletServerCa {
    /// Against this CA file.
    File(PathBuf),
    /// Not at all (explicitly asked for).
    InsecureSkipVerify,
}

/// The kubelet backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletSettings {
    /// `https://host:port` of the kubelet.
    pub url: http::Uri,
    /// vn-agent's client certificate.
    pub client_certificate: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// How the kubelet's certificate is checked.
    pub server_ca: KubeletServerCa,
}

/// The backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSettings {
    /// The node's kubelet.
    Kubelet(KubeletSettings),
    /// The super apiserver, with the client vn-agent was started with.
    SuperApiserver,
}

/// The ConfigMap of tenants' kubelet-client CAs (keys: cluster keys; values: PEM), see
/// `crds::kubelet_client`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaBundle {
    /// Namespace (the platform's).
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// Everything the proxy needs, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Listen address of the kubelet API.
    pub listen_address: SocketAddr,
    /// Serving certificate.
    pub serving_certificate: ServingCertificate,
    /// Whose pods are served.
    pub nodes: NodeScope,
    /// Where requests go.
    pub backend: BackendSettings,
    /// How long open requests and streams may run on after shutdown begins.
    pub shutdown_grace_period: Duration,
    /// Caps on connections and streams.
    pub limits: crate::limits::Limits,
    /// Where the tenants' kubelet-client CAs are.
    pub ca_bundle: CaBundle,
}

impl Args {
    /// Validates the flags into [`Settings`].
    pub fn settings(&self) -> Result<Settings> {
        let node_names: Vec<String> = self
            .node_name
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        let nodes = match (self.all_nodes, node_names.is_empty()) {
            (true, _) => NodeScope::All,
            (false, false) => NodeScope::Named(node_names.clone()),
            (false, true) => {
                return Err(Error::Settings(
                    "no node: set --node-name (or NODE_NAME from the downward API), or --all-nodes".into(),
                ));
            }
        };
        let serving_certificate = match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(cert), Some(key)) => ServingCertificate::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            (None, None) => {
                let mut names = node_names;
                names.extend(
                    self.tls_sans
                        .iter()
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty()),
                );
                for fixed in ["localhost", "127.0.0.1"] {
                    if !names.iter().any(|n| n == fixed) {
                        names.push(fixed.to_owned());
                    }
                }
                ServingCertificate::SelfSigned { names }
            }
            _ => {
                return Err(Error::Settings(
                    "--tls-cert-file and --tls-private-key-file go together".into(),
                ));
            }
        };
        let backend = match self.backend {
            BackendKind::SuperApiserver => BackendSettings::SuperApiserver,
            BackendKind::Kubelet => {
                let (Some(cert), Some(key)) = (&self.kubelet_client_certificate, &self.kubelet_client_key)
                else {
                    return Err(Error::Settings(
                        "the kubelet backend needs --kubelet-client-certificate and --kubelet-client-key"
                            .into(),
                    ));
                };
                let server_ca = match (
                    &self.kubelet_certificate_authority,
                    self.kubelet_insecure_skip_tls_verify,
                ) {
                    (Some(ca), false) => KubeletServerCa::File(ca.clone()),
                    (None, true) => KubeletServerCa::InsecureSkipVerify,
                    _ => {
                        return Err(Error::Settings(
                            "the kubelet backend needs --kubelet-certificate-authority (or, knowingly, --kubelet-insecure-skip-tls-verify)".into(),
                        ));
                    }
                };
                if self.kubelet_url.scheme_str() != Some("https") || self.kubelet_url.host().is_none() {
                    return Err(Error::Settings(format!(
                        "--kubelet-url {} must be https://host:port",
                        self.kubelet_url
                    )));
                }
                BackendSettings::Kubelet(KubeletSettings {
                    url: self.kubelet_url.clone(),
                    client_certificate: cert.clone(),
                    client_key: key.clone(),
                    server_ca,
                })
            }
        };
        let ca_bundle = match self
            .kubelet_client_ca_bundle
            .as_deref()
            .map(str::parse::<crds::NamespacedName>)
        {
            Some(Ok(bundle)) => CaBundle {
                namespace: bundle.namespace,
                name: bundle.name,
            },
            _ => {
                return Err(Error::Settings(
                    "--kubelet-client-ca-bundle must name the ConfigMap (namespace/name) vc-manager keeps the tenants' kubelet-client CAs in (its own --kubelet-client-ca-bundle)".into(),
                ));
            }
        };
        Ok(Settings {
            listen_address: self.listen_address,
            serving_certificate,
            nodes,
            backend,
            shutdown_grace_period: Duration::from_secs(self.shutdown_grace_period_seconds),
            limits: crate::limits::Limits {
                connections: self.max_connections.max(1),
                connections_per_source: self.max_connections_per_source.max(1),
                streams_per_tenant: self.max_streams_per_tenant.max(1),
            },
            ca_bundle,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> std::result::Result<Args, clap::Error> {
        Args::try_parse_from(
            [
                "vn-agent",
                "--kubelet-client-ca-bundle",
                "platform/kubelet-client-cas",
            ]
            .into_iter()
            .chain(args.iter().copied()),
        )
    }

    #[test]
    fn the_ca_bundle_is_a_namespaced_config_map() {
        let settings = parse(&["--node-name", "node-1"])
            .expect("args")
            .settings()
            .expect("settings");
        assert_eq!(
            settings.ca_bundle,
            CaBundle {
                namespace: "platform".into(),
                name: "kubelet-client-cas".into()
            }
        );
        for wrong in ["kubelet-client-cas", "/x", "a/", "a/b/c"] {
            let error = Args::try_parse_from([
                "vn-agent",
                "--node-name",
                "node-1",
                "--kubelet-client-ca-bundle",
                wrong,
            ])
            .expect("args")
            .settings()
            .expect_err(wrong);
            assert!(
                error.to_string().contains("--kubelet-client-ca-bundle"),
                "{error}"
            );
        }
        let missing = Args::try_parse_from(["vn-agent", "--node-name", "node-1"]).expect("args");
        assert!(missing.settings().is_err(), "no bundle, no tenants to trust");
    }

    #[test]
    fn defaults_serve_one_node_through_the_super_apiserver_on_10550() {
        let settings = parse(&["--node-name", "node-1"])
            .expect("args")
            .settings()
            .expect("settings");
        assert_eq!(settings.listen_address.port(), 10550);
        assert_eq!(settings.nodes, NodeScope::Named(vec!["node-1".into()]));
        assert_eq!(settings.backend, BackendSettings::SuperApiserver);
        assert_eq!(
            settings.serving_certificate,
            ServingCertificate::SelfSigned {
                names: vec!["node-1".into(), "localhost".into(), "127.0.0.1".into()]
            }
        );
        assert_eq!(settings.shutdown_grace_period, Duration::from_secs(20));
        let args = parse(&["--node-name", "node-1"]).expect("args");
        assert_ne!(args.admin_address.port(), args.listen_address.port());
        assert!(
            args.metrics_address.ip().is_loopback(),
            "metrics stay on the node's loopback"
        );
    }

    #[test]
    fn several_nodes_or_all_nodes() {
        let settings = parse(&["--node-name", "a,b", "--node-name", "c"])
            .expect("args")
            .settings()
            .expect("settings");
        assert_eq!(
            settings.nodes,
            NodeScope::Named(vec!["a".into(), "b".into(), "c".into()])
        );
        assert!(settings.nodes.contains("b") && !settings.nodes.contains("d"));
        let settings = parse(&["--all-nodes"])
            .expect("args")
            .settings()
            .expect("settings");
        assert_eq!(settings.nodes, NodeScope::All);
        assert!(parse(&["--all-nodes", "--node-name", "a"]).is_err());
        let error = parse(&[]).expect("args").settings().expect_err("no node");
        assert!(error.to_string().contains("NODE_NAME"), "{error}");
    }

    #[test]
    fn the_kubelet_backend_needs_an_identity_and_a_way_to_trust_the_kubelet() {
        let base = ["--node-name", "n", "--backend", "kubelet"];
        let error = parse(&base).expect("args").settings().expect_err("no cert");
        assert!(
            error.to_string().contains("--kubelet-client-certificate"),
            "{error}"
        );

        let with_cert = [
            &base[..],
            &[
                "--kubelet-client-certificate",
                "c.pem",
                "--kubelet-client-key",
                "k.pem",
            ],
        ]
        .concat();
        let error = parse(&with_cert).expect("args").settings().expect_err("no CA");
        assert!(
            error.to_string().contains("--kubelet-certificate-authority"),
            "{error}"
        );

        let with_ca = [&with_cert[..], &["--kubelet-certificate-authority", "ca.pem"]].concat();
        let settings = parse(&with_ca).expect("args").settings().expect("settings");
        let BackendSettings::Kubelet(kubelet) = settings.backend else {
            panic!("kubelet backend expected");
        };
        assert_eq!(kubelet.url, "https://127.0.0.1:10250");
        assert_eq!(kubelet.server_ca, KubeletServerCa::File("ca.pem".into()));

        let insecure = [&with_cert[..], &["--kubelet-insecure-skip-tls-verify"]].concat();
        let settings = parse(&insecure).expect("args").settings().expect("settings");
        assert!(matches!(
            settings.backend,
            BackendSettings::Kubelet(KubeletSettings {
                server_ca: KubeletServerCa::InsecureSkipVerify,
                ..
            })
        ));
        assert!(parse(&[&with_ca[..], &["--kubelet-insecure-skip-tls-verify"]].concat()).is_err());

        let plain_http = [&with_ca[..], &["--kubelet-url", "http://127.0.0.1:10255"]].concat();
        assert!(parse(&plain_http).expect("args").settings().is_err());
    }

    #[test]
    fn serving_certificate_files_or_generated_names() {
        let settings = parse(&[
            "--node-name",
            "n",
            "--tls-cert-file",
            "c",
            "--tls-private-key-file",
            "k",
        ])
        .expect("args")
        .settings()
        .expect("settings");
        assert_eq!(
            settings.serving_certificate,
            ServingCertificate::Files {
                cert: "c".into(),
                key: "k".into()
            }
        );
        assert!(parse(&["--node-name", "n", "--tls-cert-file", "c"]).is_err());
        let settings = parse(&["--node-name", "n", "--tls-san", "10.0.0.5,vn.example"])
            .expect("args")
            .settings()
            .expect("settings");
        assert_eq!(
            settings.serving_certificate,
            ServingCertificate::SelfSigned {
                names: vec![
                    "n".into(),
                    "10.0.0.5".into(),
                    "vn.example".into(),
                    "localhost".into(),
                    "127.0.0.1".into()
                ]
            }
        );
    }
}
