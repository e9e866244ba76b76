//! Renewal: one timer per shard, not per pod. A member in the last fifth of its tokens' life renews its
//! shard: every member past half its life is minted again in one write ([`super::shards`]), so tokens
//! minted together are renewed together. [`run`] fires the timers and queues the members then due.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    sync::{Arc, Mutex},
    time::Duration,
};

use super::{
    Tokens, now,
    records::{Shard, shard_index},
};
use crate::engine::{
    items::{DownItem, Kind},
    queue::{FairQueue, TenantId},
};

/// Renewal timers, one per shard rather than one per pod: a shard's timer fires at its earliest member's
/// renewal time, queues the members then due (the first of them renews the whole shard in one write) and
/// is set again for the next member. Keyed by the shard, so a pod deleted meanwhile takes no other
/// member's renewal with it.
#[derive(Default)]
pub(crate) struct Renewals {
    /// Earliest first; an entry whose shard has since been set for another time is stale and skipped.
    pub(crate) timers: Mutex<BinaryHeap<Reverse<RenewalTimer>>>,
    pub(crate) wake: tokio::sync::Notify,
}

/// When a shard's timer fires (unix seconds), the shard (super namespace, index), and its tenant.
pub(crate) type RenewalTimer = (i64, String, u32, TenantId);

impl Tokens {
    /// Sets a shard's renewal timer for `at` (unix seconds), unless it fires earlier already.
    pub(crate) fn schedule_renewal(&self, shard: &Shard, tenant: &TenantId, at: i64) {
        {
            let mut state = shard.lock();
            if state.renewal_at.is_some_and(|set| set <= at) {
                return;
            }
            state.renewal_at = Some(at);
        }
        let index = shard_index(&shard.name).unwrap_or_default();
        self.renewals
            .timers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Reverse((at, shard.namespace.clone(), index, tenant.clone())));
        self.renewals.wake.notify_one();
    }

    /// Fires the renewal timers due at `now`: returns the members due for renewal, as down items of their
    /// tenants, and sets each fired shard's timer again for its next member. Also returns when the next
    /// timer fires.
    pub(crate) fn fire_renewals(&self, now: i64) -> (Vec<(TenantId, DownItem)>, Option<i64>) {
        let mut due = Vec::new();
        loop {
            let fired = {
                let mut timers = self.renewals.timers.lock().unwrap_or_else(|e| e.into_inner());
                match timers.peek() {
                    Some(Reverse((at, ..))) if *at <= now => timers.pop().map(|Reverse(timer)| timer),
                    next => return (due, next.map(|Reverse((at, ..))| *at)),
                }
            };
            let Some((at, namespace, index, tenant)) = fired else {
                continue;
            };
            let Some(shard) = self.known_shard(&namespace, index) else {
                continue;
            };
            let next = {
                let mut state = shard.lock();
                if state.renewal_at != Some(at) {
                    continue;
                }
                state.renewal_at = None;
                let mut next: Option<i64> = None;
                for (pod, member) in &state.members {
                    match member.refresh_at() {
                        Some(refresh) if refresh <= now => {
                            due.push((
                                tenant.clone(),
                                DownItem::new(Kind::Pod, &shard.tenant_namespace, pod),
                            ));
                        }
                        Some(refresh) => next = Some(next.map_or(refresh, |n| n.min(refresh))),
                        None => {}
                    }
                }
                next
            };
            if let Some(next) = next {
                self.schedule_renewal(&shard, &tenant, next);
            }
        }
    }
}

/// Runs the shards' renewal timers: queues each member due for renewal on its tenant's down queue.
pub async fn run(tokens: Arc<Tokens>, down: Arc<FairQueue<DownItem>>) {
    loop {
        let woken = tokens.renewals.wake.notified();
        let now = now();
        let (due, next) = tokens.fire_renewals(now);
        for (tenant, item) in due {
            down.add(&tenant, item);
        }
        let wait = next.map_or(Duration::from_secs(3600), |at| {
            Duration::from_secs(u64::try_from(at - now).unwrap_or(0).max(1))
        });
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::records::member;

    #[test]
    fn one_timer_per_shard_queues_the_members_due_and_is_set_again_for_the_next() {
        let shards = Tokens::default();
        let tenant: TenantId = Arc::from("tenant-a");
        let shard = shards.shard("tenant-a-default", "default", 0);
        {
            let mut state = shard.lock();
            state.loaded = true;
            // Renewal times: 1800 (web-0, web-1), 3600 (web-2); web-3 has no token.
            state.members.insert("web-0".into(), member(1000, 2000));
            state.members.insert("web-1".into(), member(1000, 2000));
            state.members.insert("web-2".into(), member(2000, 4000));
            state.members.insert("web-3".into(), member(0, 0));
        }
        // Every member asks; the shard keeps one timer, at the earliest.
        for at in [3600, 1800, 1800, 3600] {
            shards.schedule_renewal(&shard, &tenant, at);
        }
        assert_eq!(
            shards.renewals.timers.lock().unwrap().len(),
            2,
            "a later time adds no timer"
        );
        assert_eq!(shards.fire_renewals(1799), (vec![], Some(1800)));

        let (due, next) = shards.fire_renewals(1800);
        let pods: Vec<(&str, &str, &str)> = due
            .iter()
            .map(|(t, item)| (&**t, item.namespace.as_str(), item.name.as_str()))
            .collect();
        assert_eq!(
            pods,
            [("tenant-a", "default", "web-0"), ("tenant-a", "default", "web-1")]
        );
        assert_eq!(next, Some(3600), "set again for web-2");
        // The stale timer at 3600 and the new one fire once together.
        let (due, next) = shards.fire_renewals(3600);
        let pods: Vec<&str> = due.iter().map(|(_, item)| item.name.as_str()).collect();
        assert_eq!(
            pods,
            ["web-0", "web-1", "web-2"],
            "members not renewed meanwhile are due still"
        );
        assert_eq!(next, None);

        // A pod gone from the shard takes no other member's renewal with it.
        {
            let mut state = shard.lock();
            state.members.remove("web-0");
            state.members.insert("web-1".into(), member(3600, 5600));
            state.members.insert("web-2".into(), member(3600, 5600));
        }
        shards.schedule_renewal(&shard, &tenant, 5200);
        let (due, _) = shards.fire_renewals(5200);
        let pods: Vec<&str> = due.iter().map(|(_, item)| item.name.as_str()).collect();
        assert_eq!(pods, ["web-1", "web-2"]);
    }
}
