//! Flags of the `vc-manager` binary.

use std::{net::SocketAddr, time::Duration};

use vc_runtime::{clients::ClientTimeouts, leader::LeaderElectionArgs, logging::LogFormat};

use crate::{LeaderElection, Settings};

/// vc-manager: provisions and adopts tenant control planes for VirtualClusters.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "vc-manager", version, about)]
pub struct Args {
    /// Address of the admin endpoint (`/metrics`, `/healthz`, `/readyz`).
    #[arg(long, env = "ADMIN_ADDRESS", default_value = "0.0.0.0:8080")]
    pub admin_address: SocketAddr,

    /// Leader election.
    #[command(flatten)]
    pub leader_election: LeaderElectionArgs,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// How many VirtualClusters are reconciled at once.
    #[arg(long, env = "CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,

    /// DNS domain of the super cluster (for the FQDN of control-plane Services in certificates).
    #[arg(long, env = "SUPER_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub super_cluster_domain: String,

    /// Milliseconds within which triggers for one VirtualCluster are merged into one reconcile.
    #[arg(long, default_value_t = 200)]
    pub debounce_millis: u64,

    /// Seconds between reconciles of a healthy VirtualCluster (certificate renewals also schedule one).
    #[arg(long, default_value_t = 600)]
    pub resync_seconds: u64,

    /// Seconds between checks of an adopted apiserver.
    #[arg(long, default_value_t = 60)]
    pub adopt_check_seconds: u64,

    /// First delay, in seconds, after a failed reconcile; it doubles with each failure.
    #[arg(long, default_value_t = 1)]
    pub backoff_base_seconds: u64,

    /// Longest delay, in seconds, between retries of a failing VirtualCluster.
    #[arg(long, default_value_t = 300)]
    pub backoff_max_seconds: u64,

    /// Longest wait, in seconds, between checks of a provisioned tenant whose apiserver does not answer
    /// yet; the wait starts at 3 s and doubles, so a tenant that never becomes ready costs the super
    /// apiserver a few reads a minute and no writes.
    #[arg(long, env = "NOT_READY_RECHECK_MAX_SECONDS", default_value_t = 60)]
    pub not_ready_recheck_max_seconds: u64,

    /// Seconds to wait for a TCP/TLS connection to an adopted apiserver.
    #[arg(long, default_value_t = 5)]
    pub tenant_connect_timeout_seconds: u64,

    /// Seconds to wait for an adopted apiserver's answer.
    #[arg(long, default_value_t = 10)]
    pub tenant_read_timeout_seconds: u64,

    /// The longest, in seconds, that a tenant's leaf certificates (serving, client, kubeconfig) may live,
    /// whatever the VirtualCluster's `pkiExpireDays` asks (at least 60). Unset: `pkiExpireDays` decides.
    #[arg(long, env = "MAX_CERTIFICATE_LIFETIME_SECONDS")]
    pub max_certificate_lifetime_seconds: Option<u64>,

    /// ConfigMap (`namespace/name`) to keep every tenant's public kubelet-client CA in, for vn-agent, which
    /// then needs no access to Secrets. Unset: no bundle is kept.
    #[arg(long, env = "KUBELET_CLIENT_CA_BUNDLE")]
    pub kubelet_client_ca_bundle: Option<crate::ca_bundle::BundleRef>,
}

impl Args {
    /// Controller settings from the flags.
    pub fn settings(&self) -> Settings {
        Settings {
            super_cluster_domain: self.super_cluster_domain.clone(),
            resync_interval: Duration::from_secs(self.resync_seconds.max(1)),
            adopt_check_interval: Duration::from_secs(self.adopt_check_seconds.max(1)),
            backoff_base: Duration::from_secs(self.backoff_base_seconds.max(1)),
            backoff_max: Duration::from_secs(self.backoff_max_seconds.max(1)),
            tenant_timeouts: ClientTimeouts {
                connect: Duration::from_secs(self.tenant_connect_timeout_seconds.max(1)),
                read: Duration::from_secs(self.tenant_read_timeout_seconds.max(1)),
            },
            concurrency: self.concurrency.max(1),
            debounce: Duration::from_millis(self.debounce_millis),
            max_certificate_lifetime: self.max_certificate_lifetime_seconds.map(Duration::from_secs),
            kubelet_client_ca_bundle: self.kubelet_client_ca_bundle.clone(),
            not_ready_recheck_max: Duration::from_secs(self.not_ready_recheck_max_seconds.max(3)),
            ..Settings::default()
        }
    }

    /// Leader election, unless disabled.
    pub fn leader_election(&self) -> Option<LeaderElection> {
        self.leader_election.leader_election()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults() {
        let args = Args::try_parse_from(["vc-manager"]).expect("defaults parse");
        assert_eq!(args.admin_address, "0.0.0.0:8080".parse().expect("addr"));
        let settings = args.settings();
        assert_eq!(settings.resync_interval, Duration::from_secs(600));
        assert_eq!(settings.backoff_max, Duration::from_secs(300));
        assert_eq!(settings.not_ready_recheck_max, Duration::from_secs(60));
        assert_eq!(settings.super_cluster_domain, "cluster.local");
        let election = args.leader_election().expect("on by default");
        assert_eq!(election.lease_duration, Duration::from_secs(15));
    }

    #[test]
    fn leader_election_can_be_disabled() {
        let args = Args::try_parse_from(["vc-manager", "--leader-elect=false", "--concurrency", "4"])
            .expect("parse");
        assert!(args.leader_election().is_none());
        assert_eq!(args.settings().concurrency, 4);
    }
}
