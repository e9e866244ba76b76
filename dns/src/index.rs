//! What vc-dns answers from: every tenant's Services, endpoints and pod addresses as the super cluster
//! holds them, indexed by super namespace, and the record logic (pure: no I/O, no clock).
//!
//! Everything here comes from super-cluster objects the syncer wrote (or the super cluster's own
//! controllers derived from them), and whose tenant is read from the syncer's annotations, never from
//! names. Every lookup starts from the asking tenant's cluster key and checks at each step that the
//! object found belongs to that tenant: the super namespace's annotations name the tenant and the tenant
//! namespace asked for, the Service's annotations name the same, and a pod address counts for a tenant only
//! when its pod lives in a super namespace of that tenant. So a tenant can never be answered with
//! another tenant's or the super cluster's objects, whatever it asks and whatever order events came in.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
};

use hickory_proto::rr::{
    Name, RData, Record, RecordType,
    rdata::{A, AAAA, CNAME, PTR, SOA, SRV},
};

/// Seconds every answer may be cached, as CoreDNS's default: short, so that changes show quickly also
/// behind caching clients.
pub const TTL: u32 = 5;

/// A cluster key (`crds::naming::cluster_key`).
pub type Key = Arc<str>;

/// Who a super namespace serves, from its annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceOwner {
    /// The tenant's cluster key.
    pub cluster: Key,
    /// The tenant namespace.
    pub tenant_namespace: Box<str>,
}

/// The transport protocol of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// From a Kubernetes protocol name (TCP when unset).
    pub fn parse(value: Option<&str>) -> Option<Self> {
        match value.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The SRV label, without the underscore.
    fn label(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// A named port (unnamed ports have no SRV records).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    /// The port's name (lower case).
    pub name: Box<str>,
    /// Its protocol.
    pub protocol: Protocol,
    /// The number.
    pub port: u16,
}

/// What a Service's name stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    /// A Service with cluster IPs (the super cluster's).
    ClusterIp(Vec<IpAddr>),
    /// A headless Service: the addresses of its ready endpoints.
    Headless,
    /// An ExternalName Service: a CNAME.
    ExternalName(Name),
}

/// A super Service of a tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRecord {
    /// Whose, from its annotations.
    pub owner: NamespaceOwner,
    /// What its name stands for.
    pub kind: ServiceKind,
    /// Its named ports (the Service's port numbers).
    pub ports: Vec<Port>,
}

/// One endpoint of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
    /// `hostname` (StatefulSet pods, and pods with `hostname` and `subdomain`), lower case.
    pub hostname: Option<Box<str>>,
    /// Ready (or `ready` unset, which means ready).
    pub ready: bool,
}

/// An EndpointSlice of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// The Service it belongs to (label `kubernetes.io/service-name`).
    pub service: Box<str>,
    /// Its endpoints.
    pub endpoints: Vec<Endpoint>,
    /// Its named ports (the endpoints' port numbers).
    pub ports: Vec<Port>,
}

/// A live tenant pod's addresses (pods on the host network and finished pods are not recorded: their
/// addresses are not theirs alone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAddresses {
    /// Whose pod, from its label.
    pub cluster: Key,
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
}

/// Everything of one super namespace.
#[derive(Debug, Default)]
struct Namespace {
    owner: Option<NamespaceOwner>,
    services: HashMap<Arc<str>, ServiceRecord>,
    /// Slices by Service name, then slice name.
    slices: HashMap<Arc<str>, HashMap<Arc<str>, Slice>>,
    pods: HashMap<Arc<str>, PodAddresses>,
}

impl Namespace {
    fn is_empty(&self) -> bool {
        self.owner.is_none() && self.services.is_empty() && self.slices.is_empty() && self.pods.is_empty()
    }
}

/// Where an address is used, for PTR records and source identification.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Use {
    /// A Service's cluster IP.
    ClusterIp { namespace: Arc<str>, service: Arc<str> },
    /// An endpoint of a Service.
    Endpoint {
        namespace: Arc<str>,
        service: Arc<str>,
        slice: Arc<str>,
    },
    /// A pod's address.
    Pod { namespace: Arc<str>, pod: Arc<str> },
}

/// The index of every tenant's names.
#[derive(Debug, Default)]
pub struct Index {
    /// Cluster domain (lower case, no trailing dot) of every tenant, from VirtualClusters.
    domains: HashMap<Key, Name>,
    namespaces: HashMap<Arc<str>, Namespace>,
    addresses: HashMap<IpAddr, Vec<Use>>,
    records: usize,
}

/// What to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The name exists: these records (`answers` may be empty: no data of that type).
    Found {
        /// Answer section.
        answers: Vec<Record>,
        /// Additional section (addresses of SRV targets).
        additionals: Vec<Record>,
        /// The tenant's zone, for the SOA of an empty answer.
        zone: Name,
    },
    /// The name does not exist in the tenant's zone (or is another tenant's or the super cluster's).
    NxDomain {
        /// The zone to name in the SOA (the tenant's, or the blocked one).
        zone: Name,
    },
    /// An ExternalName Service: the CNAME, and its target to resolve upstream (a name outside the
    /// tenant's zone).
    Cname {
        /// The CNAME record.
        answers: Vec<Record>,
        /// Its target.
        target: Name,
    },
    /// Not a name of the cluster: ask the upstream resolvers.
    Forward,
}

fn lower_labels(name: &Name) -> Option<Vec<String>> {
    name.iter()
        .map(|label| std::str::from_utf8(label).ok().map(str::to_ascii_lowercase))
        .collect()
}

fn record(name: Name, rdata: RData) -> Record {
    Record::from_rdata(name, TTL, rdata)
}

fn address_record(name: Name, ip: IpAddr) -> Record {
    match ip {
        IpAddr::V4(v4) => record(name, RData::A(A(v4))),
        IpAddr::V6(v6) => record(name, RData::AAAA(AAAA(v6))),
    }
}

fn wants(qtype: RecordType, ip: &IpAddr) -> bool {
    match qtype {
        RecordType::A => ip.is_ipv4(),
        RecordType::AAAA => ip.is_ipv6(),
        RecordType::ANY => true,
        _ => false,
    }
}

/// `10-244-0-5` for 10.244.0.5, `fd00--5` for fd00::5: the name CoreDNS gives an endpoint without a
/// hostname.
pub fn dashed(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// The address a dashed name stands for (the inverse of [`dashed`]).
pub fn undashed(label: &str) -> Option<IpAddr> {
    if let Ok(v4) = label.replace('-', ".").parse::<std::net::Ipv4Addr>() {
        return Some(IpAddr::V4(v4));
    }
    label
        .replace('-', ":")
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// The SOA record of a tenant zone (for negative answers: its minimum is the negative TTL).
pub fn soa(zone: &Name) -> Record {
    let mname = Name::from_ascii("ns.dns")
        .and_then(|n| n.append_domain(zone))
        .unwrap_or_else(|_| zone.clone());
    let rname = Name::from_ascii("hostmaster")
        .and_then(|n| n.append_domain(zone))
        .unwrap_or_else(|_| zone.clone());
    record(
        zone.clone(),
        RData::SOA(SOA::new(mname, rname, 1, 7200, 1800, 86400, TTL)),
    )
}

/// The address a reverse name (`d.c.b.a.in-addr.arpa.`, 32 nibbles `.ip6.arpa.`) stands for.
pub fn reverse_address(name: &Name) -> Option<IpAddr> {
    let labels = lower_labels(name)?;
    match labels.as_slice() {
        [d, c, b, a, in_addr, arpa] if in_addr == "in-addr" && arpa == "arpa" => {
            format!("{a}.{b}.{c}.{d}").parse().ok()
        }
        [nibbles @ .., ip6, arpa] if ip6 == "ip6" && arpa == "arpa" && nibbles.len() == 32 => {
            let mut hex: String = nibbles.iter().rev().map(String::as_str).collect();
            if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            let mut text = String::with_capacity(39);
            for (i, chunk) in hex.split_off(0).as_bytes().chunks(4).enumerate() {
                if i > 0 {
                    text.push(':');
                }
                text.push_str(std::str::from_utf8(chunk).ok()?);
            }
            text.parse().ok()
        }
        _ => None,
    }
}

/// Whether `name` is a reverse name at all (`in-addr.arpa.` or `ip6.arpa.`, any depth).
pub fn is_reverse(name: &Name) -> bool {
    lower_labels(name).is_some_and(|labels| {
        labels.last().is_some_and(|l| l == "arpa")
            && labels.len() >= 2
            && matches!(labels[labels.len() - 2].as_str(), "in-addr" | "ip6")
    })
}

/// Addresses whose reverse names are never forwarded: private and shared ranges, where pods, Services
/// and nodes live. An upstream could only know them from the super cluster's DNS.
pub fn is_private(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_private() || v4.is_loopback() || v4.is_link_local() || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        }
    }
}

impl Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many objects (namespaces, Services, slices, pods) are recorded.
    pub fn records(&self) -> usize {
        self.records
    }

    /// How many tenants have a cluster domain recorded.
    pub fn tenants(&self) -> usize {
        self.domains.len()
    }

    // ---- updates ----

    /// Records a tenant's cluster domain (from its VirtualCluster).
    pub fn set_domain(&mut self, cluster: Key, domain: &str) {
        let domain = domain.trim().trim_end_matches('.').to_ascii_lowercase();
        match Name::from_ascii(format!("{domain}.")) {
            Ok(name) if !domain.is_empty() => {
                self.domains.insert(cluster, name);
            }
            _ => {
                self.domains.remove(&cluster);
            }
        }
    }

    /// Forgets a tenant's cluster domain (its VirtualCluster is gone): its names no longer resolve.
    pub fn remove_domain(&mut self, cluster: &str) {
        self.domains.remove(cluster);
    }

    /// Replaces every tenant's domain.
    pub fn replace_domains(&mut self, domains: impl IntoIterator<Item = (Key, String)>) {
        self.domains.clear();
        for (cluster, domain) in domains {
            self.set_domain(cluster, &domain);
        }
    }

    fn namespace_mut(&mut self, namespace: &str) -> &mut Namespace {
        self.namespaces.entry(namespace.into()).or_default()
    }

    fn prune(&mut self, namespace: &str) {
        if self.namespaces.get(namespace).is_some_and(Namespace::is_empty) {
            self.namespaces.remove(namespace);
        }
    }

    /// The namespace's name as the index holds it (one allocation shared by every entry that names it).
    fn shared_namespace(&mut self, namespace: &str) -> Arc<str> {
        if let Some((key, _)) = self.namespaces.get_key_value(namespace) {
            return key.clone();
        }
        let key: Arc<str> = Arc::from(namespace);
        self.namespaces.insert(key.clone(), Namespace::default());
        key
    }

    fn add_use(&mut self, ip: IpAddr, used: Use) {
        // Almost every address has one use: a vector of one, not a set.
        let uses = self.addresses.entry(ip).or_default();
        if !uses.contains(&used) {
            uses.push(used);
        }
    }

    fn remove_use(&mut self, ip: &IpAddr, used: &Use) {
        if let Some(uses) = self.addresses.get_mut(ip) {
            uses.retain(|u| u != used);
            if uses.is_empty() {
                self.addresses.remove(ip);
            }
        }
    }

    /// Records (`Some`) or forgets (`None`) who a super namespace serves.
    pub fn set_namespace(&mut self, namespace: &str, owner: Option<NamespaceOwner>) {
        let entry = self.namespace_mut(namespace);
        let before = entry.owner.is_some();
        entry.owner = owner;
        let after = entry.owner.is_some();
        self.records = self.records + usize::from(after) - usize::from(before);
        self.prune(namespace);
    }

    /// Records (`Some`) or forgets (`None`) a super Service.
    pub fn set_service(&mut self, namespace: &str, name: &str, service: Option<ServiceRecord>) {
        let shared = self.shared_namespace(namespace);
        let old = self.namespace_mut(namespace).services.remove_entry(name);
        let key: Arc<str> = match &old {
            Some((key, _)) => key.clone(),
            None => Arc::from(name),
        };
        let used = Use::ClusterIp {
            namespace: shared,
            service: key.clone(),
        };
        if let Some((_, old)) = &old {
            self.records -= 1;
            if let ServiceKind::ClusterIp(ips) = &old.kind {
                for ip in ips {
                    self.remove_use(ip, &used);
                }
            }
        }
        if let Some(service) = service {
            if let ServiceKind::ClusterIp(ips) = &service.kind {
                for ip in ips {
                    self.add_use(*ip, used.clone());
                }
            }
            self.records += 1;
            self.namespace_mut(namespace).services.insert(key, service);
        }
        self.prune(namespace);
    }

    /// Records (`Some`) or forgets (`None`) an EndpointSlice.
    pub fn set_slice(&mut self, namespace: &str, name: &str, slice: Option<Slice>) {
        // A slice never changes its Service, but look it up anywhere to be safe.
        let mut old: Option<Slice> = None;
        {
            let entry = self.namespace_mut(namespace);
            let mut emptied = None;
            for (service, slices) in entry.slices.iter_mut() {
                if let Some(found) = slices.remove(name) {
                    old = Some(found);
                    if slices.is_empty() {
                        emptied = Some(service.clone());
                    }
                    break;
                }
            }
            if let Some(service) = emptied {
                entry.slices.remove(&service);
            }
        }
        let shared = self.shared_namespace(namespace);
        let slice_name: Arc<str> = Arc::from(name);
        if let Some(old) = old {
            self.records -= 1;
            let used = Use::Endpoint {
                namespace: shared.clone(),
                service: Arc::from(&*old.service),
                slice: slice_name.clone(),
            };
            for endpoint in &old.endpoints {
                for ip in &endpoint.addresses {
                    self.remove_use(ip, &used);
                }
            }
        }
        if let Some(slice) = slice {
            let service: Arc<str> = Arc::from(&*slice.service);
            let used = Use::Endpoint {
                namespace: shared,
                service: service.clone(),
                slice: slice_name.clone(),
            };
            for endpoint in &slice.endpoints {
                for ip in &endpoint.addresses {
                    self.add_use(*ip, used.clone());
                }
            }
            self.records += 1;
            self.namespace_mut(namespace)
                .slices
                .entry(service)
                .or_default()
                .insert(slice_name, slice);
        }
        self.prune(namespace);
    }

    /// Records (`Some`) or forgets (`None`) a tenant pod's addresses.
    pub fn set_pod(&mut self, namespace: &str, name: &str, pod: Option<PodAddresses>) {
        let key: Arc<str> = Arc::from(name);
        let used = Use::Pod {
            namespace: self.shared_namespace(namespace),
            pod: key.clone(),
        };
        if let Some(old) = self.namespace_mut(namespace).pods.remove(name) {
            self.records -= 1;
            for ip in &old.addresses {
                self.remove_use(ip, &used);
            }
        }
        if let Some(pod) = pod {
            for ip in &pod.addresses {
                self.add_use(*ip, used.clone());
            }
            self.records += 1;
            self.namespace_mut(namespace).pods.insert(key, pod);
        }
        self.prune(namespace);
    }

    /// Forgets every object of a kind, before a watch relists.
    pub fn clear(&mut self, kind: ClearKind) {
        let namespaces: Vec<Arc<str>> = self.namespaces.keys().cloned().collect();
        for namespace in namespaces {
            let Some(entry) = self.namespaces.get(&namespace) else {
                continue;
            };
            match kind {
                ClearKind::Namespaces => self.set_namespace(&namespace, None),
                ClearKind::Services => {
                    let names: Vec<Arc<str>> = entry.services.keys().cloned().collect();
                    for name in names {
                        self.set_service(&namespace, &name, None);
                    }
                }
                ClearKind::Slices => {
                    let names: Vec<Arc<str>> =
                        entry.slices.values().flat_map(|s| s.keys().cloned()).collect();
                    for name in names {
                        self.set_slice(&namespace, &name, None);
                    }
                }
                ClearKind::Pods => {
                    let names: Vec<Arc<str>> = entry.pods.keys().cloned().collect();
                    for name in names {
                        self.set_pod(&namespace, &name, None);
                    }
                }
            }
        }
    }

    // ---- lookups ----

    /// The owner of a super namespace, when it is `cluster`'s.
    fn owned<'a>(&'a self, namespace: &str, cluster: &str) -> Option<&'a Namespace> {
        self.namespaces
            .get(namespace)
            .filter(|n| n.owner.as_ref().is_some_and(|o| &*o.cluster == cluster))
    }

    /// The tenant a query comes from: the one whose live pod has the source address. Unknown addresses,
    /// and addresses that pods of two tenants claim at once (a reused address while the old pod goes),
    /// have none.
    pub fn tenant_of(&self, source: IpAddr) -> Option<Key> {
        let uses = self.addresses.get(&source)?;
        let holders = uses.iter().filter_map(|used| {
            let Use::Pod { namespace, pod } = used else {
                return None;
            };
            let entry = self.namespaces.get(namespace)?;
            let found = entry.pods.get(pod)?;
            // The pod counts only in a super namespace of its own tenant.
            entry
                .owner
                .as_ref()
                .is_some_and(|o| o.cluster == found.cluster)
                .then_some(&found.cluster)
        });
        crds::addresses::sole_holder(holders).cloned()
    }

    /// The cluster domain of a tenant.
    pub fn domain(&self, cluster: &str) -> Option<&Name> {
        self.domains.get(cluster)
    }

    /// The super namespace serving tenant namespace `tenant_namespace` of `cluster`, with its name, when its
    /// annotations say so.
    fn tenant_namespace(&self, cluster: &str, tenant_namespace: &str) -> Option<(String, &Namespace)> {
        let super_namespace = crds::naming::super_namespace(cluster, tenant_namespace);
        let entry = self.owned(&super_namespace, cluster)?;
        if entry
            .owner
            .as_ref()
            .is_none_or(|o| &*o.tenant_namespace != tenant_namespace)
        {
            return None;
        }
        Some((super_namespace, entry))
    }

    /// Whether `ip` is an address of a live pod of `cluster` in tenant namespace `tenant_namespace`.
    fn has_pod_address(&self, cluster: &str, tenant_namespace: &str, ip: IpAddr) -> bool {
        let Some((super_namespace, entry)) = self.tenant_namespace(cluster, tenant_namespace) else {
            return false;
        };
        self.addresses
            .get(&ip)
            .into_iter()
            .flatten()
            .any(|used| match used {
                Use::Pod { namespace, pod } => {
                    **namespace == *super_namespace
                        && entry.pods.get(pod).is_some_and(|p| &*p.cluster == cluster)
                }
                _ => false,
            })
    }

    /// The Service `name` in tenant namespace `tenant_namespace` of `cluster`, with its super namespace.
    fn service(
        &self,
        cluster: &str,
        tenant_namespace: &str,
        name: &str,
    ) -> Option<(&Namespace, &ServiceRecord)> {
        let (_, entry) = self.tenant_namespace(cluster, tenant_namespace)?;
        let service = entry.services.get(name)?;
        (&*service.owner.cluster == cluster && &*service.owner.tenant_namespace == tenant_namespace)
            .then_some((entry, service))
    }

    /// Ready endpoints of a Service: (hostname or dashed address, address).
    fn ready_endpoints<'a>(
        entry: &'a Namespace,
        service: &str,
    ) -> impl Iterator<Item = (&'a Endpoint, IpAddr)> + 'a {
        entry
            .slices
            .get(service)
            .into_iter()
            .flat_map(|slices| slices.values())
            .flat_map(|slice| slice.endpoints.iter())
            .filter(|e| e.ready)
            .flat_map(|e| e.addresses.iter().map(move |ip| (e, *ip)))
    }

    /// Ports of the endpoints of a Service, by name and protocol.
    fn endpoint_port(entry: &Namespace, service: &str, name: &str, protocol: Protocol) -> Option<u16> {
        entry
            .slices
            .get(service)?
            .values()
            .flat_map(|slice| slice.ports.iter())
            .find(|p| &*p.name == name && p.protocol == protocol)
            .map(|p| p.port)
    }

    /// What to answer tenant `cluster` asking for `name` of type `qtype`. `blocked` are zones that never
    /// resolve and are never forwarded (the super cluster's domain).
    pub fn resolve(&self, cluster: &str, name: &Name, qtype: RecordType, blocked: &[Name]) -> Resolution {
        let Some(zone) = self.domains.get(cluster) else {
            // A tenant without a VirtualCluster has no names; its pods are going.
            return Resolution::NxDomain { zone: Name::root() };
        };
        if zone.zone_of(name) {
            return self.in_zone(cluster, zone, name, qtype, true);
        }
        if is_reverse(name) {
            return self.reverse(cluster, zone, name, qtype);
        }
        if let Some(blocked) = blocked.iter().find(|b| b.zone_of(name)) {
            return Resolution::NxDomain {
                zone: blocked.clone(),
            };
        }
        Resolution::Forward
    }

    /// `chase`: follow an ExternalName Service's CNAME inside the zone (one step: never a loop).
    fn in_zone(&self, cluster: &str, zone: &Name, name: &Name, qtype: RecordType, chase: bool) -> Resolution {
        let nx = || Resolution::NxDomain { zone: zone.clone() };
        let found = |answers: Vec<Record>, additionals: Vec<Record>| Resolution::Found {
            answers,
            additionals,
            zone: zone.clone(),
        };
        let Some(labels) = lower_labels(name) else {
            return nx();
        };
        let depth = labels.len() - usize::from(zone.num_labels());
        let relative = &labels[..depth];
        match relative {
            // The zone itself, `svc.<zone>` and `pod.<zone>`: they exist, with no data but the zone's SOA.
            [] => match qtype {
                RecordType::SOA => found(vec![soa(zone)], Vec::new()),
                _ => found(Vec::new(), Vec::new()),
            },
            [subdomain] if matches!(subdomain.as_str(), "svc" | "pod") => found(Vec::new(), Vec::new()),
            // A pod by its dashed address, as CoreDNS's `pods verified`: only the asking tenant's own live
            // pods in that namespace have one.
            [host, namespace, pod] if pod == "pod" => match undashed(host) {
                Some(ip) if self.has_pod_address(cluster, namespace, ip) => found(
                    wants(qtype, &ip)
                        .then(|| address_record(name.clone(), ip))
                        .into_iter()
                        .collect(),
                    Vec::new(),
                ),
                _ => nx(),
            },
            [service, namespace, svc] if svc == "svc" => {
                let Some((entry, record)) = self.service(cluster, namespace, service) else {
                    return nx();
                };
                self.service_records(entry, service, record, name, qtype, zone, chase)
            }
            [host, service, namespace, svc] if svc == "svc" => {
                let Some((entry, record)) = self.service(cluster, namespace, service) else {
                    return nx();
                };
                if record.kind != ServiceKind::Headless {
                    return nx();
                }
                let addresses: Vec<IpAddr> = Self::ready_endpoints(entry, service)
                    .filter(|(endpoint, ip)| match &endpoint.hostname {
                        Some(hostname) => &**hostname == host,
                        None => dashed(ip) == *host,
                    })
                    .map(|(_, ip)| ip)
                    .collect();
                if addresses.is_empty() {
                    return nx();
                }
                found(
                    addresses
                        .iter()
                        .filter(|ip| wants(qtype, ip))
                        .map(|ip| address_record(name.clone(), *ip))
                        .collect(),
                    Vec::new(),
                )
            }
            [port, protocol, service, namespace, svc]
                if svc == "svc" && port.starts_with('_') && protocol.starts_with('_') =>
            {
                let Some((entry, record)) = self.service(cluster, namespace, service) else {
                    return nx();
                };
                let Some(protocol) = Protocol::parse(Some(&protocol[1..].to_ascii_uppercase())) else {
                    return nx();
                };
                let port_name = &port[1..];
                if !record
                    .ports
                    .iter()
                    .any(|p| &*p.name == port_name && p.protocol == protocol)
                {
                    return nx();
                }
                if !matches!(qtype, RecordType::SRV | RecordType::ANY) {
                    return found(Vec::new(), Vec::new());
                }
                let (answers, additionals) = self.srv_records(
                    entry,
                    service,
                    namespace,
                    record,
                    Some((port_name, protocol)),
                    name,
                    zone,
                );
                found(answers, additionals)
            }
            _ => nx(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn srv_records(
        &self,
        entry: &Namespace,
        service: &str,
        namespace: &str,
        record: &ServiceRecord,
        only: Option<(&str, Protocol)>,
        name: &Name,
        zone: &Name,
    ) -> (Vec<Record>, Vec<Record>) {
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        let Ok(service_name) =
            Name::from_ascii(format!("{service}.{namespace}.svc")).and_then(|n| n.append_domain(zone))
        else {
            return (answers, additionals);
        };
        let ports = record
            .ports
            .iter()
            .filter(|p| only.is_none_or(|(n, proto)| &*p.name == n && p.protocol == proto));
        for port in ports {
            let owner = match only {
                Some(_) => name.clone(),
                None => match Name::from_ascii(format!("_{}._{}", port.name, port.protocol.label()))
                    .and_then(|n| n.append_name(&service_name))
                {
                    Ok(owner) => owner,
                    Err(_) => continue,
                },
            };
            match &record.kind {
                ServiceKind::ClusterIp(ips) => {
                    answers.push(record_srv(owner, port.port, service_name.clone()));
                    additionals.extend(ips.iter().map(|ip| address_record(service_name.clone(), *ip)));
                }
                ServiceKind::Headless => {
                    let target_port =
                        Self::endpoint_port(entry, service, &port.name, port.protocol).unwrap_or(port.port);
                    let mut seen = HashSet::new();
                    for (endpoint, ip) in Self::ready_endpoints(entry, service) {
                        let host = endpoint
                            .hostname
                            .as_deref()
                            .map_or_else(|| dashed(&ip), str::to_owned);
                        let Ok(target) = Name::from_ascii(&host).and_then(|n| n.append_name(&service_name))
                        else {
                            continue;
                        };
                        if seen.insert(target.clone()) {
                            answers.push(record_srv(owner.clone(), target_port, target.clone()));
                        }
                        additionals.push(address_record(target, ip));
                    }
                }
                ServiceKind::ExternalName(_) => {}
            }
        }
        (answers, additionals)
    }

    #[allow(clippy::too_many_arguments)]
    fn service_records(
        &self,
        entry: &Namespace,
        service: &str,
        record: &ServiceRecord,
        name: &Name,
        qtype: RecordType,
        zone: &Name,
        chase: bool,
    ) -> Resolution {
        let found = |answers: Vec<Record>, additionals: Vec<Record>| Resolution::Found {
            answers,
            additionals,
            zone: zone.clone(),
        };
        let namespace = record.owner.tenant_namespace.clone();
        match &record.kind {
            ServiceKind::ExternalName(target) => {
                let cname = record_cname(name.clone(), target.clone());
                if qtype == RecordType::CNAME {
                    return found(vec![cname], Vec::new());
                }
                if zone.zone_of(target) {
                    // Inside the tenant's own zone: one more step here, never a loop.
                    let mut answers = vec![cname];
                    if chase
                        && let Resolution::Found { answers: more, .. } =
                            self.in_zone(&record.owner.cluster, zone, target, qtype, false)
                        && !more.iter().any(|r| r.record_type() == RecordType::CNAME)
                    {
                        answers.extend(more);
                    }
                    return found(answers, Vec::new());
                }
                Resolution::Cname {
                    answers: vec![cname],
                    target: target.clone(),
                }
            }
            ServiceKind::ClusterIp(ips) => match qtype {
                RecordType::SRV => {
                    let (answers, additionals) =
                        self.srv_records(entry, service, &namespace, record, None, name, zone);
                    found(answers, additionals)
                }
                _ => found(
                    ips.iter()
                        .filter(|ip| wants(qtype, ip))
                        .map(|ip| address_record(name.clone(), *ip))
                        .collect(),
                    Vec::new(),
                ),
            },
            ServiceKind::Headless => match qtype {
                RecordType::SRV => {
                    let (answers, additionals) =
                        self.srv_records(entry, service, &namespace, record, None, name, zone);
                    found(answers, additionals)
                }
                _ => {
                    let mut seen = HashSet::new();
                    found(
                        Self::ready_endpoints(entry, service)
                            .filter(|(_, ip)| wants(qtype, ip) && seen.insert(*ip))
                            .map(|(_, ip)| address_record(name.clone(), ip))
                            .collect(),
                        Vec::new(),
                    )
                }
            },
        }
    }

    fn reverse(&self, cluster: &str, zone: &Name, name: &Name, qtype: RecordType) -> Resolution {
        let Some(ip) = reverse_address(name) else {
            // A partial reverse name (a zone cut): never a private range's data from upstream.
            return Resolution::NxDomain { zone: Name::root() };
        };
        let mut answers = Vec::new();
        let mut seen = HashSet::new();
        for used in self.addresses.get(&ip).into_iter().flatten() {
            let target = match used {
                Use::ClusterIp { namespace, service } => self
                    .owned_service(namespace, service, cluster)
                    .and_then(|record| {
                        Name::from_ascii(format!("{service}.{}.svc", record.owner.tenant_namespace)).ok()
                    }),
                Use::Endpoint {
                    namespace,
                    service,
                    slice,
                } => {
                    let Some(record) = self.owned_service(namespace, service, cluster) else {
                        continue;
                    };
                    let Some(entry) = self.namespaces.get(namespace) else {
                        continue;
                    };
                    let endpoint = entry
                        .slices
                        .get(service)
                        .and_then(|slices| slices.get(slice))
                        .and_then(|s| s.endpoints.iter().find(|e| e.ready && e.addresses.contains(&ip)));
                    endpoint.and_then(|endpoint| {
                        let host = endpoint
                            .hostname
                            .as_deref()
                            .map_or_else(|| dashed(&ip), str::to_owned);
                        Name::from_ascii(format!("{host}.{service}.{}.svc", record.owner.tenant_namespace))
                            .ok()
                    })
                }
                Use::Pod { .. } => None,
            };
            let Some(target) = target.and_then(|t| t.append_domain(zone).ok()) else {
                continue;
            };
            if seen.insert(target.clone()) {
                answers.push(record(name.clone(), RData::PTR(PTR(target))));
            }
        }
        if answers.is_empty() {
            if is_private(&ip) {
                return Resolution::NxDomain { zone: Name::root() };
            }
            return Resolution::Forward;
        }
        if !matches!(qtype, RecordType::PTR | RecordType::ANY) {
            answers.clear();
        }
        Resolution::Found {
            answers,
            additionals: Vec::new(),
            zone: zone.clone(),
        }
    }

    fn owned_service(&self, namespace: &str, service: &str, cluster: &str) -> Option<&ServiceRecord> {
        let entry = self.owned(namespace, cluster)?;
        let owner = entry.owner.as_ref()?;
        entry.services.get(service).filter(|s| s.owner == *owner)
    }
}

fn record_srv(owner: Name, port: u16, target: Name) -> Record {
    record(owner, RData::SRV(SRV::new(0, 100, port, target)))
}

fn record_cname(owner: Name, target: Name) -> Record {
    record(owner, RData::CNAME(CNAME(target)))
}

/// The kinds a watch clears when it relists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClearKind {
    /// Namespace owners.
    Namespaces,
    /// Services.
    Services,
    /// EndpointSlices.
    Slices,
    /// Pods.
    Pods,
}

#[cfg(test)]
mod tests {
    use super::*;

    const A_KEY: &str = "default-aaaaaa-a";
    const B_KEY: &str = "default-bbbbbb-b";

    fn name(text: &str) -> Name {
        Name::from_ascii(text).expect("name")
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    fn owner(cluster: &str, namespace: &str) -> NamespaceOwner {
        NamespaceOwner {
            cluster: cluster.into(),
            tenant_namespace: namespace.into(),
        }
    }

    fn port(name: &str, number: u16) -> Port {
        Port {
            name: name.into(),
            protocol: Protocol::Tcp,
            port: number,
        }
    }

    /// Tenants a and b, each with namespace `shop` holding Service `web` (different super IPs), a pod,
    /// and for a: headless `db` with two ready endpoints (one a StatefulSet pod) and one not ready.
    fn index() -> Index {
        let mut index = Index::new();
        for (key, web_ip, pod_ip) in [
            (A_KEY, "10.96.0.10", "10.244.0.5"),
            (B_KEY, "10.96.0.20", "10.244.0.6"),
        ] {
            index.set_domain(key.into(), "cluster.local");
            let namespace = crds::naming::super_namespace(key, "shop");
            index.set_namespace(&namespace, Some(owner(key, "shop")));
            index.set_service(
                &namespace,
                "web",
                Some(ServiceRecord {
                    owner: owner(key, "shop"),
                    kind: ServiceKind::ClusterIp(vec![ip(web_ip)]),
                    ports: vec![port("http", 80)],
                }),
            );
            index.set_pod(
                &namespace,
                "client",
                Some(PodAddresses {
                    cluster: key.into(),
                    addresses: vec![ip(pod_ip)],
                }),
            );
        }
        let namespace = crds::naming::super_namespace(A_KEY, "shop");
        index.set_service(
            &namespace,
            "db",
            Some(ServiceRecord {
                owner: owner(A_KEY, "shop"),
                kind: ServiceKind::Headless,
                ports: vec![port("pg", 5432)],
            }),
        );
        index.set_slice(
            &namespace,
            "db-x1",
            Some(Slice {
                service: "db".into(),
                endpoints: vec![
                    Endpoint {
                        addresses: vec![ip("10.244.1.7")],
                        hostname: Some("db-0".into()),
                        ready: true,
                    },
                    Endpoint {
                        addresses: vec![ip("10.244.1.8")],
                        hostname: None,
                        ready: true,
                    },
                    Endpoint {
                        addresses: vec![ip("10.244.1.9")],
                        hostname: Some("db-2".into()),
                        ready: false,
                    },
                ],
                ports: vec![port("pg", 15432)],
            }),
        );
        index
    }

    fn addresses(resolution: &Resolution) -> Vec<String> {
        let Resolution::Found { answers, .. } = resolution else {
            panic!("not found: {resolution:?}")
        };
        let mut out: Vec<String> = answers.iter().map(|r| r.data.to_string()).collect();
        out.sort();
        out
    }

    fn resolve(index: &Index, key: &str, query: &str, qtype: RecordType) -> Resolution {
        index.resolve(key, &name(query), qtype, &[name("cluster.local.")])
    }

    #[test]
    fn two_tenants_with_the_same_service_name_get_their_own_address() {
        let index = index();
        let a = resolve(&index, A_KEY, "web.shop.svc.cluster.local.", RecordType::A);
        let b = resolve(&index, B_KEY, "web.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(addresses(&a), ["10.96.0.10"]);
        assert_eq!(addresses(&b), ["10.96.0.20"]);
        // No AAAA: the name exists without data of that type.
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "web.shop.svc.cluster.local.",
                RecordType::AAAA
            )),
            Vec::<String>::new()
        );
        // Case does not matter.
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "WEB.Shop.SVC.cluster.local.",
                RecordType::A
            )),
            ["10.96.0.10"]
        );
    }

    #[test]
    fn other_tenants_and_the_super_clusters_names_do_not_exist() {
        let index = index();
        // b has no `db`: a's does not leak.
        assert!(matches!(
            resolve(&index, B_KEY, "db.shop.svc.cluster.local.", RecordType::A),
            Resolution::NxDomain { .. }
        ));
        // The super namespace's name as a tenant namespace, the super apiserver's Service, kube-dns.
        let super_namespace = crds::naming::super_namespace(B_KEY, "shop");
        for query in [
            format!("web.{super_namespace}.svc.cluster.local."),
            "kubernetes.default.svc.cluster.local.".to_owned(),
            "kube-dns.kube-system.svc.cluster.local.".to_owned(),
            "web.shop.svc.cluster.local.shop.svc.cluster.local.".to_owned(),
            "shop.svc.cluster.local.".to_owned(),
        ] {
            assert!(
                matches!(
                    resolve(&index, A_KEY, &query, RecordType::A),
                    Resolution::NxDomain { .. }
                ),
                "{query}"
            );
        }
        // An unknown tenant has no names at all.
        assert!(matches!(
            resolve(&index, "nobody", "web.shop.svc.cluster.local.", RecordType::A),
            Resolution::NxDomain { .. }
        ));
    }

    #[test]
    fn a_service_whose_annotations_name_another_tenant_is_not_answered() {
        let mut index = index();
        // A Service in a's super namespace that claims to be b's (or another namespace's) is nobody's.
        let namespace = crds::naming::super_namespace(A_KEY, "shop");
        index.set_service(
            &namespace,
            "stray",
            Some(ServiceRecord {
                owner: owner(B_KEY, "shop"),
                kind: ServiceKind::ClusterIp(vec![ip("10.96.0.99")]),
                ports: Vec::new(),
            }),
        );
        for key in [A_KEY, B_KEY] {
            assert!(matches!(
                resolve(&index, key, "stray.shop.svc.cluster.local.", RecordType::A),
                Resolution::NxDomain { .. }
            ));
        }
        // A namespace whose annotations name another tenant namespace serves none.
        index.set_namespace(&namespace, Some(owner(A_KEY, "other")));
        assert!(matches!(
            resolve(&index, A_KEY, "web.shop.svc.cluster.local.", RecordType::A),
            Resolution::NxDomain { .. }
        ));
    }

    #[test]
    fn headless_services_answer_ready_endpoints_and_statefulset_hostnames() {
        let index = index();
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "db.shop.svc.cluster.local.",
                RecordType::A
            )),
            ["10.244.1.7", "10.244.1.8"]
        );
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "db-0.db.shop.svc.cluster.local.",
                RecordType::A
            )),
            ["10.244.1.7"]
        );
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "10-244-1-8.db.shop.svc.cluster.local.",
                RecordType::A
            )),
            ["10.244.1.8"]
        );
        // Not ready: no record.
        assert!(matches!(
            resolve(&index, A_KEY, "db-2.db.shop.svc.cluster.local.", RecordType::A),
            Resolution::NxDomain { .. }
        ));
        // Endpoint names exist only under headless Services.
        assert!(matches!(
            resolve(&index, A_KEY, "x.web.shop.svc.cluster.local.", RecordType::A),
            Resolution::NxDomain { .. }
        ));
    }

    #[test]
    fn srv_records_name_the_ports_and_their_targets() {
        let index = index();
        let Resolution::Found {
            answers, additionals, ..
        } = resolve(
            &index,
            A_KEY,
            "_http._tcp.web.shop.svc.cluster.local.",
            RecordType::SRV,
        )
        else {
            panic!("no SRV")
        };
        assert_eq!(answers.len(), 1);
        assert_eq!(
            answers[0].data.to_string(),
            "0 100 80 web.shop.svc.cluster.local."
        );
        assert_eq!(additionals[0].data.to_string(), "10.96.0.10");
        // Headless: one per ready endpoint, at the endpoints' port.
        let Resolution::Found {
            answers, additionals, ..
        } = resolve(
            &index,
            A_KEY,
            "_pg._tcp.db.shop.svc.cluster.local.",
            RecordType::SRV,
        )
        else {
            panic!("no SRV")
        };
        let mut targets: Vec<String> = answers.iter().map(|r| r.data.to_string()).collect();
        targets.sort();
        assert_eq!(
            targets,
            [
                "0 100 15432 10-244-1-8.db.shop.svc.cluster.local.",
                "0 100 15432 db-0.db.shop.svc.cluster.local."
            ]
        );
        assert_eq!(additionals.len(), 2);
        // The bare Service name lists every named port.
        let Resolution::Found { answers, .. } =
            resolve(&index, A_KEY, "web.shop.svc.cluster.local.", RecordType::SRV)
        else {
            panic!("no SRV")
        };
        assert_eq!(
            answers[0].name.to_ascii(),
            "_http._tcp.web.shop.svc.cluster.local."
        );
        // Unknown port or protocol.
        for query in [
            "_https._tcp.web.shop.svc.cluster.local.",
            "_http._udp.web.shop.svc.cluster.local.",
        ] {
            assert!(
                matches!(
                    resolve(&index, A_KEY, query, RecordType::SRV),
                    Resolution::NxDomain { .. }
                ),
                "{query}"
            );
        }
    }

    #[test]
    fn external_names_are_cnames_chased_inside_the_zone_or_upstream() {
        let mut index = index();
        let namespace = crds::naming::super_namespace(A_KEY, "shop");
        for (service, target) in [
            ("ext", "db.example.com."),
            ("alias", "web.shop.svc.cluster.local."),
        ] {
            index.set_service(
                &namespace,
                service,
                Some(ServiceRecord {
                    owner: owner(A_KEY, "shop"),
                    kind: ServiceKind::ExternalName(name(target)),
                    ports: Vec::new(),
                }),
            );
        }
        match resolve(&index, A_KEY, "ext.shop.svc.cluster.local.", RecordType::A) {
            Resolution::Cname { answers, target } => {
                assert_eq!(target.to_ascii(), "db.example.com.");
                assert_eq!(answers[0].data.to_string(), "db.example.com.");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "alias.shop.svc.cluster.local.",
                RecordType::A
            )),
            ["10.96.0.10", "web.shop.svc.cluster.local."]
        );
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "ext.shop.svc.cluster.local.",
                RecordType::CNAME
            )),
            ["db.example.com."]
        );
    }

    #[test]
    fn pod_names_only_for_the_tenants_own_pods_in_that_namespace() {
        let mut index = index();
        // a's client pod, 10.244.0.5, in shop.
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "10-244-0-5.shop.pod.cluster.local.",
                RecordType::A
            )),
            ["10.244.0.5"]
        );
        // The name exists without an AAAA record.
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "10-244-0-5.shop.pod.cluster.local.",
                RecordType::AAAA
            )),
            Vec::<String>::new()
        );
        for (key, query) in [
            // b's pod, asked by a; a's pod, asked by b.
            (A_KEY, "10-244-0-6.shop.pod.cluster.local."),
            (B_KEY, "10-244-0-5.shop.pod.cluster.local."),
            // The right pod in another namespace.
            (A_KEY, "10-244-0-5.other.pod.cluster.local."),
            // A Service address and an endpoint that is no pod of the index, and not an address at all.
            (A_KEY, "10-96-0-10.shop.pod.cluster.local."),
            (A_KEY, "10-244-1-7.shop.pod.cluster.local."),
            (A_KEY, "10-244-0-x.shop.pod.cluster.local."),
            (A_KEY, "010-244-0-5.shop.pod.cluster.local."),
            (A_KEY, "shop.pod.cluster.local."),
        ] {
            assert!(
                matches!(
                    resolve(&index, key, query, RecordType::A),
                    Resolution::NxDomain { .. }
                ),
                "{key} {query}"
            );
        }
        // A pod whose label names a's tenant, in b's namespace: not a's.
        let namespace = crds::naming::super_namespace(B_KEY, "shop");
        index.set_pod(
            &namespace,
            "forged",
            Some(PodAddresses {
                cluster: A_KEY.into(),
                addresses: vec![ip("10.244.9.9")],
            }),
        );
        for key in [A_KEY, B_KEY] {
            assert!(matches!(
                resolve(&index, key, "10-244-9-9.shop.pod.cluster.local.", RecordType::A),
                Resolution::NxDomain { .. }
            ));
        }
        // IPv6, dashed as CoreDNS does.
        let namespace = crds::naming::super_namespace(A_KEY, "shop");
        index.set_pod(
            &namespace,
            "v6",
            Some(PodAddresses {
                cluster: A_KEY.into(),
                addresses: vec![ip("fd00::5")],
            }),
        );
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "fd00--5.shop.pod.cluster.local.",
                RecordType::AAAA
            )),
            ["fd00::5"]
        );
        assert_eq!(undashed(&dashed(&ip("fd00::5"))), Some(ip("fd00::5")));
    }

    #[test]
    fn reverse_names_only_for_the_tenants_own_addresses() {
        let index = index();
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "10.0.96.10.in-addr.arpa.",
                RecordType::PTR
            )),
            ["web.shop.svc.cluster.local."]
        );
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "7.1.244.10.in-addr.arpa.",
                RecordType::PTR
            )),
            ["db-0.db.shop.svc.cluster.local."]
        );
        // b's Service address, from a: not found, and never forwarded (a private range).
        assert!(matches!(
            resolve(&index, A_KEY, "20.0.96.10.in-addr.arpa.", RecordType::PTR),
            Resolution::NxDomain { .. }
        ));
        // A public address is the upstream's.
        assert_eq!(
            resolve(&index, A_KEY, "8.8.8.8.in-addr.arpa.", RecordType::PTR),
            Resolution::Forward
        );
        assert_eq!(
            reverse_address(&name(
                "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa."
            )),
            Some(ip("fd00::1"))
        );
    }

    #[test]
    fn names_outside_the_zone_are_forwarded_except_the_super_clusters() {
        let mut index = index();
        assert_eq!(
            resolve(&index, A_KEY, "example.com.", RecordType::A),
            Resolution::Forward
        );
        // A tenant with its own domain: cluster.local is the super cluster's and never forwarded.
        index.set_domain(B_KEY.into(), "tenant-b.local");
        assert!(matches!(
            resolve(
                &index,
                B_KEY,
                "kubernetes.default.svc.cluster.local.",
                RecordType::A
            ),
            Resolution::NxDomain { .. }
        ));
        assert_eq!(
            addresses(&resolve(
                &index,
                B_KEY,
                "web.shop.svc.tenant-b.local.",
                RecordType::A
            )),
            ["10.96.0.20"]
        );
    }

    #[test]
    fn the_source_address_names_the_tenant_only_when_unambiguous() {
        let mut index = index();
        assert_eq!(index.tenant_of(ip("10.244.0.5")).as_deref(), Some(A_KEY));
        assert_eq!(index.tenant_of(ip("10.244.0.6")).as_deref(), Some(B_KEY));
        // A Service address or an endpoint is no pod: not a tenant.
        assert_eq!(index.tenant_of(ip("10.96.0.10")), None);
        assert_eq!(index.tenant_of(ip("192.0.2.1")), None);
        // An address two tenants' pods claim (one going, one coming): nobody's.
        let namespace = crds::naming::super_namespace(B_KEY, "shop");
        index.set_pod(
            &namespace,
            "new",
            Some(PodAddresses {
                cluster: B_KEY.into(),
                addresses: vec![ip("10.244.0.5")],
            }),
        );
        assert_eq!(index.tenant_of(ip("10.244.0.5")), None);
        index.set_pod(&namespace, "new", None);
        assert_eq!(index.tenant_of(ip("10.244.0.5")).as_deref(), Some(A_KEY));
        // A pod whose label names a tenant, in a namespace that is not that tenant's: nobody's.
        index.set_pod(
            &namespace,
            "forged",
            Some(PodAddresses {
                cluster: A_KEY.into(),
                addresses: vec![ip("10.244.9.9")],
            }),
        );
        assert_eq!(index.tenant_of(ip("10.244.9.9")), None);
    }

    #[test]
    fn updates_and_relists_keep_the_counts_and_reverse_entries_right() {
        let mut index = index();
        let before = index.records();
        let namespace = crds::naming::super_namespace(A_KEY, "shop");
        index.set_service(&namespace, "web", None);
        assert_eq!(index.records(), before - 1);
        assert!(matches!(
            resolve(&index, A_KEY, "10.0.96.10.in-addr.arpa.", RecordType::PTR),
            Resolution::NxDomain { .. }
        ));
        index.clear(ClearKind::Slices);
        assert_eq!(
            addresses(&resolve(
                &index,
                A_KEY,
                "db.shop.svc.cluster.local.",
                RecordType::A
            )),
            Vec::<String>::new()
        );
        index.clear(ClearKind::Pods);
        index.clear(ClearKind::Services);
        index.clear(ClearKind::Namespaces);
        assert_eq!(index.records(), 0);
        assert!(index.namespaces.is_empty());
        assert!(index.addresses.is_empty());
    }
}
