//! Applies that would change nothing are not sent: what vc-manager last applied to each control-plane
//! object, and whether the object is still as that apply left it.
//!
//! A reconcile runs on every watch event of a tenant's objects and, while a tenant is not ready, every few
//! seconds; applying its Services and StatefulSets each time was a write storm of no-ops on the super
//! apiserver (a tenant whose apiserver never answered cost five applies every 2-3 seconds). An object is
//! applied again only when what vc-manager wants of it changed (the hash of the desired object), or
//! someone else changed it since (its `generation`, which only spec changes move, or for kinds without one
//! its `resourceVersion`), or it was replaced (its uid). The memo lives in memory: after a restart every
//! object is applied once.

use std::{collections::HashMap, sync::Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// What one apply left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Hash of the desired object applied.
    pub hash: String,
    /// Uid of the object the apply answered with.
    pub uid: String,
    /// Its version ([`version_of`]).
    pub version: String,
}

/// What moves when someone changes an object: its `generation` where it has one (spec changes only, so
/// status updates do not count), else its `resourceVersion`.
pub fn version_of(meta: &ObjectMeta) -> String {
    match meta.generation {
        Some(generation) => format!("g{generation}"),
        None => format!("rv{}", meta.resource_version.as_deref().unwrap_or_default()),
    }
}

/// The hash of a desired object.
pub fn hash_of<T: Serialize>(desired: &T) -> String {
    let json = serde_json::to_vec(desired).unwrap_or_default();
    hex::encode(&Sha256::digest(&json)[..16])
}

/// Whether applying `desired_hash` to the object `live` would change nothing, given what the last apply
/// left (`last`).
pub fn unchanged(last: Option<&Applied>, desired_hash: &str, live: Option<&ObjectMeta>) -> bool {
    match (last, live) {
        (Some(last), Some(live)) => {
            last.hash == desired_hash
                && live.uid.as_deref() == Some(last.uid.as_str())
                && version_of(live) == last.version
                && live.deletion_timestamp.is_none()
        }
        _ => false,
    }
}

/// What vc-manager last applied, by object (`kind/namespace/name`).
#[derive(Debug, Default)]
pub struct AppliedMemo {
    applied: Mutex<HashMap<String, Applied>>,
}

impl AppliedMemo {
    fn key(kind: &str, namespace: &str, name: &str) -> String {
        format!("{kind}/{namespace}/{name}")
    }

    /// What the last apply of that object left.
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Applied> {
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&Self::key(kind, namespace, name))
            .cloned()
    }

    /// Records an apply of `desired_hash` that answered with `result`.
    pub fn record(&self, kind: &str, namespace: &str, name: &str, desired_hash: &str, result: &ObjectMeta) {
        let applied = Applied {
            hash: desired_hash.to_owned(),
            uid: result.uid.clone().unwrap_or_default(),
            version: version_of(result),
        };
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(Self::key(kind, namespace, name), applied);
    }

    /// Forgets every object of a namespace (a tenant deleted).
    pub fn forget_namespace(&self, namespace: &str) {
        let infix = format!("/{namespace}/");
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|key, _| !key.contains(&infix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(uid: &str, generation: Option<i64>, rv: &str) -> ObjectMeta {
        ObjectMeta {
            uid: Some(uid.into()),
            generation,
            resource_version: Some(rv.into()),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_change_on_either_side_is_applied_again() {
        let last = Applied {
            hash: "h1".into(),
            uid: "u1".into(),
            version: version_of(&meta("u1", Some(3), "100")),
        };
        let service = Applied {
            hash: "h1".into(),
            uid: "u1".into(),
            version: version_of(&meta("u1", None, "100")),
        };
        let cases = [
            // As left: nothing to do, whatever its status did meanwhile.
            (Some(&last), "h1", Some(meta("u1", Some(3), "105")), true),
            // Something else is wanted now.
            (Some(&last), "h2", Some(meta("u1", Some(3), "100")), false),
            // Someone edited its spec.
            (Some(&last), "h1", Some(meta("u1", Some(4), "120")), false),
            // Deleted and made again by someone.
            (Some(&last), "h1", Some(meta("u2", Some(3), "100")), false),
            // Gone, or never applied by this process.
            (Some(&last), "h1", None, false),
            (None, "h1", Some(meta("u1", Some(3), "100")), false),
            // Without a generation any change counts.
            (Some(&service), "h1", Some(meta("u1", None, "100")), true),
            (Some(&service), "h1", Some(meta("u1", None, "101")), false),
        ];
        for (last, hash, live, expected) in cases {
            assert_eq!(
                unchanged(last, hash, live.as_ref()),
                expected,
                "{last:?} {hash} {live:?}"
            );
        }
    }

    #[test]
    fn the_memo_remembers_per_object_and_forgets_per_namespace() {
        let memo = AppliedMemo::default();
        memo.record(
            "StatefulSet",
            "root-a",
            "apiserver",
            "h",
            &meta("u", Some(1), "5"),
        );
        memo.record("Service", "root-b", "apiserver-svc", "h", &meta("v", None, "6"));
        assert_eq!(
            memo.get("StatefulSet", "root-a", "apiserver").map(|a| a.version),
            Some("g1".into())
        );
        assert!(memo.get("StatefulSet", "root-b", "apiserver").is_none());
        memo.forget_namespace("root-a");
        assert!(memo.get("StatefulSet", "root-a", "apiserver").is_none());
        assert!(memo.get("Service", "root-b", "apiserver-svc").is_some());
    }
}
