//! `kubectl vc kubeconfig`: a tenant kubeconfig with a server address that works where kubectl runs.
//!
//! - Provisioned tenants: the admin kubeconfig vc-manager keeps in Secret `admin-kubeconfig` of the root
//!   namespace (or, with `--user`, a certificate minted by [`crate::certs`]), with the server moved from the
//!   apiserver Service's in-cluster name to a load-balancer address or a node port, unless `--server` says
//!   where. The tenant CA stays; when the address is not a name in the apiserver's certificate,
//!   `tls-server-name` names one that is (never `insecure-skip-tls-verify`).
//! - Adopted tenants: the kubeconfig vc-manager adopted (read by [`tenant_pki::adopted::read_kubeconfig`]), its
//!   current context only, renamed.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use crds::{
    VirtualCluster,
    wellknown::{SECRET_ADMIN_KUBECONFIG, SECRET_ADOPTED_CLIENT_CA},
};
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use kube::{
    Api, Client, ResourceExt,
    config::{AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext},
};

use crate::{
    Error, Result, Streams,
    args::{Format, KubeconfigArgs},
    certs, output,
};
use tenant_pki::{
    adopted,
    names::{SECRET_APISERVER, SECRET_ROOT_CA},
    pki::CertifiedKey,
};

/// Lifetime of a minted user certificate when `--ttl` is not given.
pub const DEFAULT_USER_TTL: Duration = Duration::from_secs(24 * 3600);

/// Names of the cluster, user and context in a printed kubeconfig.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// The cluster: `<vc namespace>-<vc name>`.
    pub cluster: String,
    /// The user: `<vc namespace>-<vc name>-admin`, or `<user>@<vc namespace>-<vc name>`.
    pub user: String,
    /// The context: the cluster name for the admin, the user name for a minted user.
    pub context: String,
}

impl Names {
    /// For the tenant's admin kubeconfig.
    pub fn admin(vc_namespace: &str, vc_name: &str) -> Self {
        let cluster = format!("{vc_namespace}-{vc_name}");
        Self {
            user: format!("{cluster}-admin"),
            context: cluster.clone(),
            cluster,
        }
    }

    /// For a user with a minted certificate.
    pub fn user(vc_namespace: &str, vc_name: &str, user: &str) -> Self {
        let cluster = format!("{vc_namespace}-{vc_name}");
        let user = format!("{user}@{cluster}");
        Self {
            context: user.clone(),
            user,
            cluster,
        }
    }
}

/// The scheme, host (IPv6 without brackets) and port of an `https://host:port/...` URL.
pub fn split_url(url: &str) -> Option<(&str, &str, Option<u16>)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(port) => Some(port.parse().ok()?),
        None => None,
    };
    Some((scheme, host, port))
}

/// `https://host:port`, with brackets around an IPv6 host.
pub fn https_url(host: &str, port: i32) -> String {
    if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// The tenant apiserver as the admin kubeconfig reaches it inside the super cluster:
/// `https://<service>.<namespace>.svc[.<domain>]:<port>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InClusterEndpoint {
    /// The URL as written in the kubeconfig.
    pub url: String,
    /// The Service's name.
    pub service: String,
    /// The Service's namespace (the root namespace).
    pub namespace: String,
    /// The Service port.
    pub port: i32,
}

impl InClusterEndpoint {
    /// Reads the Service name, namespace and port from an in-cluster URL; `None` for any other URL.
    pub fn parse(url: &str) -> Option<Self> {
        let (_, host, port) = split_url(url)?;
        let mut labels = host.split('.');
        let service = labels.next()?;
        let namespace = labels.next()?;
        if labels.next() != Some("svc") || service.is_empty() || namespace.is_empty() {
            return None;
        }
        Some(Self {
            url: url.to_owned(),
            service: service.to_owned(),
            namespace: namespace.to_owned(),
            port: port.map_or(443, i32::from),
        })
    }

    /// `<service>.<namespace>.svc`: a name every tenant apiserver certificate carries.
    pub fn host(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }
}

/// Where an address for the tenant apiserver came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressSource {
    /// `--server`.
    Given,
    /// The apiserver Service's load-balancer ingress.
    LoadBalancer,
    /// A node address and the Service's node port.
    NodePort {
        /// The node.
        node: String,
    },
    /// The in-cluster address, reachable only from inside the super cluster.
    InCluster,
}

/// An address of the tenant apiserver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// `https://host:port`.
    pub url: String,
    /// The host (what the certificate must name, unless `tls-server-name` says otherwise).
    pub host: String,
    /// Where it came from.
    pub source: AddressSource,
}

/// The Service port the in-cluster URL uses (matched by port number, else the first).
fn service_port(service: &Service, port: i32) -> Option<&k8s_openapi::api::core::v1::ServicePort> {
    let ports = service.spec.as_ref()?.ports.as_ref()?;
    ports.iter().find(|p| p.port == port).or_else(|| ports.first())
}

/// The node port of the apiserver Service, if it has one (type NodePort or LoadBalancer).
pub fn node_port(service: &Service, port: i32) -> Option<i32> {
    service_port(service, port)?.node_port.filter(|p| *p > 0)
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A node address to reach node ports at: a Ready node's ExternalIP, else its InternalIP (nodes by name;
/// any node when none is Ready). `(node, address)`.
pub fn node_address(nodes: &[Node]) -> Option<(String, String)> {
    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by_key(|n| (!is_ready(n), n.name_any()));
    for kind in ["ExternalIP", "InternalIP"] {
        for node in &sorted {
            let address = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|addresses| {
                    addresses
                        .iter()
                        .find(|a| a.type_ == kind && !a.address.is_empty())
                });
            if let Some(address) = address {
                return Some((node.name_any(), address.address.clone()));
            }
        }
    }
    None
}

/// The best address of the apiserver from outside the super cluster: a load-balancer ingress (IP or host
/// name), else a node address with the node port, else the in-cluster address.
pub fn discover(endpoint: &InClusterEndpoint, service: Option<&Service>, nodes: &[Node]) -> Address {
    if let Some(service) = service {
        let port = service_port(service, endpoint.port).map_or(endpoint.port, |p| p.port);
        let ingress = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .find_map(|i| {
                i.ip.clone()
                    .filter(|ip| !ip.is_empty())
                    .or_else(|| i.hostname.clone().filter(|h| !h.is_empty()))
            });
        if let Some(host) = ingress {
            return Address {
                url: https_url(&host, port),
                host,
                source: AddressSource::LoadBalancer,
            };
        }
        if let (Some(node_port), Some((node, host))) =
            (node_port(service, endpoint.port), node_address(nodes))
        {
            return Address {
                url: https_url(&host, node_port),
                host,
                source: AddressSource::NodePort { node },
            };
        }
    }
    Address {
        url: endpoint.url.clone(),
        host: endpoint.host(),
        source: AddressSource::InCluster,
    }
}

/// Why the in-cluster address was kept, and what to do.
pub fn in_cluster_warning(endpoint: &InClusterEndpoint, service: Option<&Service>) -> String {
    let why = match service {
        None => format!(
            "Service {}/{} was not found",
            endpoint.namespace, endpoint.service
        ),
        Some(service) => {
            let type_ = service
                .spec
                .as_ref()
                .and_then(|s| s.type_.clone())
                .unwrap_or_else(|| "ClusterIP".into());
            match type_.as_str() {
                "LoadBalancer" => format!(
                    "Service {}/{} has no load-balancer address yet",
                    endpoint.namespace, endpoint.service
                ),
                "NodePort" => format!(
                    "no node address was found for Service {}/{}'s node port",
                    endpoint.namespace, endpoint.service
                ),
                other => format!(
                    "Service {}/{} is of type {other}",
                    endpoint.namespace, endpoint.service
                ),
            }
        }
    };
    format!(
        "{} is the tenant apiserver's in-cluster address ({why}): it is reachable only from inside the super cluster. Give --server with an address that reaches it, e.g. run `kubectl -n {} port-forward svc/{} 6443:{}` and use --server https://127.0.0.1:6443",
        endpoint.url, endpoint.namespace, endpoint.service, endpoint.port
    )
}

/// The names a server certificate is valid for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertNames {
    /// DNS names (possibly `*.` wildcards).
    pub dns: BTreeSet<String>,
    /// IP addresses.
    pub ips: BTreeSet<IpAddr>,
}

impl CertNames {
    /// The subject alternative names of a PEM certificate.
    pub fn from_pem(cert_pem: &str) -> Option<Self> {
        let info = tenant_pki::pki::inspect(cert_pem).ok()?;
        Some(Self {
            dns: info.dns_names,
            ips: info.ip_addresses,
        })
    }

    /// Names vc-manager always puts into a tenant apiserver's certificate (when the certificate itself
    /// cannot be read): the Service's in-cluster names and loopback.
    pub fn always(endpoint: &InClusterEndpoint) -> Self {
        Self {
            dns: [
                endpoint.service.clone(),
                format!("{}.{}", endpoint.service, endpoint.namespace),
                endpoint.host(),
                "localhost".to_owned(),
            ]
            .into(),
            ips: [IpAddr::from([127, 0, 0, 1])].into(),
        }
    }

    /// Whether a certificate with these names is valid for `host`.
    pub fn covers(&self, host: &str) -> bool {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self.ips.contains(&ip);
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.dns.iter().any(|name| {
            let name = name.to_ascii_lowercase();
            match name.strip_prefix("*.") {
                Some(suffix) => host
                    .split_once('.')
                    .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
                None => name == host,
            }
        })
    }
}

/// The `server` and `tls-server-name` to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// The URL.
    pub url: String,
    /// The name to verify the certificate against, when the URL's host is not in it.
    pub tls_server_name: Option<String>,
}

/// The server entry for `address` of a provisioned tenant: `tls-server-name` is `explicit` when given,
/// else the Service's in-cluster name when the certificate does not cover the address's host.
pub fn server_for(
    address: &Address,
    endpoint: &InClusterEndpoint,
    cert: &CertNames,
    explicit: Option<&str>,
) -> Server {
    let tls_server_name = match explicit {
        Some(name) => Some(name.to_owned()),
        None if cert.covers(&address.host) => None,
        None => Some(endpoint.host()),
    };
    Server {
        url: address.url.clone(),
        tls_server_name,
    }
}

/// The current context's cluster and user of a kubeconfig.
#[derive(Clone, Debug)]
pub struct Current {
    /// The cluster.
    pub cluster: Cluster,
    /// The user.
    pub auth: AuthInfo,
}

/// Reads the current context (else the first) of a kubeconfig. `origin` names it in errors.
pub fn current(yaml: &str, origin: &str) -> Result<Current> {
    let invalid = |problem: String| Error::Kubeconfig {
        origin: origin.to_owned(),
        problem,
    };
    // Data, never a recipe: whoever uses the printed kubeconfig must not run a program or read a file that
    // the VirtualCluster's editor put there.
    let config = vc_runtime::kubeconfig::parse_inline(yaml).map_err(|e| match e {
        vc_runtime::Error::KubeconfigRefused { .. } => invalid(e.to_string()),
        // Told without the kubeconfig's content (vc_runtime's errors never quote it).
        e => invalid(format!("not a kubeconfig: {e}")),
    })?;
    let context = config
        .current_context
        .as_deref()
        .and_then(|name| config.contexts.iter().find(|c| c.name == name))
        .or_else(|| config.contexts.first())
        .and_then(|c| c.context.clone());
    let (cluster_name, user_name) = match &context {
        Some(context) => (Some(context.cluster.clone()), context.user.clone()),
        None => (None, None),
    };
    let cluster = match cluster_name {
        Some(name) => config.clusters.iter().find(|c| c.name == name),
        None => config.clusters.first(),
    }
    .and_then(|c| c.cluster.clone())
    .ok_or_else(|| invalid("it names no cluster".into()))?;
    if cluster.server.as_deref().is_none_or(str::is_empty) {
        return Err(invalid("its cluster has no server".into()));
    }
    let auth = match user_name {
        Some(name) => config.auth_infos.iter().find(|u| u.name == name),
        None => config.auth_infos.first(),
    }
    .and_then(|u| u.auth_info.clone())
    .unwrap_or_default();
    Ok(Current { cluster, auth })
}

/// A kubeconfig with one cluster, user and context named `names`, `current-context` set.
pub fn single(names: &Names, cluster: Cluster, auth: AuthInfo) -> Kubeconfig {
    Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: names.cluster.clone(),
            cluster: Some(cluster),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: names.user.clone(),
            auth_info: Some(auth),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: names.context.clone(),
            context: Some(Context {
                cluster: names.cluster.clone(),
                user: Some(names.user.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(names.context.clone()),
        ..Default::default()
    }
}

/// A stored kubeconfig's current context as a single-context kubeconfig named `names`, its server replaced
/// by `server` when given. `insecure-skip-tls-verify` is never written; the warnings say what was dropped
/// or will not work elsewhere.
pub fn rewrite(current: Current, names: &Names, server: Option<&Server>) -> (Kubeconfig, Vec<String>) {
    let Current { mut cluster, auth } = current;
    let mut warnings = Vec::new();
    if let Some(server) = server {
        cluster.server = Some(server.url.clone());
        if server.tls_server_name.is_some() {
            cluster.tls_server_name = server.tls_server_name.clone();
        }
    }
    if cluster.insecure_skip_tls_verify.take() == Some(true) {
        warnings.push(if cluster.certificate_authority_data.is_some() {
            "the stored kubeconfig sets insecure-skip-tls-verify; it was dropped and the server is verified against its certificate-authority-data".to_owned()
        } else {
            "the stored kubeconfig sets insecure-skip-tls-verify and has no certificate-authority-data; kubectl vc never writes insecure-skip-tls-verify, so the server is verified against the system's trusted CAs: add certificate-authority-data to the stored kubeconfig".to_owned()
        });
    }
    let files: Vec<&str> = [
        cluster
            .certificate_authority
            .as_ref()
            .map(|_| "certificate-authority"),
        auth.client_certificate.as_ref().map(|_| "client-certificate"),
        auth.client_key.as_ref().map(|_| "client-key"),
        auth.token_file.as_ref().map(|_| "tokenFile"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !files.is_empty() {
        warnings.push(format!(
            "the stored kubeconfig refers to files ({}) that exist only where it was written",
            files.join(", ")
        ));
    }
    (single(names, cluster, auth), warnings)
}

/// A kubeconfig for a client certificate, trusting `ca_pem`.
pub fn for_certificate(names: &Names, server: &Server, ca_pem: &str, client: &CertifiedKey) -> Kubeconfig {
    use base64::{Engine, engine::general_purpose::STANDARD};
    let cluster = Cluster {
        server: Some(server.url.clone()),
        certificate_authority_data: Some(STANDARD.encode(ca_pem)),
        tls_server_name: server.tls_server_name.clone(),
        ..Default::default()
    };
    single(names, cluster, user_auth(client))
}

/// Credentials of a client certificate, embedded.
fn user_auth(client: &CertifiedKey) -> AuthInfo {
    use base64::{Engine, engine::general_purpose::STANDARD};
    AuthInfo {
        client_certificate_data: Some(STANDARD.encode(&client.cert_pem)),
        client_key_data: Some(STANDARD.encode(&client.key_pem).into()),
        ..Default::default()
    }
}

/// Mints `user`'s certificate from the CA in Secret `root/secret`, for `--group`s and `--ttl`.
fn mint_user(
    ca_cert: &str,
    ca_key: &str,
    root: &str,
    secret: &str,
    user: &str,
    args: &KubeconfigArgs,
) -> Result<certs::Minted> {
    let ttl = args.ttl.unwrap_or(DEFAULT_USER_TTL);
    certs::mint(ca_cert, ca_key, user, &args.groups, ttl, vc_runtime::clock::now()).map_err(|problem| {
        match problem {
            certs::MintError::Authority(problem) => Error::BadSecret {
                namespace: root.to_owned(),
                name: secret.to_owned(),
                problem: format!("not a usable certificate authority: {problem}"),
            },
            certs::MintError::Argument { flag, problem } => Error::InvalidArgument { flag, problem },
            certs::MintError::Issue(error) => Error::Pki(error),
        }
    })
}

/// The kubeconfig as YAML or JSON.
pub fn to_text(config: &Kubeconfig, format: Format) -> Result<String> {
    output::serialize(config, format, "the kubeconfig")
}

/// The text of `key` of a Secret (`data`, else `stringData`).
pub fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key)).cloned())
        .filter(|s| !s.trim().is_empty())
}

/// Reads `keys` of Secret `namespace/name`; a missing Secret or key is an error that says so.
pub async fn read_secret<const N: usize>(
    client: &Client,
    namespace: &str,
    name: &str,
    keys: [&str; N],
) -> Result<[String; N]> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api
        .get(name)
        .await
        .map_err(|e| Error::reading("Secret", namespace, name, e))?;
    let mut values = Vec::with_capacity(N);
    for key in keys {
        values.push(secret_text(&secret, key).ok_or_else(|| Error::BadSecret {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            problem: format!("it has no key {key:?}"),
        })?);
    }
    values.try_into().map_err(|_| Error::BadSecret {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        problem: "unreadable".into(),
    })
}

/// Reads a VirtualCluster.
pub async fn get_virtual_cluster(client: &Client, namespace: &str, name: &str) -> Result<VirtualCluster> {
    let api: Api<VirtualCluster> = Api::namespaced(client.clone(), namespace);
    api.get(name)
        .await
        .map_err(|e| Error::reading("VirtualCluster", namespace, name, e))
}

/// The root namespace of a VirtualCluster, computed from its identity (its cluster key), never read from
/// its status, which others can write. A VirtualCluster whose status names no root namespace yet has not
/// been set up by vc-manager.
pub fn root_namespace(vc: &VirtualCluster) -> Result<String> {
    vc.status
        .as_ref()
        .and_then(|s| s.cluster_namespace.as_ref())
        .filter(|ns| !ns.is_empty())
        .and_then(|_| crds::naming::cluster_key_of(vc))
        .ok_or_else(|| Error::NotProvisioned {
            vc: format!("{}/{}", vc.namespace().unwrap_or_default(), vc.name_any()),
            name: vc.name_any(),
            phase: vc.phase().map_or("none".into(), |p| p.to_string()),
        })
}

/// Decides the server of a provisioned tenant's kubeconfig: `--server`, else a discovered address; adds
/// warnings when only the in-cluster address is known or discovery was refused.
async fn native_server(
    client: &Client,
    root: &str,
    current: &Current,
    args: &KubeconfigArgs,
    warnings: &mut Vec<String>,
) -> Result<Server> {
    let url = current.cluster.server.clone().unwrap_or_default();
    let Some(endpoint) = InClusterEndpoint::parse(&url) else {
        // Not vc-manager's in-cluster form: keep it (or take --server) as it is.
        return Ok(Server {
            url: args.server.clone().unwrap_or(url),
            tls_server_name: args
                .tls_server_name
                .clone()
                .or_else(|| current.cluster.tls_server_name.clone()),
        });
    };
    let address = match &args.server {
        Some(given) => {
            let (_, host, _) = split_url(given).ok_or_else(|| Error::InvalidArgument {
                flag: "--server",
                problem: format!("{given:?} is not a URL such as https://203.0.113.10:6443"),
            })?;
            Address {
                url: given.clone(),
                host: host.to_owned(),
                source: AddressSource::Given,
            }
        }
        None => {
            let services: Api<Service> = Api::namespaced(client.clone(), &endpoint.namespace);
            let service = match services.get_opt(&endpoint.service).await {
                Ok(service) => service,
                Err(error) => {
                    warnings.push(format!(
                        "reading Service {}/{}: {}",
                        endpoint.namespace,
                        endpoint.service,
                        crate::error::api_message(&error)
                    ));
                    None
                }
            };
            let nodes = match service.as_ref().and_then(|s| node_port(s, endpoint.port)) {
                Some(_) if !has_load_balancer_ingress(service.as_ref()) => {
                    match Api::<Node>::all(client.clone()).list(&Default::default()).await {
                        Ok(list) => list.items,
                        Err(error) => {
                            warnings.push(format!(
                                "listing nodes for the apiserver's node port: {}",
                                crate::error::api_message(&error)
                            ));
                            Vec::new()
                        }
                    }
                }
                _ => Vec::new(),
            };
            let address = discover(&endpoint, service.as_ref(), &nodes);
            if address.source == AddressSource::InCluster {
                warnings.push(in_cluster_warning(&endpoint, service.as_ref()));
            }
            address
        }
    };
    let cert = if args.tls_server_name.is_none() && address.host != endpoint.host() {
        let api: Api<Secret> = Api::namespaced(client.clone(), root);
        api.get_opt(SECRET_APISERVER)
            .await
            .ok()
            .flatten()
            .and_then(|s| secret_text(&s, "tls.crt"))
            .and_then(|pem| CertNames::from_pem(&pem))
            .unwrap_or_else(|| CertNames::always(&endpoint))
    } else {
        CertNames::always(&endpoint)
    };
    Ok(server_for(
        &address,
        &endpoint,
        &cert,
        args.tls_server_name.as_deref(),
    ))
}

fn has_load_balancer_ingress(service: Option<&Service>) -> bool {
    service
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// A tenant's admin kubeconfig as `kubectl vc kubeconfig` prints it.
#[derive(Clone, Debug)]
pub struct Admin {
    /// The single-context kubeconfig, its server an address that should work from outside the super
    /// cluster (`--server`, a load-balancer or node-port address, else the in-cluster address).
    pub config: Kubeconfig,
    /// What the user should know about it.
    pub warnings: Vec<String>,
    /// For a provisioned tenant, the apiserver Service its stored kubeconfig names: where a port-forward
    /// goes. `None` for adopted tenants.
    pub endpoint: Option<InClusterEndpoint>,
}

/// The admin kubeconfig of `vc` named `names`; `args.server` and `args.tls_server_name` override the
/// address.
pub async fn admin(
    client: &Client,
    vc: &VirtualCluster,
    names: &Names,
    args: &KubeconfigArgs,
) -> Result<Admin> {
    let mut warnings = Vec::new();
    match vc.adoption() {
        Some(adoption) => {
            let (origin, yaml) = adopted::read_kubeconfig(vc, &adoption, client).await?;
            let current = current(&yaml, &origin)?;
            let server = args.server.as_ref().map(|url| Server {
                url: url.clone(),
                tls_server_name: args.tls_server_name.clone(),
            });
            let (config, more) = rewrite(current, names, server.as_ref());
            warnings.extend(more);
            Ok(Admin {
                config,
                warnings,
                endpoint: None,
            })
        }
        None => {
            let root = root_namespace(vc)?;
            let [admin] =
                read_secret(client, &root, SECRET_ADMIN_KUBECONFIG, [SECRET_ADMIN_KUBECONFIG]).await?;
            let current = current(&admin, &format!("Secret {root}/{SECRET_ADMIN_KUBECONFIG}"))?;
            let endpoint = current
                .cluster
                .server
                .as_deref()
                .and_then(InClusterEndpoint::parse);
            let server = native_server(client, &root, &current, args, &mut warnings).await?;
            let (config, more) = rewrite(current, names, Some(&server));
            warnings.extend(more);
            Ok(Admin {
                config,
                warnings,
                endpoint,
            })
        }
    }
}

/// `kubectl vc kubeconfig NAME`: prints the kubeconfig on stdout, warnings on stderr.
pub async fn command(
    client: &Client,
    namespace: &str,
    args: &KubeconfigArgs,
    io: &mut Streams<'_>,
) -> Result<()> {
    let vc = get_virtual_cluster(client, namespace, &args.name).await?;
    let vc_ref = format!("{namespace}/{}", args.name);
    let mut warnings = Vec::new();
    let config = match (&args.user, vc.adoption()) {
        (None, _) => {
            let admin = admin(client, &vc, &Names::admin(namespace, &args.name), args).await?;
            warnings.extend(admin.warnings);
            admin.config
        }
        (Some(user), Some(adoption)) => {
            // The adopted kubeconfig's server and CA, with a certificate from the client CA the operator
            // handed over.
            let (origin, yaml) = adopted::read_kubeconfig(&vc, &adoption, client).await?;
            let current = current(&yaml, &origin)?;
            let server = args.server.as_ref().map(|url| Server {
                url: url.clone(),
                tls_server_name: args.tls_server_name.clone(),
            });
            let root = root_namespace(&vc)?;
            let [ca_cert, ca_key] =
                match read_secret(client, &root, SECRET_ADOPTED_CLIENT_CA, ["tls.crt", "tls.key"]).await {
                    Err(Error::NotFound { .. }) => {
                        return Err(Error::AdoptedNoCa {
                            vc: vc_ref,
                            namespace: root,
                            secret: SECRET_ADOPTED_CLIENT_CA,
                        });
                    }
                    other => other?,
                };
            let minted = mint_user(&ca_cert, &ca_key, &root, SECRET_ADOPTED_CLIENT_CA, user, args)?;
            warnings.extend(minted.warnings.iter().cloned());
            let current = Current {
                cluster: current.cluster,
                auth: user_auth(&minted.key),
            };
            let (config, more) = rewrite(
                current,
                &Names::user(namespace, &args.name, user),
                server.as_ref(),
            );
            warnings.extend(more);
            config
        }
        (Some(user), None) => {
            let root = root_namespace(&vc)?;
            let [admin] =
                read_secret(client, &root, SECRET_ADMIN_KUBECONFIG, [SECRET_ADMIN_KUBECONFIG]).await?;
            let current = current(&admin, &format!("Secret {root}/{SECRET_ADMIN_KUBECONFIG}"))?;
            let server = native_server(client, &root, &current, args, &mut warnings).await?;
            let [ca_cert, ca_key] =
                read_secret(client, &root, SECRET_ROOT_CA, ["tls.crt", "tls.key"]).await?;
            let minted = mint_user(&ca_cert, &ca_key, &root, SECRET_ROOT_CA, user, args)?;
            warnings.extend(minted.warnings.iter().cloned());
            for_certificate(
                &Names::user(namespace, &args.name, user),
                &server,
                &ca_cert,
                &minted.key,
            )
        }
    };
    for warning in &warnings {
        io.warn(warning)?;
    }
    let format = args.output.output.unwrap_or(Format::Yaml);
    io.out.write_all(to_text(&config, format)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, NodeAddress, NodeCondition, NodeStatus, ServicePort,
        ServiceSpec, ServiceStatus,
    };

    use super::*;
    use tenant_pki::pki::{CertificateAuthority, LeafSpec, Usage};

    const URL: &str = "https://apiserver-svc.team-0b5c7f-vc-1.svc:6443";

    fn endpoint() -> InClusterEndpoint {
        InClusterEndpoint::parse(URL).expect("in-cluster URL")
    }

    fn service(type_: &str, node_port: Option<i32>, ingress: Option<LoadBalancerIngress>) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                ports: Some(vec![ServicePort {
                    name: Some("https".into()),
                    port: 6443,
                    node_port,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: ingress.map(|i| vec![i]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(name: &str, ready: bool, addresses: &[(&str, &str)]) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(t, a)| NodeAddress {
                            type_: (*t).into(),
                            address: (*a).into(),
                        })
                        .collect(),
                ),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn urls_split_into_host_and_port() {
        assert_eq!(
            split_url("https://10.0.0.1:6443"),
            Some(("https", "10.0.0.1", Some(6443)))
        );
        assert_eq!(
            split_url("https://[fd00::1]:6443/x"),
            Some(("https", "fd00::1", Some(6443)))
        );
        assert_eq!(
            split_url("https://vc.example.com"),
            Some(("https", "vc.example.com", None))
        );
        assert_eq!(split_url("vc.example.com:6443"), None);
        assert_eq!(split_url("https://:6443"), None);
        assert_eq!(https_url("fd00::1", 30443), "https://[fd00::1]:30443");
        let endpoint = endpoint();
        assert_eq!(endpoint.service, "apiserver-svc");
        assert_eq!(endpoint.namespace, "team-0b5c7f-vc-1");
        assert_eq!(endpoint.port, 6443);
        assert_eq!(endpoint.host(), "apiserver-svc.team-0b5c7f-vc-1.svc");
        assert_eq!(InClusterEndpoint::parse("https://10.0.0.1:6443"), None);
    }

    #[test]
    fn a_load_balancer_address_comes_first() {
        let lb = service(
            "LoadBalancer",
            Some(31443),
            Some(LoadBalancerIngress {
                hostname: Some("vc-1.elb.example.com".into()),
                ..Default::default()
            }),
        );
        let nodes = [node("n1", true, &[("ExternalIP", "203.0.113.5")])];
        let address = discover(&endpoint(), Some(&lb), &nodes);
        assert_eq!(address.url, "https://vc-1.elb.example.com:6443");
        assert_eq!(address.source, AddressSource::LoadBalancer);
    }

    #[test]
    fn node_ports_go_to_a_ready_nodes_external_then_internal_ip() {
        let np = service("NodePort", Some(31443), None);
        let nodes = [
            node("a-not-ready", false, &[("ExternalIP", "203.0.113.9")]),
            node("b", true, &[("InternalIP", "10.0.0.2"), ("Hostname", "b")]),
            node(
                "c",
                true,
                &[("InternalIP", "10.0.0.3"), ("ExternalIP", "203.0.113.3")],
            ),
        ];
        let address = discover(&endpoint(), Some(&np), &nodes);
        assert_eq!(address.url, "https://203.0.113.3:31443");
        assert_eq!(address.source, AddressSource::NodePort { node: "c".into() });
        let internal_only = [node("b", true, &[("InternalIP", "10.0.0.2")])];
        assert_eq!(
            discover(&endpoint(), Some(&np), &internal_only).url,
            "https://10.0.0.2:31443"
        );
        // A load balancer still waiting for its address: its node port.
        let pending_lb = service("LoadBalancer", Some(31443), None);
        assert_eq!(
            discover(&endpoint(), Some(&pending_lb), &internal_only).url,
            "https://10.0.0.2:31443"
        );
    }

    #[test]
    fn otherwise_the_in_cluster_address_stays_with_a_warning() {
        let cluster_ip = service("ClusterIP", None, None);
        let address = discover(&endpoint(), Some(&cluster_ip), &[]);
        assert_eq!(address.url, URL);
        assert_eq!(address.source, AddressSource::InCluster);
        let warning = in_cluster_warning(&endpoint(), Some(&cluster_ip));
        assert!(warning.contains("is of type ClusterIP"), "{warning}");
        assert!(warning.contains("--server"), "{warning}");
        assert!(
            warning.contains("port-forward svc/apiserver-svc 6443:6443"),
            "{warning}"
        );
        assert!(in_cluster_warning(&endpoint(), None).contains("was not found"));
        // A node port but no nodes.
        assert_eq!(
            discover(&endpoint(), Some(&service("NodePort", Some(31443), None)), &[]).source,
            AddressSource::InCluster
        );
    }

    #[test]
    fn tls_server_name_is_set_only_when_the_certificate_lacks_the_host() {
        let ca =
            CertificateAuthority::generate("kubernetes", "k", Duration::from_secs(86_400), 1_800_000_000)
                .expect("ca");
        let serving = ca
            .issue(
                &LeafSpec::with_names(
                    "kube-apiserver",
                    [
                        "apiserver-svc.team-0b5c7f-vc-1.svc",
                        "vc-1.elb.example.com",
                        "198.51.100.7",
                    ],
                    Usage::Server,
                ),
                Duration::from_secs(3600),
                1_800_000_000,
            )
            .expect("leaf");
        let names = CertNames::from_pem(&serving.cert_pem).expect("names");
        let at = |url: &str, host: &str| Address {
            url: url.into(),
            host: host.into(),
            source: AddressSource::Given,
        };
        let lb = server_for(
            &at("https://vc-1.elb.example.com:6443", "vc-1.elb.example.com"),
            &endpoint(),
            &names,
            None,
        );
        assert_eq!(lb.tls_server_name, None);
        assert_eq!(
            server_for(
                &at("https://198.51.100.7:6443", "198.51.100.7"),
                &endpoint(),
                &names,
                None
            )
            .tls_server_name,
            None
        );
        let node_port = server_for(
            &at("https://10.0.0.2:31443", "10.0.0.2"),
            &endpoint(),
            &names,
            None,
        );
        assert_eq!(node_port.url, "https://10.0.0.2:31443");
        assert_eq!(
            node_port.tls_server_name.as_deref(),
            Some("apiserver-svc.team-0b5c7f-vc-1.svc")
        );
        assert_eq!(
            server_for(
                &at("https://10.0.0.2:31443", "10.0.0.2"),
                &endpoint(),
                &names,
                Some("vc.example.com")
            )
            .tls_server_name
            .as_deref(),
            Some("vc.example.com")
        );
        // Without the certificate: only what every tenant certificate has.
        let always = CertNames::always(&endpoint());
        assert!(always.covers("127.0.0.1"));
        assert!(always.covers("localhost"));
        assert!(always.covers("APISERVER-SVC.team-0b5c7f-vc-1.svc."));
        assert!(!always.covers("10.0.0.2"));
        let wildcard = CertNames {
            dns: ["*.example.com".to_owned()].into(),
            ips: BTreeSet::new(),
        };
        assert!(wildcard.covers("vc.example.com"));
        assert!(!wildcard.covers("a.vc.example.com"));
        assert!(!wildcard.covers("example.com"));
    }

    fn admin_yaml(insecure: bool) -> String {
        let client = CertifiedKey {
            cert_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\nBBBB\n-----END PRIVATE KEY-----\n".into(),
        };
        let yaml =
            tenant_pki::kubeconfig::render("team-0b5c7f-vc-1", URL, "CA PEM", "kubernetes-admin", &client);
        if insecure {
            yaml.replace("    server: ", "    insecure-skip-tls-verify: true\n    server: ")
        } else {
            yaml
        }
    }

    #[tokio::test]
    async fn rendered_kubeconfigs_keep_the_ca_and_take_the_new_server() {
        let current = current(&admin_yaml(false), "Secret x/admin-kubeconfig").expect("reads");
        assert_eq!(current.cluster.server.as_deref(), Some(URL));
        let server = Server {
            url: "https://10.0.0.2:31443".into(),
            tls_server_name: Some("apiserver-svc.team-0b5c7f-vc-1.svc".into()),
        };
        let (config, warnings) = rewrite(current, &Names::admin("team", "vc-1"), Some(&server));
        assert!(warnings.is_empty(), "{warnings:?}");
        let yaml = to_text(&config, Format::Yaml).expect("yaml");
        assert!(!yaml.contains("insecure"), "{yaml}");
        let parsed = Kubeconfig::from_yaml(&yaml).expect("kube reads it");
        assert_eq!(parsed.current_context.as_deref(), Some("team-vc-1"));
        assert_eq!(parsed.contexts[0].name, "team-vc-1");
        assert_eq!(parsed.clusters[0].name, "team-vc-1");
        assert_eq!(parsed.auth_infos[0].name, "team-vc-1-admin");
        let cluster = parsed.clusters[0].cluster.clone().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.2:31443"));
        assert_eq!(
            cluster.tls_server_name.as_deref(),
            Some("apiserver-svc.team-0b5c7f-vc-1.svc")
        );
        use base64::{Engine, engine::general_purpose::STANDARD};
        assert_eq!(
            cluster.certificate_authority_data.as_deref(),
            Some(STANDARD.encode("CA PEM").as_str())
        );
        let certificate = tenant_pki::kubeconfig::client_certificate(&yaml).expect("client certificate kept");
        assert!(certificate.cert_pem.contains("AAAA"));
        // kube builds a client configuration from it.
        let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
            .await
            .expect("kube config");
        assert_eq!(config.cluster_url.to_string(), "https://10.0.0.2:31443/");
        // JSON as well.
        let json: serde_json::Value = serde_json::from_str(
            &to_text(
                &single(&Names::admin("a", "b"), Cluster::default(), AuthInfo::default()),
                Format::Json,
            )
            .expect("json"),
        )
        .expect("valid JSON");
        assert_eq!(json["current-context"], "a-b");
    }

    #[test]
    fn insecure_skip_tls_verify_is_never_written() {
        let current = current(&admin_yaml(true), "Secret x/y").expect("reads");
        assert_eq!(current.cluster.insecure_skip_tls_verify, Some(true));
        let (config, warnings) = rewrite(current, &Names::admin("team", "vc-1"), None);
        let yaml = to_text(&config, Format::Yaml).expect("yaml");
        assert!(!yaml.contains("insecure-skip-tls-verify"), "{yaml}");
        assert!(yaml.contains(URL), "{yaml}");
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("dropped"), "{warnings:?}");
    }

    #[test]
    fn broken_kubeconfigs_are_reported_with_their_origin() {
        let error = current("clusters: [unclosed", "Secret a/b key value").expect_err("invalid");
        assert!(
            error
                .to_string()
                .starts_with("kubeconfig from Secret a/b key value: not a kubeconfig"),
            "{error}"
        );
        let no_server = "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {}}]\ncontexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n";
        assert_eq!(
            current(no_server, "o").expect_err("no server").to_string(),
            "kubeconfig from o: its cluster has no server"
        );
    }

    #[test]
    fn names_say_which_tenant_and_user() {
        assert_eq!(
            Names::user("team", "vc-1", "alice"),
            Names {
                cluster: "team-vc-1".into(),
                user: "alice@team-vc-1".into(),
                context: "alice@team-vc-1".into(),
            }
        );
    }

    #[test]
    fn a_kubeconfig_that_runs_a_program_is_not_handed_out() {
        let hostile = "apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: 'https://tenant:6443'}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
";
        let error = current(hostile, "Secret team/kc key value").expect_err("refused");
        let message = error.to_string();
        assert!(message.contains("users[u].exec"), "{message}");
        assert!(message.contains("Secret team/kc key value"), "{message}");
    }

    #[test]
    fn the_root_namespace_is_the_cluster_key_whatever_the_status_says() {
        let mut vc = VirtualCluster::new("vc-1", Default::default());
        vc.metadata.namespace = Some("team".into());
        vc.metadata.uid = Some("uid-1".into());
        vc.status = Some(crds::VirtualClusterStatus {
            cluster_namespace: Some("someone-elses-root".into()),
            ..Default::default()
        });
        assert_eq!(
            root_namespace(&vc).expect("root"),
            crds::naming::cluster_key("team", "uid-1", "vc-1")
        );
        vc.status = None;
        assert!(root_namespace(&vc).is_err(), "not set up by vc-manager yet");
    }
}
