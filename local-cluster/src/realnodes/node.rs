//! One real node: a network namespace of its own (see [`host`]), a containerd of its own (config, root,
//! state and socket in the node's folder), the CNI bridge of the node, a kubelet registered with its own
//! client certificate and serving its API with a certificate the super cluster's CA signed for the node's
//! address, and the node's kube-proxy.

use std::{path::PathBuf, time::Duration};

use super::{
    host::{self, CNI_NETWORK, find_tool},
    images::PAUSE_IMAGE,
};
use crate::{
    ApiServer, Binary, Error, ManagedProcess, Result, WorkDir, kubeconfig_yaml, locate,
    pki::{CertificateAuthority, Usage},
};

/// Where kubelets and containerd keep container logs.
const POD_LOGS: &str = "/var/log/pods";
/// Where every kubelet puts its device-plugin socket, whatever its --root-dir.
const DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";

/// The kubelet's port on the node's address.
pub const KUBELET_PORT: u16 = 10250;

/// These VMs refuse to lower `oom_score_adj` (writing a negative value fails with EIO), and the kubelet asks
/// for -998 on pod sandboxes, so runc fails with "can't get final child's PID from pipe: EOF". This wrapper,
/// the runtime's `BinaryName`, raises `process.oomScoreAdj` in the bundle's config.json to at least 0 before
/// calling runc. It belongs to the test harness only: a real node has no such restriction.
const RUNC_WRAPPER: &str = r#"#!/bin/sh
bundle=""
previous=""
for argument in "$@"; do
  case "$previous" in --bundle|-b) bundle="$argument" ;; esac
  case "$argument" in --bundle=*) bundle="${argument#--bundle=}" ;; esac
  previous="$argument"
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  sed -i 's/"oomScoreAdj":-[0-9]*/"oomScoreAdj":0/g' "$bundle/config.json"
fi
exec RUNC "$@"
"#;

/// A running node. Dropping it kills its kubelet and containerd; the containers are removed by the
/// cluster's teardown (see [`host::sweep`]).
pub struct RealNode {
    name: String,
    index: usize,
    kubelet: ManagedProcess,
    kube_proxy: ManagedProcess,
    containerd: ManagedProcess,
    dir: WorkDir,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What every node of a cluster shares.
pub struct NodeSettings<'a> {
    /// The super cluster's apiserver (it must be reachable from the nodes:
    /// [`crate::ApiServerOptions::reachable_from_nodes`]).
    pub apiserver: &'a ApiServer,
    /// The registry every registry name is mirrored to, as the nodes reach it.
    pub registry_url: String,
    /// CAs (PEM) whose client certificates the kubelet accepts, besides the super cluster's.
    pub extra_client_cas: Vec<String>,
    /// The cluster IP of the super cluster's DNS Service, the pods' nameserver.
    pub cluster_dns: String,
}

impl RealNode {
    /// Starts containerd, the kubelet and kube-proxy of node `index` called `name` in the node's network
    /// namespace, which must exist ([`host::create_node_network`]).
    pub async fn start(index: usize, name: &str, settings: &NodeSettings<'_>) -> Result<Self> {
        let dir = WorkDir::new(&format!("realnode-{name}"))?;
        let containerd = start_containerd(&dir, index, name, &settings.registry_url).await?;
        let containerd_pid = containerd
            .pid()
            .ok_or_else(|| containerd.not_ready("no process"))?;
        let kubelet = start_kubelet(&dir, index, name, settings, containerd_pid)?;
        let kube_proxy = start_kube_proxy(settings.apiserver, index, name, &dir)?;
        Ok(Self {
            name: name.to_owned(),
            index,
            kubelet,
            kube_proxy,
            containerd,
            dir,
        })
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address (InternalIP), on its own network namespace's `eth0`.
    pub fn ip(&self) -> String {
        host::node_ip(self.index)
    }

    /// The node's index (its address, subnet and network namespace follow from it).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The node's network namespace, for `nsenter --net=`.
    pub fn netns_path(&self) -> PathBuf {
        host::netns_path(self.index)
    }

    /// containerd's socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// The node's folder.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The kubelet process, for logs.
    pub fn kubelet(&self) -> &ManagedProcess {
        &self.kubelet
    }

    /// containerd, for logs.
    pub fn containerd(&self) -> &ManagedProcess {
        &self.containerd
    }

    /// The node's kube-proxy, for logs.
    pub fn kube_proxy(&self) -> &ManagedProcess {
        &self.kube_proxy
    }

    /// Whether the kubelet, containerd and kube-proxy still run.
    pub fn is_running(&mut self) -> bool {
        self.kubelet.is_running() && self.containerd.is_running() && self.kube_proxy.is_running()
    }

    /// Stops the kubelet, kube-proxy and containerd (containers keep running until the sweep).
    pub fn stop(&mut self) {
        self.kubelet.stop();
        self.kube_proxy.stop();
        self.containerd.stop();
    }
}

async fn start_containerd(
    dir: &WorkDir,
    index: usize,
    name: &str,
    registry_url: &str,
) -> Result<ManagedProcess> {
    let containerd = find_tool("containerd").ok_or_else(|| missing("containerd"))?;
    let runc = find_tool("runc").ok_or_else(|| missing("runc"))?;
    let wrapper = dir.write(
        "runc-wrapper",
        RUNC_WRAPPER.replace("RUNC", &runc.display().to_string()),
    )?;
    set_executable(&wrapper)?;
    let cni_dir = dir.join("cni");
    std::fs::create_dir_all(&cni_dir).map_err(Error::io("creating the CNI folder"))?;
    let conflist = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": host::POD_BRIDGE,
                "isGateway": true,
                // Nothing leaves the machine, so nothing needs masquerading.
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": host::node_subnet(index), "gateway": host::pod_gateway(index) }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": dir.join("ipam"),
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    });
    std::fs::write(
        cni_dir.join("10-vc-e2e.conflist"),
        serde_json::to_vec_pretty(&conflist).expect("JSON"),
    )
    .map_err(Error::io("writing the CNI configuration"))?;
    let socket = dir.join("containerd.sock");
    let mirrors: String = [
        "docker.io",
        "registry.k8s.io",
        "k8s.gcr.io",
        "quay.io",
        "ghcr.io",
        super::LOCAL_REGISTRY,
        // Any other registry a chart's values name (registry.example.com/...): the harness's registry
        // serves what it has under whatever name it is asked for.
        "*",
    ]
        .iter()
        .map(|registry| {
            format!(
                "[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"{registry}\"]\n  endpoint = [\"{registry_url}\"]\n"
            )
        })
        .collect();
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  enable_selinux = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni}"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "{wrapper}"
  Root = "{runc_root}"
  SystemdCgroup = false

{mirrors}"#,
        root = dir.join("containerd/root").display(),
        state = dir.join("containerd/state").display(),
        socket = socket.display(),
        opt = dir.join("containerd/opt").display(),
        cni = cni_dir.display(),
        cni_bin = crate::cni_plugin_dir(super::CNI_PLUGINS)
            .unwrap_or_else(|| std::path::PathBuf::from("/usr/lib/cni"))
            .display(),
        wrapper = wrapper.display(),
        runc_root = dir.join("containerd/runc").display(),
    );
    let config_path = dir.write("containerd.toml", config)?;
    // Kubelets remove the log folders in /var/log/pods of pods they do not know, and where the path is
    // configurable (podLogsDir) depends on the version: each node gets a mount namespace of its own (a
    // slave of the host's) with its own folder over /var/log/pods. containerd writes the logs there and the
    // kubelet, which joins the namespace, reads them. Mounts made inside vanish with the namespace.
    // The device-plugin socket folder is fixed in every kubelet version (not under --root-dir): two kubelets
    // starting together remove each other's socket and one fails with "address already in use", so each
    // node gets its own folder there too.
    let pod_logs = dir.join("pod-logs");
    std::fs::create_dir_all(&pod_logs).map_err(Error::io("creating the node's pod log folder"))?;
    std::fs::create_dir_all(POD_LOGS).map_err(Error::io(format!("creating {POD_LOGS}")))?;
    let device_plugins = dir.join("device-plugins");
    std::fs::create_dir_all(&device_plugins)
        .map_err(Error::io("creating the node's device-plugin folder"))?;
    std::fs::create_dir_all(DEVICE_PLUGINS).map_err(Error::io(format!("creating {DEVICE_PLUGINS}")))?;
    let unshare = find_tool("unshare").ok_or_else(|| missing("unshare"))?;
    let nsenter = find_tool("nsenter").ok_or_else(|| missing("nsenter"))?;
    // In the node's network namespace: the CNI plugins it runs make the pod bridge and the pods' links
    // there, and host-network containers share it.
    let mut process = ManagedProcess::start(
        &format!("containerd {name}"),
        &nsenter,
        vec![
            format!("--net={}", host::netns_path(index).display()),
            "--".to_owned(),
            unshare.display().to_string(),
            "--mount".to_owned(),
            "--propagation".to_owned(),
            "slave".to_owned(),
            "--".to_owned(),
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            format!(
                "mount --bind \"$1\" {POD_LOGS} && mount --bind \"$4\" {DEVICE_PLUGINS} && exec \"$2\" --config=\"$3\""
            ),
            "sh".to_owned(),
            pod_logs.display().to_string(),
            containerd.display().to_string(),
            config_path.display().to_string(),
            device_plugins.display().to_string(),
        ],
        dir.join("containerd.log"),
    )?;
    let socket_probe = socket.clone();
    process
        .wait_ready(Duration::from_secs(30), move || {
            let socket = socket_probe.clone();
            async move { tokio::net::UnixStream::connect(&socket).await.is_ok() }
        })
        .await?;
    Ok(process)
}

fn start_kubelet(
    dir: &WorkDir,
    index: usize,
    name: &str,
    settings: &NodeSettings<'_>,
    containerd_pid: u32,
) -> Result<ManagedProcess> {
    let kubelet = locate(Binary::Kubelet)?;
    let nsenter = find_tool("nsenter").ok_or_else(|| missing("nsenter"))?;
    let ca: &CertificateAuthority = settings.apiserver.ca();
    let ip = host::node_ip(index);
    let client = ca.issue(
        &format!("system:node:{name}"),
        &["system:nodes"],
        &[],
        Usage::Client,
    )?;
    // Every address of the node's own network namespace, as a kubelet binds by default: vn-agent on the
    // host network may call it at https://localhost:10250.
    let serving = ca.issue(
        name,
        &[],
        &[ip.as_str(), name, "localhost", "127.0.0.1"],
        Usage::Server,
    )?;
    let kubeconfig = dir.write(
        "kubelet.kubeconfig",
        kubeconfig_yaml(name, &settings.apiserver.node_url(), ca.cert_pem(), &client),
    )?;
    let mut client_cas = ca.cert_pem().to_owned();
    for extra in &settings.extra_client_cas {
        client_cas.push('\n');
        client_cas.push_str(extra);
    }
    let client_ca = dir.write("kubelet-client-ca.crt", client_cas)?;
    let cert = dir.write("kubelet.crt", &serving.cert_pem)?;
    let key = dir.write("kubelet.key", &serving.key_pem)?;
    let config = format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: {KUBELET_PORT}
readOnlyPort: 0
healthzPort: 0
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
    cacheTTL: 10s
  x509:
    clientCAFile: {client_ca}
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 10s
    cacheUnauthorizedTTL: 5s
# Settings these VMs need: no systemd, no swap accounting, cgroup v1 without QoS levels.
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
# kube-proxy owns the host's iptables rules; the kubelet's own chains would outlive the test.
makeIPTablesUtilChains: false
clusterDNS:
- {cluster_dns}
clusterDomain: {domain}
resolvConf: /etc/resolv.conf
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 10s
syncFrequency: 10s
volumePluginDir: {plugins}
maxPods: 110
"#,
        cert = cert.display(),
        key = key.display(),
        client_ca = client_ca.display(),
        domain = super::dns::CLUSTER_DOMAIN,
        cluster_dns = settings.cluster_dns,
        plugins = dir.join("volume-plugins").display(),
    );
    let config_path = dir.write("kubelet.yaml", config)?;
    let args = vec![
        // The node's mount namespace, which containerd made (see start_containerd), and its network
        // namespace.
        format!("--mount=/proc/{containerd_pid}/ns/mnt"),
        format!("--net=/proc/{containerd_pid}/ns/net"),
        "--".to_owned(),
        kubelet.display().to_string(),
        format!("--config={}", config_path.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!(
            "--container-runtime-endpoint=unix://{}",
            dir.join("containerd.sock").display()
        ),
        format!("--hostname-override={name}"),
        format!("--node-ip={ip}"),
        format!("--root-dir={}", dir.join("kubelet").display()),
        format!("--cert-dir={}", dir.join("kubelet-pki").display()),
        format!(
            "--node-labels=e2e.virtualcluster.io/real-node=true,e2e.virtualcluster.io/node-index={index}"
        ),
        "--v=2".to_owned(),
    ];
    ManagedProcess::start(
        &format!("kubelet {name}"),
        &nsenter,
        args,
        dir.join("kubelet.log"),
    )
}

/// The kube-proxy of node `index`, in the node's network namespace: its Services' rules, NodePorts and
/// cluster IPs for the node's pods, host-network pods and the node itself.
fn start_kube_proxy(
    apiserver: &ApiServer,
    index: usize,
    node_name: &str,
    dir: &WorkDir,
) -> Result<ManagedProcess> {
    let kube_proxy = locate(Binary::KubeProxy)?;
    let nsenter = find_tool("nsenter").ok_or_else(|| missing("nsenter"))?;
    let ca = apiserver.ca();
    let client = ca.issue("system:kube-proxy", &[], &[], Usage::Client)?;
    let kubeconfig = dir.write(
        "kube-proxy.kubeconfig",
        kubeconfig_yaml("kube-proxy", &apiserver.node_url(), ca.cert_pem(), &client),
    )?;
    let config = format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
mode: iptables
# Traffic to a cluster IP from outside the pod range (the host, through the route to node 0) is
# masqueraded, so that its answer comes back through this node.
clusterCIDR: {pods}
hostnameOverride: {node_name}
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the host's conntrack sysctls as they are.
conntrack:
  maxPerCore: 0
  min: 0
iptables:
  minSyncPeriod: 0s
  syncPeriod: 10s
"#,
        kubeconfig = kubeconfig.display(),
        pods = host::POD_CIDR,
    );
    let config_path = dir.write("kube-proxy.yaml", config)?;
    ManagedProcess::start(
        &format!("kube-proxy {node_name}"),
        &nsenter,
        vec![
            format!("--net={}", host::netns_path(index).display()),
            "--".to_owned(),
            kube_proxy.display().to_string(),
            format!("--config={}", config_path.display()),
            "--v=2".to_owned(),
        ],
        dir.join("kube-proxy.log"),
    )
}

fn set_executable(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(Error::io(format!("making {} executable", path.display())))
}

fn missing(tool: &str) -> Error {
    Error::MissingPart {
        part: tool.to_owned(),
        hint:
            "apt-get install containerd runc containernetworking-plugins iptables busybox-static dnsmasq-base"
                .into(),
    }
}
