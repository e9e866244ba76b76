//! Labels and annotations read by key, from an object's full metadata or from a cached record's packed
//! metadata ([`PackedMeta`]).
//!
//! Identity (which tenant a super object belongs to, which tenant object it was made from) is read from
//! annotations. Most caches hold `ObjectMeta`, whose labels and annotations are B-tree maps: a map's node
//! takes about half a KiB however few keys it holds, and each key and value is a string of its own. A
//! super pod carries about a dozen keys, most of them the syncer's own, and every synced pod has one, so
//! the super pods' cache keeps its metadata packed instead: every key and value of a map in one string.
//! Code that reads identity takes [`Tagged`], so it reads either.

use std::{borrow::Cow, collections::BTreeMap, fmt};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Serialize, Serializer};

use crate::cache::interned::Interned;

/// An object's name and namespace, and its labels and annotations read by key or in key order: the trait
/// lives in `crds`, beside the ownership rule that reads through it.
pub use crds::Tagged;

/// An object whose labels and annotations identity is read from: every kube `Resource` (by its
/// `ObjectMeta`), and the cached records that pack theirs.
pub trait HasTags {
    /// Its name, namespace, labels and annotations.
    fn tags(&self) -> &impl Tagged;
}

impl<K: kube::Resource> HasTags for K {
    fn tags(&self) -> &impl Tagged {
        self.meta()
    }
}

/// The prefix of the syncer's own keys, a dozen on every super pod: kept as [`PREFIX_MARK`].
const SHARED_PREFIX: &str = "tenancy.x-k8s.io/";
/// Stands for [`SHARED_PREFIX`] at the start of a packed key. No label or annotation key holds it: the
/// apiserver allows only letters, digits, `-`, `_`, `.` and one `/` in them.
const PREFIX_MARK: char = '\0';

/// A string map packed into one string: every key and value one after the other, keys in order, and
/// where each ends. Two allocations for the whole map, against a B-tree node and two strings a pair.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PackedPairs {
    text: Box<str>,
    /// End of each key and each value in `text`, alternately.
    ends: Box<[u32]>,
}

impl PackedPairs {
    /// The pairs of an apiserver's map (in its key order); `None` is the empty map.
    ///
    /// A map is at most 256 KiB (the apiserver's limit on an object's annotations), well within `u32`
    /// offsets; should one be larger, it keeps the pairs that fit.
    pub fn from_map(map: Option<&BTreeMap<String, String>>) -> Self {
        let map = map.into_iter().flatten();
        let mut text = String::new();
        let mut ends = Vec::new();
        for (key, value) in map {
            let start = text.len();
            match key.strip_prefix(SHARED_PREFIX) {
                Some(rest) => {
                    text.push(PREFIX_MARK);
                    text.push_str(rest);
                }
                None => text.push_str(key),
            }
            let key_end = text.len();
            text.push_str(value);
            let (Ok(key_end), Ok(value_end)) = (u32::try_from(key_end), u32::try_from(text.len())) else {
                text.truncate(start);
                break;
            };
            ends.extend([key_end, value_end]);
        }
        Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        }
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.ends.len() / 2
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn part(&self, index: usize) -> &str {
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1] as usize,
        };
        &self.text[start..self.ends[index] as usize]
    }

    fn pair(&self, index: usize) -> (Cow<'_, str>, &str) {
        let key = self.part(2 * index);
        let key = match key.strip_prefix(PREFIX_MARK) {
            Some(rest) => Cow::Owned(format!("{SHARED_PREFIX}{rest}")),
            None => Cow::Borrowed(key),
        };
        (key, self.part(2 * index + 1))
    }

    /// How the key at `index` orders against `key` (without unpacking it).
    fn cmp_key(&self, index: usize, key: &str) -> std::cmp::Ordering {
        let packed = self.part(2 * index);
        match packed.strip_prefix(PREFIX_MARK) {
            Some(rest) => SHARED_PREFIX.bytes().chain(rest.bytes()).cmp(key.bytes()),
            None => packed.cmp(key),
        }
    }

    /// The value of a key.
    pub fn get(&self, key: &str) -> Option<&str> {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let middle = (low + high) / 2;
            match self.cmp_key(middle, key) {
                std::cmp::Ordering::Equal => return Some(self.part(2 * middle + 1)),
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
            }
        }
        None
    }

    /// Every pair, in key order (a key with the syncer's prefix is unpacked into a string of its own).
    pub fn iter(&self) -> impl Iterator<Item = (Cow<'_, str>, &str)> {
        (0..self.len()).map(|i| self.pair(i))
    }

    /// As the apiserver's map: `None` when empty.
    pub fn to_map(&self) -> Option<BTreeMap<String, String>> {
        (!self.is_empty()).then(|| self.iter().map(|(k, v)| (k.into_owned(), v.to_owned())).collect())
    }
}

impl Serialize for PackedPairs {
    /// As the apiserver's map (for pooling: the objects of one template, or one namespace, have their labels
    /// alike).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

crate::pooled!(PackedPairs);
// The namespaces of cached records.
crate::pooled!(Box<str>);

impl fmt::Debug for PackedPairs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// The metadata a cached record keeps: what identifies the object, its owners, when it was created and
/// whether it is being deleted, and its labels and annotations packed. Managed fields, finalizers and the
/// generation are left out: nothing reads them from the cache. The namespace and the labels, which the
/// objects of one namespace or one template have alike, are kept once for all ([`crate::cache::interned`]);
/// the annotations are the syncer's per-object identity, and differ.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackedMeta {
    /// Name.
    pub name: Box<str>,
    /// Namespace (pooled).
    pub namespace: Option<Interned<Box<str>>>,
    /// Uid.
    pub uid: Option<Box<str>>,
    /// Resource version.
    pub resource_version: Option<Box<str>>,
    /// When it was created.
    pub creation_timestamp: Option<Time>,
    /// When deletion was asked for.
    pub deletion_timestamp: Option<Time>,
    /// The grace period its deletion was asked with.
    pub deletion_grace_period_seconds: Option<i64>,
    /// Its owners (without spare room).
    pub owner_references: Option<Box<[OwnerReference]>>,
    /// Labels (pooled).
    pub labels: Interned<PackedPairs>,
    /// Annotations.
    pub annotations: PackedPairs,
}

impl From<ObjectMeta> for PackedMeta {
    fn from(meta: ObjectMeta) -> Self {
        let boxed = |s: Option<String>| s.map(String::into_boxed_str);
        Self {
            labels: Interned::new(PackedPairs::from_map(meta.labels.as_ref())),
            annotations: PackedPairs::from_map(meta.annotations.as_ref()),
            name: meta.name.unwrap_or_default().into_boxed_str(),
            namespace: boxed(meta.namespace).map(Interned::new),
            uid: boxed(meta.uid),
            resource_version: boxed(meta.resource_version),
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
            deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
            owner_references: meta.owner_references.map(Vec::into_boxed_slice),
        }
    }
}

impl PackedMeta {
    /// As the apiserver's metadata (for what compares or builds whole metadata).
    pub fn to_object_meta(&self) -> ObjectMeta {
        let owned = |s: &Option<Box<str>>| s.as_deref().map(str::to_owned);
        ObjectMeta {
            name: Some(self.name.to_string()),
            namespace: self.object_namespace().map(str::to_owned),
            uid: owned(&self.uid),
            resource_version: owned(&self.resource_version),
            creation_timestamp: self.creation_timestamp.clone(),
            deletion_timestamp: self.deletion_timestamp.clone(),
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            owner_references: self.owner_references.as_deref().map(<[_]>::to_vec),
            labels: self.labels.to_map(),
            annotations: self.annotations.to_map(),
            ..ObjectMeta::default()
        }
    }
}

impl Tagged for PackedMeta {
    fn object_name(&self) -> Option<&str> {
        Some(&self.name)
    }

    fn object_namespace(&self) -> Option<&str> {
        self.namespace.as_deref().map(|namespace| &**namespace)
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key)
    }

    fn each_label(&self) -> impl Iterator<Item = (Cow<'_, str>, &str)> {
        self.labels.iter()
    }

    fn each_annotation(&self) -> impl Iterator<Item = (Cow<'_, str>, &str)> {
        self.annotations.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn packed_pairs_read_like_the_map_they_were_packed_from() {
        let source = map(&[
            ("tenancy.x-k8s.io/uid", "u-1"),
            ("app", "web"),
            ("empty", ""),
            ("", "empty key"),
            ("tenancy.x-k8s.io/cluster", "default-abc123-vc"),
        ]);
        let packed = PackedPairs::from_map(Some(&source));
        assert_eq!(packed.len(), 5);
        for (key, value) in &source {
            assert_eq!(packed.get(key), Some(value.as_str()), "{key}");
        }
        assert_eq!(packed.get("missing"), None);
        assert_eq!(packed.get("tenancy.x-k8s.io/"), None);
        assert_eq!(
            packed
                .iter()
                .map(|(k, v)| (k.into_owned(), v))
                .collect::<Vec<_>>(),
            source
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str()))
                .collect::<Vec<_>>()
        );
        // The syncer's prefix is packed as one character.
        let unpacked: usize = source.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(packed.text.len(), unpacked - 2 * (SHARED_PREFIX.len() - 1));
        assert_eq!(packed.to_map(), Some(source));
        let empty = PackedPairs::from_map(None);
        assert!(empty.is_empty() && empty.get("").is_none() && empty.to_map().is_none());
        assert_eq!(PackedPairs::from_map(Some(&BTreeMap::new())), empty);
    }

    #[test]
    fn packed_metadata_keeps_identity_and_tags() {
        let meta = ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default-abc123-vc-shop".into()),
            uid: Some("u-9".into()),
            resource_version: Some("42".into()),
            labels: Some(map(&[("app", "web")])),
            annotations: Some(map(&[("tenancy.x-k8s.io/uid", "t-1")])),
            managed_fields: Some(vec![Default::default()]),
            owner_references: Some(vec![OwnerReference {
                name: "rs".into(),
                ..Default::default()
            }]),
            deletion_grace_period_seconds: Some(30),
            finalizers: Some(vec!["x".into()]),
            ..ObjectMeta::default()
        };
        let packed = PackedMeta::from(meta.clone());
        assert_eq!(packed.label("app"), Some("web"));
        assert_eq!(packed.annotation("tenancy.x-k8s.io/uid"), Some("t-1"));
        assert_eq!(packed.annotation("app"), None);
        let back = packed.to_object_meta();
        assert_eq!(
            (back.name, back.namespace, back.uid, back.resource_version),
            (meta.name, meta.namespace, meta.uid, meta.resource_version)
        );
        assert_eq!((back.labels, back.annotations), (meta.labels, meta.annotations));
        assert_eq!(
            (back.owner_references, back.deletion_grace_period_seconds),
            (meta.owner_references, meta.deletion_grace_period_seconds)
        );
        assert!(back.managed_fields.is_none() && back.finalizers.is_none());
    }

    #[test]
    fn objects_alike_share_their_namespace_and_labels_but_not_their_annotations() {
        let meta = |name: &str, app: &str| {
            PackedMeta::from(ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default-abc123-vc-shop".into()),
                labels: Some(map(&[("app", app), ("tenancy.x-k8s.io/vcname", "vc")])),
                annotations: Some(map(&[("tenancy.x-k8s.io/uid", name)])),
                ..ObjectMeta::default()
            })
        };
        let (first, second, other) = (meta("a", "web"), meta("b", "web"), meta("c", "db"));
        assert!(std::ptr::eq::<PackedPairs>(&*first.labels, &*second.labels));
        assert!(std::ptr::eq::<str>(
            first.object_namespace().expect("namespace"),
            second.object_namespace().expect("namespace")
        ));
        assert!(!std::ptr::eq::<PackedPairs>(&*first.labels, &*other.labels));
        assert_eq!(
            (first.label("app"), second.label("app"), other.label("app")),
            (Some("web"), Some("web"), Some("db"))
        );
        assert_eq!(
            (
                first.annotation("tenancy.x-k8s.io/uid"),
                second.annotation("tenancy.x-k8s.io/uid")
            ),
            (Some("a"), Some("b"))
        );
        // The syncer's prefix is packed, not lost: a label that differs only there is another label.
        let unprefixed = PackedMeta::from(ObjectMeta {
            name: Some("d".into()),
            labels: Some(map(&[("app", "web"), ("vcname", "vc")])),
            ..ObjectMeta::default()
        });
        assert!(!std::ptr::eq::<PackedPairs>(&*first.labels, &*unprefixed.labels));
        assert_eq!(unprefixed.label("tenancy.x-k8s.io/vcname"), None);
    }
}
