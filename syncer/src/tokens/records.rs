//! The records of the shared token Secrets: a shard's name, its members (which pod, by tenant uid, owns
//! which keys, issued and expiring when: the Secret's annotation [`ANNOTATION_TOKEN_MEMBERS`]), what the
//! syncer knows of a shard ahead of the super cache ([`ShardState`]), and the pure choices and patches
//! its writes are made of ([`choose`], [`data_patch`]). Token values are never kept.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Instant,
};

use k8s_openapi::{ByteString, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::mounts::{KEY_CA, KEY_NAMESPACE, KEY_UID, SHARD_SUFFIX, TokenNeed, pod_data_key};
use crate::{
    engine::{
        group_commit::GroupCommit,
        items::{DownItem, Kind},
    },
    error::Error,
    tenancy::identity,
};

/// Annotation on a shard Secret: its members, as JSON `{pod: {uid, keys, issued, expires}}`.
pub const ANNOTATION_TOKEN_MEMBERS: &str = "tenancy.x-k8s.io/token-members";

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

impl Member {
    /// Whether it holds every key `needs` asks for.
    pub fn covers(&self, prefix: &str, needs: &[TokenNeed]) -> bool {
        needs
            .iter()
            .all(|n| self.keys.contains(&pod_data_key(prefix, &n.key)))
            && self.keys.contains(&pod_data_key(prefix, KEY_UID))
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

/// The shard a new pod goes to: the one it is already in, else the first with room (`occupancy` below
/// `capacity`), else a new one after the last in use.
pub fn choose(shards: &[ShardView], capacity: usize) -> u32 {
    if let Some(own) = shards.iter().find(|s| s.holds_pod) {
        return own.index;
    }
    shards
        .iter()
        .find(|s| s.occupancy < capacity)
        .map(|s| s.index)
        .unwrap_or_else(|| shards.iter().map(|s| s.index + 1).max().unwrap_or(0))
}

/// What [`choose`] knows of a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardView {
    /// Its index.
    pub index: u32,
    /// Live members and reservations.
    pub occupancy: usize,
    /// Whether the pod is a member or reserved there already.
    pub holds_pod: bool,
}

/// A write's merge patch of the data: keys added with their values, keys of removed members as `null`,
/// and the shared CA and namespace.
pub fn data_patch(
    added: &BTreeMap<String, ByteString>,
    removed: &[&Member],
    ca: &str,
    namespace: &str,
) -> serde_json::Map<String, Value> {
    let mut data = serde_json::Map::new();
    for member in removed {
        for key in member.keys.iter() {
            data.insert(key.to_owned(), Value::Null);
        }
    }
    for (key, value) in added {
        data.insert(key.clone(), json!(value));
    }
    data.insert(KEY_CA.to_owned(), json!(ByteString(ca.as_bytes().to_vec())));
    data.insert(
        KEY_NAMESPACE.to_owned(),
        json!(ByteString(namespace.as_bytes().to_vec())),
    );
    data
}

/// A member of one pod's two keys, for the token tests.
#[cfg(test)]
pub(crate) fn member(issued: i64, expires: i64) -> Member {
    Member {
        uid: "u".into(),
        keys: ["p.token", "p.uid"].into_iter().collect(),
        issued,
        expires,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn shard_names_round_trip_and_are_reserved() {
        assert_eq!(shard_name(0), "shard-0.vc-tokens");
        assert_eq!(shard_index("shard-12.vc-tokens"), Some(12));
        assert_eq!(shard_index("shard-012.vc-tokens"), None);
        assert_eq!(shard_index("web-1.vc-token"), None);
        assert_eq!(shard_index("shard-x.vc-tokens"), None);
        assert!(crate::tokens::mounts::is_reserved_secret_name(&shard_name(7)));
        assert!(crate::tokens::mounts::is_reserved_secret_name(
            &crate::tokens::legacy::secret_name("web-1")
        ));
        assert!(!crate::tokens::mounts::is_reserved_secret_name("vc-tokens"));
    }

    #[test]
    fn members_are_due_in_the_last_fifth_and_join_a_renewal_past_half_their_life() {
        let m = member(1000, 2000);
        assert_eq!(m.refresh_at(), Some(1800));
        assert!(!m.due(1799));
        assert!(m.due(1800));
        assert!(!m.joins_renewal(1499));
        assert!(m.joins_renewal(1500));
        let no_token = member(0, 0);
        assert!(!no_token.due(i64::MAX) && !no_token.joins_renewal(i64::MAX));
        assert!(m.covers(
            "p",
            &[TokenNeed {
                key: "token".into(),
                audience: None,
                expiration_seconds: None
            }]
        ));
        assert!(!m.covers(
            "p",
            &[TokenNeed {
                key: "token-x".into(),
                audience: None,
                expiration_seconds: None
            }]
        ));
    }

    #[test]
    fn a_pod_goes_to_its_own_shard_else_the_first_with_room_else_a_new_one() {
        let view = |index, occupancy, holds_pod| ShardView {
            index,
            occupancy,
            holds_pod,
        };
        assert_eq!(choose(&[], 32), 0);
        assert_eq!(choose(&[view(0, 32, false), view(1, 5, false)], 32), 1);
        assert_eq!(choose(&[view(0, 32, false), view(1, 32, false)], 32), 2);
        assert_eq!(choose(&[view(0, 3, false), view(1, 32, true)], 32), 1);
    }

    #[test]
    fn a_data_patch_adds_removes_and_keeps_the_shared_keys() {
        let added: BTreeMap<String, ByteString> =
            [("a.token".to_owned(), ByteString(b"jwt".to_vec()))].into();
        let gone = member(1, 2);
        let data = data_patch(&added, &[&gone], "CA", "shop");
        assert_eq!(data["a.token"], json!("and0"));
        assert_eq!(data["p.token"], Value::Null);
        assert_eq!(data["p.uid"], Value::Null);
        assert_eq!(data["ca.crt"], json!("Q0E="));
        assert_eq!(data["namespace"], json!("c2hvcA=="));
    }
}
