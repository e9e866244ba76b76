//! Real nodes on this machine: kubelets with containerd, runc and the CNI bridge plugin, kube-proxy, cluster
//! DNS and images made from local files, registered with a super cluster of the harness.
//!
//! Tests choose them instead of the [`NodeSimulator`](crate::NodeSimulator) where containers must really run
//! (native tenant control planes, `kubectl logs/exec` through a real kubelet, Service traffic); the simulated
//! nodes stay for scale tests and benchmarks. Real nodes change the host (bridges, iptables, mounts), so
//! one set runs at a time on a machine: they hold a machine-wide lock (a test takes it with its turn in
//! [`require`], see [`crate::turns`]; else [`RealNodes::start`] does), the start sweeps what an earlier run
//! may have left, and the drop undoes everything, also after a panic.
//!
//! Layout (see [`host`]): node N is called `<prefix>N` and has a network namespace of its own with the
//! address `10.243.0.<N+10>`, pods in `10.244.N.0/24` and a kube-proxy of its own; the kubelet serves on
//! `10.243.0.<N+10>:10250`. The host is `10.243.0.1` to the nodes: the apiservers, the image registry and
//! the super cluster's DNS (dnsmasq, port 53) answer there.
//!
//! The CNI bridge plugin enforces no NetworkPolicies; with [`RealNodeOptions::network_policies`] the nodes
//! enforce them as a policy-enforcing CNI would (see [`policy`]).

pub mod dns;
pub mod host;
pub mod images;
mod node;
pub mod policy;
pub mod registry;

use std::{path::PathBuf, time::Duration};

use k8s_openapi::api::{
    core::v1::Node,
    rbac::v1::{ClusterRoleBinding, RoleRef, Subject},
    storage::v1::StorageClass,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams},
};

pub use images::{BUSYBOX_IMAGE, ControlPlaneImages, LocalImage, PAUSE_IMAGE};
pub use node::{KUBELET_PORT, RealNode};

use crate::{Binary, ControlPlane, Error, Result, locate, nodes::node_is_ready, turns, wait};

/// How to start real nodes.
#[derive(Clone, Debug)]
pub struct RealNodeOptions {
    /// How many nodes (at most 200).
    pub node_count: usize,
    /// Node names are this prefix plus an index.
    pub name_prefix: String,
    /// CA certificates (PEM) whose client certificates the kubelets accept besides the super cluster's.
    pub extra_client_cas: Vec<String>,
    /// Users of the super cluster allowed the whole kubelet API (bound to `system:kubelet-api-admin`), such
    /// as vn-agent's client certificate's common name.
    pub kubelet_api_users: Vec<String>,
    /// Enforce the super cluster's NetworkPolicies on the nodes ([`policy::Enforcer`]); off, the nodes
    /// behave as the plain bridge plugin does and let every packet through.
    pub network_policies: bool,
}

impl Default for RealNodeOptions {
    fn default() -> Self {
        Self {
            node_count: 2,
            name_prefix: "node-".to_owned(),
            extra_client_cas: Vec::new(),
            kubelet_api_users: Vec::new(),
            network_policies: false,
        }
    }
}

/// A registry name of this harness alone (the workspace's component images are served under it); like
/// every registry the nodes know, it is mirrored to the harness's registry.
pub const LOCAL_REGISTRY: &str = "vc-e2e.local";

/// The CNI plugins every node uses.
pub const CNI_PLUGINS: &[&str] = &["bridge", "host-local", "portmap", "loopback"];

/// Field manager of what the harness writes for real nodes.
const FIELD_MANAGER: &str = "e2e-real-nodes";
/// The default StorageClass, served by kube-controller-manager's hostpath provisioner.
pub const STORAGE_CLASS: &str = "standard";

/// Real nodes of one super cluster. Fields drop in order; [`Drop`] sweeps what the processes left.
pub struct RealNodes {
    policy: Option<policy::Enforcer>,
    nodes: Vec<RealNode>,
    _dns: dns::ClusterDns,
    host: host::HostState,
    folders: Vec<PathBuf>,
    _lock: std::fs::File,
    /// When the lock was taken: the drop logs how long this set held the machine.
    locked_at: std::time::Instant,
}

impl std::fmt::Debug for RealNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNodes")
            .field("nodes", &self.names())
            .finish_non_exhaustive()
    }
}

/// Checks that every part real nodes need is on this machine. When one is missing, prints one line naming
/// the test and every missing part and returns `false`: the caller returns early (a skip). When all are
/// there, takes the test's turn with the machine-wide lock ([`crate::turns`]), which its real nodes hold on.
pub fn require(test: &str) -> bool {
    let missing = missing_parts();
    if missing.is_empty() {
        if let Err(error) = turns::take_real_node_turn() {
            // Real nodes will try again and fail with it.
            turns::log_lock(&format!("could not take the machine-wide lock: {error}"));
        }
        return true;
    }
    crate::skip(test, &format!("real nodes need {}", missing.join(", ")));
    false
}

/// The parts real nodes need that this machine lacks, each with where it comes from.
pub fn missing_parts() -> Vec<String> {
    let mut missing = Vec::new();
    for binary in [
        Binary::Etcd,
        Binary::KubeApiserver,
        Binary::KubeControllerManager,
        Binary::KubeScheduler,
        Binary::Kubelet,
        Binary::KubeProxy,
    ] {
        if let Err(error) = locate(binary) {
            missing.push(error.to_string());
        }
    }
    for (tool, package) in [
        ("containerd", "containerd"),
        ("containerd-shim-runc-v2", "containerd"),
        ("runc", "runc"),
        ("iptables", "iptables"),
        ("ip", "iproute2"),
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
        ("dnsmasq", "dnsmasq-base"),
    ] {
        if host::find_tool(tool).is_none() {
            missing.push(format!("{tool} (Debian package {package})"));
        }
    }
    if crate::cni_plugin_dir(CNI_PLUGINS).is_none() {
        missing.push(format!(
            "the CNI plugins {} in /usr/lib/cni or /opt/cni/bin (Debian package containernetworking-plugins)",
            CNI_PLUGINS.join(", ")
        ));
    }
    if images::find_busybox().is_err() {
        missing.push("a static /bin/busybox (Debian package busybox-static)".to_owned());
    }
    if !is_root() {
        missing.push("root (bridges, iptables and mounts)".to_owned());
    }
    missing
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

impl RealNodes {
    /// Starts `options.node_count` nodes for `cluster` (started with
    /// [`crate::ControlPlaneOptions::with_real_nodes`]: reachable from the nodes, a scheduler, the hostpath
    /// provisioner and NodeRestriction) and waits until they are Ready.
    pub async fn start(cluster: &ControlPlane, options: RealNodeOptions) -> Result<Self> {
        let missing = missing_parts();
        if !missing.is_empty() {
            return Err(Error::MissingPart {
                part: missing.join(", "),
                hint: "see the README's real-node section".into(),
            });
        }
        // Taken with the test's turn, or else here.
        let lock = match turns::real_node_lock() {
            Some(lock) => lock,
            None => tokio::task::spawn_blocking(turns::lock_machine)
                .await
                .map_err(|e| Error::Io {
                    context: "waiting for the real-node lock".into(),
                    source: std::io::Error::other(e),
                })??,
        };
        let locked_at = std::time::Instant::now();
        let kube_proxy_binary = locate(Binary::KubeProxy).ok();
        host::sweep(&host::stale_folders(), kube_proxy_binary.as_deref());
        let registry = tokio::task::spawn_blocking(registry::Registry::shared)
            .await
            .map_err(|e| Error::Io {
                context: "building the test images".into(),
                source: std::io::Error::other(e),
            })??;
        let host_state = host::prepare()?;
        let mut folders = Vec::new();
        let started = Self::start_parts(cluster, &options, registry, &mut folders).await;
        match started {
            Ok((nodes, dns)) => {
                let mut real = Self {
                    policy: None,
                    nodes,
                    _dns: dns,
                    host: host_state,
                    folders,
                    _lock: lock,
                    locked_at,
                };
                if options.network_policies {
                    let nodes = real.nodes.iter().map(|n| policy::PolicyNode {
                        name: n.name().to_owned(),
                        netns: n.netns_path(),
                    });
                    real.policy = Some(policy::Enforcer::start(cluster.client(), nodes.collect()).await?);
                }
                real.wait_ready(&cluster.client()).await?;
                Ok(real)
            }
            Err(error) => {
                host::sweep(&folders, kube_proxy_binary.as_deref());
                host::restore(&host_state);
                Err(error)
            }
        }
    }

    async fn start_parts(
        cluster: &ControlPlane,
        options: &RealNodeOptions,
        registry: &registry::Registry,
        folders: &mut Vec<PathBuf>,
    ) -> Result<(Vec<RealNode>, dns::ClusterDns)> {
        let client = cluster.client();
        if !cluster.apiserver().is_reachable_from_nodes() {
            return Err(Error::MissingPart {
                part: "a super cluster the nodes can reach".into(),
                hint: "start it with ControlPlaneOptions::with_real_nodes()".into(),
            });
        }
        let names: Vec<String> = (0..options.node_count)
            .map(|i| format!("{}{i}", options.name_prefix))
            .collect();
        host::create_host_bridge()?;
        for index in 0..names.len() {
            host::create_node_network(index)?;
        }
        host::route_services(cluster.apiserver().service_cidr(), 0)?;
        prepare_cluster(&client, &options.kubelet_api_users).await?;
        let dns = dns::ClusterDns::start(client.clone(), &[host::HOST_DNS_IP.to_owned()]).await?;
        let dns_ip =
            dns::dns_cluster_ip(cluster.apiserver().service_cidr()).ok_or_else(|| Error::MissingPart {
                part: format!(
                    "a DNS address in the service range {}",
                    cluster.apiserver().service_cidr()
                ),
                hint: "an IPv4 service range".into(),
            })?;
        dns::apply_dns_service(&client, &dns_ip, host::HOST_DNS_IP).await?;
        let settings = node::NodeSettings {
            apiserver: cluster.apiserver(),
            cluster_dns: dns_ip,
            registry_url: registry.node_url(),
            extra_client_cas: options.extra_client_cas.clone(),
        };
        let mut nodes = Vec::new();
        for (index, name) in names.iter().enumerate() {
            let node = RealNode::start(index, name, &settings).await?;
            folders.push(node.dir().to_path_buf());
            nodes.push(node);
        }
        Ok((nodes, dns))
    }

    /// Waits until every node reports Ready, failing early with its kubelet's log when one exits.
    pub async fn wait_ready(&self, client: &Client) -> Result<()> {
        let api: Api<Node> = Api::all(client.clone());
        for node in &self.nodes {
            let name = node.name().to_owned();
            let found = wait::until_true(
                Duration::from_secs(120),
                &format!("real node {name} Ready"),
                || {
                    let api = api.clone();
                    let name = name.clone();
                    async move { api.get(&name).await.ok().is_some_and(|n| node_is_ready(&n)) }
                },
            )
            .await;
            if let Err(error) = found {
                return Err(node.kubelet().not_ready(error.to_string()));
            }
        }
        Ok(())
    }

    /// The nodes' names.
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name().to_owned()).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RealNode] {
        &self.nodes
    }

    /// Makes TCP port `port` of node `index`'s address lead to `target` on the host, for a component that
    /// runs in this process but must answer on a node's address (vn-agent, whose address tenants'
    /// apiservers take from the vNode): DNAT in the node's network namespace, and SNAT to the node's address
    /// so that the answer comes back through it. The rules go with the node's namespace.
    pub fn forward_to_host(&self, index: usize, port: u16, target: std::net::SocketAddr) -> Result<()> {
        let node_ip = host::node_ip(index);
        let netns = format!("--net={}", host::netns_path(index).display());
        let nsenter = host::find_tool("nsenter").ok_or_else(|| Error::MissingPart {
            part: "nsenter".into(),
            hint: "apt-get install util-linux".into(),
        })?;
        let iptables = host::find_tool("iptables").ok_or_else(|| Error::MissingPart {
            part: "iptables".into(),
            hint: "apt-get install iptables".into(),
        })?;
        let (nsenter, iptables) = (nsenter.display().to_string(), iptables.display().to_string());
        let port = port.to_string();
        let destination = target.to_string();
        let (target_ip, target_port) = (target.ip().to_string(), target.port().to_string());
        let rules: [Vec<&str>; 2] = [
            vec![
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-d",
                &node_ip,
                "-p",
                "tcp",
                "--dport",
                &port,
                "-j",
                "DNAT",
                "--to-destination",
                &destination,
            ],
            vec![
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-d",
                &target_ip,
                "-p",
                "tcp",
                "--dport",
                &target_port,
                "-j",
                "SNAT",
                "--to-source",
                &node_ip,
            ],
        ];
        for rule in rules {
            let mut args = vec![netns.as_str(), "--", iptables.as_str(), "-w"];
            args.extend(rule);
            host::run("forwarding a node's port to the host", &nsenter, &args)?;
        }
        Ok(())
    }

    /// The control-plane images that were built from the harness's binaries.
    pub fn control_plane_images() -> Result<ControlPlaneImages> {
        Ok(registry::Registry::shared()?.versions())
    }

    /// Serves an image of a program built on this machine under `reference` to every node (see
    /// [`images::ImageStore::add_program`]); blocks while it writes the layer.
    pub fn add_program_image(reference: &str, program: &std::path::Path) -> Result<()> {
        registry::Registry::shared()?.add_program(reference, program)
    }

    /// Serves a [`images::DistrolessImage`] to every node; blocks while it writes the layer. Its size, or
    /// `None` when it was served already.
    pub fn add_distroless_image(image: images::DistrolessImage) -> Result<Option<u64>> {
        registry::Registry::shared()?.add_distroless(image)
    }

    /// Serves a [`LocalImage`] to every node; blocks while it writes the layer.
    pub fn add_local_image(image: LocalImage) -> Result<()> {
        registry::Registry::shared()?.add_local(image)
    }

    /// Serves the image `existing` under `name` too; false when no image is known as `existing`.
    pub fn alias_image(existing: &str, name: &str) -> Result<bool> {
        Ok(registry::Registry::shared()?.alias(existing, name))
    }

    /// The last lines of every node daemon's log, for a failure report.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            for process in [node.kubelet(), node.containerd(), node.kube_proxy()] {
                text.push_str(&format!(
                    "--- {} ---\n{}\n",
                    process.name(),
                    process.log_tail(lines)
                ));
            }
        }
        text
    }
}

/// The namespaces of the pods whose containers run on `nodes`, as containerd's runtime (runc) sees them:
/// one entry per running container, read from the CRI annotations of each container's bundle.
pub fn running_pod_namespaces(nodes: &RealNodes) -> Result<Vec<String>> {
    let runc = host::find_tool("runc").ok_or_else(|| Error::MissingPart {
        part: "runc".into(),
        hint: "apt-get install runc".into(),
    })?;
    let mut namespaces = Vec::new();
    for node in &nodes.nodes {
        let root = node.dir().join("containerd/runc/k8s.io");
        if !root.exists() {
            continue;
        }
        let listed = host::run(
            "listing containers",
            &runc.display().to_string(),
            &["--root", &root.display().to_string(), "list", "--format", "json"],
        )?;
        let containers: Vec<serde_json::Value> = serde_json::from_str(listed.trim()).unwrap_or_default();
        for container in containers.iter().filter(|c| c["status"] == "running") {
            let Some(bundle) = container["bundle"].as_str() else {
                continue;
            };
            let Ok(config) = std::fs::read(std::path::Path::new(bundle).join("config.json")) else {
                continue;
            };
            let config: serde_json::Value = serde_json::from_slice(&config).unwrap_or_default();
            if let Some(namespace) = config["annotations"]["io.kubernetes.cri.sandbox-namespace"].as_str() {
                namespaces.push(namespace.to_owned());
            }
        }
    }
    Ok(namespaces)
}

impl Drop for RealNodes {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails(15));
        }
        self.policy.take();
        for node in &mut self.nodes {
            node.stop();
        }
        host::sweep(&self.folders, locate(Binary::KubeProxy).ok().as_deref());
        host::restore(&self.host);
        turns::log_lock(&format!(
            "held the machine-wide lock for {:.1} s",
            self.locked_at.elapsed().as_secs_f64()
        ));
    }
}

/// What the super cluster needs for real nodes: a default StorageClass for the hostpath provisioner, and
/// the kubelet API for the given users.
async fn prepare_cluster(client: &Client, kubelet_api_users: &[String]) -> Result<()> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(STORAGE_CLASS.to_owned()),
            annotations: Some(
                [(
                    "storageclass.kubernetes.io/is-default-class".to_owned(),
                    "true".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        provisioner: "kubernetes.io/host-path".to_owned(),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("Immediate".to_owned()),
        ..Default::default()
    };
    Api::<StorageClass>::all(client.clone())
        .patch(STORAGE_CLASS, &params, &Patch::Apply(&class))
        .await
        .map_err(Error::kube("creating the default StorageClass"))?;
    if !kubelet_api_users.is_empty() {
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some("e2e-kubelet-api".to_owned()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".to_owned(),
                kind: "ClusterRole".to_owned(),
                name: "system:kubelet-api-admin".to_owned(),
            },
            subjects: Some(
                kubelet_api_users
                    .iter()
                    .map(|user| Subject {
                        api_group: Some("rbac.authorization.k8s.io".to_owned()),
                        kind: "User".to_owned(),
                        name: user.clone(),
                        namespace: None,
                    })
                    .collect(),
            ),
        };
        Api::<ClusterRoleBinding>::all(client.clone())
            .patch("e2e-kubelet-api", &params, &Patch::Apply(&binding))
            .await
            .map_err(Error::kube("granting the kubelet API"))?;
    }
    Ok(())
}
