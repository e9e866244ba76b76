//! Whether this replica leads: one flag, set by the leader election in `run` and read by every writer (the
//! reconciles through the `Context`, the CA bundle's writer directly), so it sits below both.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

/// Whether this replica may write. Without leader election it always may.
#[derive(Clone, Debug, Default)]
pub struct LeaderFlag(Arc<AtomicBool>);

impl LeaderFlag {
    /// A flag that is already set (no leader election).
    pub fn always() -> Self {
        let flag = Self::default();
        flag.set(true);
        flag
    }

    /// Sets or clears the flag.
    pub fn set(&self, leader: bool) {
        self.0.store(leader, Ordering::SeqCst);
    }

    /// Whether this replica leads.
    pub fn is_leader(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_flag() {
        let flag = LeaderFlag::default();
        assert!(!flag.is_leader());
        flag.set(true);
        assert!(flag.clone().is_leader());
        assert!(LeaderFlag::always().is_leader());
    }
}
