//! Flags of the syncer.

#[cfg(test)]
mod command_line;
pub mod custom_kinds;

use std::time::Duration;
use vc_runtime::limits::ResponseLimits;

use crate::engine::budget::CacheLimits;
use ipnet::IpNet;

/// Default of `--super-write-slots`: off (unbounded). 8 slots measured worse than none (docs/syncer.md, "Fair super writes").
pub const DEFAULT_SUPER_WRITE_SLOTS: usize = 0;

/// What the super cluster gets of a tenant's ExternalName Service. Either way the target must be a host
/// name (`crds::naming::external_name_target`); otherwise nothing is synced and the tenant Service gets a
/// Warning `ExternalNameRefused` event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ExternalNameServices {
    /// A stub nothing in the super cluster follows: a selector-less headless Service without endpoints,
    /// with the target in an annotation only vc-dns reads, so the name is a CNAME inside the tenant's pods
    /// and nowhere else. Super-cluster ingress controllers and gateways follow real ExternalName Services
    /// with their own network position, so a real one would let a tenant aim them at any name, the super
    /// apiserver and other namespaces' Services included (CVE-2021-25740). `refused` is the old name.
    #[default]
    #[value(name = "dns-only", alias = "refused")]
    DnsOnly,
    /// A real ExternalName Service, which super-cluster controllers follow. `allowed` is the old name.
    #[value(name = "synced", alias = "allowed")]
    Synced,
}

/// The NetworkPolicy the syncer keeps in every super namespace of a tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkIsolation {
    /// Whether it is kept at all (when not, existing ones are deleted).
    pub enabled: bool,
    /// Namespaces (label `key=value`) whose pods may reach every tenant's pods.
    pub allow_namespaces: Vec<(String, String)>,
    /// Addresses that may reach every tenant's pods.
    pub allow_cidrs: Vec<IpNet>,
    /// The super cluster's own DNS Service (`namespace`, `name`), which tenants' pods may not reach: its
    /// records name every tenant's Services. Its namespace's pods are out of their reach too.
    pub platform_dns: Option<(String, String)>,
    /// Addresses tenants' pods may not reach (a cloud's instance metadata service, the platform's own).
    pub deny_egress: Vec<IpNet>,
}

impl NetworkIsolation {
    /// Whether tenants' pods' egress is isolated too.
    pub fn isolates_egress(&self) -> bool {
        self.platform_dns.is_some() || !self.deny_egress.is_empty()
    }
}

impl Default for NetworkIsolation {
    fn default() -> Self {
        Self {
            enabled: true,
            allow_namespaces: Vec::new(),
            allow_cidrs: Vec::new(),
            platform_dns: Some(("kube-system".to_owned(), "kube-dns".to_owned())),
            deny_egress: vec![INSTANCE_METADATA.parse().expect("a CIDR")],
        }
    }
}

fn cidrs(flag: &str, values: Vec<String>) -> Result<Vec<IpNet>, String> {
    values
        .into_iter()
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.trim()
                .parse::<IpNet>()
                .map(|net| net.trunc())
                .map_err(|e| format!("{flag}: {v:?} is not a CIDR ({e})"))
        })
        .collect()
}

/// Where vNodes say their kubelet (vn-agent) is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VNodeAddresses {
    /// The super node's own addresses (vn-agent runs with hostNetwork).
    Node,
    /// The ClusterIP of this vn-agent Service (`namespace/name`), for every vNode.
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
    },
}

/// The instance metadata service of the public clouds, which hands out the node's own credentials.
pub const INSTANCE_METADATA: &str = "169.254.169.254/32";

/// Which super nodes a tenant sees as vNodes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum VNodeMode {
    /// Only those its pods run on, unschedulable, removed a grace period after its last pod left (the
    /// original project's behaviour: fewest objects).
    #[default]
    Pods,
    /// Every super node its pods may use (each NoSchedule/NoExecute taint one the tenant may tolerate),
    /// from attach on, schedulable: a tenant sees ready nodes before it runs anything, and DaemonSets get
    /// one pod per node.
    Usable,
    /// The usable super nodes that carry these labels (`key=value`, all of them).
    Selected(Vec<(String, String)>),
}

impl std::str::FromStr for VNodeMode {
    type Err = String;

    /// `pods`, `usable`, or `selected:key=value[,key=value...]`.
    fn from_str(value: &str) -> Result<Self, String> {
        vnode_mode(value)
    }
}

impl std::fmt::Display for VNodeMode {
    /// As the flag takes it, so that it round-trips through [`std::str::FromStr`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pods => f.write_str("pods"),
            Self::Usable => f.write_str("usable"),
            Self::Selected(labels) => {
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "selected:{}", labels.join(","))
            }
        }
    }
}

fn vnode_mode(value: &str) -> Result<VNodeMode, String> {
    match value.trim() {
        "pods" => Ok(VNodeMode::Pods),
        "usable" => Ok(VNodeMode::Usable),
        other => {
            let Some(labels) = other.strip_prefix("selected:") else {
                return Err(format!(
                    "--vnode-mode must be pods, usable or selected:key=value[,key=value], got {other:?}"
                ));
            };
            let labels = labels
                .split(',')
                .map(|pair| match pair.split_once('=') {
                    Some((key, value)) if !key.trim().is_empty() => {
                        Ok((key.trim().to_owned(), value.trim().to_owned()))
                    }
                    _ => Err(format!(
                        "--vnode-mode selected: {pair:?} is not a key=value label"
                    )),
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(VNodeMode::Selected(labels))
        }
    }
}

/// The tenant DNS Service (vc-dns) pods are pointed at, and its cluster IP once read.
#[derive(Clone, Debug)]
pub struct TenantDnsService {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// Its cluster IP and when it was read (re-read after a minute, so a recreated Service is followed).
    pub cached: std::sync::Arc<std::sync::Mutex<Option<(String, std::time::Instant)>>>,
}

impl TenantDnsService {
    /// The Service `namespace/name`, not yet read.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            cached: Default::default(),
        }
    }
}

impl PartialEq for TenantDnsService {
    fn eq(&self, other: &Self) -> bool {
        self.namespace == other.namespace && self.name == other.name
    }
}

/// Every flag of the syncer binary: sync settings, leader election, admin endpoint, logging.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "syncer",
    version,
    about = "Syncs every tenant master with the super cluster"
)]
pub struct Args {
    /// What and how to sync.
    #[command(flatten)]
    pub syncer: SyncerArgs,
    /// Leader election.
    #[command(flatten)]
    pub leader: vc_runtime::leader::LeaderElectionArgs,
    /// Address of the /metrics, /healthz and /readyz endpoint.
    #[arg(long, env = "ADMIN_ADDRESS", default_value = "0.0.0.0:8080")]
    pub admin_address: std::net::SocketAddr,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = vc_runtime::logging::LogFormat::Text)]
    pub log_format: vc_runtime::logging::LogFormat,
}

/// Command-line flags of the syncer.
#[derive(Clone, Debug, clap::Args)]
pub struct SyncerArgs {
    /// Port vNodes advertise as their kubelet port: vn-agent's port.
    #[arg(long, env = "VN_AGENT_PORT", default_value_t = crds::wellknown::DEFAULT_VN_AGENT_PORT)]
    pub vn_agent_port: u16,
    /// Advertise this vn-agent Service's ClusterIP (`namespace/name`) as every vNode's address instead of
    /// the super node's addresses.
    #[arg(long)]
    pub vn_agent_service: Option<String>,
    /// Seconds a vNode stays after its tenant's last pod left the node.
    #[arg(long, default_value_t = 120)]
    pub vnode_grace_seconds: u64,
    /// Which super nodes tenants see: `pods` (those their pods run on, unschedulable), `usable` (every
    /// node their pods may use, from the start, schedulable) or `selected:key=value[,...]` (the usable
    /// nodes with those labels).
    #[arg(long, env = "VNODE_MODE", default_value = "pods")]
    pub vnode_mode: String,
    /// Seconds between patrols that compare tenant and super state and repair differences.
    #[arg(long, default_value_t = 60)]
    pub patrol_interval_seconds: u64,
    /// Seconds between checks that an attached tenant's apiserver still answers.
    #[arg(long, default_value_t = 30)]
    pub tenant_health_period_seconds: u64,
    /// Reach tenant apiservers over HTTP/2 when they offer it (every kube-apiserver does): a tenant's
    /// watches and requests then share one TLS connection. `false`: HTTP/1.1, one connection per watch.
    #[arg(long, env = "TENANT_HTTP2", default_value_t = true, action = clap::ArgAction::Set)]
    pub tenant_http2: bool,
    /// Reach the super cluster's apiserver over one HTTP/2 connection: less memory (one connection instead
    /// of one per request in flight), but next to a greedy tenant's burst the other tenants' writes waited
    /// longer on it (docs/syncer.md, "Connections and queue room"), so kube's HTTP/1.1 client stays the
    /// default.
    #[arg(long, env = "SUPER_HTTP2", default_value_t = false, action = clap::ArgAction::Set)]
    pub super_http2: bool,
    /// Workers syncing tenant objects down.
    #[arg(long, default_value_t = 32)]
    pub downward_workers: usize,
    /// Workers syncing status up. Many, because an upward sync waits on the tenant's own apiserver (a
    /// binding, a TokenRequest, a status write, about half a second each when its core is busy) and each
    /// tenant may hold only its share of them; they are tasks, not threads. 32 left a 10-tenant burst's
    /// status 12–21 s behind in the queue (docs/syncer.md, Performance).
    #[arg(long, default_value_t = 256)]
    pub upward_workers: usize,
    /// Super-cluster writes in flight at once, shared among tenants by weight: a burst then waits in the
    /// syncer, where other tenants' writes overtake it, rather than in the super apiserver's queue. `0`
    /// sets no bound.
    #[arg(long, env = "SUPER_WRITE_SLOTS", default_value_t = DEFAULT_SUPER_WRITE_SLOTS)]
    pub super_write_slots: usize,
    /// Also sync Ingresses down.
    #[arg(long, default_value_t = false)]
    pub sync_ingresses: bool,
    /// Copy tenants' PodDisruptionBudgets to the super cluster, so that evictions there (node drains)
    /// respect them. `false` keeps them in the tenants (and removes the copies): a tenant can then not hold
    /// up a drain with a budget that allows no disruption.
    #[arg(long, env = "SYNC_DISRUPTION_BUDGETS", default_value_t = true, action = clap::ArgAction::Set)]
    pub sync_disruption_budgets: bool,
    /// `ndots` of the DNS config given to tenant pods.
    #[arg(long, default_value_t = 5)]
    pub dns_ndots: u32,
    /// The tenant DNS Service (`namespace/name`, vc-dns): tenant pods with `ClusterFirst` DNS get its
    /// cluster IP as their nameserver. Without it they get the super cluster IP of their tenant's own
    /// `kube-system/kube-dns` Service, when the tenant has one.
    #[arg(long, env = "TENANT_DNS_SERVICE")]
    pub tenant_dns_service: Option<String>,
    /// Nameservers (IP addresses, at most 3) for tenant pods that opt out of the DNS rewrite
    /// (`tenancy.x-k8s.io/disable.dnsPolicyMutation`) but ask for cluster DNS: they get these, with their
    /// own `dnsConfig`, instead of the super cluster's DNS. Empty: the node's resolver (`dnsPolicy:
    /// Default`).
    #[arg(long, env = "POD_UPSTREAM_NAMESERVERS", value_delimiter = ',')]
    pub pod_upstream_nameservers: Vec<String>,
    /// Lifetime of the service-account tokens minted for tenant pods (refreshed at 80%).
    #[arg(long, default_value_t = 3600)]
    pub token_ttl_seconds: i64,
    /// Most pods whose tokens share one token Secret of a super namespace (1-256): every kubelet running
    /// one of them receives the whole Secret on each write.
    #[arg(long, env = "PODS_PER_TOKEN_SECRET", default_value_t = 32)]
    pub pods_per_token_secret: usize,
    /// Label and annotation prefixes that are super-owned for every tenant, besides each VirtualCluster's
    /// `opaqueMetaPrefixes`.
    #[arg(long, env = "OPAQUE_META_PREFIXES", value_delimiter = ',')]
    pub opaque_meta_prefixes: Vec<String>,
    /// Label and annotation keys (or prefixes ending in `/`) copied from tenant objects onto their super
    /// copies as they are, besides keys without a prefix and the built-in list (`app.kubernetes.io/`, the
    /// workload controllers' pod labels, ...). Other tenant labels are copied encoded (under
    /// `label.tenancy.x-k8s.io`, where the tenant's own selectors still find them), other annotations not
    /// at all. Naming a platform-owned prefix (e.g. `cert-manager.io/`) itself lets it through.
    #[arg(long, env = "COPIED_META_KEYS", value_delimiter = ',')]
    pub copied_meta_keys: Vec<String>,
    /// Namespace label keys (or prefixes ending in `/`) copied onto super namespaces as they are. Every
    /// other tenant namespace label is copied encoded, so that admission webhooks, policy engines, meshes
    /// and NetworkPolicies of the platform that select namespaces by label never select a tenant's.
    #[arg(long, env = "COPIED_NAMESPACE_LABEL_KEYS", value_delimiter = ',')]
    pub copied_namespace_label_keys: Vec<String>,
    /// Most objects the syncer caches of one tenant (over every kind); a tenant with more is detached with
    /// `TenantLimitExceeded` until it fits.
    #[arg(long, env = "TENANT_CACHE_MAX_OBJECTS", default_value_t = CacheLimits::default().max_objects)]
    pub tenant_cache_max_objects: u64,
    /// Most bytes (objects' JSON length) the syncer caches of one tenant; a tenant with more is detached
    /// with `TenantLimitExceeded` until it fits.
    #[arg(long, env = "TENANT_CACHE_MAX_BYTES", default_value_t = CacheLimits::default().max_bytes)]
    pub tenant_cache_max_bytes: u64,
    /// Most bytes all of one tenant apiserver's responses may hold at once (list pages, answers, the line a
    /// watch is reading); past it the response is cut and the tenant detached with
    /// `TenantResponseTooLarge`, backing off, so an apiserver sending endless bodies cannot fill the
    /// syncer's memory.
    #[arg(long, env = "TENANT_RESPONSE_MAX_BYTES", default_value_t = ResponseLimits::default().max_bytes)]
    pub tenant_response_max_bytes: u64,
    /// Most bytes of one watch event line from a tenant apiserver; a longer one is cut like a response
    /// past `--tenant-response-max-bytes`.
    #[arg(long, env = "TENANT_WATCH_LINE_MAX_BYTES", default_value_t = ResponseLimits::default().max_line_bytes)]
    pub tenant_watch_line_max_bytes: u64,
    /// Pod Security level enforced on every super namespace of a tenant (label
    /// `pod-security.kubernetes.io/enforce`): privileged, baseline or restricted; empty leaves it unset.
    #[arg(long, env = "POD_SECURITY_ENFORCE", default_value = "baseline")]
    pub pod_security_enforce: String,
    /// Pod Security level that warns on every super namespace of a tenant; empty leaves it unset.
    #[arg(long, env = "POD_SECURITY_WARN", default_value = "restricted")]
    pub pod_security_warn: String,
    /// Pod Security level audited on every super namespace of a tenant; empty leaves it unset.
    #[arg(long, env = "POD_SECURITY_AUDIT", default_value = "")]
    pub pod_security_audit: String,
    /// Version of the Pod Security standards the levels refer to, e.g. `latest` or `v1.33`.
    #[arg(long, env = "POD_SECURITY_VERSION", default_value = "latest")]
    pub pod_security_version: String,
    /// Taints every tenant's pods may tolerate: `key` (any value) or `key=value`. The default lists the
    /// node-condition taints the apiserver and DaemonSets tolerate.
    #[arg(long, env = "POD_ALLOWED_TAINTS", value_delimiter = ',', default_values_t = default_allowed_taints())]
    pub pod_allowed_taints: Vec<String>,
    /// Taint keys a VirtualCluster's `podPolicy.allowedTaints` may add for its tenant (default none).
    #[arg(long, env = "POD_GRANTABLE_TAINTS", value_delimiter = ',')]
    pub pod_grantable_taints: Vec<String>,
    /// Node labels every tenant's pods may select on (node selector, node affinity): `key` (any value) or
    /// `key=value`. `kubernetes.io/hostname` also allows node affinity on the node's name.
    #[arg(long, env = "POD_ALLOWED_NODE_LABELS", value_delimiter = ',', default_values_t = default_allowed_node_labels())]
    pub pod_allowed_node_labels: Vec<String>,
    /// Node label keys a VirtualCluster's `podPolicy.allowedNodeLabels` may add for its tenant (default
    /// none).
    #[arg(long, env = "POD_GRANTABLE_NODE_LABELS", value_delimiter = ',')]
    pub pod_grantable_node_labels: Vec<String>,
    /// Schedulers tenant pods may name in `schedulerName`.
    #[arg(
        long,
        env = "POD_ALLOWED_SCHEDULERS",
        value_delimiter = ',',
        default_value = "default-scheduler"
    )]
    pub pod_allowed_schedulers: Vec<String>,
    /// Linux capabilities every tenant's containers may add (default: those Pod Security `baseline`
    /// allows). A VirtualCluster's `podPolicy.capabilities` adds more.
    #[arg(long, env = "POD_ALLOWED_CAPABILITIES", value_delimiter = ',', default_values_t = default_allowed_capabilities())]
    pub pod_allowed_capabilities: Vec<String>,
    /// Volume types tenant pods may use (the Volume fields: `configMap`, `secret`, `emptyDir`, `nfs`, ...).
    /// `hostPath` is the pod policy's (`podPolicy.hostPath`) and `csi` takes its drivers from
    /// `--pod-allowed-csi-drivers`; `ephemeral` volumes are held to the rules of claims.
    #[arg(long, env = "POD_ALLOWED_VOLUME_TYPES", value_delimiter = ',', default_values_t = default_allowed_volume_types())]
    pub pod_allowed_volume_types: Vec<String>,
    /// CSI drivers tenant pods may use in inline `csi` volumes (default none).
    #[arg(long, env = "POD_ALLOWED_CSI_DRIVERS", value_delimiter = ',')]
    pub pod_allowed_csi_drivers: Vec<String>,
    /// Let tenant containers keep `NET_RAW` (raw sockets: forged packets, ARP and ICMP tricks on the
    /// node's network), which container runtimes grant by default. `false` (the default) drops it from
    /// every tenant container that does not add it itself (which the capability policy judges).
    #[arg(long, env = "POD_ALLOW_NET_RAW", default_value_t = false, action = clap::ArgAction::Set)]
    pub pod_allow_net_raw: bool,
    /// RuntimeClasses a VirtualCluster's `spec.runtimeClassName` may force besides the published ones
    /// (default none). A forced class is used only when published or listed here, and its scheduling
    /// tolerations are judged like the pods' own.
    #[arg(long, env = "POD_FORCIBLE_RUNTIME_CLASSES", value_delimiter = ',')]
    pub pod_forcible_runtime_classes: Vec<String>,
    /// The super cluster makes kubelets check a pod's right to a cached image (the
    /// `KubeletEnsureSecretPulledImages` feature, or the `AlwaysPullImages` admission plugin). `false` (the
    /// default): every tenant container is pulled with `imagePullPolicy: Always`, so that a tenant cannot
    /// run another tenant's private image from a node's cache.
    #[arg(long, env = "SUPER_ENFORCES_IMAGE_CREDENTIALS", default_value_t = false, action = clap::ArgAction::Set)]
    pub super_enforces_image_credentials: bool,
    /// `loadBalancerClass`es tenant Services may name (default none: only the super cluster's default load
    /// balancer).
    #[arg(long, env = "ALLOWED_LOAD_BALANCER_CLASSES", value_delimiter = ',')]
    pub allowed_load_balancer_classes: Vec<String>,
    /// The DNS suffix of every tenant's Ingress hosts, with `{name}`, `{namespace}` and `{key}` for the
    /// VirtualCluster's name, namespace and cluster key, e.g. `{name}.{namespace}.apps.example.com`. It
    /// must name the tenant uniquely (`{key}`, or `{name}` and `{namespace}`). Empty: none.
    #[arg(long, env = "INGRESS_HOST_SUFFIX")]
    pub ingress_host_suffix: Option<String>,
    /// Domains under which a VirtualCluster's `spec.ingressHostSuffixes` may claim suffixes (default none).
    #[arg(long, env = "INGRESS_GRANTABLE_HOST_SUFFIXES", value_delimiter = ',')]
    pub ingress_grantable_host_suffixes: Vec<String>,
    /// Highest `spec.weight` honoured (1-100); a greater one is clamped and named on the VirtualCluster.
    #[arg(long, env = "MAX_WEIGHT", default_value_t = crate::tenancy::settings::DEFAULT_MAX_WEIGHT)]
    pub max_weight: u32,
    /// Quota of a VirtualCluster whose `spec.quota` leaves a dimension out, as `dimension=quantity` pairs
    /// (`pods=100,requests.cpu=20,...`; the names of `spec.quota`). Default: none.
    #[arg(long, env = "DEFAULT_QUOTA", value_delimiter = ',')]
    pub default_quota: Vec<String>,
    /// Highest quota per dimension (same form); a dimension a VirtualCluster leaves unlimited gets it.
    /// Default: none.
    #[arg(long, env = "MAX_QUOTA", value_delimiter = ',')]
    pub max_quota: Vec<String>,
    /// Rate limit on super writes of a VirtualCluster without `spec.rateLimit`: `qps` or `qps/burst`.
    /// Default: none.
    #[arg(long, env = "DEFAULT_RATE_LIMIT")]
    pub default_rate_limit: Option<String>,
    /// Highest rate limit honoured (`qps` or `qps/burst`); a VirtualCluster without one gets it. Default:
    /// none.
    #[arg(long, env = "MAX_RATE_LIMIT")]
    pub max_rate_limit: Option<String>,
    /// CIDRs tenants may name in selector-less Endpoints (besides their own pods' addresses) and in
    /// NetworkPolicy ipBlocks; anything else is refused. Default: none.
    #[arg(long, env = "TENANT_ALLOWED_CIDRS", value_delimiter = ',')]
    pub tenant_allowed_cidrs: Vec<String>,
    /// What the super cluster gets of tenants' ExternalName Services: `dns-only` (an inert stub; the name
    /// resolves only through vc-dns) or `synced` (a real ExternalName Service). `refused` and `allowed`
    /// are accepted as their old names.
    #[arg(long, env = "EXTERNAL_NAME_SERVICES", value_enum, default_value_t = ExternalNameServices::DnsOnly)]
    pub external_name_services: ExternalNameServices,
    /// Keep a NetworkPolicy in every super namespace of a tenant that lets in only that tenant's pods and
    /// what the two flags below list (`false` deletes them).
    #[arg(long, env = "NETWORK_ISOLATION", default_value_t = true, action = clap::ArgAction::Set)]
    pub network_isolation: bool,
    /// Namespaces whose pods may reach every tenant's pods despite the isolation, as `key=value` labels
    /// (each one selector), e.g. `kubernetes.io/metadata.name=ingress-nginx`. Tenants cannot copy these
    /// labels onto their namespaces.
    #[arg(long, env = "NETWORK_ISOLATION_ALLOW_NAMESPACES", value_delimiter = ',')]
    pub network_isolation_allow_namespaces: Vec<String>,
    /// Addresses (CIDRs) that may reach every tenant's pods despite the isolation, e.g. the nodes'.
    #[arg(long, env = "NETWORK_ISOLATION_ALLOW_CIDRS", value_delimiter = ',')]
    pub network_isolation_allow_cidrs: Vec<String>,
    /// The super cluster's DNS Service (`namespace/name`), which the isolation keeps tenants' pods from
    /// (its answers name every tenant's Services; tenants have vc-dns): its cluster IPs and endpoint
    /// addresses, and every pod of its namespace. Empty leaves it reachable.
    #[arg(
        long,
        env = "NETWORK_ISOLATION_PLATFORM_DNS",
        default_value = "kube-system/kube-dns"
    )]
    pub network_isolation_platform_dns: String,
    /// Addresses (CIDRs) the isolation keeps tenants' pods from, besides the platform DNS; by default the
    /// clouds' instance metadata service (it hands out the node's credentials). Empty: none.
    #[arg(long, env = "NETWORK_ISOLATION_DENY_EGRESS_CIDRS", value_delimiter = ',', default_value = INSTANCE_METADATA)]
    pub network_isolation_deny_egress_cidrs: Vec<String>,
    /// vn-agent's ServiceAccount (`namespace/name`), bound in every super namespace of a tenant to
    /// `--vn-agent-cluster-role`: vn-agent's super-apiserver backend may read logs of, exec into, attach
    /// to and port-forward to tenant pods only, never the platform's. Empty binds nothing (and removes
    /// the bindings made before).
    #[arg(long, env = "VN_AGENT_SERVICE_ACCOUNT")]
    pub vn_agent_service_account: Option<String>,
    /// The ClusterRole those bindings grant (the chart's `<release>-vn-agent-tenant-pods`).
    #[arg(long, env = "VN_AGENT_CLUSTER_ROLE")]
    pub vn_agent_cluster_role: Option<String>,
    /// Seconds between measurements of what each tenant consumes (metrics `syncer_tenant_*`, the
    /// VirtualCluster's `status.usage`); 0 measures nothing.
    #[arg(long, env = "USAGE_INTERVAL_SECONDS", default_value_t = 30)]
    pub usage_interval_seconds: u64,
    /// Read tenants' CPU and memory from each node's stats summary through the super apiserver's node
    /// proxy (needs `get` on `nodes/proxy`); `false` leaves CPU and memory out of the usage.
    #[arg(long, env = "USAGE_NODE_STATS", default_value_t = true, action = clap::ArgAction::Set)]
    pub usage_node_stats: bool,
    /// Nodes (stats summaries) and tenant apiservers (request counters) read at once when measuring usage.
    #[arg(long, env = "USAGE_CONCURRENCY", default_value_t = 8)]
    pub usage_concurrency: usize,
    /// Least seconds between two writes of one VirtualCluster's `status.usage` (the series follow every
    /// measurement): each write is a VirtualCluster change every watcher of VirtualClusters processes.
    #[arg(long, env = "USAGE_STATUS_INTERVAL_SECONDS", default_value_t = 120)]
    pub usage_status_interval_seconds: u64,
    /// A namespaced custom resource kind to sync (repeatable): `<plural>.<group>`, then optionally, each
    /// after a `;`, `tenants=key=value[,...]` (VirtualCluster labels a tenant needs; default every
    /// tenant), `secrets=path[,...]` and `configmaps=path[,...]` (fields naming Secrets and ConfigMaps,
    /// e.g. `spec.credentials` or `spec.volumes[].secretName`). Its super CRD is published into the
    /// tenants, their objects copied down and their status up.
    #[arg(long)]
    pub custom_resources: Vec<String>,
    /// Shard tenants across replicas: every replica is active and syncs only the tenants whose Lease it
    /// holds, placed by weight over the live replicas (whole-process leader election is then off).
    #[arg(long, env = "SHARDS", default_value_t = false, action = clap::ArgAction::Set)]
    pub shards: bool,
    /// This replica's name among the shards (default: the pod name).
    #[arg(long, env = "POD_NAME")]
    pub replica_id: Option<String>,
    /// Namespace of the shard Leases (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub shard_namespace: String,
    /// Seconds a replica's membership (and with it every tenant Lease it holds) lasts without renewal. It
    /// renews every third of that and stops syncing after two thirds without renewal; a dead replica's
    /// tenants move after this long.
    #[arg(long, env = "SHARD_LEASE_DURATION_SECONDS", default_value_t = 6)]
    pub shard_lease_duration_seconds: u64,
    /// Keep an attach journal (a ConfigMap per replica): a tenant being attached when a syncer process
    /// stops without a clean shutdown (a crash, an out-of-memory kill) is held back before any replica
    /// attaches it again, so one poisoned tenant cannot take every replica down in turn.
    #[arg(long, env = "ATTACH_JOURNAL", default_value_t = true, action = clap::ArgAction::Set)]
    pub attach_journal: bool,
    /// Namespace of the attach journals (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub attach_journal_namespace: String,
    /// Seconds a newly attached tenant stays in the journal after its caches listed: a stop within that
    /// time counts against it.
    #[arg(long, env = "ATTACH_PROBATION_SECONDS", default_value_t = 60)]
    pub attach_probation_seconds: u64,
    /// Seconds a tenant is held back after a syncer process stopped while attaching it alone; doubled for
    /// each further stop in a row.
    #[arg(long, env = "CRASH_BACKOFF_SECONDS", default_value_t = 60)]
    pub crash_backoff_seconds: u64,
    /// The longest a tenant is held back.
    #[arg(long, env = "CRASH_BACKOFF_MAX_SECONDS", default_value_t = 3600)]
    pub crash_backoff_max_seconds: u64,
}

/// Taints of node conditions: the apiserver gives every pod tolerations of `not-ready` and `unreachable`,
/// and DaemonSet pods tolerate the rest.
fn default_allowed_taints() -> Vec<String> {
    [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/network-unavailable",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Well-known labels every node has, which vNodes show tenants.
fn default_allowed_node_labels() -> Vec<String> {
    [
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The volume types tenant pods may use by default: what a workload needs of its own objects and scratch
/// space, and claims (held to the platform's StorageClasses).
fn default_allowed_volume_types() -> Vec<String> {
    [
        "configMap",
        "secret",
        "projected",
        "downwardAPI",
        "emptyDir",
        "persistentVolumeClaim",
        "ephemeral",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The capabilities Pod Security `baseline` lets containers add.
fn default_allowed_capabilities() -> Vec<String> {
    [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The Pod Security labels of super namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSecurityLabels {
    /// `enforce` level, if set.
    pub enforce: Option<String>,
    /// `warn` level, if set.
    pub warn: Option<String>,
    /// `audit` level, if set.
    pub audit: Option<String>,
    /// Version of the standards.
    pub version: String,
}

/// Prefix of the Pod Security admission labels.
pub const POD_SECURITY_PREFIX: &str = "pod-security.kubernetes.io/";

impl PodSecurityLabels {
    /// The labels, each mode with its version.
    pub fn labels(&self) -> Vec<(String, String)> {
        let mut labels = Vec::new();
        for (mode, level) in [
            ("enforce", &self.enforce),
            ("warn", &self.warn),
            ("audit", &self.audit),
        ] {
            if let Some(level) = level {
                labels.push((format!("{POD_SECURITY_PREFIX}{mode}"), level.clone()));
                labels.push((
                    format!("{POD_SECURITY_PREFIX}{mode}-version"),
                    self.version.clone(),
                ));
            }
        }
        labels
    }
}

impl Default for PodSecurityLabels {
    fn default() -> Self {
        Self {
            enforce: Some("baseline".into()),
            warn: Some("restricted".into()),
            audit: None,
            version: "latest".into(),
        }
    }
}

/// What every tenant's pods may do, whatever their VirtualCluster says; and how far a VirtualCluster's
/// `podPolicy` may widen placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlatformPodPolicy {
    /// Tolerable taints (`key` or `key=value`).
    pub allowed_taints: Vec<String>,
    /// Taint keys a VirtualCluster may grant.
    pub grantable_taints: Vec<String>,
    /// Selectable node labels (`key` or `key=value`).
    pub allowed_node_labels: Vec<String>,
    /// Node label keys a VirtualCluster may grant.
    pub grantable_node_labels: Vec<String>,
    /// Scheduler names.
    pub allowed_schedulers: Vec<String>,
    /// Capabilities containers may add.
    pub allowed_capabilities: Vec<String>,
    /// Volume types (Volume field names) pods may use, `hostPath` and `csi` aside.
    pub allowed_volume_types: Vec<String>,
    /// CSI drivers of inline `csi` volumes.
    pub allowed_csi_drivers: Vec<String>,
    /// Whether containers keep `NET_RAW`.
    pub allow_net_raw: bool,
    /// RuntimeClasses a VirtualCluster may force besides the published ones.
    pub forcible_runtime_classes: Vec<String>,
}

impl Default for PlatformPodPolicy {
    fn default() -> Self {
        Self {
            allowed_taints: default_allowed_taints(),
            grantable_taints: Vec::new(),
            allowed_node_labels: default_allowed_node_labels(),
            grantable_node_labels: Vec::new(),
            allowed_schedulers: vec!["default-scheduler".into()],
            allowed_capabilities: default_allowed_capabilities(),
            allowed_volume_types: default_allowed_volume_types(),
            allowed_csi_drivers: Vec::new(),
            allow_net_raw: false,
            forcible_runtime_classes: Vec::new(),
        }
    }
}

/// Every volume type (the fields of a pod's Volume besides its name).
pub const VOLUME_TYPES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
];

/// `qps` or `qps/burst` (burst at least qps).
fn rate_limit(flag: &str, value: Option<&str>) -> Result<Option<(u32, u32)>, String> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let number = |text: &str| {
        text.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("{flag}: {value:?} must be qps or qps/burst, positive whole numbers"))
    };
    let (qps, burst) = match value.split_once('/') {
        Some((qps, burst)) => (number(qps)?, number(burst)?),
        None => (number(value)?, number(value)?),
    };
    if burst < qps {
        return Err(format!("{flag}: burst must be at least qps, got {value:?}"));
    }
    Ok(Some((qps, burst)))
}

/// `dimension=quantity` pairs of a quota, by the names of `spec.quota`.
fn quota(flag: &str, pairs: &[String]) -> Result<Option<crds::TenantQuota>, String> {
    let mut quota = crds::TenantQuota::default();
    let mut any = false;
    for pair in pairs.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!("{flag}: {pair:?} is not dimension=quantity"));
        };
        let value = value.trim();
        if crds::quantity::parse_quantity(value, 1000.0).is_none_or(|q| q < 0) {
            return Err(format!("{flag}: {value:?} of {name} is not a quantity"));
        }
        let quantity = k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.to_owned());
        if !crate::tenancy::settings::set_quota_dimension(&mut quota, name.trim(), quantity) {
            return Err(format!(
                "{flag}: {name:?} is not a quota dimension (one of {})",
                crate::tenancy::settings::quota_dimensions()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        any = true;
    }
    Ok(any.then_some(quota))
}

/// The platform's limits on VirtualClusters' specs, from their flags.
fn platform_limits(
    max_weight: u32,
    default_quota: &[String],
    max_quota: &[String],
    default_rate_limit: Option<&str>,
    max_rate_limit: Option<&str>,
    ingress_host_suffix: Option<&str>,
    grantable: Vec<String>,
) -> Result<crate::tenancy::settings::PlatformLimits, String> {
    if !(1..=100).contains(&max_weight) {
        return Err(format!(
            "--max-weight must be between 1 and 100, got {max_weight}"
        ));
    }
    let ingress_host_suffix = match ingress_host_suffix.map(str::trim).filter(|s| !s.is_empty()) {
        None => None,
        Some(pattern) => {
            let unique =
                pattern.contains("{key}") || (pattern.contains("{name}") && pattern.contains("{namespace}"));
            if !unique {
                return Err(format!(
                    "--ingress-host-suffix must name the tenant ({{key}}, or {{name}} and {{namespace}}), got {pattern:?}"
                ));
            }
            let example = pattern
                .replace("{key}", "ns-0a1b2c-name")
                .replace("{name}", "name")
                .replace("{namespace}", "ns");
            if !is_dns_name(&example) {
                return Err(format!("--ingress-host-suffix: {pattern:?} is not a DNS name"));
            }
            Some(pattern.to_ascii_lowercase())
        }
    };
    let grantable = non_empty(grantable)
        .into_iter()
        .map(|domain| {
            let domain = domain.trim_end_matches('.').to_ascii_lowercase();
            match is_dns_name(&domain) {
                true => Ok(domain),
                false => Err(format!(
                    "--ingress-grantable-host-suffixes: {domain:?} is not a DNS name"
                )),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(crate::tenancy::settings::PlatformLimits {
        max_weight,
        default_quota: quota("--default-quota", default_quota)?,
        max_quota: quota("--max-quota", max_quota)?,
        default_rate_limit: rate_limit("--default-rate-limit", default_rate_limit)?,
        max_rate_limit: rate_limit("--max-rate-limit", max_rate_limit)?,
        ingress_host_suffix,
        grantable_ingress_host_suffixes: grantable,
    })
}

/// A lowercase DNS name of labels of letters, digits and `-`.
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// Keys or prefixes (ending in `/`) of an allow-list of labels and annotations; keys in the syncer's own
/// domain are refused.
fn meta_keys(flag: &str, values: Vec<String>) -> Result<Vec<String>, String> {
    non_empty(values)
        .into_iter()
        .map(|entry| {
            let prefix = entry.split_once('/').map(|(p, _)| p).unwrap_or_default();
            if prefix == "tenancy.x-k8s.io" || prefix.ends_with(".tenancy.x-k8s.io") {
                return Err(format!(
                    "{flag}: {entry:?} is in the syncer's own domain (tenancy.x-k8s.io)"
                ));
            }
            if entry.matches('/').count() > 1 || entry.starts_with('/') {
                return Err(format!(
                    "{flag}: {entry:?} is neither a label key nor a prefix ending in /"
                ));
            }
            Ok(entry)
        })
        .collect()
}

fn non_empty(values: Vec<String>) -> Vec<String> {
    values
        .into_iter()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

fn pod_security_level(flag: &str, value: &str) -> Result<Option<String>, String> {
    match value {
        "" => Ok(None),
        "privileged" | "baseline" | "restricted" => Ok(Some(value.to_owned())),
        other => Err(format!(
            "--{flag} must be privileged, baseline, restricted or empty, got {other:?}"
        )),
    }
}

/// Whom the syncer lets act on the pods of every tenant super namespace, by a RoleBinding there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VnAgentAccess {
    /// Namespace of vn-agent's ServiceAccount.
    pub namespace: String,
    /// Name of vn-agent's ServiceAccount.
    pub service_account: String,
    /// The ClusterRole bound.
    pub cluster_role: String,
}

/// `--vn-agent-service-account` and `--vn-agent-cluster-role`: both or neither.
fn vn_agent_access(
    service_account: Option<&str>,
    cluster_role: Option<&str>,
) -> Result<Option<VnAgentAccess>, String> {
    let service_account = service_account.map(str::trim).filter(|s| !s.is_empty());
    let cluster_role = cluster_role.map(str::trim).filter(|s| !s.is_empty());
    match (service_account, cluster_role) {
        (None, None) => Ok(None),
        (Some(account), Some(role)) => match account.parse::<crds::NamespacedName>() {
            Ok(account) => Ok(Some(VnAgentAccess {
                namespace: account.namespace,
                service_account: account.name,
                cluster_role: role.to_owned(),
            })),
            Err(_) => Err(format!(
                "--vn-agent-service-account must be namespace/name, got {account:?}"
            )),
        },
        _ => Err("--vn-agent-service-account and --vn-agent-cluster-role go together".into()),
    }
}

/// The syncer's settings.
#[derive(Clone, Debug)]
pub struct SyncerConfig {
    /// vNode kubelet port.
    pub vn_agent_port: u16,
    /// vNode addresses.
    pub vnode_addresses: VNodeAddresses,
    /// vNode lifetime after the last pod.
    pub vnode_grace: Duration,
    /// Which super nodes tenants see.
    pub vnode_mode: VNodeMode,
    /// Patrol period.
    pub patrol_interval: Duration,
    /// Tenant health-check period.
    pub tenant_health_period: Duration,
    /// Tenant clients over HTTP/2 (one connection per tenant).
    pub tenant_http2: bool,
    /// Downward workers.
    pub downward_workers: usize,
    /// Upward workers.
    pub upward_workers: usize,
    /// Super writes in flight at once; `0`: unbounded.
    pub super_write_slots: usize,
    /// Sync Ingresses.
    pub sync_ingresses: bool,
    /// Copy PodDisruptionBudgets down.
    pub sync_disruption_budgets: bool,
    /// DNS ndots.
    pub dns_ndots: u32,
    /// The tenant DNS Service (vc-dns), when pods are pointed at it.
    pub tenant_dns: Option<TenantDnsService>,
    /// Nameservers of pods that opt out of the DNS rewrite (empty: the node's).
    pub pod_upstream_nameservers: Vec<String>,
    /// Token lifetime in seconds.
    pub token_ttl_seconds: i64,
    /// Most pods per token Secret.
    pub pods_per_token_secret: usize,
    /// Super-owned prefixes for every tenant.
    pub opaque_meta_prefixes: Vec<String>,
    /// Label and annotation keys copied as they are, besides the built-in ones.
    pub copied_meta_keys: Vec<String>,
    /// Namespace label keys copied as they are.
    pub copied_namespace_label_keys: Vec<String>,
    /// What the syncer caches of one tenant at most.
    pub tenant_cache_limits: CacheLimits,
    /// What a tenant apiserver's responses may hold at once.
    pub tenant_response_limits: ResponseLimits,
    /// Pod Security labels of super namespaces.
    pub pod_security: PodSecurityLabels,
    /// What every tenant's pods may do.
    pub pod_policy: PlatformPodPolicy,
    /// CIDRs tenants may name in selector-less Endpoints and NetworkPolicy ipBlocks.
    pub tenant_allowed_cidrs: Vec<IpNet>,
    /// ExternalName Services.
    pub external_name_services: ExternalNameServices,
    /// Whether the super cluster checks a pod's right to a cached image (else the syncer pulls always).
    pub super_enforces_image_credentials: bool,
    /// `loadBalancerClass`es tenant Services may name.
    pub allowed_load_balancer_classes: Vec<String>,
    /// How far a VirtualCluster's spec may reach (weight, quota, rate limit, ingress hosts).
    pub limits: crate::tenancy::settings::PlatformLimits,
    /// The isolating NetworkPolicy.
    pub network_isolation: NetworkIsolation,
    /// vn-agent's rights on tenant pods, bound per super namespace; `None` binds nothing.
    pub vn_agent_access: Option<VnAgentAccess>,
    /// How tenants' usage is measured.
    pub usage: crate::accounting::usage::settings::UsageSettings,
    /// The custom resource kinds synced.
    pub custom_resources: Vec<custom_kinds::CustomKind>,
    /// Sharding across replicas (`--shards`); `None`: this process syncs every tenant.
    pub shards: Option<crate::tenancy::shards::ShardSettings>,
    /// The attach journal ([`crate::tenancy::journal`]); `None`: none is kept.
    pub journal: Option<crate::tenancy::journal::JournalSettings>,
}

impl Default for SyncerConfig {
    fn default() -> Self {
        Self {
            vn_agent_port: crds::wellknown::DEFAULT_VN_AGENT_PORT,
            vnode_addresses: VNodeAddresses::Node,
            vnode_grace: Duration::from_secs(120),
            vnode_mode: VNodeMode::Pods,
            patrol_interval: Duration::from_secs(60),
            tenant_health_period: Duration::from_secs(30),
            tenant_http2: true,
            downward_workers: 32,
            upward_workers: 256,
            super_write_slots: DEFAULT_SUPER_WRITE_SLOTS,
            sync_ingresses: false,
            sync_disruption_budgets: true,
            dns_ndots: 5,
            tenant_dns: None,
            pod_upstream_nameservers: Vec::new(),
            token_ttl_seconds: 3600,
            pods_per_token_secret: 32,
            opaque_meta_prefixes: Vec::new(),
            copied_meta_keys: Vec::new(),
            copied_namespace_label_keys: Vec::new(),
            tenant_cache_limits: CacheLimits::default(),
            tenant_response_limits: ResponseLimits::default(),
            pod_security: PodSecurityLabels::default(),
            pod_policy: PlatformPodPolicy::default(),
            tenant_allowed_cidrs: Vec::new(),
            external_name_services: ExternalNameServices::DnsOnly,
            super_enforces_image_credentials: false,
            allowed_load_balancer_classes: Vec::new(),
            limits: crate::tenancy::settings::PlatformLimits::default(),
            network_isolation: NetworkIsolation::default(),
            vn_agent_access: None,
            usage: crate::accounting::usage::settings::UsageSettings::default(),
            custom_resources: Vec::new(),
            shards: None,
            journal: None,
        }
    }
}

impl TryFrom<SyncerArgs> for SyncerConfig {
    type Error = String;

    fn try_from(args: SyncerArgs) -> Result<Self, String> {
        let vnode_addresses = match args.vn_agent_service.as_deref() {
            None | Some("") => VNodeAddresses::Node,
            Some(reference) => match reference.parse::<crds::NamespacedName>() {
                Ok(service) => VNodeAddresses::Service {
                    namespace: service.namespace,
                    name: service.name,
                },
                Err(_) => {
                    return Err(format!(
                        "--vn-agent-service must be namespace/name, got {reference:?}"
                    ));
                }
            },
        };
        let tenant_dns = match args.tenant_dns_service.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(reference) => match reference.parse::<crds::NamespacedName>() {
                Ok(service) => Some(TenantDnsService::new(&service.namespace, &service.name)),
                Err(_) => {
                    return Err(format!(
                        "--tenant-dns-service must be namespace/name, got {reference:?}"
                    ));
                }
            },
        };
        let pod_upstream_nameservers = args
            .pod_upstream_nameservers
            .iter()
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<std::net::IpAddr>()
                    .map(|ip| ip.to_string())
                    .map_err(|e| format!("--pod-upstream-nameservers: {v:?} is not an IP address ({e})"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if pod_upstream_nameservers.len() > 3 {
            return Err("--pod-upstream-nameservers: at most 3 (a pod's resolver uses no more)".into());
        }
        if args.token_ttl_seconds < 600 {
            return Err("--token-ttl-seconds must be at least 600 (the apiserver's minimum)".into());
        }
        if !(1..=256).contains(&args.pods_per_token_secret) {
            return Err(
                "--pods-per-token-secret must be between 1 and 256 (a Secret holds at most 1 MiB)".into(),
            );
        }
        let version = args.pod_security_version.trim();
        let version_ok = version == "latest"
            || version
                .strip_prefix("v1.")
                .is_some_and(|minor| !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()));
        if !version_ok {
            return Err(format!(
                "--pod-security-version must be latest or v1.<minor>, got {version:?}"
            ));
        }
        let pod_security = PodSecurityLabels {
            enforce: pod_security_level("pod-security-enforce", args.pod_security_enforce.trim())?,
            warn: pod_security_level("pod-security-warn", args.pod_security_warn.trim())?,
            audit: pod_security_level("pod-security-audit", args.pod_security_audit.trim())?,
            version: version.to_owned(),
        };
        let allowed_volume_types = non_empty(args.pod_allowed_volume_types);
        for type_ in &allowed_volume_types {
            match type_.as_str() {
                "hostPath" => {
                    return Err("--pod-allowed-volume-types: hostPath is allowed per VirtualCluster (podPolicy.hostPath), not here".into());
                }
                "csi" => {
                    return Err("--pod-allowed-volume-types: csi volumes are allowed by driver (--pod-allowed-csi-drivers), not here".into());
                }
                _ if !VOLUME_TYPES.contains(&type_.as_str()) => {
                    return Err(format!(
                        "--pod-allowed-volume-types: {type_:?} is not a volume type (one of {})",
                        VOLUME_TYPES.join(", ")
                    ));
                }
                _ => {}
            }
        }
        let pod_policy = PlatformPodPolicy {
            allowed_taints: non_empty(args.pod_allowed_taints),
            grantable_taints: non_empty(args.pod_grantable_taints),
            allowed_node_labels: non_empty(args.pod_allowed_node_labels),
            grantable_node_labels: non_empty(args.pod_grantable_node_labels),
            allowed_schedulers: non_empty(args.pod_allowed_schedulers),
            allowed_capabilities: non_empty(args.pod_allowed_capabilities),
            allowed_volume_types,
            allowed_csi_drivers: non_empty(args.pod_allowed_csi_drivers),
            allow_net_raw: args.pod_allow_net_raw,
            forcible_runtime_classes: non_empty(args.pod_forcible_runtime_classes),
        };
        let limits = platform_limits(
            args.max_weight,
            &args.default_quota,
            &args.max_quota,
            args.default_rate_limit.as_deref(),
            args.max_rate_limit.as_deref(),
            args.ingress_host_suffix.as_deref(),
            args.ingress_grantable_host_suffixes,
        )?;
        let allow_namespaces = args
            .network_isolation_allow_namespaces
            .iter()
            .filter(|v| !v.is_empty())
            .map(|v| match v.split_once('=') {
                Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
                _ => Err(format!(
                    "--network-isolation-allow-namespaces: {v:?} is not a key=value label"
                )),
            })
            .collect::<Result<Vec<_>, String>>()?;
        let platform_dns = match args.network_isolation_platform_dns.trim() {
            "" => None,
            value => Some(
                value
                    .split_once('/')
                    .filter(|(namespace, name)| !namespace.is_empty() && !name.is_empty())
                    .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
                    .ok_or_else(|| {
                        format!("--network-isolation-platform-dns: {value:?} is not namespace/name")
                    })?,
            ),
        };
        let network_isolation = NetworkIsolation {
            enabled: args.network_isolation,
            allow_namespaces,
            allow_cidrs: cidrs(
                "--network-isolation-allow-cidrs",
                args.network_isolation_allow_cidrs,
            )?,
            platform_dns,
            deny_egress: cidrs(
                "--network-isolation-deny-egress-cidrs",
                args.network_isolation_deny_egress_cidrs,
            )?,
        };
        let vn_agent_access = vn_agent_access(
            args.vn_agent_service_account.as_deref(),
            args.vn_agent_cluster_role.as_deref(),
        )?;
        let usage = crate::accounting::usage::settings::UsageSettings {
            interval: (args.usage_interval_seconds > 0)
                .then(|| Duration::from_secs(args.usage_interval_seconds)),
            node_stats: args.usage_node_stats,
            concurrency: args.usage_concurrency.max(1),
            status_interval: Duration::from_secs(args.usage_status_interval_seconds),
        };
        let custom_resources = custom_kinds::parse_all(&args.custom_resources)?;
        let shards = match args.shards {
            false => None,
            true => {
                let lease_duration = Duration::from_secs(args.shard_lease_duration_seconds);
                if lease_duration < crate::tenancy::shards::MIN_LEASE_DURATION {
                    return Err(format!(
                        "--shard-lease-duration-seconds must be at least {}",
                        crate::tenancy::shards::MIN_LEASE_DURATION.as_secs()
                    ));
                }
                let replica_id = args
                    .replica_id
                    .filter(|id| !id.trim().is_empty())
                    // Outside a pod: host name and pid, made a Lease name.
                    .unwrap_or_else(|| {
                        vc_runtime::leader::identity()
                            .to_ascii_lowercase()
                            .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '.', "-")
                            .trim_matches(|c: char| !c.is_ascii_alphanumeric())
                            .to_owned()
                    });
                let namespace = args.shard_namespace.trim();
                if namespace.is_empty() {
                    return Err("--shard-namespace must not be empty".into());
                }
                Some(crate::tenancy::shards::ShardSettings {
                    replica_id: crate::tenancy::shards::replica_id(&replica_id)?,
                    namespace: namespace.to_owned(),
                    lease_duration,
                })
            }
        };
        let journal = match args.attach_journal {
            false => None,
            true => {
                let namespace = args.attach_journal_namespace.trim();
                if namespace.is_empty() {
                    return Err("--attach-journal-namespace must not be empty".into());
                }
                if args.crash_backoff_seconds == 0 {
                    return Err("--crash-backoff-seconds must be at least 1".into());
                }
                Some(crate::tenancy::journal::JournalSettings {
                    namespace: namespace.to_owned(),
                    probation: Duration::from_secs(args.attach_probation_seconds.max(1)),
                    policy: crate::tenancy::journal::Policy {
                        base: Duration::from_secs(args.crash_backoff_seconds),
                        max: Duration::from_secs(
                            args.crash_backoff_max_seconds.max(args.crash_backoff_seconds),
                        ),
                    },
                })
            }
        };
        Ok(Self {
            shards,
            usage,
            custom_resources,
            vn_agent_access,
            pod_security,
            pod_policy,
            tenant_allowed_cidrs: cidrs("--tenant-allowed-cidrs", args.tenant_allowed_cidrs)?,
            external_name_services: args.external_name_services,
            super_enforces_image_credentials: args.super_enforces_image_credentials,
            allowed_load_balancer_classes: non_empty(args.allowed_load_balancer_classes),
            limits,
            network_isolation,
            vn_agent_port: args.vn_agent_port,
            vnode_addresses,
            vnode_grace: Duration::from_secs(args.vnode_grace_seconds),
            vnode_mode: vnode_mode(&args.vnode_mode)?,
            patrol_interval: Duration::from_secs(args.patrol_interval_seconds.max(1)),
            tenant_health_period: Duration::from_secs(args.tenant_health_period_seconds.max(1)),
            tenant_http2: args.tenant_http2,
            downward_workers: args.downward_workers.max(1),
            upward_workers: args.upward_workers.max(1),
            super_write_slots: args.super_write_slots,
            sync_ingresses: args.sync_ingresses,
            sync_disruption_budgets: args.sync_disruption_budgets,
            dns_ndots: args.dns_ndots,
            tenant_dns,
            pod_upstream_nameservers,
            token_ttl_seconds: args.token_ttl_seconds,
            pods_per_token_secret: args.pods_per_token_secret,
            opaque_meta_prefixes: args
                .opaque_meta_prefixes
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect(),
            copied_meta_keys: meta_keys("--copied-meta-keys", args.copied_meta_keys)?,
            copied_namespace_label_keys: meta_keys(
                "--copied-namespace-label-keys",
                args.copied_namespace_label_keys,
            )?,
            tenant_cache_limits: CacheLimits {
                max_objects: args.tenant_cache_max_objects.max(1),
                max_bytes: args.tenant_cache_max_bytes.max(1),
            },
            tenant_response_limits: ResponseLimits {
                max_bytes: args.tenant_response_max_bytes.max(64 * 1024),
                max_line_bytes: args.tenant_watch_line_max_bytes.max(64 * 1024),
            },
            journal,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn vnode_modes_round_trip_through_their_text() {
        for text in ["pods", "usable", "selected:zone=a,tier=gold"] {
            let mode: VNodeMode = text.parse().expect("parses");
            assert_eq!(mode.to_string(), text);
        }
    }

    fn parse(flags: &[&str]) -> Result<SyncerConfig, String> {
        let args = Args::try_parse_from(["syncer"].iter().chain(flags)).map_err(|e| e.to_string())?;
        SyncerConfig::try_from(args.syncer)
    }

    #[test]
    fn the_attach_journal_is_on_by_default_and_its_flags_are_checked() {
        let journal = parse(&[]).expect("defaults").journal.expect("on");
        assert_eq!(journal.probation, Duration::from_secs(60));
        assert_eq!(
            journal.policy,
            crate::tenancy::journal::Policy {
                base: Duration::from_secs(60),
                max: Duration::from_secs(3600)
            }
        );
        assert!(parse(&["--attach-journal=false"]).expect("off").journal.is_none());
        let set = parse(&[
            "--attach-journal-namespace=vc-system",
            "--attach-probation-seconds=5",
            "--crash-backoff-seconds=10",
            "--crash-backoff-max-seconds=5",
        ])
        .expect("set")
        .journal
        .expect("on");
        assert_eq!(set.namespace, "vc-system");
        // A ceiling below the first wait is the first wait.
        assert_eq!(set.policy.max, Duration::from_secs(10));
        let refused = parse(&["--crash-backoff-seconds=0"]).expect_err("refused");
        assert!(refused.contains("--crash-backoff-seconds"), "{refused}");
    }

    #[test]
    fn shards_are_off_by_default_and_their_flags_are_checked() {
        assert!(parse(&[]).expect("defaults").shards.is_none());
        let config = parse(&[
            "--shards=true",
            "--replica-id=syncer-7f9c-abcde",
            "--shard-namespace=vc-system",
        ])
        .expect("sharded");
        assert_eq!(
            config.shards,
            Some(crate::tenancy::shards::ShardSettings {
                replica_id: "syncer-7f9c-abcde".into(),
                namespace: "vc-system".into(),
                lease_duration: Duration::from_secs(6),
            })
        );
        let refused = parse(&["--shards=true", "--replica-id=Bad_Name"]).expect_err("refused");
        assert!(refused.contains("--replica-id"), "{refused}");
        let refused = parse(&[
            "--shards=true",
            "--replica-id=a",
            "--shard-lease-duration-seconds=2",
        ])
        .expect_err("refused");
        assert!(refused.contains("at least 3"), "{refused}");
    }

    #[test]
    fn pod_security_and_pod_policy_flags_default_to_the_safe_levels() {
        let config = parse(&[]).expect("defaults");
        assert_eq!(config.pod_security, PodSecurityLabels::default());
        assert_eq!(config.pod_policy, PlatformPodPolicy::default());
        assert_eq!(
            config.pod_security.labels(),
            [
                ("pod-security.kubernetes.io/enforce", "baseline"),
                ("pod-security.kubernetes.io/enforce-version", "latest"),
                ("pod-security.kubernetes.io/warn", "restricted"),
                ("pod-security.kubernetes.io/warn-version", "latest"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );

        let config = parse(&[
            "--pod-security-enforce=restricted",
            "--pod-security-warn=",
            "--pod-security-version=v1.30",
            "--pod-allowed-capabilities=",
            "--pod-grantable-taints=dedicated,pool",
        ])
        .expect("set");
        assert_eq!(config.pod_security.enforce.as_deref(), Some("restricted"));
        assert_eq!(config.pod_security.warn, None);
        assert!(config.pod_policy.allowed_capabilities.is_empty());
        assert_eq!(config.pod_policy.grantable_taints, ["dedicated", "pool"]);

        for bad in ["--pod-security-enforce=none", "--pod-security-version=1.30"] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn vnode_modes_parse() {
        assert_eq!(parse(&[]).expect("default").vnode_mode, VNodeMode::Pods);
        assert_eq!(
            parse(&["--vnode-mode=usable"]).expect("usable").vnode_mode,
            VNodeMode::Usable
        );
        assert_eq!(
            parse(&["--vnode-mode=selected:pool=tenants,zone=a"])
                .expect("selected")
                .vnode_mode,
            VNodeMode::Selected(vec![
                ("pool".into(), "tenants".into()),
                ("zone".into(), "a".into())
            ])
        );
        for bad in [
            "--vnode-mode=all",
            "--vnode-mode=selected:",
            "--vnode-mode=selected:=x",
        ] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn isolation_and_service_settings_default_to_the_safe_side() {
        let config = parse(&[]).expect("defaults");
        assert!(config.network_isolation.enabled);
        assert!(config.network_isolation.allow_namespaces.is_empty());
        assert!(config.tenant_allowed_cidrs.is_empty());
        assert_eq!(config.external_name_services, ExternalNameServices::DnsOnly);
        // The old names still parse, to what they always kept out of the super cluster or let in.
        let old = parse(&["--external-name-services=refused"]).expect("old name");
        assert_eq!(old.external_name_services, ExternalNameServices::DnsOnly);
        let old = parse(&["--external-name-services=allowed"]).expect("old name");
        assert_eq!(old.external_name_services, ExternalNameServices::Synced);
    }

    #[test]
    fn isolation_and_service_settings_parse_or_are_refused() {
        let config = parse(&[
            "--network-isolation=false",
            "--network-isolation-allow-namespaces=kubernetes.io/metadata.name=ingress-nginx,team=platform",
            "--network-isolation-allow-cidrs=10.0.0.7/24",
            "--tenant-allowed-cidrs=203.0.113.0/24,2001:db8::/32",
            "--external-name-services=synced",
        ])
        .expect("valid");
        assert!(!config.network_isolation.enabled);
        assert_eq!(
            config.network_isolation.allow_namespaces,
            [
                (
                    "kubernetes.io/metadata.name".to_owned(),
                    "ingress-nginx".to_owned()
                ),
                ("team".to_owned(), "platform".to_owned())
            ]
        );
        // Host bits are cleared, so that the policy names the network.
        assert_eq!(config.network_isolation.allow_cidrs[0].to_string(), "10.0.0.0/24");
        assert_eq!(config.tenant_allowed_cidrs.len(), 2);
        assert_eq!(config.external_name_services, ExternalNameServices::Synced);

        let error = parse(&["--tenant-allowed-cidrs=10.0.0.300/8"]).expect_err("not a CIDR");
        assert!(error.contains("--tenant-allowed-cidrs"), "{error}");
        let error = parse(&["--network-isolation-allow-namespaces=ingress"]).expect_err("no value");
        assert!(error.contains("key=value"), "{error}");
    }

    #[test]
    fn hardening_and_ceilings_default_to_the_safe_side() {
        let config = parse(&[]).expect("defaults");
        assert!(!config.super_enforces_image_credentials);
        assert!(!config.pod_policy.allow_net_raw);
        assert!(config.pod_policy.allowed_csi_drivers.is_empty());
        assert!(config.pod_policy.forcible_runtime_classes.is_empty());
        assert!(
            !config
                .pod_policy
                .allowed_volume_types
                .iter()
                .any(|t| t == "nfs" || t == "hostPath")
        );
        assert!(config.allowed_load_balancer_classes.is_empty());
        assert!(config.copied_meta_keys.is_empty() && config.copied_namespace_label_keys.is_empty());
        assert_eq!(config.limits, crate::tenancy::settings::PlatformLimits::default());
        assert_eq!(config.limits.max_weight, 10);
    }

    #[test]
    fn ceilings_and_allow_lists_parse_or_are_refused() {
        let config = parse(&[
            "--max-weight=5",
            "--default-quota=pods=10, requests.cpu=2",
            "--max-quota=pods=100,requests.storage=1Ti",
            "--default-rate-limit=5",
            "--max-rate-limit=50/100",
            "--ingress-host-suffix={name}.{namespace}.apps.example.com",
            "--ingress-grantable-host-suffixes=Shops.Example.com.",
            "--pod-allowed-volume-types=configMap,nfs",
            "--copied-meta-keys=prometheus.io/,cert-manager.io/cluster-issuer",
        ])
        .expect("valid");
        assert_eq!(config.limits.max_weight, 5);
        let quota = config.limits.default_quota.expect("default quota");
        assert_eq!(quota.pods.map(|q| q.0).as_deref(), Some("10"));
        assert_eq!(quota.requests_cpu.map(|q| q.0).as_deref(), Some("2"));
        let max = config.limits.max_quota.expect("max quota");
        assert_eq!(max.requests_storage.map(|q| q.0).as_deref(), Some("1Ti"));
        assert_eq!(config.limits.default_rate_limit, Some((5, 5)));
        assert_eq!(config.limits.max_rate_limit, Some((50, 100)));
        assert_eq!(
            config.limits.grantable_ingress_host_suffixes,
            ["shops.example.com"]
        );
        assert_eq!(config.pod_policy.allowed_volume_types, ["configMap", "nfs"]);
        assert_eq!(config.copied_meta_keys.len(), 2);

        for (bad, says) in [
            ("--max-weight=0", "--max-weight"),
            ("--max-weight=101", "--max-weight"),
            ("--default-quota=pods", "dimension=quantity"),
            ("--max-quota=gpus=1", "not a quota dimension"),
            ("--max-quota=pods=many", "not a quantity"),
            ("--default-rate-limit=10/5", "burst must be at least qps"),
            ("--max-rate-limit=fast", "qps or qps/burst"),
            ("--ingress-host-suffix=apps.example.com", "must name the tenant"),
            (
                "--ingress-host-suffix={name}.apps.example.com",
                "must name the tenant",
            ),
            (
                "--ingress-grantable-host-suffixes=*.example.com",
                "not a DNS name",
            ),
            ("--pod-allowed-volume-types=hostPath", "podPolicy.hostPath"),
            ("--pod-allowed-volume-types=csi", "--pod-allowed-csi-drivers"),
            ("--pod-allowed-volume-types=nsf", "not a volume type"),
            (
                "--copied-meta-keys=tenancy.x-k8s.io/cluster",
                "the syncer's own domain",
            ),
            (
                "--copied-namespace-label-keys=x.label.tenancy.x-k8s.io/",
                "the syncer's own domain",
            ),
            ("--copied-meta-keys=a/b/c", "neither a label key"),
        ] {
            let error = parse(&[bad]).expect_err(bad);
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn tenant_dns_flags_name_a_service_and_upstream_addresses() {
        let config = parse(&[]).expect("defaults");
        assert_eq!(config.tenant_dns, None);
        assert!(config.pod_upstream_nameservers.is_empty());
        let config = parse(&[
            "--tenant-dns-service=vc-system/vc-dns",
            "--pod-upstream-nameservers=10.0.0.2, fd00::53",
        ])
        .expect("flags");
        assert_eq!(
            config.tenant_dns,
            Some(TenantDnsService::new("vc-system", "vc-dns"))
        );
        assert_eq!(config.pod_upstream_nameservers, ["10.0.0.2", "fd00::53"]);
        assert!(parse(&["--tenant-dns-service=vc-dns"]).is_err());
        assert!(parse(&["--pod-upstream-nameservers=dns.example"]).is_err());
        assert!(parse(&["--pod-upstream-nameservers=1.1.1.1,1.0.0.1,8.8.8.8,8.8.4.4"]).is_err());
    }
}
