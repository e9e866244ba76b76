//! NetworkPolicies enforced on real nodes, as a policy-enforcing CNI (Calico, kube-router, Cilium) would
//! enforce them; the CNI bridge plugin the nodes use enforces none.
//!
//! [`Enforcer`] watches the super cluster's NetworkPolicies, Pods and Namespaces and programs iptables in
//! every node's network namespace. What each node gets is decided by pure functions ([`node_rules`]: which
//! of the node's pods are isolated and what is let through to and from them; [`render`]: iptables chains;
//! [`restore_input`]: the `iptables-restore --noflush` input that brings the node's filter table from what
//! it holds to those chains), and written by a small executor, one atomic restore per node.
//!
//! # Where packets are judged
//! Every node's namespace has bridge netfilter on, so all pod traffic that crosses a node's namespace passes
//! its `FORWARD` chain: between two pods on one bridge, from a pod out of `eth0` (to other nodes' pods, to
//! other nodes, to the host at `10.243.0.1`) and from `eth0` in to a pod. `FORWARD` jumps first to
//! `VC-NETPOL-FORWARD`, which lets replies of allowed connections through (conntrack `ESTABLISHED,RELATED`),
//! then sends a new connection from a local pod through that pod's egress chain (`VC-NETPOL-E-*`) and one to
//! a local pod through its ingress chain (`VC-NETPOL-I-*`). A chain returns when a rule of any policy lets
//! the connection through and rejects it otherwise (ICMP port unreachable, as kube-router does: the sender
//! learns at once, where Calico's drop makes it wait). Each node judges only its own pods: a connection
//! between pods on two nodes is judged for egress on the sender's node and for ingress on the receiver's.
//! kube-proxy rewrites Service addresses before `FORWARD`, so rules always see pod addresses, as with
//! every CNI that enforces policies with iptables.
//!
//! # What is enforced
//! The `networking.k8s.io/v1` semantics: a pod selected by a policy of a type (Ingress, Egress; without
//! `policyTypes`, Ingress and, when it has egress rules, Egress) accepts in that direction only what at
//! least one such policy of its namespace allows (the union of their rules; none: nothing). Peers by
//! `podSelector` (in the policy's namespace), `namespaceSelector`, both together (pods matching the one in
//! namespaces matching the other), or `ipBlock` with `except`; no peers means every address. Ports by
//! number, by range (`endPort`) or by name, per protocol (TCP, UDP, SCTP; a protocol without a port means
//! all its ports); no ports means all traffic, ICMP included. A named port is resolved on the pod it
//! names: the selected pod's own containers for ingress, each destination pod's for egress (so an egress
//! named port reaches only pods, never other addresses of an `ipBlock`). Replies of allowed connections
//! pass both ways.
//!
//! # What is not
//! - Traffic between a pod and its own node (the kubelet's probes, host-network pods of that node) never
//!   passes `FORWARD` and is always allowed, as the NetworkPolicy documentation requires ("traffic to and
//!   from the node where a Pod is running is always allowed").
//! - Host-network pods are neither isolated nor selected as peers (their address is their node's, which
//!   only an `ipBlock` can name); finished pods and pods without an address are not peers either.
//! - Connections open when a policy begins to deny them keep going (conntrack), as with most CNIs.
//! - A new pod's rules follow its address into the apiserver: the kubelet reports the address after the
//!   sandbox is up, so the first packets of a pod may pass before its rules exist (kube-router has the same
//!   window; Calico closes it in the CNI plugin).
//! - IPv4 only (the nodes have no IPv6); IPv6 `ipBlock`s match nothing. Peers are one rule per address
//!   (there is no `ipset` here), which suits the harness's clusters, not thousands of pods.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::Write,
    net::Ipv4Addr,
    path::PathBuf,
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use ipnet::Ipv4Net;
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Pod},
        networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};
use kube::{
    Api, Client, ResourceExt,
    core::{Selector, SelectorExt},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::host;
use crate::{Error, Result};

/// Prefix of every chain the enforcer owns.
pub const CHAIN_PREFIX: &str = "VC-NETPOL-";
/// The chain `FORWARD` jumps to first.
pub const MAIN_CHAIN: &str = "VC-NETPOL-FORWARD";
/// Comment on the jump from `FORWARD`.
const JUMP_COMMENT: &str = "vc-e2e: NetworkPolicies";
/// Packet mark bit an `except` chain sets when an address of an `ipBlock` is not excepted (kube-proxy uses
/// 0x4000 and 0x8000, kube-router 0x10000 and 0x20000).
const ALLOW_MARK: &str = "0x100000/0x100000";
const CLEAR_MARK: &str = "0x0/0x100000";
/// The label the apiserver puts on every namespace (Kubernetes 1.21 and later), added here for namespaces
/// not (yet) in the cache.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// How long a burst of changes may go on before the rules are rewritten.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Every node's rules are rewritten this often, whatever changed: repairs a failed write or a jump that
/// another program moved.
const RESYNC: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------------------
// Decisions (pure)

/// A transport protocol a NetworkPolicy port names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    fn parse(name: Option<&str>) -> Option<Self> {
        match name.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    fn iptables(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// Destination ports of one protocol: all of them, or an inclusive range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ports {
    /// The protocol.
    pub protocol: Protocol,
    /// First and last port; `None`: every port of the protocol.
    pub range: Option<(u16, u16)>,
}

/// One thing a pod's policies let through in one direction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Allow {
    /// The other end (the source of ingress, the destination of egress); `None`: any address.
    pub peer: Option<Ipv4Net>,
    /// Addresses of `peer` that are not let through (an `ipBlock`'s `except`).
    pub except: Vec<Ipv4Net>,
    /// Destination protocol and ports (the pod's for ingress, the peer's for egress); `None`: all traffic.
    pub ports: Option<Ports>,
}

/// What one pod of a node is held to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRules {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Its IPv4 addresses.
    pub ips: Vec<Ipv4Addr>,
    /// `None` when no policy isolates it for ingress; else what they let in (empty: nothing).
    pub ingress: Option<BTreeSet<Allow>>,
    /// `None` when no policy isolates it for egress; else what they let out (empty: nothing).
    pub egress: Option<BTreeSet<Allow>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

/// A pod that takes part in policies: live, on the pod network, with an address.
struct Endpoint<'a> {
    namespace: String,
    name: String,
    node: Option<&'a str>,
    labels: &'a BTreeMap<String, String>,
    ips: Vec<Ipv4Addr>,
    /// Named container ports: (name, protocol) → number.
    named_ports: HashMap<(&'a str, Protocol), u16>,
}

/// What the decision reads of the cluster, indexed once.
struct ClusterIndex<'a> {
    endpoints: Vec<Endpoint<'a>>,
    namespace_labels: HashMap<String, BTreeMap<String, String>>,
}

impl<'a> ClusterIndex<'a> {
    fn new(pods: &'a [Arc<Pod>], namespaces: &[Arc<Namespace>]) -> Self {
        let mut namespace_labels: HashMap<String, BTreeMap<String, String>> = namespaces
            .iter()
            .map(|ns| {
                let mut labels = ns.labels().clone();
                labels
                    .entry(NAMESPACE_NAME_LABEL.to_owned())
                    .or_insert_with(|| ns.name_any());
                (ns.name_any(), labels)
            })
            .collect();
        let endpoints: Vec<Endpoint<'a>> = pods.iter().filter_map(|pod| endpoint(pod)).collect();
        for endpoint in &endpoints {
            namespace_labels
                .entry(endpoint.namespace.clone())
                .or_insert_with(|| [(NAMESPACE_NAME_LABEL.to_owned(), endpoint.namespace.clone())].into());
        }
        Self {
            endpoints,
            namespace_labels,
        }
    }

    fn namespace_matches(&self, namespace: &str, selector: &LabelSelector) -> bool {
        let labels = self.namespace_labels.get(namespace);
        let empty = BTreeMap::new();
        selector_matches(selector, labels.unwrap_or(&empty))
    }

    /// The pods a peer selects (none for an `ipBlock`).
    fn selected_by(&self, policy_namespace: &str, peer: &NetworkPolicyPeer) -> Vec<&Endpoint<'a>> {
        if peer.ip_block.is_some() {
            return Vec::new();
        }
        self.endpoints
            .iter()
            .filter(|e| match (&peer.namespace_selector, &peer.pod_selector) {
                (None, None) => false,
                (None, Some(pods)) => e.namespace == policy_namespace && selector_matches(pods, e.labels),
                (Some(namespaces), pods) => {
                    self.namespace_matches(&e.namespace, namespaces)
                        && pods.as_ref().is_none_or(|pods| selector_matches(pods, e.labels))
                }
            })
            .collect()
    }
}

fn endpoint(pod: &Pod) -> Option<Endpoint<'_>> {
    let spec = pod.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let mut ips: Vec<Ipv4Addr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(
            status
                .pod_ip
                .as_deref()
                .and_then(|ip| ip.parse::<Ipv4Addr>().ok()),
        );
    }
    if ips.is_empty() {
        return None;
    }
    // Sidecars (init containers that keep running) serve ports as containers do.
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let mut named_ports = HashMap::new();
    for container in spec.containers.iter().chain(sidecars) {
        for port in container.ports.iter().flatten() {
            let (Some(name), Some(protocol), Ok(number)) = (
                port.name.as_deref(),
                Protocol::parse(port.protocol.as_deref()),
                u16::try_from(port.container_port),
            ) else {
                continue;
            };
            named_ports.entry((name, protocol)).or_insert(number);
        }
    }
    Some(Endpoint {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        node: spec.node_name.as_deref(),
        labels: pod.labels(),
        ips,
        named_ports,
    })
}

/// An invalid selector (the apiserver refuses them) selects nothing.
fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

/// The policy types a policy has, as the apiserver defaults them.
fn policy_types(policy: &NetworkPolicy) -> (bool, bool) {
    let Some(spec) = policy.spec.as_ref() else {
        return (false, false);
    };
    match spec.policy_types.as_deref() {
        Some(types) if !types.is_empty() => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
    }
}

/// A port entry of a rule, before named ports are resolved.
enum PortEntry<'p> {
    All,
    Numbered(Ports),
    Named(&'p str, Protocol),
}

fn port_entries(ports: Option<&[NetworkPolicyPort]>) -> Vec<PortEntry<'_>> {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return vec![PortEntry::All];
    };
    ports
        .iter()
        .filter_map(|port| {
            let protocol = Protocol::parse(port.protocol.as_deref())?;
            match &port.port {
                None => Some(PortEntry::Numbered(Ports {
                    protocol,
                    range: None,
                })),
                Some(IntOrString::Int(first)) => {
                    let first = u16::try_from(*first).ok().filter(|p| *p > 0)?;
                    let last = match port.end_port {
                        Some(end) => u16::try_from(end).ok().filter(|end| *end >= first)?,
                        None => first,
                    };
                    Some(PortEntry::Numbered(Ports {
                        protocol,
                        range: Some((first, last)),
                    }))
                }
                Some(IntOrString::String(name)) => Some(PortEntry::Named(name, protocol)),
            }
        })
        .collect()
}

/// The addresses a peer names: each an address block and what is excepted from it.
fn peer_blocks(
    index: &ClusterIndex<'_>,
    namespace: &str,
    peer: &NetworkPolicyPeer,
) -> Vec<(Ipv4Net, Vec<Ipv4Net>)> {
    if let Some(block) = &peer.ip_block {
        let Ok(cidr) = block.cidr.parse::<Ipv4Net>() else {
            return Vec::new();
        };
        let except = block
            .except
            .iter()
            .flatten()
            .filter_map(|e| e.parse::<Ipv4Net>().ok())
            .map(|e| e.trunc())
            .collect();
        return vec![(cidr.trunc(), except)];
    }
    index
        .selected_by(namespace, peer)
        .into_iter()
        .flat_map(|e| e.ips.iter().map(|ip| (Ipv4Net::from(*ip), Vec::new())))
        .collect()
}

/// What one rule (its peers and ports) of a policy in `namespace` lets through for `target`.
fn rule_allows(
    index: &ClusterIndex<'_>,
    namespace: &str,
    direction: Direction,
    peers: Option<&[NetworkPolicyPeer]>,
    ports: Option<&[NetworkPolicyPort]>,
    target: &Endpoint<'_>,
) -> Vec<Allow> {
    let peers = peers.filter(|p| !p.is_empty());
    // Every address (None), or the blocks the peers name.
    let blocks: Vec<(Option<Ipv4Net>, Vec<Ipv4Net>)> = match peers {
        None => vec![(None, Vec::new())],
        Some(peers) => peers
            .iter()
            .flat_map(|peer| peer_blocks(index, namespace, peer))
            .map(|(cidr, except)| (Some(cidr), except))
            .collect(),
    };
    let with_ports = |ports: Option<Ports>| {
        blocks.iter().map(move |(peer, except)| Allow {
            peer: *peer,
            except: except.clone(),
            ports,
        })
    };
    let mut allows = Vec::new();
    for entry in port_entries(ports) {
        match entry {
            PortEntry::All => allows.extend(with_ports(None)),
            PortEntry::Numbered(ports) => allows.extend(with_ports(Some(ports))),
            PortEntry::Named(name, protocol) => match direction {
                // The selected pod's own port of that name.
                Direction::Ingress => {
                    if let Some(number) = target.named_ports.get(&(name, protocol)) {
                        allows.extend(with_ports(Some(Ports {
                            protocol,
                            range: Some((*number, *number)),
                        })));
                    }
                }
                // Each destination pod's port of that name.
                Direction::Egress => {
                    for destination in &index.endpoints {
                        let Some(number) = destination.named_ports.get(&(name, protocol)) else {
                            continue;
                        };
                        for ip in &destination.ips {
                            let admitted = match peers {
                                None => true,
                                Some(peers) => peers
                                    .iter()
                                    .any(|peer| peer_admits(index, namespace, peer, destination, *ip)),
                            };
                            if admitted {
                                allows.push(Allow {
                                    peer: Some(Ipv4Net::from(*ip)),
                                    except: Vec::new(),
                                    ports: Some(Ports {
                                        protocol,
                                        range: Some((*number, *number)),
                                    }),
                                });
                            }
                        }
                    }
                }
            },
        }
    }
    allows
}

/// Whether a peer of a policy in `namespace` names `ip` of the pod `endpoint`.
fn peer_admits(
    index: &ClusterIndex<'_>,
    namespace: &str,
    peer: &NetworkPolicyPeer,
    endpoint: &Endpoint<'_>,
    ip: Ipv4Addr,
) -> bool {
    if peer.ip_block.is_some() {
        return peer_blocks(index, namespace, peer)
            .iter()
            .any(|(cidr, except)| cidr.contains(&ip) && !except.iter().any(|e| e.contains(&ip)));
    }
    match (&peer.namespace_selector, &peer.pod_selector) {
        (None, None) => false,
        (None, Some(pods)) => endpoint.namespace == namespace && selector_matches(pods, endpoint.labels),
        (Some(namespaces), pods) => {
            index.namespace_matches(&endpoint.namespace, namespaces)
                && pods
                    .as_ref()
                    .is_none_or(|pods| selector_matches(pods, endpoint.labels))
        }
    }
}

/// What the pods on node `node` are held to: one entry per pod some policy isolates, sorted by namespace
/// and name.
pub fn node_rules(
    node: &str,
    policies: &[Arc<NetworkPolicy>],
    pods: &[Arc<Pod>],
    namespaces: &[Arc<Namespace>],
) -> Vec<PodRules> {
    let index = ClusterIndex::new(pods, namespaces);
    let mut rules = Vec::new();
    for target in index.endpoints.iter().filter(|e| e.node == Some(node)) {
        let mut ingress: Option<BTreeSet<Allow>> = None;
        let mut egress: Option<BTreeSet<Allow>> = None;
        for policy in policies {
            let namespace = policy.namespace().unwrap_or_default();
            let Some(spec) = policy.spec.as_ref() else {
                continue;
            };
            let everyone = LabelSelector::default();
            let selector = spec.pod_selector.as_ref().unwrap_or(&everyone);
            if namespace != target.namespace || !selector_matches(selector, target.labels) {
                continue;
            }
            let (isolates_ingress, isolates_egress) = policy_types(policy);
            if isolates_ingress {
                let allowed = ingress.get_or_insert_default();
                for rule in spec.ingress.iter().flatten() {
                    allowed.extend(rule_allows(
                        &index,
                        &namespace,
                        Direction::Ingress,
                        rule.from.as_deref(),
                        rule.ports.as_deref(),
                        target,
                    ));
                }
            }
            if isolates_egress {
                let allowed = egress.get_or_insert_default();
                for rule in spec.egress.iter().flatten() {
                    allowed.extend(rule_allows(
                        &index,
                        &namespace,
                        Direction::Egress,
                        rule.to.as_deref(),
                        rule.ports.as_deref(),
                        target,
                    ));
                }
            }
        }
        if ingress.is_some() || egress.is_some() {
            rules.push(PodRules {
                namespace: target.namespace.clone(),
                name: target.name.clone(),
                ips: target.ips.clone(),
                ingress,
                egress,
            });
        }
    }
    rules.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rules
}

/// iptables chains, by name: the rules of each (what follows `-A <chain>`), in order.
pub type Chains = BTreeMap<String, Vec<String>>;

fn chain_name(kind: &str, key: &str) -> String {
    let digest = hex::encode(Sha256::digest(key.as_bytes()));
    // At most 28 characters: the prefix, a letter and a dash, 16 hexadecimal digits.
    format!("{CHAIN_PREFIX}{kind}-{}", &digest[..16])
}

/// The chains that enforce `pods`' rules on one node, [`MAIN_CHAIN`] among them.
pub fn render(pods: &[PodRules]) -> Chains {
    let mut chains = Chains::new();
    let mut main = vec!["-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN".to_owned()];
    for pod in pods {
        let key = format!("{}/{}", pod.namespace, pod.name);
        for (direction, allows) in [
            (Direction::Egress, &pod.egress),
            (Direction::Ingress, &pod.ingress),
        ] {
            let Some(allows) = allows else { continue };
            let (kind, flag, word) = match direction {
                Direction::Ingress => ("I", "-s", "ingress"),
                Direction::Egress => ("E", "-d", "egress"),
            };
            let chain = chain_name(kind, &key);
            let pod_flag = match direction {
                Direction::Ingress => "-d",
                Direction::Egress => "-s",
            };
            for ip in &pod.ips {
                main.push(format!(
                    "{pod_flag} {ip}/32 -m comment --comment \"{key} {word}\" -j {chain}"
                ));
            }
            let mut rules = vec![format!("-j MARK --set-xmark {CLEAR_MARK}")];
            for (n, allow) in allows.iter().enumerate() {
                let mut matches = Vec::new();
                if let Some(peer) = allow.peer {
                    matches.push(format!("{flag} {peer}"));
                }
                if let Some(ports) = allow.ports {
                    let protocol = ports.protocol.iptables();
                    matches.push(match ports.range {
                        None => format!("-p {protocol}"),
                        Some((first, last)) if first == last => {
                            format!("-p {protocol} -m {protocol} --dport {first}")
                        }
                        Some((first, last)) => {
                            format!("-p {protocol} -m {protocol} --dport {first}:{last}")
                        }
                    });
                }
                let matches = matches.join(" ");
                let prefix = if matches.is_empty() {
                    String::new()
                } else {
                    format!("{matches} ")
                };
                if allow.except.is_empty() {
                    rules.push(format!("{prefix}-j RETURN"));
                    continue;
                }
                let except_chain = chain_name("X", &format!("{chain}/{n}"));
                let mut excepted: Vec<String> = allow
                    .except
                    .iter()
                    .map(|e| format!("{flag} {e} -j RETURN"))
                    .collect();
                excepted.push(format!("-j MARK --set-xmark {ALLOW_MARK}"));
                chains.insert(except_chain.clone(), excepted);
                rules.push(format!("{prefix}-j {except_chain}"));
                rules.push(format!("-m mark --mark {ALLOW_MARK} -j RETURN"));
            }
            rules.push(format!(
                "-m comment --comment \"{key} {word}: no NetworkPolicy allows it\" -j REJECT"
            ));
            chains.insert(chain, rules);
        }
    }
    // Leave no mark of ours on packets that go on.
    main.push(format!("-j MARK --set-xmark {CLEAR_MARK}"));
    chains.insert(MAIN_CHAIN.to_owned(), main);
    chains
}

fn jump_rule() -> String {
    format!("-m comment --comment \"{JUMP_COMMENT}\" -j {MAIN_CHAIN}")
}

/// The `iptables-restore --noflush` input that turns a node's filter table, as `iptables-save -t filter`
/// printed it (`saved`), into `chains`: every chain of ours rewritten, ours that are no longer wanted
/// deleted, and the jump from `FORWARD` made its first rule, once.
pub fn restore_input(chains: &Chains, saved: &str) -> String {
    let existing: BTreeSet<&str> = saved
        .lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(CHAIN_PREFIX))
        .collect();
    let stale: Vec<&str> = existing
        .iter()
        .copied()
        .filter(|name| !chains.contains_key(*name))
        .collect();
    let forward: Vec<&str> = saved
        .lines()
        .filter(|line| line.starts_with("-A FORWARD "))
        .collect();
    let jumps: Vec<&str> = forward
        .iter()
        .copied()
        .filter(|line| line.ends_with(&format!("-j {MAIN_CHAIN}")))
        .collect();
    let jump_in_place = jumps.len() == 1 && forward.first() == jumps.first();

    let mut text = String::from("*filter\n");
    for name in chains.keys().map(String::as_str).chain(stale.iter().copied()) {
        text.push_str(&format!(":{name} - [0:0]\n"));
    }
    if !jump_in_place {
        for jump in &jumps {
            text.push_str(&jump.replacen("-A ", "-D ", 1));
            text.push('\n');
        }
        text.push_str(&format!("-I FORWARD 1 {}\n", jump_rule()));
    }
    for (name, rules) in chains {
        for rule in rules {
            text.push_str(&format!("-A {name} {rule}\n"));
        }
    }
    for name in &stale {
        text.push_str(&format!("-X {name}\n"));
    }
    text.push_str("COMMIT\n");
    text
}

// ---------------------------------------------------------------------------------------------------------
// Acting

/// A node whose network namespace the enforcer programs.
#[derive(Clone, Debug)]
pub struct PolicyNode {
    /// The Node's name (pods' `spec.nodeName`).
    pub name: String,
    /// Its network namespace, for `nsenter --net=`.
    pub netns: PathBuf,
}

struct Tools {
    nsenter: PathBuf,
    save: PathBuf,
    restore: PathBuf,
}

impl Tools {
    fn find() -> Result<Self> {
        let find = |name: &str| {
            host::find_tool(name).ok_or_else(|| Error::MissingPart {
                part: format!("{name} (NetworkPolicies on real nodes)"),
                hint: "apt-get install iptables util-linux".into(),
            })
        };
        Ok(Self {
            nsenter: find("nsenter")?,
            save: find("iptables-save")?,
            restore: find("iptables-restore")?,
        })
    }

    /// Writes `chains` into `node`'s filter table in one transaction.
    fn apply(&self, node: &PolicyNode, chains: &Chains) -> Result<()> {
        let netns = format!("--net={}", node.netns.display());
        let context = format!("NetworkPolicies on node {}", node.name);
        let saved = host::run(
            &context,
            &self.nsenter.display().to_string(),
            &[&netns, "--", &self.save.display().to_string(), "-t", "filter"],
        )?;
        let input = restore_input(chains, &saved);
        let mut child = Command::new(&self.nsenter)
            .args([netns.as_str(), "--"])
            .arg(&self.restore)
            .args(["-w", "--noflush"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(Error::io(format!("{context}: starting iptables-restore")))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .map_err(Error::io(format!("{context}: writing to iptables-restore")))?;
        }
        let output = child
            .wait_with_output()
            .map_err(Error::io(format!("{context}: iptables-restore")))?;
        if output.status.success() {
            return Ok(());
        }
        Err(Error::Command {
            context,
            command: format!("iptables-restore --noflush <<EOF\n{input}EOF"),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// The caches the decision reads.
#[derive(Clone)]
struct Stores {
    policies: Store<NetworkPolicy>,
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
}

/// Keeps every node's rules in line with the cluster's NetworkPolicies until dropped. Dropping it stops
/// the watches; the rules stay until the nodes' network namespaces go.
pub struct Enforcer {
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Enforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enforcer").finish_non_exhaustive()
    }
}

impl Drop for Enforcer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Enforcer {
    /// Watches the cluster of `client`, writes every node's rules once (failing when that fails) and keeps
    /// them current: within [`DEBOUNCE`] of a burst of changes, and every [`RESYNC`].
    pub async fn start(client: Client, nodes: Vec<PolicyNode>) -> Result<Self> {
        let tools = Arc::new(Tools::find()?);
        let (policies, policies_writer) = reflector::store::<NetworkPolicy>();
        let (pods, pods_writer) = reflector::store::<Pod>();
        let (namespaces, namespaces_writer) = reflector::store::<Namespace>();
        let config = watcher::Config::default();
        let policy_events = watcher(Api::<NetworkPolicy>::all(client.clone()), config.clone())
            .default_backoff()
            .reflect(policies_writer)
            .map(|_| ());
        let pod_events = watcher(Api::<Pod>::all(client.clone()), config.clone())
            .default_backoff()
            .reflect(pods_writer)
            .map(|_| ());
        let namespace_events = watcher(Api::<Namespace>::all(client), config)
            .default_backoff()
            .reflect(namespaces_writer)
            .map(|_| ());
        let mut events = futures::stream::select_all([
            policy_events.boxed(),
            pod_events.boxed(),
            namespace_events.boxed(),
        ]);
        let stores = Stores {
            policies,
            pods,
            namespaces,
        };

        // The first rules only once every cache holds the whole cluster.
        let ready = async {
            let _ = tokio::join!(
                stores.policies.wait_until_ready(),
                stores.pods.wait_until_ready(),
                stores.namespaces.wait_until_ready(),
            );
        };
        let listed = async {
            tokio::pin!(ready);
            loop {
                tokio::select! {
                    _ = &mut ready => return,
                    _ = events.next() => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), listed)
            .await
            .map_err(|_| Error::Timeout {
                what: "the NetworkPolicy enforcer's first list of policies, pods and namespaces".into(),
                seconds: 60.0,
            })?;
        let mut applied: HashMap<String, Chains> = HashMap::new();
        if let Some(failure) = sync(&tools, &nodes, &stores, &mut applied, true)
            .await
            .into_iter()
            .next()
        {
            return Err(failure);
        }
        tracing::info!(nodes = nodes.len(), "NetworkPolicy enforcer started");

        let task = tokio::spawn(async move {
            let mut resync = tokio::time::interval(RESYNC);
            resync.tick().await;
            loop {
                let force = tokio::select! {
                    event = events.next() => {
                        if event.is_none() {
                            break;
                        }
                        // Coalesce a burst of changes into one write per node.
                        tokio::time::sleep(DEBOUNCE).await;
                        while let Some(Some(_)) = events.next().now_or_never() {}
                        false
                    }
                    _ = resync.tick() => true,
                };
                for error in sync(&tools, &nodes, &stores, &mut applied, force).await {
                    tracing::warn!(error = %crate::error_chain(&error), "writing NetworkPolicy rules");
                }
            }
        });
        Ok(Self { task })
    }
}

/// Decides every node's chains from the caches and writes those that changed since they were last
/// written (all with `force`). Returns the failures; a node that failed is written again next time.
async fn sync(
    tools: &Arc<Tools>,
    nodes: &[PolicyNode],
    stores: &Stores,
    applied: &mut HashMap<String, Chains>,
    force: bool,
) -> Vec<Error> {
    let policies = stores.policies.state();
    let pods = stores.pods.state();
    let namespaces = stores.namespaces.state();
    let mut failures = Vec::new();
    for node in nodes {
        let pod_rules = node_rules(&node.name, &policies, &pods, &namespaces);
        let chains = render(&pod_rules);
        if !force && applied.get(&node.name) == Some(&chains) {
            continue;
        }
        let (tools, target, desired) = (tools.clone(), node.clone(), chains.clone());
        let written = tokio::task::spawn_blocking(move || tools.apply(&target, &desired))
            .await
            .unwrap_or_else(|e| {
                Err(Error::Io {
                    context: "writing NetworkPolicy rules".into(),
                    source: std::io::Error::other(e),
                })
            });
        match written {
            Ok(()) => {
                if applied.get(&node.name) != Some(&chains) {
                    tracing::debug!(node = %node.name, isolated_pods = pod_rules.len(), "NetworkPolicy rules written");
                }
                applied.insert(node.name.clone(), chains);
            }
            Err(error) => {
                applied.remove(&node.name);
                failures.push(error);
            }
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str, name: &str, node: &str, ip: &str, labels: serde_json::Value) -> Arc<Pod> {
        pod_with(namespace, name, node, ip, labels, serde_json::json!([]), false)
    }

    fn pod_with(
        namespace: &str,
        name: &str,
        node: &str,
        ip: &str,
        labels: serde_json::Value,
        ports: serde_json::Value,
        host_network: bool,
    ) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": { "namespace": namespace, "name": name, "labels": labels },
                "spec": {
                    "nodeName": node,
                    "hostNetwork": host_network,
                    "containers": [{ "name": "main", "ports": ports }],
                },
                "status": { "phase": "Running", "podIP": ip, "podIPs": [{ "ip": ip }] },
            }))
            .expect("pod"),
        )
    }

    fn namespace(name: &str, labels: serde_json::Value) -> Arc<Namespace> {
        Arc::new(
            serde_json::from_value(serde_json::json!({ "metadata": { "name": name, "labels": labels } }))
                .expect("namespace"),
        )
    }

    fn policy(namespace: &str, name: &str, spec: serde_json::Value) -> Arc<NetworkPolicy> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": { "namespace": namespace, "name": name },
                "spec": spec,
            }))
            .expect("policy"),
        )
    }

    fn net(cidr: &str) -> Ipv4Net {
        cidr.parse().expect("cidr")
    }

    fn allow(peer: Option<&str>, ports: Option<(Protocol, Option<(u16, u16)>)>) -> Allow {
        Allow {
            peer: peer.map(net),
            except: Vec::new(),
            ports: ports.map(|(protocol, range)| Ports { protocol, range }),
        }
    }

    fn set(allows: &[Allow]) -> Option<BTreeSet<Allow>> {
        Some(allows.iter().cloned().collect())
    }

    /// The world of most tests: `web` (app=web) and `db` (app=db) in `shop` on node-0, `client` in `ops`
    /// (team=ops) on node-1, `stranger` in `other` on node-1, a host-network pod in `shop` on node-1.
    fn world() -> (Vec<Arc<Pod>>, Vec<Arc<Namespace>>) {
        let pods = vec![
            pod_with(
                "shop",
                "web",
                "node-0",
                "10.244.0.5",
                serde_json::json!({ "app": "web" }),
                serde_json::json!([
                    { "name": "http", "containerPort": 8080 },
                    { "name": "dns", "containerPort": 5353, "protocol": "UDP" },
                ]),
                false,
            ),
            pod(
                "shop",
                "db",
                "node-0",
                "10.244.0.6",
                serde_json::json!({ "app": "db" }),
            ),
            pod(
                "ops",
                "client",
                "node-1",
                "10.244.1.5",
                serde_json::json!({ "app": "client" }),
            ),
            pod(
                "other",
                "stranger",
                "node-1",
                "10.244.1.6",
                serde_json::json!({ "app": "client" }),
            ),
            pod_with(
                "shop",
                "agent",
                "node-1",
                "10.243.0.11",
                serde_json::json!({ "app": "web" }),
                serde_json::json!([]),
                true,
            ),
        ];
        let namespaces = vec![
            namespace("shop", serde_json::json!({ "team": "shop" })),
            namespace("ops", serde_json::json!({ "team": "ops" })),
            namespace("other", serde_json::json!({})),
        ];
        (pods, namespaces)
    }

    fn rules_of<'a>(rules: &'a [PodRules], name: &str) -> Option<&'a PodRules> {
        rules.iter().find(|r| r.name == name)
    }

    #[test]
    fn selection_isolates_only_the_pods_of_the_policys_namespace_its_selector_names() {
        let (pods, namespaces) = world();
        struct Case {
            what: &'static str,
            policy: Arc<NetworkPolicy>,
            node: &'static str,
            isolated: &'static [&'static str],
        }
        let deny = |namespace: &str, selector: serde_json::Value| {
            policy(
                namespace,
                "deny",
                serde_json::json!({ "podSelector": selector, "policyTypes": ["Ingress"] }),
            )
        };
        let cases = [
            Case {
                what: "a selector names one pod",
                policy: deny("shop", serde_json::json!({ "matchLabels": { "app": "web" } })),
                node: "node-0",
                isolated: &["web"],
            },
            Case {
                what: "an empty selector names every pod of the namespace",
                policy: deny("shop", serde_json::json!({})),
                node: "node-0",
                isolated: &["db", "web"],
            },
            Case {
                what: "expressions",
                policy: deny(
                    "shop",
                    serde_json::json!({ "matchExpressions": [{ "key": "app", "operator": "NotIn", "values": ["web"] }] }),
                ),
                node: "node-0",
                isolated: &["db"],
            },
            Case {
                what: "a policy of another namespace does not apply",
                policy: deny("ops", serde_json::json!({})),
                node: "node-0",
                isolated: &[],
            },
            Case {
                what: "pods on another node are that node's business",
                policy: deny("ops", serde_json::json!({})),
                node: "node-1",
                isolated: &["client"],
            },
            Case {
                what: "host-network pods are not isolated",
                policy: deny("shop", serde_json::json!({ "matchLabels": { "app": "web" } })),
                node: "node-1",
                isolated: &[],
            },
        ];
        for case in cases {
            let rules = node_rules(case.node, &[case.policy], &pods, &namespaces);
            let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
            assert_eq!(names, case.isolated, "{}", case.what);
            for rule in &rules {
                assert_eq!(rule.ingress, set(&[]), "{}: deny all ingress", case.what);
                assert_eq!(rule.egress, None, "{}: egress untouched", case.what);
            }
        }
    }

    #[test]
    fn peers_by_pod_and_namespace_selectors() {
        let (pods, namespaces) = world();
        let cases = [
            (
                "podSelector: pods of the policy's namespace only",
                serde_json::json!([{ "podSelector": { "matchLabels": { "app": "client" } } }]),
                vec![],
            ),
            (
                "podSelector {}: every pod of the policy's namespace, not host-network ones",
                serde_json::json!([{ "podSelector": {} }]),
                vec!["10.244.0.5/32", "10.244.0.6/32"],
            ),
            (
                "namespaceSelector: every pod of the namespaces",
                serde_json::json!([{ "namespaceSelector": { "matchLabels": { "team": "ops" } } }]),
                vec!["10.244.1.5/32"],
            ),
            (
                "namespaceSelector by the name label the apiserver sets",
                serde_json::json!([{ "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "other" } } }]),
                vec!["10.244.1.6/32"],
            ),
            (
                "namespaceSelector {}: every pod",
                serde_json::json!([{ "namespaceSelector": {} }]),
                vec!["10.244.0.5/32", "10.244.0.6/32", "10.244.1.5/32", "10.244.1.6/32"],
            ),
            (
                "both: pods matching the one in namespaces matching the other",
                serde_json::json!([{
                    "namespaceSelector": { "matchExpressions": [{ "key": "team", "operator": "Exists" }] },
                    "podSelector": { "matchLabels": { "app": "client" } },
                }]),
                vec!["10.244.1.5/32"],
            ),
            (
                "two peers: the union",
                serde_json::json!([
                    { "podSelector": { "matchLabels": { "app": "db" } } },
                    { "namespaceSelector": { "matchLabels": { "team": "ops" } } },
                ]),
                vec!["10.244.0.6/32", "10.244.1.5/32"],
            ),
        ];
        for (what, from, expected) in cases {
            let policies = [policy(
                "shop",
                "p",
                serde_json::json!({
                    "podSelector": { "matchLabels": { "app": "web" } },
                    "policyTypes": ["Ingress"],
                    "ingress": [{ "from": from }],
                }),
            )];
            let rules = node_rules("node-0", &policies, &pods, &namespaces);
            let web = rules_of(&rules, "web").expect("web is isolated");
            let peers: Vec<String> = web
                .ingress
                .iter()
                .flatten()
                .map(|a| a.peer.expect("a peer").to_string())
                .collect();
            assert_eq!(peers, expected, "{what}");
        }
    }

    #[test]
    fn no_peers_or_no_ports_mean_everything_and_policies_add_up() {
        let (pods, namespaces) = world();
        let policies = [
            policy(
                "shop",
                "all-ports-from-ops",
                serde_json::json!({
                    "podSelector": {},
                    "ingress": [{ "from": [{ "namespaceSelector": { "matchLabels": { "team": "ops" } } }] }],
                }),
            ),
            policy(
                "shop",
                "port-from-anywhere",
                serde_json::json!({
                    "podSelector": { "matchLabels": { "app": "web" } },
                    "ingress": [{ "ports": [{ "port": 443 }, { "protocol": "UDP" }] }],
                }),
            ),
            policy(
                "shop",
                "everything",
                serde_json::json!({ "podSelector": { "matchLabels": { "app": "db" } }, "ingress": [{}] }),
            ),
        ];
        let rules = node_rules("node-0", &policies, &pods, &namespaces);
        assert_eq!(
            rules_of(&rules, "web").expect("web").ingress,
            set(&[
                allow(None, Some((Protocol::Tcp, Some((443, 443))))),
                allow(None, Some((Protocol::Udp, None))),
                allow(Some("10.244.1.5/32"), None),
            ])
        );
        assert_eq!(
            rules_of(&rules, "db").expect("db").ingress,
            set(&[allow(None, None), allow(Some("10.244.1.5/32"), None)])
        );
        // Without policyTypes and without egress rules, a policy is about ingress alone.
        assert_eq!(rules_of(&rules, "web").expect("web").egress, None);
    }

    #[test]
    fn ip_blocks_with_except_and_port_ranges() {
        let (pods, namespaces) = world();
        let policies = [policy(
            "shop",
            "p",
            serde_json::json!({
                "podSelector": { "matchLabels": { "app": "web" } },
                "policyTypes": ["Egress"],
                "egress": [{
                    "to": [
                        { "ipBlock": { "cidr": "0.0.0.0/0", "except": ["10.243.0.1/32", "192.168.0.0/16"] } },
                        { "ipBlock": { "cidr": "fd00::/8" } },
                    ],
                    "ports": [{ "port": 30000, "endPort": 32767 }, { "protocol": "SCTP", "port": 9 }],
                }],
            }),
        )];
        let rules = node_rules("node-0", &policies, &pods, &namespaces);
        let web = rules_of(&rules, "web").expect("web");
        assert_eq!(web.ingress, None, "an Egress policy leaves ingress open");
        let except = vec![net("10.243.0.1/32"), net("192.168.0.0/16")];
        let expected: BTreeSet<Allow> = [(Protocol::Tcp, (30000, 32767)), (Protocol::Sctp, (9, 9))]
            .into_iter()
            .map(|(protocol, range)| Allow {
                peer: Some(net("0.0.0.0/0")),
                except: except.clone(),
                ports: Some(Ports {
                    protocol,
                    range: Some(range),
                }),
            })
            .collect();
        assert_eq!(
            web.egress.as_ref(),
            Some(&expected),
            "the IPv6 block matches nothing"
        );

        let chains = render(&rules);
        let egress_chain = chain_name("E", "shop/web");
        assert!(chains[MAIN_CHAIN].contains(&format!(
            "-s 10.244.0.5/32 -m comment --comment \"shop/web egress\" -j {egress_chain}"
        )));
        let rules = &chains[&egress_chain];
        let except_chains: Vec<&String> = chains.keys().filter(|c| c.starts_with("VC-NETPOL-X-")).collect();
        assert_eq!(except_chains.len(), 2, "{chains:#?}");
        let jump = rules
            .iter()
            .position(|r| r.starts_with("-d 0.0.0.0/0 -p tcp -m tcp --dport 30000:32767 -j VC-NETPOL-X-"))
            .expect("a jump to an except chain");
        assert_eq!(rules[jump + 1], "-m mark --mark 0x100000/0x100000 -j RETURN");
        for chain in except_chains {
            assert_eq!(
                chains[chain],
                [
                    "-d 10.243.0.1/32 -j RETURN",
                    "-d 192.168.0.0/16 -j RETURN",
                    "-j MARK --set-xmark 0x100000/0x100000",
                ]
            );
        }
        assert_eq!(rules.last().map(|r| r.ends_with("-j REJECT")), Some(true));
        assert!(
            chains.keys().all(|c| c.len() <= 28),
            "iptables chain names have at most 28 characters"
        );
    }

    #[test]
    fn named_ports_resolve_on_the_selected_pod_for_ingress_and_on_destinations_for_egress() {
        let (pods, namespaces) = world();
        let policies = [
            policy(
                "shop",
                "in",
                serde_json::json!({
                    "podSelector": {},
                    "policyTypes": ["Ingress"],
                    "ingress": [{ "ports": [
                        { "port": "http" },
                        { "port": "dns", "protocol": "UDP" },
                        { "port": "dns" },
                    ] }],
                }),
            ),
            policy(
                "ops",
                "out",
                serde_json::json!({
                    "podSelector": {},
                    "policyTypes": ["Egress"],
                    "egress": [
                        { "ports": [{ "port": "http" }] },
                        { "to": [{ "ipBlock": { "cidr": "10.244.0.0/16", "except": ["10.244.0.5/32"] } }], "ports": [{ "port": "dns", "protocol": "UDP" }] },
                    ],
                }),
            ),
        ];
        let rules = node_rules("node-0", &policies, &pods, &namespaces);
        assert_eq!(
            rules_of(&rules, "web").expect("web").ingress,
            set(&[
                allow(None, Some((Protocol::Tcp, Some((8080, 8080))))),
                allow(None, Some((Protocol::Udp, Some((5353, 5353))))),
            ]),
            "TCP `dns` is no port of web's"
        );
        assert_eq!(
            rules_of(&rules, "db").expect("db").ingress,
            set(&[]),
            "db has no named ports: nothing is let in"
        );
        let rules = node_rules("node-1", &policies, &pods, &namespaces);
        assert_eq!(
            rules_of(&rules, "client").expect("client").egress,
            set(&[allow(
                Some("10.244.0.5/32"),
                Some((Protocol::Tcp, Some((8080, 8080))))
            )]),
            "http of the pods that name it; the excepted address does not get dns"
        );
    }

    #[test]
    fn ingress_and_egress_together_and_policy_types_defaulted() {
        let (pods, namespaces) = world();
        let policies = [policy(
            "ops",
            "both",
            serde_json::json!({
                "podSelector": {},
                "ingress": [{ "from": [{ "podSelector": {} }] }],
                "egress": [{ "to": [{ "namespaceSelector": { "matchLabels": { "team": "shop" } }, "podSelector": { "matchLabels": { "app": "db" } } }], "ports": [{ "port": 5432 }] }],
            }),
        )];
        let rules = node_rules("node-1", &policies, &pods, &namespaces);
        let client = rules_of(&rules, "client").expect("client");
        assert_eq!(client.ingress, set(&[allow(Some("10.244.1.5/32"), None)]));
        assert_eq!(
            client.egress,
            set(&[allow(
                Some("10.244.0.6/32"),
                Some((Protocol::Tcp, Some((5432, 5432))))
            )])
        );
        let chains = render(&rules);
        let main = &chains[MAIN_CHAIN];
        assert_eq!(main[0], "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN");
        assert!(
            main.iter()
                .any(|r| r.starts_with("-s 10.244.1.5/32") && r.ends_with(&chain_name("E", "ops/client")))
        );
        assert!(
            main.iter()
                .any(|r| r.starts_with("-d 10.244.1.5/32") && r.ends_with(&chain_name("I", "ops/client")))
        );
        assert_eq!(
            chains[&chain_name("E", "ops/client")],
            [
                "-j MARK --set-xmark 0x0/0x100000",
                "-d 10.244.0.6/32 -p tcp -m tcp --dport 5432 -j RETURN",
                "-m comment --comment \"ops/client egress: no NetworkPolicy allows it\" -j REJECT",
            ]
        );
    }

    #[test]
    fn finished_pods_and_pods_without_addresses_are_no_peers() {
        let (mut pods, namespaces) = world();
        let mut finished = (*pod("ops", "done", "node-1", "10.244.1.9", serde_json::json!({}))).clone();
        finished.status.as_mut().expect("status").phase = Some("Succeeded".into());
        let mut pending = (*pod("ops", "pending", "node-1", "", serde_json::json!({}))).clone();
        pending.status = Some(Default::default());
        pods.extend([Arc::new(finished), Arc::new(pending)]);
        let policies = [policy(
            "shop",
            "p",
            serde_json::json!({ "podSelector": { "matchLabels": { "app": "web" } }, "ingress": [{ "from": [{ "namespaceSelector": { "matchLabels": { "team": "ops" } } }] }] }),
        )];
        let rules = node_rules("node-0", &policies, &pods, &namespaces);
        assert_eq!(
            rules_of(&rules, "web").expect("web").ingress,
            set(&[allow(Some("10.244.1.5/32"), None)])
        );
    }

    #[test]
    fn restore_input_rewrites_our_chains_removes_stale_ones_and_keeps_the_jump_first() {
        let chains = render(&[]);
        let fresh = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                     -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\nCOMMIT\n";
        let input = restore_input(&chains, fresh);
        assert_eq!(
            input,
            format!(
                "*filter\n:VC-NETPOL-FORWARD - [0:0]\n-I FORWARD 1 -m comment --comment \"{JUMP_COMMENT}\" -j VC-NETPOL-FORWARD\n\
                 -A VC-NETPOL-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n\
                 -A VC-NETPOL-FORWARD -j MARK --set-xmark 0x0/0x100000\nCOMMIT\n"
            )
        );

        let jump = format!("-A FORWARD -m comment --comment \"{JUMP_COMMENT}\" -j VC-NETPOL-FORWARD");
        let in_place = format!(
            "*filter\n:FORWARD ACCEPT [0:0]\n:VC-NETPOL-FORWARD - [0:0]\n:VC-NETPOL-I-0123456789abcdef - [0:0]\n\
             {jump}\n-A FORWARD -j KUBE-FORWARD\nCOMMIT\n"
        );
        let input = restore_input(&chains, &in_place);
        assert!(!input.contains("FORWARD 1"), "the jump is first already: {input}");
        assert!(
            input.contains(":VC-NETPOL-I-0123456789abcdef - [0:0]\n"),
            "flushed: {input}"
        );
        assert!(
            input.ends_with("-X VC-NETPOL-I-0123456789abcdef\nCOMMIT\n"),
            "then deleted: {input}"
        );

        let moved = format!(
            "*filter\n:FORWARD ACCEPT [0:0]\n:VC-NETPOL-FORWARD - [0:0]\n\
             -A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\n{jump}\n{jump}\nCOMMIT\n"
        );
        let input = restore_input(&chains, &moved);
        let delete = jump.replacen("-A ", "-D ", 1);
        assert_eq!(input.matches(&delete).count(), 2, "{input}");
        assert_eq!(input.matches("-I FORWARD 1 ").count(), 1, "{input}");
        assert!(input.find(&delete) < input.find("-I FORWARD 1 "));
    }
}
