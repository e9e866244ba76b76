//! Flags of the syncer: the command line, made of the flag groups each subsystem defines beside itself,
//! and the [`SyncerConfig`] they give. Each flag's value is checked by its value parser, so that a bad one
//! fails at parse time with clap's error naming it; the checks across flags are [`SyncerConfig`]'s
//! `try_from`, the one place they are made. The defaults are the flags' own: a test's config is parsed
//! from an argument list too ([`SyncerConfig::for_tests`]).
//!
//! | group | flags | defined in |
//! | --- | --- | --- |
//! | [`EngineFlags`] | workers, write slots, patrol | [`crate::engine::flags`] |
//! | [`AttachFlags`] | tenant health, HTTP/2, cache and response limits | [`crate::tenancy::attach_flags`] |
//! | [`ShardFlags`] | `--shards`, replica id, shard Leases | [`crate::tenancy::shards::flags`] |
//! | [`JournalFlags`] | the attach journal, crash backoff | [`crate::tenancy::journal::flags`] |
//! | [`LimitFlags`] | weight, quota, rate limit, ingress hosts | [`crate::tenancy::settings::flags`] |
//! | [`UsageFlags`] | `--usage-*` | [`crate::accounting::usage::settings`] |
//! | [`PodFlags`] | pod DNS, Pod Security, pod policy, image pulls | [`crate::resources::pod::flags`] |
//! | [`TokenFlags`] | token lifetime, pods per token Secret | [`crate::tokens::flags`] |
//! | [`VNodeFlags`] | vNodes | [`crate::resources::vnode::flags`] |
//! | [`ServiceFlags`] | ExternalName Services, load-balancer classes | [`crate::resources::service::flags`] |
//! | [`NetworkFlags`] | network isolation, the CIDRs tenants may name | [`crate::resources::isolation::flags`] |
//! | [`VnAgentAccessFlags`] | vn-agent's rights on tenant pods | [`crate::resources::access::flags`] |
//! | [`KindFlags`], [`MetaFlags`] | which kinds are synced, the labels and annotations copied | [`crate::resources::flags`] |

#[cfg(test)]
mod command_line;
pub mod custom_kinds;
pub mod values;

use std::time::Duration;

use ipnet::IpNet;
use vc_runtime::limits::ResponseLimits;

use crate::{
    accounting::usage::settings::{UsageFlags, UsageSettings},
    engine::{budget::CacheLimits, flags::EngineFlags},
    resources::{
        access::flags::VnAgentAccessFlags,
        flags::{KindFlags, MetaFlags},
        isolation::flags::NetworkFlags,
        pod::flags::PodFlags,
        service::flags::ServiceFlags,
        vnode::flags::VNodeFlags,
    },
    tenancy::{
        attach_flags::AttachFlags, journal::flags::JournalFlags, settings::flags::LimitFlags,
        shards::flags::ShardFlags,
    },
    tokens::flags::TokenFlags,
};
// The types the config holds, where callers have always found them.
pub use crate::resources::{
    access::flags::VnAgentAccess,
    isolation::flags::{INSTANCE_METADATA, NetworkIsolation},
    pod::flags::{POD_SECURITY_PREFIX, PlatformPodPolicy, PodSecurityLabels, TenantDnsService, VOLUME_TYPES},
    service::flags::ExternalNameServices,
    vnode::flags::{VNodeAddresses, VNodeMode},
};

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
    /// Reach the super cluster's apiserver over one HTTP/2 connection: less memory (one connection instead
    /// of one per request in flight), but next to a greedy tenant's burst the other tenants' writes waited
    /// longer on it (docs/syncer.md, "Connections and queue room"), so kube's HTTP/1.1 client stays the
    /// default.
    #[arg(long, env = "SUPER_HTTP2", default_value_t = false, action = clap::ArgAction::Set)]
    pub super_http2: bool,
}

/// The syncer's flags, group by group.
#[derive(Clone, Debug, clap::Args)]
pub struct SyncerArgs {
    /// Workers, write slots, patrol.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// Attaching tenants.
    #[command(flatten)]
    pub attach: AttachFlags,
    /// Sharding across replicas.
    #[command(flatten)]
    pub shards: ShardFlags,
    /// The attach journal.
    #[command(flatten)]
    pub journal: JournalFlags,
    /// Limits on VirtualClusters' specs.
    #[command(flatten)]
    pub limits: LimitFlags,
    /// Measuring usage.
    #[command(flatten)]
    pub usage: UsageFlags,
    /// Tenant pods.
    #[command(flatten)]
    pub pods: PodFlags,
    /// Pods' tokens.
    #[command(flatten)]
    pub tokens: TokenFlags,
    /// Which kinds are synced.
    #[command(flatten)]
    pub kinds: KindFlags,
    /// vNodes.
    #[command(flatten)]
    pub vnodes: VNodeFlags,
    /// Tenant Services.
    #[command(flatten)]
    pub services: ServiceFlags,
    /// Network isolation and the addresses tenants may name.
    #[command(flatten)]
    pub network: NetworkFlags,
    /// vn-agent's rights on tenant pods.
    #[command(flatten)]
    pub vn_agent: VnAgentAccessFlags,
    /// Labels and annotations copied.
    #[command(flatten)]
    pub meta: MetaFlags,
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
    pub usage: UsageSettings,
    /// The custom resource kinds synced.
    pub custom_resources: Vec<custom_kinds::CustomKind>,
    /// Sharding across replicas (`--shards`); `None`: this process syncs every tenant.
    pub shards: Option<crate::tenancy::shards::ShardSettings>,
    /// The attach journal ([`crate::tenancy::journal`]); `None`: none is kept.
    pub journal: Option<crate::tenancy::journal::JournalSettings>,
}

impl SyncerConfig {
    /// The config of these syncer flags alone (no binary name), the environment unread.
    pub fn from_flags(flags: &[&str]) -> Result<Self, String> {
        Self::try_from(values::parse_without_env::<SyncerArgs>(flags)?)
    }

    /// The flags' defaults, but without the attach journal: tests start and drop syncers at will, and a
    /// dropped syncer's successor would hold back the tenants it was attaching. Change a field with
    /// `SyncerConfig { field, ..SyncerConfig::for_tests() }`, or parse flags with [`Self::from_flags`].
    ///
    /// # Panics
    ///
    /// When the defaults do not parse, a fault of the flags' definitions every test shows.
    pub fn for_tests() -> Self {
        match Self::from_flags(&["--attach-journal=false"]) {
            Ok(config) => config,
            Err(error) => panic!("the syncer's default flags do not parse: {error}"),
        }
    }
}

impl TryFrom<SyncerArgs> for SyncerConfig {
    type Error = String;

    /// The config of parsed flags, with the checks that span more than one value.
    fn try_from(args: SyncerArgs) -> Result<Self, String> {
        let SyncerArgs {
            engine,
            attach,
            shards,
            journal,
            limits,
            usage,
            pods,
            tokens,
            kinds,
            vnodes,
            services,
            network,
            vn_agent,
            meta,
        } = args;
        Ok(Self {
            vn_agent_port: vnodes.vn_agent_port,
            vnode_addresses: vnodes.addresses(),
            vnode_grace: vnodes.vnode_grace,
            vnode_mode: vnodes.vnode_mode,
            patrol_interval: engine.patrol_interval,
            tenant_health_period: attach.tenant_health_period,
            tenant_http2: attach.tenant_http2,
            downward_workers: engine.downward_workers,
            upward_workers: engine.upward_workers,
            super_write_slots: engine.super_write_slots,
            sync_ingresses: kinds.sync_ingresses,
            sync_disruption_budgets: kinds.sync_disruption_budgets,
            dns_ndots: pods.dns_ndots,
            tenant_dns: pods.tenant_dns(),
            pod_upstream_nameservers: pods.upstream_nameservers()?,
            token_ttl_seconds: tokens.token_ttl_seconds,
            pods_per_token_secret: tokens.pods_per_token_secret,
            opaque_meta_prefixes: values::listed(meta.opaque_meta_prefixes),
            copied_meta_keys: values::listed(meta.copied_meta_keys),
            copied_namespace_label_keys: values::listed(meta.copied_namespace_label_keys),
            tenant_response_limits: attach.tenant_response_limits(),
            tenant_cache_limits: attach.tenant_cache_limits,
            pod_security: pods.security.labels(),
            pod_policy: pods.policy.tidy(),
            super_enforces_image_credentials: pods.super_enforces_image_credentials,
            tenant_allowed_cidrs: network.tenant_allowed_cidrs(),
            network_isolation: network.isolation(),
            external_name_services: services.external_name_services,
            allowed_load_balancer_classes: values::listed(services.allowed_load_balancer_classes),
            limits: limits.limits(),
            vn_agent_access: vn_agent.access()?,
            usage: usage.settings(),
            custom_resources: custom_kinds::parse_all(&kinds.custom_resources)?,
            shards: shards.settings()?,
            journal: journal.settings(),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(flags: &[&str]) -> Result<SyncerConfig, String> {
        let args = Args::try_parse_from(["syncer"].iter().chain(flags)).map_err(|e| e.to_string())?;
        SyncerConfig::try_from(args.syncer)
    }

    #[test]
    fn bad_values_fail_at_parse_time_naming_their_flag() {
        for (bad, flag) in [
            ("--downward-workers=many", "--downward-workers"),
            ("--patrol-interval-seconds=-1", "--patrol-interval-seconds"),
            ("--token-ttl-seconds=599", "--token-ttl-seconds"),
            ("--pods-per-token-secret=0", "--pods-per-token-secret"),
            ("--pods-per-token-secret=257", "--pods-per-token-secret"),
            ("--tenant-cache-max-bytes=1G", "--tenant-cache-max-bytes"),
            ("--usage-interval-seconds=soon", "--usage-interval-seconds"),
            ("--vn-agent-service=vn-agent", "--vn-agent-service"),
            ("--tenant-dns-service=a/b/c", "--tenant-dns-service"),
            (
                "--network-isolation-platform-dns=kube-dns",
                "--network-isolation-platform-dns",
            ),
            ("--pod-security-warn=strict", "--pod-security-warn"),
            ("--attach-journal-namespace= ", "--attach-journal-namespace"),
        ] {
            // Refused by clap, before any config is made: the parser's error names the flag.
            let error = Args::try_parse_from(["syncer", bad]).expect_err(bad).to_string();
            assert!(error.contains(flag), "{bad}: {error}");
        }
    }

    #[test]
    fn zero_periods_and_counts_are_taken_as_one() {
        let config = parse(&[
            "--patrol-interval-seconds=0",
            "--downward-workers=0",
            "--tenant-cache-max-objects=0",
            "--tenant-response-max-bytes=1",
            "--usage-concurrency=0",
        ])
        .expect("clamped");
        assert_eq!(config.patrol_interval, Duration::from_secs(1));
        assert_eq!(config.downward_workers, 1);
        assert_eq!(config.tenant_cache_limits.max_objects, 1);
        assert_eq!(config.tenant_response_limits.max_bytes, 64 * 1024);
        assert_eq!(config.usage.concurrency, 1);
        assert_eq!(
            parse(&["--usage-interval-seconds=0"])
                .expect("off")
                .usage
                .interval,
            None
        );
    }

    #[test]
    fn vn_agent_access_needs_both_flags() {
        assert_eq!(parse(&[]).expect("defaults").vn_agent_access, None);
        let access = parse(&[
            "--vn-agent-service-account=vc-system/vn-agent",
            "--vn-agent-cluster-role=vc-vn-agent-tenant-pods",
        ])
        .expect("both")
        .vn_agent_access
        .expect("granted");
        assert_eq!(
            (access.namespace.as_str(), access.service_account.as_str()),
            ("vc-system", "vn-agent")
        );
        for one in [
            "--vn-agent-service-account=vc-system/vn-agent",
            "--vn-agent-cluster-role=vc-vn-agent-tenant-pods",
        ] {
            let error = parse(&[one]).expect_err(one);
            assert!(error.contains("go together"), "{error}");
        }
    }

    #[test]
    fn tests_get_the_flags_defaults_without_the_journal() {
        let parsed = parse(&[]).expect("defaults");
        let for_tests = SyncerConfig::for_tests();
        assert!(parsed.journal.is_some() && for_tests.journal.is_none());
        assert_eq!(
            format!(
                "{:?}",
                SyncerConfig {
                    journal: None,
                    ..parsed
                }
            ),
            format!("{for_tests:?}")
        );
        let config = SyncerConfig::from_flags(&["--downward-workers=4"]).expect("flags");
        assert_eq!(config.downward_workers, 4);
        assert!(SyncerConfig::from_flags(&["--no-such-flag"]).is_err());
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
}
