//! The Secrets of a tenant's root namespace (the table in `docs/architecture.md`), planned from what is
//! stored: certificate authorities and the service-account key are kept while present and valid, leaf
//! certificates and kubeconfigs are reissued only when they are missing, invalid, renamed or in the last
//! fifth of their life. The plan says for each Secret whether it must be written and why.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use crds::wellknown::{LABEL_KUBELET_CLIENT, SECRET_ADMIN_KUBECONFIG, SECRET_KUBELET_CLIENT};
use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};

use crds::{TenantIdentity, tenant::managed_labels};

use crate::{
    Result, kubeconfig,
    names::{
        SECRET_APISERVER, SECRET_CONTROLLER_MANAGER_KUBECONFIG, SECRET_ETCD_CA, SECRET_ETCD_CLIENT,
        SECRET_ETCD_SERVER, SECRET_FRONT_PROXY_CA, SECRET_FRONT_PROXY_CLIENT, SECRET_KUBELET_CLIENT_CA,
        SECRET_ROOT_CA, SECRET_SERVICE_ACCOUNT,
    },
    pki::{CertificateAuthority, CertifiedKey, LeafSpec, ServiceAccountKey, Usage},
};

/// Common name of the admin kubeconfig's user (in `system:masters`).
pub const ADMIN_USER: &str = "kubernetes-admin";
/// Common name of the controller-manager's client certificate.
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
/// Common name of the front-proxy client certificate (`--requestheader-allowed-names`).
pub const FRONT_PROXY_CLIENT_USER: &str = "front-proxy-client";

const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const CA_CRT: &str = "ca.crt";
const TYPE_TLS: &str = "kubernetes.io/tls";
const TYPE_OPAQUE: &str = "Opaque";

/// How long certificates live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    /// Leaf certificates: `pkiExpireDays`.
    pub leaf: Duration,
    /// Certificate authorities: ten years, or `pkiExpireDays` when longer.
    pub ca: Duration,
}

impl Lifetimes {
    /// Lifetimes for `spec.pkiExpireDays`.
    pub fn for_days(pki_expire_days: i64) -> Self {
        let days = u64::try_from(pki_expire_days.max(1)).unwrap_or(1);
        Self {
            leaf: Duration::from_secs(days * 86_400),
            ca: Duration::from_secs(days.max(3650) * 86_400),
        }
    }

    /// Caps leaf certificates at the platform's longest lifetime (`--max-certificate-lifetime-seconds`),
    /// never below [`Lifetimes::SHORTEST_LEAF`]. Authorities are not capped: a renewed authority rolls the
    /// control plane (the components load trust bundles once), a renewed leaf does not.
    pub fn capped(self, max_leaf: Option<Duration>) -> Self {
        match max_leaf {
            Some(max) => Self {
                leaf: self.leaf.min(max.max(Self::SHORTEST_LEAF)),
                ..self
            },
            None => self,
        }
    }

    /// The shortest leaf lifetime: renewal starts when a fifth of it remains, and the kubelet must deliver
    /// the renewed files into the pods (its sync period, a minute by default) well before the old ones
    /// expire.
    pub const SHORTEST_LEAF: Duration = Duration::from_secs(60);
}

/// Where the tenant apiserver is reached inside the super cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiServerEndpoint {
    /// Name of the apiserver Service.
    pub service: String,
    /// Its port.
    pub port: i32,
}

/// Where a provisioned control plane is reached, for certificate names and kubeconfig URLs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// The apiserver Service and port.
    pub apiserver: ApiServerEndpoint,
    /// More IPs the apiserver is reached at: its Service's cluster IP, load-balancer IPs.
    pub apiserver_ips: Vec<IpAddr>,
    /// More DNS names: the external-apiserver-domain label, load-balancer host names.
    pub apiserver_hostnames: Vec<String>,
    /// etcd client Service.
    pub etcd_service: String,
    /// etcd peer (governing) Service.
    pub etcd_peer_service: String,
    /// etcd member (pod) names: each gets its own names under the peer Service, besides the wildcard
    /// (which some verifiers, like webpki, refuse under a one-label domain such as `*.etcd`).
    pub etcd_members: Vec<String>,
    /// The tenant's cluster domain (`spec.clusterDomain`).
    pub cluster_domain: String,
    /// The super cluster's DNS domain.
    pub super_cluster_domain: String,
    /// First IP of each tenant service range: the tenant's `kubernetes` Service.
    pub tenant_service_ips: Vec<IpAddr>,
}

/// Which Secrets a tenant gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A provisioned control plane: every Secret.
    Native(Box<Network>),
    /// An adopted control plane: only the kubelet-client CA and certificate.
    KubeletClientOnly,
}

/// Everything a plan depends on.
#[derive(Clone, Debug)]
pub struct PkiInput<'a> {
    /// The tenant.
    pub identity: &'a TenantIdentity,
    /// Certificate lifetimes.
    pub lifetimes: Lifetimes,
    /// Now, Unix seconds.
    pub now: i64,
    /// Which Secrets.
    pub scope: &'a Scope,
}

/// Why a Secret is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// It did not exist.
    Created,
    /// Its certificate was reissued, for this reason.
    Renewed(String),
    /// A certificate authority or key that was unusable was replaced, for this reason.
    Replaced(String),
    /// Contents derived from others (a CA bundle, a kubeconfig) or its labels changed.
    Updated,
}

/// One Secret of the plan.
#[derive(Clone, Debug)]
pub struct PlannedSecret {
    /// The Secret as it must be (name, namespace, labels, annotations, type, data).
    pub secret: Secret,
    /// Why it must be written; `None` when the stored one is already right.
    pub change: Option<Change>,
}

impl PlannedSecret {
    /// The Secret's name.
    pub fn name(&self) -> &str {
        self.secret.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The Secrets of a tenant and what to write.
#[derive(Clone, Debug, Default)]
pub struct PkiPlan {
    /// Every Secret, certificate authorities first.
    pub secrets: Vec<PlannedSecret>,
    /// Expiry (Unix seconds) of the certificate in each Secret.
    pub expiries: BTreeMap<String, i64>,
    /// When the next certificate enters its renewal window (Unix seconds).
    pub next_renewal: Option<i64>,
}

impl PkiPlan {
    /// The Secrets that must be written.
    pub fn changed(&self) -> impl Iterator<Item = &PlannedSecret> {
        self.secrets.iter().filter(|s| s.change.is_some())
    }

    /// A planned Secret by name.
    pub fn secret(&self, name: &str) -> Option<&Secret> {
        self.secrets.iter().find(|s| s.name() == name).map(|s| &s.secret)
    }
}

fn data_str<'a>(secret: Option<&'a Secret>, key: &str) -> Option<&'a str> {
    let ByteString(bytes) = secret?.data.as_ref()?.get(key)?;
    std::str::from_utf8(bytes).ok().filter(|s| !s.trim().is_empty())
}

struct Planner<'a> {
    existing: &'a BTreeMap<String, Secret>,
    input: &'a PkiInput<'a>,
    plan: PkiPlan,
}

impl Planner<'_> {
    fn record(
        &mut self,
        name: &str,
        type_: &str,
        data: Vec<(&str, String)>,
        change: Option<Change>,
        expiry: Option<(i64, i64)>,
    ) {
        let identity = self.input.identity;
        let mut labels = managed_labels();
        if name == SECRET_KUBELET_CLIENT {
            labels.insert(LABEL_KUBELET_CLIENT.to_owned(), "true".to_owned());
        }
        let annotations = identity.annotations();
        let existing = self.existing.get(name);
        let data: BTreeMap<String, ByteString> = data
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
            .collect();
        let change = change.or_else(|| match existing {
            None => Some(Change::Created),
            Some(stored) => {
                let stored_data = stored.data.clone().unwrap_or_default();
                let data_same = data.iter().all(|(k, v)| stored_data.get(k) == Some(v));
                let contains = |have: &Option<BTreeMap<String, String>>, want: &BTreeMap<String, String>| {
                    let have = have.clone().unwrap_or_default();
                    want.iter().all(|(k, v)| have.get(k) == Some(v))
                };
                let meta_same = contains(&stored.metadata.labels, &labels)
                    && contains(&stored.metadata.annotations, &annotations);
                (!data_same || !meta_same).then_some(Change::Updated)
            }
        });
        // The type of a Secret cannot change; keep whatever a stored one has.
        let type_ = existing
            .and_then(|s| s.type_.clone())
            .unwrap_or_else(|| type_.to_owned());
        if let Some((not_after, renew_at)) = expiry {
            self.plan.expiries.insert(name.to_owned(), not_after);
            self.plan.next_renewal = Some(self.plan.next_renewal.map_or(renew_at, |n| n.min(renew_at)));
        }
        self.plan.secrets.push(PlannedSecret {
            secret: Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(identity.root_namespace().to_owned()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                type_: Some(type_),
                data: Some(data),
                ..Default::default()
            },
            change,
        });
    }

    fn certificate_authority(&mut self, name: &str, common_name: &str) -> Result<CertificateAuthority> {
        let PkiInput { lifetimes, now, .. } = *self.input;
        let stored = self.existing.get(name);
        let generate = || {
            CertificateAuthority::generate(common_name, &self.input.identity.cluster_key, lifetimes.ca, now)
        };
        let (ca, change) = match (data_str(stored, TLS_CRT), data_str(stored, TLS_KEY)) {
            (Some(cert), Some(key)) => match CertificateAuthority::load(cert, key, now) {
                Ok(ca) if ca.info().needs_renewal(now) => match ca.renewed(lifetimes.ca, now) {
                    Ok(renewed) => (
                        renewed,
                        Some(Change::Renewed(
                            "less than a fifth of its lifetime remains".into(),
                        )),
                    ),
                    Err(error) => {
                        // A CA whose subject we cannot reproduce is kept until it expires.
                        tracing::warn!(
                            secret = name,
                            error = &error as &dyn std::error::Error,
                            "cannot renew certificate authority; keeping it"
                        );
                        (ca, None)
                    }
                },
                Ok(ca) => (ca, None),
                Err(problem) => (generate()?, Some(Change::Replaced(problem))),
            },
            _ if stored.is_some() => (
                generate()?,
                Some(Change::Replaced("tls.crt or tls.key is missing".into())),
            ),
            _ => (generate()?, None),
        };
        let info = ca.info().clone();
        let pem = ca.pem().clone();
        self.record(
            name,
            TYPE_TLS,
            vec![(TLS_CRT, pem.cert_pem), (TLS_KEY, pem.key_pem)],
            change,
            Some((info.not_after, info.renew_at())),
        );
        Ok(ca)
    }

    fn leaf_certificate(
        &self,
        stored: Option<CertifiedKey>,
        ca: &CertificateAuthority,
        spec: &LeafSpec,
    ) -> Result<(CertifiedKey, Option<Change>)> {
        let PkiInput { lifetimes, now, .. } = *self.input;
        match stored {
            None => Ok((ca.issue(spec, lifetimes.leaf, now)?, None)),
            Some(leaf) => match ca.leaf_problem(&leaf, spec, lifetimes.leaf, now) {
                None => Ok((leaf, None)),
                Some(problem) => Ok((
                    ca.issue(spec, lifetimes.leaf, now)?,
                    Some(Change::Renewed(problem)),
                )),
            },
        }
    }

    fn expiry_of(cert_pem: &str) -> Option<(i64, i64)> {
        crate::pki::inspect(cert_pem)
            .ok()
            .map(|i| (i.not_after, i.renew_at()))
    }

    fn leaf(&mut self, name: &str, ca: &CertificateAuthority, spec: &LeafSpec) -> Result<()> {
        let stored = self.existing.get(name);
        let stored_pair = match (data_str(stored, TLS_CRT), data_str(stored, TLS_KEY)) {
            (Some(cert), Some(key)) => Some(CertifiedKey {
                cert_pem: cert.to_owned(),
                key_pem: key.to_owned(),
            }),
            _ => None,
        };
        let incomplete = stored.is_some() && stored_pair.is_none();
        let (leaf, mut change) = self.leaf_certificate(stored_pair, ca, spec)?;
        if incomplete {
            change = Some(Change::Renewed("tls.crt or tls.key is missing".into()));
        }
        let expiry = Self::expiry_of(&leaf.cert_pem);
        self.record(
            name,
            TYPE_TLS,
            vec![
                (TLS_CRT, leaf.cert_pem),
                (TLS_KEY, leaf.key_pem),
                (CA_CRT, ca.cert_pem().to_owned()),
            ],
            change,
            expiry,
        );
        Ok(())
    }

    fn kubeconfig(
        &mut self,
        name: &str,
        ca: &CertificateAuthority,
        spec: &LeafSpec,
        server: &str,
        user: &str,
    ) -> Result<()> {
        let incomplete = self.existing.contains_key(name);
        let stored = data_str(self.existing.get(name), name).and_then(kubeconfig::client_certificate);
        let incomplete = incomplete && stored.is_none();
        let (client, mut change) = self.leaf_certificate(stored, ca, spec)?;
        if incomplete {
            change = Some(Change::Renewed("it has no readable client certificate".into()));
        }
        let expiry = Self::expiry_of(&client.cert_pem);
        let yaml = kubeconfig::render(
            &self.input.identity.cluster_key,
            server,
            ca.cert_pem(),
            user,
            &client,
        );
        self.record(name, TYPE_OPAQUE, vec![(name, yaml)], change, expiry);
        Ok(())
    }

    fn service_account_key(&mut self) -> Result<()> {
        let stored = self.existing.get(SECRET_SERVICE_ACCOUNT);
        let (key, change) = match data_str(stored, TLS_KEY) {
            Some(private) => match ServiceAccountKey::load(private) {
                Ok(key) => (key, None),
                Err(problem) => (ServiceAccountKey::generate()?, Some(Change::Replaced(problem))),
            },
            None if stored.is_some() => (
                ServiceAccountKey::generate()?,
                Some(Change::Replaced("tls.key is missing".into())),
            ),
            None => (ServiceAccountKey::generate()?, None),
        };
        self.record(
            SECRET_SERVICE_ACCOUNT,
            TYPE_OPAQUE,
            vec![(TLS_CRT, key.public_pem), (TLS_KEY, key.private_pem)],
            change,
            None,
        );
        Ok(())
    }
}

/// Whether a Secret holds a certificate authority or the service-account key (written before the
/// certificates and kubeconfigs derived from them).
pub fn is_authority(name: &str) -> bool {
    [
        SECRET_ROOT_CA,
        SECRET_ETCD_CA,
        SECRET_FRONT_PROXY_CA,
        SECRET_KUBELET_CLIENT_CA,
        SECRET_SERVICE_ACCOUNT,
    ]
    .contains(&name)
}

/// Whether a Secret holds a leaf certificate that its users reload from their files without a restart:
/// kube-apiserver watches its serving certificate and reloads its kubelet, etcd and front-proxy client
/// certificates, and etcd reads its serving and peer certificate on every handshake (both on Kubernetes
/// 1.25 to 1.33 and etcd 3.4 to 3.5). Trust bundles (`ca.crt`, the authorities) are loaded once, and
/// kubeconfigs carry their certificate inline, so those still restart their users.
pub fn reloaded_in_place(name: &str) -> bool {
    [
        SECRET_APISERVER,
        SECRET_ETCD_SERVER,
        SECRET_ETCD_CLIENT,
        SECRET_FRONT_PROXY_CLIENT,
        SECRET_KUBELET_CLIENT,
    ]
    .contains(&name)
}

/// Whether a Secret key holds a certificate or private key (as opposed to a trust bundle).
pub fn is_certificate_or_key(key: &str) -> bool {
    key == TLS_CRT || key == TLS_KEY
}

/// The DNS names of a Service: `svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.<domain>`.
fn service_names(service: &str, namespace: &str, domain: &str) -> [String; 4] {
    [
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.{domain}"),
    ]
}

/// The apiserver's serving certificate: its Service in every form, the tenant's `kubernetes` Service,
/// loopback, the Service's cluster IP and any extra names.
pub fn apiserver_spec(network: &Network, namespace: &str) -> LeafSpec {
    let mut names: BTreeSet<String> = service_names(
        &network.apiserver.service,
        namespace,
        &network.super_cluster_domain,
    )
    .into();
    names.extend(
        [
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            format!("kubernetes.default.svc.{}", network.cluster_domain),
            "localhost".to_owned(),
        ]
        .into_iter()
        .chain(network.apiserver_hostnames.iter().cloned()),
    );
    let mut spec = LeafSpec::with_names("kube-apiserver", names.iter().map(String::as_str), Usage::Server);
    spec.ip_addresses.insert(IpAddr::from([127, 0, 0, 1]));
    spec.ip_addresses.extend(network.apiserver_ips.iter().copied());
    spec.ip_addresses
        .extend(network.tenant_service_ips.iter().copied());
    spec
}

/// etcd's serving and peer certificate: its client Service, each member's name under the peer Service,
/// and loopback.
pub fn etcd_server_spec(network: &Network, namespace: &str) -> LeafSpec {
    let domain = &network.super_cluster_domain;
    let mut names: BTreeSet<String> = service_names(&network.etcd_service, namespace, domain).into();
    names.extend(service_names(&network.etcd_peer_service, namespace, domain));
    let wildcards: Vec<String> = service_names(&network.etcd_peer_service, namespace, domain)
        .iter()
        .map(|n| format!("*.{n}"))
        .collect();
    names.extend(wildcards);
    for member in &network.etcd_members {
        names.extend(
            service_names(&network.etcd_peer_service, namespace, domain)
                .iter()
                .map(|n| format!("{member}.{n}")),
        );
    }
    names.insert("localhost".to_owned());
    let mut spec = LeafSpec::with_names("etcd", names.iter().map(String::as_str), Usage::ServerAndClient);
    spec.ip_addresses.insert(IpAddr::from([127, 0, 0, 1]));
    spec
}

/// The certificate a tenant apiserver presents to vn-agent: common name = cluster key.
pub fn kubelet_client_spec(cluster_key: &str) -> LeafSpec {
    LeafSpec::client(cluster_key, &[])
}

/// The URL of a provisioned apiserver from pods in the super cluster.
pub fn apiserver_url(network: &Network, namespace: &str) -> String {
    format!(
        "https://{}.{namespace}.svc:{}",
        network.apiserver.service, network.apiserver.port
    )
}

/// Plans every Secret of a tenant from the stored ones.
pub fn plan(existing: &BTreeMap<String, Secret>, input: &PkiInput<'_>) -> Result<PkiPlan> {
    let mut planner = Planner {
        existing,
        input,
        plan: PkiPlan::default(),
    };
    let cluster_key = input.identity.cluster_key.clone();
    if let Scope::Native(network) = input.scope {
        let namespace = input.identity.root_namespace();
        let root = planner.certificate_authority(SECRET_ROOT_CA, "kubernetes")?;
        let etcd = planner.certificate_authority(SECRET_ETCD_CA, "etcd-ca")?;
        let front_proxy = planner.certificate_authority(SECRET_FRONT_PROXY_CA, "front-proxy-ca")?;
        let kubelet = planner.certificate_authority(SECRET_KUBELET_CLIENT_CA, "kubelet-client-ca")?;
        planner.service_account_key()?;
        planner.leaf(SECRET_APISERVER, &root, &apiserver_spec(network, namespace))?;
        planner.leaf(SECRET_ETCD_SERVER, &etcd, &etcd_server_spec(network, namespace))?;
        planner.leaf(
            SECRET_ETCD_CLIENT,
            &etcd,
            &LeafSpec::client("kube-apiserver-etcd-client", &[]),
        )?;
        planner.leaf(
            SECRET_FRONT_PROXY_CLIENT,
            &front_proxy,
            &LeafSpec::client(FRONT_PROXY_CLIENT_USER, &[]),
        )?;
        planner.leaf(
            SECRET_KUBELET_CLIENT,
            &kubelet,
            &kubelet_client_spec(&cluster_key),
        )?;
        let server = apiserver_url(network, namespace);
        planner.kubeconfig(
            SECRET_ADMIN_KUBECONFIG,
            &root,
            &LeafSpec::client(ADMIN_USER, &["system:masters"]),
            &server,
            ADMIN_USER,
        )?;
        planner.kubeconfig(
            SECRET_CONTROLLER_MANAGER_KUBECONFIG,
            &root,
            &LeafSpec::client(CONTROLLER_MANAGER_USER, &[]),
            &server,
            CONTROLLER_MANAGER_USER,
        )?;
    } else {
        let kubelet = planner.certificate_authority(SECRET_KUBELET_CLIENT_CA, "kubelet-client-ca")?;
        planner.leaf(
            SECRET_KUBELET_CLIENT,
            &kubelet,
            &kubelet_client_spec(&cluster_key),
        )?;
    }
    Ok(planner.plan)
}

/// The first address of each range in a comma-separated list of CIDRs (the tenant `kubernetes` Service IP).
pub fn first_service_ips(cidrs: &str) -> Vec<IpAddr> {
    cidrs
        .split(',')
        .filter_map(|cidr| {
            let (base, bits) = cidr.trim().split_once('/')?;
            let bits: u32 = bits.parse().ok()?;
            match base.parse::<IpAddr>().ok()? {
                IpAddr::V4(ip) => {
                    let mask = u32::MAX.checked_shl(32 - bits.min(32)).unwrap_or(0);
                    Some(IpAddr::from(std::net::Ipv4Addr::from((u32::from(ip) & mask) + 1)))
                }
                IpAddr::V6(ip) => {
                    let mask = u128::MAX.checked_shl(128 - bits.min(128)).unwrap_or(0);
                    Some(IpAddr::from(std::net::Ipv6Addr::from(
                        (u128::from(ip) & mask) + 1,
                    )))
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{inspect, is_signed_by};

    const NOW: i64 = 1_800_000_000;
    const DAY: i64 = 86_400;

    fn identity() -> TenantIdentity {
        TenantIdentity {
            cluster_key: "team-abc123-vc".into(),
            vc_name: "vc".into(),
            vc_namespace: "team".into(),
            vc_uid: "uid-1".into(),
        }
    }

    fn network() -> Network {
        Network {
            apiserver: ApiServerEndpoint {
                service: "apiserver-svc".into(),
                port: 6443,
            },
            apiserver_ips: vec!["10.96.12.34".parse().expect("ip")],
            apiserver_hostnames: vec!["vc.example.com".into()],
            etcd_service: "etcd".into(),
            etcd_peer_service: "etcd".into(),
            etcd_members: vec!["etcd-0".into()],
            cluster_domain: "tenant.local".into(),
            super_cluster_domain: "cluster.local".into(),
            tenant_service_ips: vec!["10.32.0.1".parse().expect("ip")],
        }
    }

    fn plan_at(existing: &BTreeMap<String, Secret>, now: i64, scope: &Scope) -> PkiPlan {
        let identity = identity();
        plan(
            existing,
            &PkiInput {
                identity: &identity,
                lifetimes: Lifetimes::for_days(365),
                now,
                scope,
            },
        )
        .expect("plan")
    }

    fn stored(plan: &PkiPlan) -> BTreeMap<String, Secret> {
        plan.secrets
            .iter()
            .map(|s| (s.name().to_owned(), s.secret.clone()))
            .collect()
    }

    fn text(secret: &Secret, key: &str) -> String {
        String::from_utf8(secret.data.as_ref().expect("data")[key].0.clone()).expect("utf-8")
    }

    fn changes(plan: &PkiPlan) -> BTreeMap<String, Change> {
        plan.secrets
            .iter()
            .filter_map(|s| s.change.clone().map(|c| (s.name().to_owned(), c)))
            .collect()
    }

    #[test]
    fn a_new_tenant_gets_every_secret_of_the_architecture_table() {
        let scope = Scope::Native(Box::new(network()));
        let plan = plan_at(&BTreeMap::new(), NOW, &scope);
        let names: Vec<&str> = plan.secrets.iter().map(PlannedSecret::name).collect();
        assert_eq!(
            names,
            [
                "root-ca",
                "etcd-ca",
                "front-proxy-ca",
                "kubelet-client-ca",
                "serviceaccount-rsa",
                "apiserver-ca",
                "etcd-server",
                "etcd-client",
                "front-proxy-client",
                "kubelet-client",
                "admin-kubeconfig",
                "controller-manager-kubeconfig",
            ]
        );
        assert!(plan.secrets.iter().all(|s| s.change == Some(Change::Created)));
        for (name, keys) in [
            ("root-ca", &["tls.crt", "tls.key"][..]),
            ("apiserver-ca", &["ca.crt", "tls.crt", "tls.key"]),
            ("etcd-ca", &["tls.crt", "tls.key"]),
            ("etcd-server", &["ca.crt", "tls.crt", "tls.key"]),
            ("etcd-client", &["ca.crt", "tls.crt", "tls.key"]),
            ("front-proxy-ca", &["tls.crt", "tls.key"]),
            ("front-proxy-client", &["ca.crt", "tls.crt", "tls.key"]),
            ("serviceaccount-rsa", &["tls.crt", "tls.key"]),
            ("kubelet-client-ca", &["tls.crt", "tls.key"]),
            ("kubelet-client", &["ca.crt", "tls.crt", "tls.key"]),
            ("admin-kubeconfig", &["admin-kubeconfig"]),
            (
                "controller-manager-kubeconfig",
                &["controller-manager-kubeconfig"],
            ),
        ] {
            let secret = plan.secret(name).expect(name);
            let have: Vec<&str> = secret
                .data
                .as_ref()
                .expect("data")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(have, keys, "{name}");
            assert_eq!(secret.metadata.namespace.as_deref(), Some("team-abc123-vc"));
            let annotations = secret.metadata.annotations.clone().unwrap_or_default();
            assert_eq!(annotations["tenancy.x-k8s.io/cluster"], "team-abc123-vc");
            assert_eq!(annotations["tenancy.x-k8s.io/vcname"], "vc");
            assert_eq!(annotations["tenancy.x-k8s.io/vcnamespace"], "team");
            assert_eq!(annotations["tenancy.x-k8s.io/vcuid"], "uid-1");
        }
        assert_eq!(plan.expiries.len(), 11);
        assert_eq!(plan.expiries["apiserver-ca"], NOW + 365 * DAY);
        assert_eq!(plan.expiries["root-ca"], NOW + 3650 * DAY);
        assert_eq!(plan.next_renewal, Some(NOW + 365 * DAY - (365 * DAY + 300) / 5));
    }

    #[test]
    fn certificates_chain_to_their_cas_with_the_right_names() {
        let scope = Scope::Native(Box::new(network()));
        let plan = plan_at(&BTreeMap::new(), NOW, &scope);
        let get = |name: &str| plan.secret(name).expect(name);
        let root = text(get("root-ca"), "tls.crt");
        let apiserver = text(get("apiserver-ca"), "tls.crt");
        assert!(is_signed_by(&apiserver, &root));
        assert_eq!(text(get("apiserver-ca"), "ca.crt"), root);
        let info = inspect(&apiserver).expect("apiserver cert");
        for name in [
            "apiserver-svc",
            "apiserver-svc.team-abc123-vc",
            "apiserver-svc.team-abc123-vc.svc",
            "apiserver-svc.team-abc123-vc.svc.cluster.local",
            "kubernetes.default.svc.tenant.local",
            "vc.example.com",
        ] {
            assert!(info.dns_names.contains(name), "{name} in {:?}", info.dns_names);
        }
        for ip in ["10.96.12.34", "10.32.0.1", "127.0.0.1"] {
            assert!(info.ip_addresses.contains(&ip.parse().expect("ip")), "{ip}");
        }

        let etcd_ca = text(get("etcd-ca"), "tls.crt");
        let etcd = inspect(&text(get("etcd-server"), "tls.crt")).expect("etcd");
        assert!(etcd.dns_names.contains("*.etcd.team-abc123-vc.svc"));
        assert!(etcd.dns_names.contains("etcd-0.etcd"));
        assert!(
            etcd.dns_names
                .contains("etcd-0.etcd.team-abc123-vc.svc.cluster.local")
        );
        assert!(etcd.dns_names.contains("etcd.team-abc123-vc.svc.cluster.local"));
        assert!(is_signed_by(&text(get("etcd-server"), "tls.crt"), &etcd_ca));
        assert!(is_signed_by(&text(get("etcd-client"), "tls.crt"), &etcd_ca));

        let kubelet = inspect(&text(get("kubelet-client"), "tls.crt")).expect("kubelet-client");
        assert_eq!(kubelet.common_name.as_deref(), Some("team-abc123-vc"));
        assert_eq!(
            text(get("kubelet-client"), "ca.crt"),
            text(get("kubelet-client-ca"), "tls.crt")
        );
        let labels = get("kubelet-client").metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["tenancy.x-k8s.io/kubelet-client"], "true");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "vc-manager");

        let admin_yaml = text(get("admin-kubeconfig"), "admin-kubeconfig");
        assert_eq!(
            kubeconfig::server(&admin_yaml).as_deref(),
            Some("https://apiserver-svc.team-abc123-vc.svc:6443")
        );
        let admin = kubeconfig::client_certificate(&admin_yaml).expect("admin client");
        let admin_info = inspect(&admin.cert_pem).expect("admin cert");
        assert_eq!(admin_info.organizations, ["system:masters".to_owned()].into());
        assert!(is_signed_by(&admin.cert_pem, &root));
        let manager = kubeconfig::client_certificate(&text(
            get("controller-manager-kubeconfig"),
            "controller-manager-kubeconfig",
        ))
        .expect("controller-manager client");
        assert_eq!(
            inspect(&manager.cert_pem).expect("cert").common_name.as_deref(),
            Some("system:kube-controller-manager")
        );
        assert_eq!(
            inspect(&text(get("front-proxy-client"), "tls.crt"))
                .expect("cert")
                .common_name
                .as_deref(),
            Some("front-proxy-client")
        );
    }

    #[test]
    fn a_complete_stored_set_needs_no_writes() {
        let scope = Scope::Native(Box::new(network()));
        let first = plan_at(&BTreeMap::new(), NOW, &scope);
        let second = plan_at(&stored(&first), NOW + DAY, &scope);
        assert_eq!(changes(&second), BTreeMap::new());
        assert_eq!(second.expiries, first.expiries);
    }

    #[test]
    fn renewal_keeps_the_cas_and_the_service_account_key() {
        let scope = Scope::Native(Box::new(network()));
        let first = plan_at(&BTreeMap::new(), NOW, &scope);
        // 300 days in: every 365-day leaf is in its last fifth; the 10-year CAs are not.
        let later = plan_at(&stored(&first), NOW + 300 * DAY, &scope);
        let changed = changes(&later);
        for leaf in [
            "apiserver-ca",
            "etcd-server",
            "etcd-client",
            "front-proxy-client",
            "kubelet-client",
            "admin-kubeconfig",
            "controller-manager-kubeconfig",
        ] {
            assert_eq!(
                changed.get(leaf),
                Some(&Change::Renewed(
                    "less than a fifth of its lifetime remains".into()
                )),
                "{leaf}"
            );
        }
        for kept in [
            "root-ca",
            "etcd-ca",
            "front-proxy-ca",
            "kubelet-client-ca",
            "serviceaccount-rsa",
        ] {
            assert!(!changed.contains_key(kept), "{kept} must be kept");
            assert_eq!(
                later.secret(kept).map(|s| &s.data),
                first.secret(kept).map(|s| &s.data)
            );
        }
        let root = text(later.secret("root-ca").expect("root"), "tls.crt");
        assert!(is_signed_by(
            &text(later.secret("apiserver-ca").expect("apiserver"), "tls.crt"),
            &root
        ));
        assert_eq!(later.expiries["apiserver-ca"], NOW + 665 * DAY);
    }

    #[test]
    fn an_ageing_ca_is_renewed_with_its_key_and_dependents_get_the_new_bundle() {
        let scope = Scope::Native(Box::new(network()));
        let first = plan_at(&BTreeMap::new(), NOW, &scope);
        // Nine years in: CAs are in their last fifth.
        let now = NOW + 9 * 365 * DAY;
        let later = plan_at(&stored(&first), now, &scope);
        let changed = changes(&later);
        assert!(matches!(changed.get("root-ca"), Some(Change::Renewed(_))));
        let old_root = first.secret("root-ca").expect("root");
        let new_root = later.secret("root-ca").expect("root");
        assert_eq!(text(old_root, "tls.key"), text(new_root, "tls.key"));
        assert_ne!(text(old_root, "tls.crt"), text(new_root, "tls.crt"));
        // Leaves still signed by the same key chain to the renewed certificate.
        assert!(is_signed_by(
            &text(later.secret("apiserver-ca").expect("a"), "tls.crt"),
            &text(new_root, "tls.crt")
        ));
        assert_eq!(
            text(later.secret("apiserver-ca").expect("a"), "ca.crt"),
            text(new_root, "tls.crt")
        );
        assert!(!changed.contains_key("serviceaccount-rsa"));
    }

    #[test]
    fn a_broken_ca_is_replaced_and_its_leaves_reissued() {
        let scope = Scope::Native(Box::new(network()));
        let first = plan_at(&BTreeMap::new(), NOW, &scope);
        let mut secrets = stored(&first);
        let etcd_ca = secrets.get_mut("etcd-ca").expect("etcd-ca");
        etcd_ca
            .data
            .as_mut()
            .expect("data")
            .insert("tls.crt".into(), ByteString(b"garbage".to_vec()));
        let later = plan_at(&secrets, NOW, &scope);
        let changed = changes(&later);
        assert!(
            matches!(changed.get("etcd-ca"), Some(Change::Replaced(_))),
            "{changed:?}"
        );
        assert_eq!(
            changed.get("etcd-server"),
            Some(&Change::Renewed(
                "it is not signed by the current certificate authority".into()
            ))
        );
        assert!(changed.contains_key("etcd-client"));
        assert!(!changed.contains_key("root-ca"));
        assert!(!changed.contains_key("apiserver-ca"));
    }

    #[test]
    fn new_names_reissue_only_the_serving_certificate() {
        let first = plan_at(&BTreeMap::new(), NOW, &Scope::Native(Box::new(network())));
        let mut moved = network();
        moved.apiserver_ips = vec!["10.96.99.99".parse().expect("ip")];
        let later = plan_at(&stored(&first), NOW, &Scope::Native(Box::new(moved)));
        assert_eq!(
            changes(&later),
            [(
                "apiserver-ca".to_owned(),
                Change::Renewed("its names changed".into())
            )]
            .into()
        );
    }

    #[test]
    fn a_moved_apiserver_port_rewrites_the_kubeconfigs_only() {
        let first = plan_at(&BTreeMap::new(), NOW, &Scope::Native(Box::new(network())));
        let mut moved = network();
        moved.apiserver.port = 443;
        let later = plan_at(&stored(&first), NOW, &Scope::Native(Box::new(moved)));
        assert_eq!(
            changes(&later),
            [
                ("admin-kubeconfig".to_owned(), Change::Updated),
                ("controller-manager-kubeconfig".to_owned(), Change::Updated)
            ]
            .into()
        );
    }

    #[test]
    fn edited_metadata_or_extra_keys() {
        let first = plan_at(&BTreeMap::new(), NOW, &Scope::Native(Box::new(network())));
        let mut secrets = stored(&first);
        // Someone else's extra key or label is left alone.
        let root = secrets.get_mut("root-ca").expect("root");
        root.data
            .as_mut()
            .expect("data")
            .insert("extra".into(), ByteString(b"x".to_vec()));
        root.metadata
            .labels
            .as_mut()
            .expect("labels")
            .insert("team".into(), "a".into());
        // Our label removed: written again.
        let client = secrets.get_mut("kubelet-client").expect("kubelet-client");
        client
            .metadata
            .labels
            .as_mut()
            .expect("labels")
            .remove("tenancy.x-k8s.io/kubelet-client");
        // A Secret of another type is kept with its type.
        secrets.get_mut("etcd-ca").expect("etcd-ca").type_ = Some("Opaque".into());
        let later = plan_at(&secrets, NOW, &Scope::Native(Box::new(network())));
        assert_eq!(
            changes(&later),
            [("kubelet-client".to_owned(), Change::Updated)].into()
        );
        assert_eq!(
            later.secret("etcd-ca").and_then(|s| s.type_.as_deref()),
            Some("Opaque")
        );
        assert_eq!(
            later.secret("root-ca").and_then(|s| s.type_.as_deref()),
            Some("kubernetes.io/tls")
        );
    }

    #[test]
    fn a_damaged_service_account_public_key_is_repaired_without_a_new_key() {
        let first = plan_at(&BTreeMap::new(), NOW, &Scope::Native(Box::new(network())));
        let mut secrets = stored(&first);
        let sa = secrets.get_mut("serviceaccount-rsa").expect("sa");
        sa.data
            .as_mut()
            .expect("data")
            .insert("tls.crt".into(), ByteString(b"bad".to_vec()));
        let later = plan_at(&secrets, NOW, &Scope::Native(Box::new(network())));
        assert_eq!(
            changes(&later),
            [("serviceaccount-rsa".to_owned(), Change::Updated)].into()
        );
        assert_eq!(
            later.secret("serviceaccount-rsa").map(|s| &s.data),
            first.secret("serviceaccount-rsa").map(|s| &s.data)
        );
        // A missing private key cannot be repaired: a new pair.
        let mut secrets = stored(&first);
        secrets
            .get_mut("serviceaccount-rsa")
            .expect("sa")
            .data
            .as_mut()
            .expect("data")
            .remove("tls.key");
        let later = plan_at(&secrets, NOW, &Scope::Native(Box::new(network())));
        assert_eq!(
            changes(&later).get("serviceaccount-rsa"),
            Some(&Change::Replaced("tls.key is missing".into()))
        );
    }

    #[test]
    fn adopted_tenants_get_only_the_kubelet_client_pair() {
        let plan = plan_at(&BTreeMap::new(), NOW, &Scope::KubeletClientOnly);
        let names: Vec<&str> = plan.secrets.iter().map(PlannedSecret::name).collect();
        assert_eq!(names, ["kubelet-client-ca", "kubelet-client"]);
        let client = plan.secret("kubelet-client").expect("client");
        let cert = text(client, "tls.crt");
        assert!(is_signed_by(&cert, &text(client, "ca.crt")));
        assert_eq!(
            inspect(&cert).expect("cert").common_name.as_deref(),
            Some("team-abc123-vc")
        );
        assert!(changes(&plan_at(&stored(&plan), NOW, &Scope::KubeletClientOnly)).is_empty());
    }

    #[test]
    fn first_service_ips_of_ranges() {
        assert_eq!(
            first_service_ips("10.32.0.0/16, fd00:10:96::/112"),
            vec![
                "10.32.0.1".parse::<IpAddr>().expect("ip"),
                "fd00:10:96::1".parse().expect("ip")
            ]
        );
        assert_eq!(
            first_service_ips("10.32.7.9/16"),
            vec!["10.32.0.1".parse::<IpAddr>().expect("ip")]
        );
        assert!(first_service_ips("garbage").is_empty());
    }

    #[test]
    fn lifetimes_follow_pki_expire_days() {
        assert_eq!(Lifetimes::for_days(30).leaf, Duration::from_secs(30 * 86_400));
        assert_eq!(Lifetimes::for_days(30).ca, Duration::from_secs(3650 * 86_400));
        assert_eq!(Lifetimes::for_days(7300).ca, Duration::from_secs(7300 * 86_400));
        assert_eq!(Lifetimes::for_days(0).leaf, Duration::from_secs(86_400));
    }

    #[test]
    fn the_platform_caps_leaf_lifetimes_but_not_authorities() {
        let capped = Lifetimes::for_days(30).capped(Some(Duration::from_secs(3600)));
        assert_eq!(capped.leaf, Duration::from_secs(3600));
        assert_eq!(capped.ca, Duration::from_secs(3650 * 86_400));
        // A cap longer than pkiExpireDays changes nothing; one too short is raised to the shortest.
        assert_eq!(
            Lifetimes::for_days(1).capped(Some(Duration::from_secs(7 * 86_400))),
            Lifetimes::for_days(1)
        );
        assert_eq!(
            Lifetimes::for_days(1).capped(Some(Duration::from_secs(1))).leaf,
            Lifetimes::SHORTEST_LEAF
        );
        assert_eq!(Lifetimes::for_days(1).capped(None), Lifetimes::for_days(1));
    }
}
