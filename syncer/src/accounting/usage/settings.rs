//! How usage is measured (flags `--usage-*`): what the syncer's config holds of it.

use std::time::Duration;

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

impl Default for UsageSettings {
    fn default() -> Self {
        Self {
            interval: Some(Duration::from_secs(30)),
            node_stats: true,
            concurrency: 8,
            status_interval: Duration::from_secs(120),
        }
    }
}
