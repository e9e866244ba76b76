//! What the pods keep of each tenant besides their cache ([`crate::tenancy::tenant::TenantCache::State`]):
//! the bindings this syncer made that the cache may not show yet.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// Tenant pods this syncer bound to a vNode, by uid, until the pod cache shows the node name.
///
/// A pod's next upward sync (its super pod starts running) often comes before the binding's own watch
/// event: the cache still shows the pod unbound, and binding it again costs a request that the apiserver
/// refuses (409). Entries are dropped when the cache shows the binding, and after [`RecentBindings::TTL`]
/// (a pod deleted meanwhile), so the map holds only pods in flight.
#[derive(Debug, Default)]
pub struct RecentBindings {
    bound: Mutex<HashMap<String, (String, Instant)>>,
}

impl RecentBindings {
    /// How long a binding is remembered at most.
    pub const TTL: Duration = Duration::from_secs(60);

    fn lock(&self) -> MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.bound.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that pod `uid` was bound to `node`.
    pub fn record(&self, uid: &str, node: &str) {
        let now = Instant::now();
        let mut bound = self.lock();
        bound.retain(|_, (_, at)| now.duration_since(*at) < Self::TTL);
        bound.insert(uid.to_owned(), (node.to_owned(), now));
    }

    /// Whether pod `uid` was bound to `node` by this syncer lately.
    pub fn bound_to(&self, uid: &str, node: &str) -> bool {
        self.lock()
            .get(uid)
            .is_some_and(|(n, at)| n == node && at.elapsed() < Self::TTL)
    }

    /// Forgets pod `uid`: the cache shows its binding.
    pub fn forget(&self, uid: &str) {
        let mut bound = self.lock();
        if !bound.is_empty() {
            bound.remove(uid);
        }
    }

    /// How many bindings are remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_is_remembered_for_its_node_until_forgotten() {
        let bindings = RecentBindings::default();
        assert!(!bindings.bound_to("uid-1", "node-1"));
        bindings.record("uid-1", "node-1");
        bindings.record("uid-2", "node-2");
        assert!(bindings.bound_to("uid-1", "node-1"));
        // Another node: the super pod was placed again (a pause); it is bound anew.
        assert!(!bindings.bound_to("uid-1", "node-2"));
        bindings.forget("uid-1");
        assert!(!bindings.bound_to("uid-1", "node-1"));
        assert_eq!(bindings.len(), 1);
    }
}
