//! Parts many cached records hold alike, kept once: the tolerations every pod gets from its apiserver's
//! admission, the conditions of every running pod. A cached pod holds a pointer to its part instead of a
//! copy of its own (`bench_pod_records`: a running pod's status with its four conditions took 653 bytes of
//! heap, 194 with them pooled).
//!
//! Parts are pooled by a digest of their JSON (read without what differs between pods alike, such as
//! timestamps, which the cached types leave out): SHA-256, so that no tenant can make two different parts
//! share an entry, and an entry costs 32 bytes of key rather than the part's JSON. A pool entry goes when
//! the last record holding it does: the pool is swept whenever it has doubled since its last sweep, so
//! parts a tenant makes unique cost about what a copy of their own would, and no more for long.

use std::{
    collections::HashMap,
    fmt,
    ops::Deref,
    sync::{Arc, Mutex, Weak},
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// A type whose values are pooled: it names its pool.
pub trait Pooled: Serialize + Send + Sync + Sized + 'static {
    /// The pool of this type's values.
    fn pool() -> &'static Pool<Self>;
}

/// The values of one type in use, by the digest of their JSON.
pub struct Pool<T> {
    entries: Mutex<Entries<T>>,
}

struct Entries<T> {
    by_digest: HashMap<[u8; 32], Weak<T>>,
    /// Entries after the last sweep: the next sweep comes when there are twice as many.
    after_sweep: usize,
}

impl<T> Pool<T> {
    /// An empty pool, for a type's `static`.
    pub fn new() -> Self {
        Self {
            entries: Mutex::new(Entries {
                by_digest: HashMap::new(),
                after_sweep: 0,
            }),
        }
    }

    /// Entries, live or not yet swept.
    pub fn len(&self) -> usize {
        self.lock().by_digest.len()
    }

    /// Whether the pool has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<T>> {
        // Every change is one map operation: a panic elsewhere cannot leave it half done.
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The pooled value equal to `value` (by its JSON), or `value` newly pooled.
    fn share(&self, value: T) -> Arc<T>
    where
        T: Serialize,
    {
        let Ok(json) = serde_json::to_vec(&value) else {
            return Arc::new(value);
        };
        let digest: [u8; 32] = Sha256::digest(&json).into();
        let mut entries = self.lock();
        if let Some(shared) = entries.by_digest.get(&digest).and_then(Weak::upgrade) {
            return shared;
        }
        let shared = Arc::new(value);
        entries.by_digest.insert(digest, Arc::downgrade(&shared));
        if entries.by_digest.len() >= 2 * entries.after_sweep.max(64) {
            entries.by_digest.retain(|_, weak| weak.strong_count() > 0);
            entries.after_sweep = entries.by_digest.len();
        }
        shared
    }
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A value kept once in its type's pool; reads as the value.
pub struct Interned<T>(Arc<T>);

impl<T: Pooled> Interned<T> {
    /// The pooled value equal to `value`.
    pub fn new(value: T) -> Self {
        Self(T::pool().share(value))
    }
}

impl<T> Deref for Interned<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Clone for Interned<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T: Pooled + Default> Default for Interned<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: PartialEq> PartialEq for Interned<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl<T: fmt::Debug> fmt::Debug for Interned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Pooled> From<T> for Interned<T> {
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: Serialize> Serialize for Interned<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Pooled + Deserialize<'de>> Deserialize<'de> for Interned<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Self::new)
    }
}

/// Declares the pool of a type.
#[macro_export]
macro_rules! pooled {
    ($type:ty) => {
        impl $crate::cache::interned::Pooled for $type {
            fn pool() -> &'static $crate::cache::interned::Pool<Self> {
                static POOL: std::sync::OnceLock<$crate::cache::interned::Pool<$type>> =
                    std::sync::OnceLock::new();
                POOL.get_or_init($crate::cache::interned::Pool::new)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    struct Part {
        name: String,
    }

    crate::pooled!(Vec<Part>);

    fn part(name: &str) -> Vec<Part> {
        vec![Part {
            name: name.to_owned(),
        }]
    }

    #[test]
    fn equal_values_share_one_allocation_and_differ_from_others() {
        let a = Interned::new(part("shared-a"));
        let b: Interned<Vec<Part>> = serde_json::from_str(r#"[{"name": "shared-a"}]"#).expect("part");
        let c = Interned::new(part("shared-c"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(b[0].name, "shared-a");
        assert_eq!(
            serde_json::to_string(&b).expect("json"),
            r#"[{"name":"shared-a"}]"#
        );
    }

    #[test]
    fn entries_go_with_their_last_holder() {
        // Unique values, each dropped at once: the pool never holds many more than the sweep's threshold.
        for i in 0..1_000 {
            drop(Interned::new(part(&format!("gone-{i}"))));
        }
        let kept: Vec<_> = (0..10)
            .map(|i| Interned::new(part(&format!("kept-{i}"))))
            .collect();
        assert!(<Vec<Part> as Pooled>::pool().len() <= 2 * 64 + 10, "swept");
        // What is still held stays shared.
        assert!(Arc::ptr_eq(&kept[3].0, &Interned::new(part("kept-3")).0));
    }
}
