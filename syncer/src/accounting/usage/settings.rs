//! How usage is measured: its flags (`--usage-*`) and what the syncer's config holds of them.

use std::time::Duration;

use crate::engine::config::values::{seconds, tasks};

/// How usage is measured (flags `--usage-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageSettings {
    /// Time between measurements; `None` measures nothing.
    pub interval: Option<Duration>,
    /// Read CPU and memory from the nodes' stats summaries (needs `get` on `nodes/proxy`).
    pub node_stats: bool,
    /// Nodes and tenant apiservers read at once.
    pub concurrency: usize,
    /// Least time between two writes of one VirtualCluster's `status.usage`: every write is a change its
    /// watchers (vc-manager, vn-agent on every node, vc-dns, the syncer) process.
    pub status_interval: Duration,
}

/// Flags of measuring usage.
#[derive(Clone, Debug, clap::Args)]
pub struct UsageFlags {
    /// Seconds between measurements of what each tenant consumes (metrics `syncer_tenant_*`, the
    /// VirtualCluster's `status.usage`); 0 measures nothing.
    #[arg(long = "usage-interval-seconds", env = "USAGE_INTERVAL_SECONDS", default_value = "30", value_parser = seconds)]
    pub interval: Duration,
    /// Read tenants' CPU and memory from each node's stats summary through the super apiserver's node
    /// proxy (needs `get` on `nodes/proxy`); `false` leaves CPU and memory out of the usage.
    #[arg(long = "usage-node-stats", env = "USAGE_NODE_STATS", default_value_t = true, action = clap::ArgAction::Set)]
    pub node_stats: bool,
    /// Nodes (stats summaries) and tenant apiservers (request counters) read at once when measuring usage.
    #[arg(long = "usage-concurrency", env = "USAGE_CONCURRENCY", default_value = "8", value_parser = tasks)]
    pub concurrency: usize,
    /// Least seconds between two writes of one VirtualCluster's `status.usage` (the series follow every
    /// measurement): each write is a VirtualCluster change every watcher of VirtualClusters processes.
    #[arg(long = "usage-status-interval-seconds", env = "USAGE_STATUS_INTERVAL_SECONDS", default_value = "120", value_parser = seconds)]
    pub status_interval: Duration,
}

impl UsageFlags {
    /// How usage is measured.
    pub fn settings(self) -> UsageSettings {
        UsageSettings {
            interval: (!self.interval.is_zero()).then_some(self.interval),
            node_stats: self.node_stats,
            concurrency: self.concurrency,
            status_interval: self.status_interval,
        }
    }
}
