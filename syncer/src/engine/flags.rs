//! The engine's flags: the workers draining each queue, the super write gate's slots and the patrol's period.

use std::time::Duration;

use crate::engine::config::values;

/// Flags of the queues' workers, the write gate and the patrol.
#[derive(Clone, Debug, clap::Args)]
pub struct EngineFlags {
    /// Workers syncing tenant objects down.
    #[arg(long, default_value = "32", value_parser = values::tasks)]
    pub downward_workers: usize,
    /// Workers syncing status up. Many, because an upward sync waits on the tenant's own apiserver (a
    /// binding, a TokenRequest, a status write, about half a second each when its core is busy) and each
    /// tenant may hold only its share of them; they are tasks, not threads. 32 left a 10-tenant burst's
    /// status 12–21 s behind in the queue (docs/syncer.md, Performance).
    #[arg(long, default_value = "256", value_parser = values::tasks)]
    pub upward_workers: usize,
    /// Super-cluster writes in flight at once, shared among tenants by weight: a burst then waits in the
    /// syncer, where other tenants' writes overtake it, rather than in the super apiserver's queue. `0`
    /// sets no bound: 8 slots measured worse than none (docs/syncer.md, "Fair super writes").
    #[arg(long, env = "SUPER_WRITE_SLOTS", default_value_t = 0)]
    pub super_write_slots: usize,
    /// Seconds between patrols that compare tenant and super state and repair differences.
    #[arg(long = "patrol-interval-seconds", default_value = "60", value_parser = values::period)]
    pub patrol_interval: Duration,
}
