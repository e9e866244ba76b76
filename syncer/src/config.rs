//! Flags of the syncer.

use std::time::Duration;

use crate::budget::CacheLimits;

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
    /// Seconds between patrols that compare tenant and super state and repair differences.
    #[arg(long, default_value_t = 60)]
    pub patrol_interval_seconds: u64,
    /// Seconds between checks that an attached tenant's apiserver still answers.
    #[arg(long, default_value_t = 30)]
    pub tenant_health_period_seconds: u64,
    /// Workers syncing tenant objects down.
    #[arg(long, default_value_t = 32)]
    pub downward_workers: usize,
    /// Workers syncing status up.
    #[arg(long, default_value_t = 32)]
    pub upward_workers: usize,
    /// Also sync Ingresses down.
    #[arg(long, default_value_t = false)]
    pub sync_ingresses: bool,
    /// `ndots` of the DNS config given to tenant pods.
    #[arg(long, default_value_t = 5)]
    pub dns_ndots: u32,
    /// Lifetime of the service-account tokens minted for tenant pods (refreshed at 80%).
    #[arg(long, default_value_t = 3600)]
    pub token_ttl_seconds: i64,
    /// Label and annotation prefixes that are super-owned for every tenant, besides each VirtualCluster's
    /// `opaqueMetaPrefixes`.
    #[arg(long, value_delimiter = ',')]
    pub opaque_meta_prefixes: Vec<String>,
    /// Most objects the syncer caches of one tenant (over every kind); a tenant with more is detached with
    /// `TenantLimitExceeded` until it fits.
    #[arg(long, env = "TENANT_CACHE_MAX_OBJECTS", default_value_t = CacheLimits::default().max_objects)]
    pub tenant_cache_max_objects: u64,
    /// Most bytes (objects' JSON length) the syncer caches of one tenant; a tenant with more is detached
    /// with `TenantLimitExceeded` until it fits.
    #[arg(long, env = "TENANT_CACHE_MAX_BYTES", default_value_t = CacheLimits::default().max_bytes)]
    pub tenant_cache_max_bytes: u64,
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
    /// Patrol period.
    pub patrol_interval: Duration,
    /// Tenant health-check period.
    pub tenant_health_period: Duration,
    /// Downward workers.
    pub downward_workers: usize,
    /// Upward workers.
    pub upward_workers: usize,
    /// Sync Ingresses.
    pub sync_ingresses: bool,
    /// DNS ndots.
    pub dns_ndots: u32,
    /// Token lifetime in seconds.
    pub token_ttl_seconds: i64,
    /// Super-owned prefixes for every tenant.
    pub opaque_meta_prefixes: Vec<String>,
    /// What the syncer caches of one tenant at most.
    pub tenant_cache_limits: CacheLimits,
}

impl Default for SyncerConfig {
    fn default() -> Self {
        Self {
            vn_agent_port: crds::wellknown::DEFAULT_VN_AGENT_PORT,
            vnode_addresses: VNodeAddresses::Node,
            vnode_grace: Duration::from_secs(120),
            patrol_interval: Duration::from_secs(60),
            tenant_health_period: Duration::from_secs(30),
            downward_workers: 32,
            upward_workers: 32,
            sync_ingresses: false,
            dns_ndots: 5,
            token_ttl_seconds: 3600,
            opaque_meta_prefixes: Vec::new(),
            tenant_cache_limits: CacheLimits::default(),
        }
    }
}

impl TryFrom<SyncerArgs> for SyncerConfig {
    type Error = String;

    fn try_from(args: SyncerArgs) -> Result<Self, String> {
        let vnode_addresses = match args.vn_agent_service.as_deref() {
            None | Some("") => VNodeAddresses::Node,
            Some(reference) => match reference.split_once('/') {
                Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
                    VNodeAddresses::Service {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                    }
                }
                _ => {
                    return Err(format!(
                        "--vn-agent-service must be namespace/name, got {reference:?}"
                    ));
                }
            },
        };
        if args.token_ttl_seconds < 600 {
            return Err("--token-ttl-seconds must be at least 600 (the apiserver's minimum)".into());
        }
        Ok(Self {
            vn_agent_port: args.vn_agent_port,
            vnode_addresses,
            vnode_grace: Duration::from_secs(args.vnode_grace_seconds),
            patrol_interval: Duration::from_secs(args.patrol_interval_seconds.max(1)),
            tenant_health_period: Duration::from_secs(args.tenant_health_period_seconds.max(1)),
            downward_workers: args.downward_workers.max(1),
            upward_workers: args.upward_workers.max(1),
            sync_ingresses: args.sync_ingresses,
            dns_ndots: args.dns_ndots,
            token_ttl_seconds: args.token_ttl_seconds,
            opaque_meta_prefixes: args
                .opaque_meta_prefixes
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect(),
            tenant_cache_limits: CacheLimits {
                max_objects: args.tenant_cache_max_objects.max(1),
                max_bytes: args.tenant_cache_max_bytes.max(1),
            },
        })
    }
}
