//! What the syncer knows of the shared token Secrets (shards of a super namespace's pod tokens), ahead of
//! the super cache: each shard's members, reservations, tokens being minted and renewal timers, and the
//! group commit its writes go through ([`crate::engine::group_commit`]). Kept beside the super caches
//! ([`crate::cache::super_stores::SuperStores`]), whose watch of the token Secrets follows changes into
//! it; the writes themselves, and the choices that need the syncer's context, are
//! [`crate::resources::pod::token_secrets`]'.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap, HashMap},
    sync::{Arc, Mutex},
    time::Instant,
};

use k8s_openapi::{ByteString, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use serde::{Deserialize, Serialize};

use crate::{
    cache::stores::Change,
    engine::{
        group_commit::GroupCommit,
        items::{DownItem, Kind},
        queue::TenantId,
    },
    error::Error,
    tenancy::identity,
};

/// Annotation on a shard Secret: its members, as JSON `{pod: {uid, keys, issued, expires}}`.
pub const ANNOTATION_TOKEN_MEMBERS: &str = "tenancy.x-k8s.io/token-members";

/// Suffix of shard Secret names. Tenant Secrets and references with it (or the per-pod `.vc-token` of
/// earlier versions) are refused ([`is_reserved_secret_name`]).
pub const SHARD_SUFFIX: &str = ".vc-tokens";

/// Whether a Secret name is the syncer's, for pods' tokens: shards (`*.vc-tokens`) and the per-pod Secrets
/// of earlier versions (`*.vc-token`). Tenant Secrets of such names are not synced and tenant pods may not
/// name them, so no tenant object can stand in for, or read, another pod's tokens.
pub fn is_reserved_secret_name(name: &str) -> bool {
    name.ends_with(".vc-token") || name.ends_with(SHARD_SUFFIX)
}

/// The name of shard `index`.
pub fn shard_name(index: u32) -> String {
    format!("shard-{index}{SHARD_SUFFIX}")
}

/// The index of a shard, by its name.
pub fn shard_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("shard-")?.strip_suffix(SHARD_SUFFIX)?;
    (!digits.starts_with('0') || digits == "0")
        .then(|| digits.parse().ok())
        .flatten()
}

/// A member's data keys, kept in one string (a shard holds a few keys for each of its pods, for every pod
/// the syncer serves); written and read as a JSON list. Data keys hold no line break (only letters, digits,
/// `-`, `_` and `.`), so one separates them; a recorded key that holds one is not a key of ours, and is
/// dropped when read.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct DataKeys(Box<str>);

impl DataKeys {
    /// Each key.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.split('\n').filter(|k| !k.is_empty())
    }

    /// Whether it holds `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.iter().any(|k| k == key)
    }
}

impl<S: AsRef<str>> FromIterator<S> for DataKeys {
    fn from_iter<I: IntoIterator<Item = S>>(keys: I) -> Self {
        let mut joined = String::new();
        for key in keys {
            let key = key.as_ref();
            if key.is_empty() || key.contains('\n') {
                continue;
            }
            if !joined.is_empty() {
                joined.push('\n');
            }
            joined.push_str(key);
        }
        Self(joined.into_boxed_str())
    }
}

impl std::fmt::Debug for DataKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for DataKeys {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for DataKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        Vec::<String>::deserialize(deserializer).map(|keys| keys.into_iter().collect())
    }
}

/// One pod's share of a shard.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The tenant pod's uid, which its tokens are bound to.
    pub uid: Box<str>,
    /// Its data keys.
    pub keys: DataKeys,
    /// When its tokens were issued (unix seconds).
    #[serde(default)]
    pub issued: i64,
    /// When its earliest token expires (unix seconds; 0: it has no token).
    #[serde(default)]
    pub expires: i64,
}

impl Member {
    /// When its tokens are renewed: in the last fifth of their life.
    pub fn refresh_at(&self) -> Option<i64> {
        (self.expires > 0).then(|| self.expires - (self.expires - self.issued) / 5)
    }

    /// Whether its tokens are due for renewal.
    pub fn due(&self, now: i64) -> bool {
        self.refresh_at().is_some_and(|at| now >= at)
    }

    /// Whether it is renewed with a shard renewed now: its tokens are past half their life, so the
    /// members minted together stay together and a renewal is one write for them all.
    pub fn joins_renewal(&self, now: i64) -> bool {
        self.expires > 0 && now >= self.issued + (self.expires - self.issued) / 2
    }
}

/// Members of a shard, by pod name.
pub type Members = BTreeMap<String, Member>;

/// The members a shard's metadata records.
pub fn members_of(meta: &ObjectMeta) -> Members {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_TOKEN_MEMBERS))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default()
}

/// What a write to a shard is asked for.
pub(crate) enum Entry {
    /// A pod's freshly minted tokens.
    Put(Put),
    /// Renew the members that are due (and those past half their life).
    Renew,
    /// Remove the keys of gone pods.
    Sweep,
}

/// A pod's keys to add.
pub(crate) struct Put {
    pub(crate) pod: String,
    pub(crate) member: Member,
    pub(crate) data: BTreeMap<String, ByteString>,
}

/// What the syncer knows of a shard Secret: what its last write left or the cache showed.
#[derive(Default)]
pub(crate) struct ShardState {
    pub(crate) loaded: bool,
    pub(crate) exists: bool,
    pub(crate) resource_version: Option<String>,
    pub(crate) members: Members,
    /// Pods assigned here whose tokens are not written yet: pod → (tenant uid, since).
    pub(crate) reserved: HashMap<String, (String, Instant)>,
    /// Pods whose tokens a worker is minting and writing now: pod → tenant uid. The binding (up) and the
    /// tenant pod's event after it (down) both find the keys missing; one of them mints.
    pub(crate) minting: HashMap<String, String>,
    /// When its renewal timer fires (unix seconds): at or before its earliest member's renewal time.
    pub(crate) renewal_at: Option<i64>,
}

/// A pod's tokens being minted and written; ends when dropped.
pub(crate) struct Minting {
    pub(crate) shard: Arc<Shard>,
    pub(crate) pod: String,
}

impl Drop for Minting {
    fn drop(&mut self) {
        self.shard.lock().minting.remove(&self.pod);
    }
}

/// One shard Secret of a super namespace.
pub struct Shard {
    pub(crate) namespace: String,
    pub(crate) tenant_namespace: String,
    pub(crate) name: String,
    pub(crate) state: Mutex<ShardState>,
    pub(crate) commit: GroupCommit<Entry, std::result::Result<bool, Arc<Error>>>,
}

/// The shards of every super namespace the syncer wrote or read since it started.
#[derive(Default)]
pub struct TokenShards {
    pub(crate) shards: Mutex<HashMap<(String, u32), Arc<Shard>>>,
    pub(crate) renewals: Renewals,
}

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

impl TokenShards {
    pub(crate) fn shard(&self, namespace: &str, tenant_namespace: &str, index: u32) -> Arc<Shard> {
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((namespace.to_owned(), index))
            .or_insert_with(|| {
                Arc::new(Shard {
                    namespace: namespace.to_owned(),
                    tenant_namespace: tenant_namespace.to_owned(),
                    name: shard_name(index),
                    state: Mutex::default(),
                    commit: GroupCommit::default(),
                })
            })
            .clone()
    }

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
            let Some(shard) = self
                .shards
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(namespace, index))
                .cloned()
            else {
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

    /// Follows the token Secrets' cache: a shard someone else changed or deleted is read again from the
    /// cache before its next use. Our own writes are known already.
    pub fn observe(&self, meta: &ObjectMeta, change: Change) {
        let (Some(namespace), Some(index)) = (
            meta.namespace.as_deref(),
            meta.name.as_deref().and_then(shard_index),
        ) else {
            return;
        };
        let Some(shard) = self
            .shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_owned(), index))
            .cloned()
        else {
            return;
        };
        let mut state = shard.lock();
        let newer = |seen: Option<&str>| match (
            seen.and_then(|v| v.parse::<u64>().ok()),
            state
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok()),
        ) {
            (Some(seen), Some(known)) => seen > known,
            _ => seen != state.resource_version.as_deref(),
        };
        if change == Change::Deleted || newer(meta.resource_version.as_deref()) {
            state.loaded = false;
        }
    }
}

impl Shard {
    /// Marks a pod's tokens as being minted, unless another worker is minting them already.
    pub(crate) fn start_minting(self: &Arc<Self>, pod: &str, uid: &str) -> Option<Minting> {
        let mut state = self.lock();
        if state.minting.get(pod).is_some_and(|minting| minting == uid) {
            return None;
        }
        state.minting.insert(pod.to_owned(), uid.to_owned());
        Some(Minting {
            shard: self.clone(),
            pod: pod.to_owned(),
        })
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, ShardState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The pods a shard serves, as down items of their tenant: when it is deleted, they write their keys
/// again.
pub fn member_items(meta: &ObjectMeta) -> Option<(crate::engine::queue::TenantId, Vec<DownItem>)> {
    let cluster = identity::owner_cluster(meta)?;
    let namespace = identity::tenant_namespace(meta)?;
    let items = members_of(meta)
        .keys()
        .map(|pod| DownItem::new(Kind::Pod, namespace, pod))
        .collect();
    Some((Arc::from(cluster), items))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(issued: i64, expires: i64) -> Member {
        Member {
            uid: "u".into(),
            keys: ["p.token", "p.uid"].into_iter().collect(),
            issued,
            expires,
        }
    }

    #[test]
    fn one_timer_per_shard_queues_the_members_due_and_is_set_again_for_the_next() {
        let shards = TokenShards::default();
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

    #[test]
    fn members_read_and_write_the_recorded_json_and_drop_keys_that_are_not_ours() {
        let recorded =
            r#"{"web-1":{"uid":"u1","keys":["web-1.token-abc","web-1.uid"],"issued":10,"expires":20}}"#;
        let members: Members = serde_json::from_str(recorded).expect("members");
        let member = &members["web-1"];
        assert_eq!(&*member.uid, "u1");
        assert!(member.keys.contains("web-1.uid") && !member.keys.contains("web-1"));
        assert_eq!(serde_json::to_string(&members).expect("json"), recorded);
        let odd: Member = serde_json::from_str(r#"{"uid":"u","keys":["a\nb","","c"]}"#).expect("member");
        assert_eq!(odd.keys.iter().collect::<Vec<_>>(), ["c"]);
        assert_eq!(DataKeys::default().iter().count(), 0);
    }
}
