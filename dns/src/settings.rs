//! Flags and the settings they make.

use std::{net::SocketAddr, time::Duration};

use hickory_proto::rr::Name;
use vc_runtime::logging::LogFormat;

use crate::{Error, Result, upstream};

/// vc-dns's command line.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "vc-dns",
    version,
    about = "Tenant DNS for virtualcluster-rs: each tenant pod gets its own cluster's names, with the super cluster's addresses"
)]
pub struct Args {
    /// Address tenant pods query (UDP and TCP).
    #[arg(long, env = "VC_DNS_LISTEN_ADDRESS", default_value = "0.0.0.0:53")]
    pub listen_address: SocketAddr,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "VC_DNS_ADMIN_ADDRESS", default_value = "0.0.0.0:8080")]
    pub admin_address: SocketAddr,
    /// Upstream resolvers for names outside the cluster domain (`ip` or `ip:port`, comma-separated or
    /// repeated). Default: the nameservers of this process's /etc/resolv.conf, which must not be the
    /// super cluster's DNS (run vc-dns with `dnsPolicy: Default`, as the chart does).
    #[arg(long = "upstream", env = "VC_DNS_UPSTREAM", value_delimiter = ',')]
    pub upstream: Vec<String>,
    /// Domains that are never forwarded upstream and never resolve for tenants (comma-separated): the
    /// super cluster's own domain. A tenant whose cluster domain is one of them still gets its own names.
    #[arg(
        long,
        env = "VC_DNS_NEVER_FORWARD",
        value_delimiter = ',',
        default_value = "cluster.local"
    )]
    pub never_forward: Vec<String>,
    /// Queries per second each tenant may ask (0: unlimited); over it, REFUSED.
    #[arg(long, env = "VC_DNS_TENANT_QPS", default_value_t = 2000)]
    pub tenant_qps: u32,
    /// Queries a tenant may ask at once above its rate.
    #[arg(long, env = "VC_DNS_TENANT_BURST", default_value_t = 4000)]
    pub tenant_burst: u32,
    /// Queries of one tenant in flight to the upstream resolvers at once; more get SERVFAIL.
    #[arg(long, env = "VC_DNS_TENANT_UPSTREAM_CONCURRENCY", default_value_t = 32)]
    pub tenant_upstream_concurrency: usize,
    /// Queries of all tenants in flight to the upstream resolvers at once.
    #[arg(long, env = "VC_DNS_UPSTREAM_CONCURRENCY", default_value_t = 1024)]
    pub upstream_concurrency: usize,
    /// Milliseconds an upstream resolver has for one attempt (two attempts).
    #[arg(long, env = "VC_DNS_UPSTREAM_TIMEOUT_MS", default_value_t = 2000)]
    pub upstream_timeout_ms: u64,
    /// Milliseconds a query from an address no tenant pod has waits for the pod watch to learn it (a new
    /// pod's first query can come before its address reaches vc-dns); still unknown then, REFUSED. 0
    /// refuses at once.
    #[arg(long, env = "VC_DNS_UNKNOWN_SOURCE_WAIT_MS", default_value_t = 2000)]
    pub unknown_source_wait_ms: u64,
    /// Queries from unknown addresses that may wait at once; more are refused at once, so a flood of
    /// them holds no more than this many tasks.
    #[arg(long, env = "VC_DNS_UNKNOWN_SOURCE_WAITERS", default_value_t = 256)]
    pub unknown_source_waiters: usize,
    /// Of those, how many may come from one source range (`--unknown-source-range-v4-bits`,
    /// `--unknown-source-range-v6-bits`): a flood from one node's pod range cannot take the waiting slots
    /// other tenants' new pods need.
    #[arg(long, env = "VC_DNS_UNKNOWN_SOURCE_WAITERS_PER_RANGE", default_value_t = 16)]
    pub unknown_source_waiters_per_range: usize,
    /// Prefix length of an IPv4 source range (a node's pod range is typically a /24).
    #[arg(long, env = "VC_DNS_UNKNOWN_SOURCE_RANGE_V4_BITS", default_value_t = 24, value_parser = clap::value_parser!(u8).range(0..=32))]
    pub unknown_source_range_v4_bits: u8,
    /// Prefix length of an IPv6 source range.
    #[arg(long, env = "VC_DNS_UNKNOWN_SOURCE_RANGE_V6_BITS", default_value_t = 64, value_parser = clap::value_parser!(u8).range(0..=128))]
    pub unknown_source_range_v6_bits: u8,
    /// Seconds an idle TCP connection stays open.
    #[arg(long, default_value_t = 10)]
    pub tcp_idle_seconds: u64,
    /// Log format.
    #[arg(long, value_enum, env = "LOG_FORMAT", default_value_t)]
    pub log_format: LogFormat,
}

/// vc-dns's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// UDP and TCP address.
    pub listen_address: SocketAddr,
    /// Upstream resolvers.
    pub upstream: Vec<SocketAddr>,
    /// Zones never forwarded.
    pub never_forward: Vec<Name>,
    /// Per-tenant query rate (0: unlimited).
    pub tenant_qps: u32,
    /// Per-tenant burst.
    pub tenant_burst: u32,
    /// Per-tenant upstream queries in flight.
    pub tenant_upstream_concurrency: usize,
    /// All upstream queries in flight.
    pub upstream_concurrency: usize,
    /// Upstream attempt timeout.
    pub upstream_timeout: Duration,
    /// How long a query from an unknown address waits for the pod watch to learn it.
    pub unknown_source_wait: Duration,
    /// Queries from unknown addresses that may wait at once.
    pub unknown_source_waiters: usize,
    /// How many of them one source range may hold.
    pub unknown_source_ranges: crate::server::RangeLimits,
    /// TCP idle timeout.
    pub tcp_idle: Duration,
}

impl Settings {
    /// Settings for tests and benchmarks: loopback, the given upstreams, generous limits.
    pub fn local(upstream: Vec<SocketAddr>) -> Self {
        Self {
            listen_address: SocketAddr::from(([127, 0, 0, 1], 0)),
            upstream,
            never_forward: vec![Name::from_ascii("cluster.local.").expect("valid name")],
            tenant_qps: 0,
            tenant_burst: 0,
            tenant_upstream_concurrency: 32,
            upstream_concurrency: 1024,
            upstream_timeout: Duration::from_secs(2),
            unknown_source_wait: Duration::from_millis(2000),
            unknown_source_waiters: 256,
            unknown_source_ranges: crate::server::RangeLimits::default(),
            tcp_idle: Duration::from_secs(10),
        }
    }
}

/// A zone name from a flag (`cluster.local` or `cluster.local.`).
pub fn zone(value: &str) -> Result<Name> {
    let value = value.trim().trim_end_matches('.').to_ascii_lowercase();
    if value.is_empty() {
        return Err(Error::Settings("an empty domain".into()));
    }
    Name::from_ascii(format!("{value}.")).map_err(|e| Error::Settings(format!("domain {value:?}: {e}")))
}

impl Args {
    /// The settings these flags make; the default upstreams are read from /etc/resolv.conf.
    pub fn settings(&self) -> Result<Settings> {
        let upstream = if self.upstream.iter().all(|u| u.trim().is_empty()) {
            let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            upstream::nameservers_of_resolv_conf(&text)
        } else {
            self.upstream
                .iter()
                .filter(|u| !u.trim().is_empty())
                .map(|u| {
                    upstream::parse_server(u)
                        .ok_or_else(|| Error::Settings(format!("--upstream {u:?} is not an address")))
                })
                .collect::<Result<Vec<_>>>()?
        };
        if upstream.is_empty() {
            return Err(Error::Settings(
                "no upstream resolvers: set --upstream or give the process an /etc/resolv.conf".into(),
            ));
        }
        Ok(Settings {
            listen_address: self.listen_address,
            upstream,
            never_forward: self
                .never_forward
                .iter()
                .filter(|d| !d.trim().is_empty())
                .map(|d| zone(d))
                .collect::<Result<_>>()?,
            tenant_qps: self.tenant_qps,
            tenant_burst: self.tenant_burst,
            tenant_upstream_concurrency: self.tenant_upstream_concurrency,
            upstream_concurrency: self.upstream_concurrency,
            upstream_timeout: Duration::from_millis(self.upstream_timeout_ms.max(100)),
            unknown_source_wait: Duration::from_millis(self.unknown_source_wait_ms),
            unknown_source_waiters: self.unknown_source_waiters,
            unknown_source_ranges: crate::server::RangeLimits {
                waiters: self.unknown_source_waiters_per_range.max(1),
                v4_bits: self.unknown_source_range_v4_bits,
                v6_bits: self.unknown_source_range_v6_bits,
            },
            tcp_idle: Duration::from_secs(self.tcp_idle_seconds.max(1)),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn flags_make_settings() {
        let args = Args::try_parse_from([
            "vc-dns",
            "--upstream=1.1.1.1,127.0.0.1:5353",
            "--never-forward=cluster.local,super.example.",
            "--tenant-qps=5",
        ])
        .expect("flags");
        let settings = args.settings().expect("settings");
        assert_eq!(settings.upstream.len(), 2);
        assert_eq!(settings.upstream[1].port(), 5353);
        assert_eq!(settings.never_forward[1].to_ascii(), "super.example.");
        assert_eq!(settings.tenant_qps, 5);
        assert_eq!(settings.unknown_source_wait, Duration::from_millis(2000));
        assert_eq!(settings.unknown_source_waiters, 256);
        assert_eq!(
            settings.unknown_source_ranges,
            crate::server::RangeLimits::default()
        );
        let bad = Args::try_parse_from(["vc-dns", "--upstream=dns.example"]).expect("flags");
        assert!(bad.settings().is_err());
    }
}
