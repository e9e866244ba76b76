//! A cache indexed by its records themselves, for the kinds with a record per synced pod.
//!
//! kube's `Store` keys each object by an `ObjectRef`: 96 bytes and four strings of its own (name,
//! namespace, resource version, uid) beside the object, about 0.3 KiB a record. Every synced pod has a
//! record in two caches (its tenant's pods and the super pods), so the pod caches find records by hashing
//! the namespace and name the records already hold, and keep nothing but a pointer per record. They read
//! as kube's `Store` does (`get` by `ObjectRef`, `state`, `wait_until_ready`), and unlike it, wake every
//! task that waits for them to be ready.

use std::{
    borrow::Cow,
    hash::{BuildHasher, RandomState},
    sync::{Arc, RwLock},
};

use hashbrown::HashTable;
use kube::runtime::{
    reflector::{Lookup, ObjectRef},
    watcher,
};
use tokio::sync::watch;

/// Records by namespace and name.
struct Table<K> {
    records: HashTable<Arc<K>>,
}

impl<K: Lookup> Table<K> {
    fn new() -> Self {
        Self {
            records: HashTable::new(),
        }
    }

    fn find(&self, hasher: &RandomState, namespace: Option<&str>, name: &str) -> Option<&Arc<K>> {
        self.records
            .find(hash(hasher, namespace, name), |r| is(&**r, namespace, name))
    }

    /// Puts `record` in, returning the record it replaces.
    fn put(&mut self, hasher: &RandomState, record: Arc<K>) -> Option<Arc<K>> {
        let (namespace, name) = key(&*record);
        let entry = self.records.entry(
            hash(hasher, namespace.as_deref(), &name),
            |r| is(&**r, namespace.as_deref(), &name),
            |r| {
                let (namespace, name) = key(&**r);
                hash(hasher, namespace.as_deref(), &name)
            },
        );
        drop((namespace, name));
        match entry {
            hashbrown::hash_table::Entry::Occupied(mut occupied) => {
                Some(std::mem::replace(occupied.get_mut(), record))
            }
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                vacant.insert(record);
                None
            }
        }
    }

    fn take(&mut self, hasher: &RandomState, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let found = self
            .records
            .find_entry(hash(hasher, namespace, name), |r| is(&**r, namespace, name))
            .ok()?;
        Some(found.remove().0)
    }
}

fn key<K: Lookup>(record: &K) -> (Option<Cow<'_, str>>, Cow<'_, str>) {
    (record.namespace(), record.name().unwrap_or_default())
}

fn hash(hasher: &RandomState, namespace: Option<&str>, name: &str) -> u64 {
    hasher.hash_one((namespace, name))
}

fn is<K: Lookup>(record: &K, namespace: Option<&str>, name: &str) -> bool {
    let (at_namespace, at_name) = key(record);
    at_name == name && at_namespace.as_deref() == namespace
}

struct Shared<K> {
    table: RwLock<Table<K>>,
    hasher: RandomState,
    ready: watch::Sender<bool>,
}

/// The reading side of a slim cache; clones read the same cache.
pub struct SlimStore<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for SlimStore<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

/// The writing side of a slim cache, fed by its watch.
pub struct SlimWriter<K> {
    shared: Arc<Shared<K>>,
    /// The list being read, shown whole when it is done (as kube's `Writer` does).
    listing: Option<Table<K>>,
}

/// An empty cache, not ready until its first list is done.
pub fn slim_store<K: Lookup>() -> (SlimStore<K>, SlimWriter<K>) {
    let shared = Arc::new(Shared {
        table: RwLock::new(Table::new()),
        hasher: RandomState::new(),
        ready: watch::Sender::new(false),
    });
    (
        SlimStore {
            shared: shared.clone(),
        },
        SlimWriter {
            shared,
            listing: None,
        },
    )
}

impl<K: Lookup> SlimStore<K> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table<K>> {
        // Every change is one table operation: a panic elsewhere cannot leave it half done.
        self.shared
            .table
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The record of this namespace and name.
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.read()
            .find(&self.shared.hasher, key.namespace.as_deref(), &key.name)
            .cloned()
    }

    /// Every record.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.read().records.iter().cloned().collect()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.read().records.len()
    }

    /// Whether the cache holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the first list is done (every waiter wakes).
    pub async fn wait_until_ready(&self) {
        let mut ready = self.shared.ready.subscribe();
        // The sender lives as long as this store does.
        let _ = ready.wait_for(|ready| *ready).await;
    }
}

impl<K: Lookup + Clone> SlimWriter<K> {
    /// Applies a watch event, as kube's `Writer::apply_watcher_event` does.
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        self.apply_returning_previous(event);
    }

    /// Applies a watch event, returning the record an added or modified one replaces (while the watch
    /// lists anew: the record the cache shows until the new list is swapped in), so that a watcher can
    /// tell what changed.
    pub fn apply_returning_previous(&mut self, event: &watcher::Event<K>) -> Option<Arc<K>> {
        let hasher = &self.shared.hasher;
        match event {
            watcher::Event::Init => {
                self.listing = Some(Table::new());
                None
            }
            watcher::Event::InitApply(record) => match self.listing.as_mut() {
                Some(listing) => {
                    listing.put(hasher, Arc::new(record.clone()));
                    let (namespace, name) = key(record);
                    let shown = self
                        .shared
                        .table
                        .read()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    shown.find(hasher, namespace.as_deref(), &name).cloned()
                }
                None => self.write().put(hasher, Arc::new(record.clone())),
            },
            watcher::Event::InitDone => {
                if let Some(listing) = self.listing.take() {
                    *self.write() = listing;
                }
                self.shared.ready.send_replace(true);
                None
            }
            watcher::Event::Apply(record) => self.write().put(hasher, Arc::new(record.clone())),
            watcher::Event::Delete(record) => {
                let (namespace, name) = key(record);
                self.write().take(hasher, namespace.as_deref(), &name)
            }
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table<K>> {
        self.shared
            .table
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::pods::TenantPod;

    fn pod(namespace: &str, name: &str, version: &str) -> TenantPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": version}
        }))
        .expect("pod")
    }

    fn at(namespace: &str, name: &str) -> ObjectRef<TenantPod> {
        ObjectRef::new(name).within(namespace)
    }

    fn version(store: &SlimStore<TenantPod>, namespace: &str, name: &str) -> Option<String> {
        store
            .get(&at(namespace, name))
            .and_then(|p| p.meta().resource_version.as_deref().map(str::to_owned))
    }

    #[tokio::test]
    async fn records_are_found_by_namespace_and_name_and_a_list_replaces_them_whole() {
        let (store, mut writer) = slim_store::<TenantPod>();
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move { store.wait_until_ready().await })
        };
        let second = {
            let store = store.clone();
            tokio::spawn(async move { store.wait_until_ready().await })
        };
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(pod("a", "web", "1")));
        writer.apply_watcher_event(&watcher::Event::InitApply(pod("b", "web", "2")));
        // Not shown before the list is done.
        assert!(store.is_empty());
        writer.apply_watcher_event(&watcher::Event::InitDone);
        // Both waiters wake.
        waiter.await.expect("first waiter");
        second.await.expect("second waiter");
        assert_eq!(store.len(), 2);
        assert_eq!(version(&store, "a", "web").as_deref(), Some("1"));
        assert_eq!(version(&store, "b", "web").as_deref(), Some("2"));
        assert!(store.get(&at("c", "web")).is_none());

        // A change replaces the record; a deletion removes it.
        writer.apply_watcher_event(&watcher::Event::Apply(pod("a", "web", "3")));
        assert_eq!(version(&store, "a", "web").as_deref(), Some("3"));
        assert_eq!(store.len(), 2);
        writer.apply_watcher_event(&watcher::Event::Delete(pod("b", "web", "2")));
        assert!(store.get(&at("b", "web")).is_none());

        // A list anew drops what it does not hold, once it is done.
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(pod("d", "db", "9")));
        assert_eq!(version(&store, "a", "web").as_deref(), Some("3"));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(store.len(), 1);
        assert!(store.get(&at("a", "web")).is_none());
        assert_eq!(version(&store, "d", "db").as_deref(), Some("9"));
        store.wait_until_ready().await;
    }

    #[test]
    fn each_change_returns_the_record_it_replaced() {
        let (_store, mut writer) = slim_store::<TenantPod>();
        let mut replaced = |event| {
            writer
                .apply_returning_previous(&event)
                .and_then(|p| p.meta().resource_version.clone())
        };
        assert_eq!(replaced(watcher::Event::Apply(pod("a", "web", "1"))), None, "new");
        assert_eq!(
            replaced(watcher::Event::Apply(pod("a", "web", "2"))).as_deref(),
            Some("1"),
            "changed"
        );
        assert_eq!(
            replaced(watcher::Event::Apply(pod("b", "web", "5"))),
            None,
            "another namespace"
        );
        // While listing anew, what the cache shows until the list is done.
        assert_eq!(replaced(watcher::Event::Init), None);
        assert_eq!(
            replaced(watcher::Event::InitApply(pod("a", "web", "3"))).as_deref(),
            Some("2"),
            "relisted"
        );
        assert_eq!(
            replaced(watcher::Event::InitApply(pod("c", "db", "4"))),
            None,
            "new in the list"
        );
        assert_eq!(replaced(watcher::Event::InitDone), None);
        assert_eq!(
            replaced(watcher::Event::Apply(pod("a", "web", "6"))).as_deref(),
            Some("3"),
            "after the list"
        );
        assert_eq!(
            replaced(watcher::Event::Delete(pod("a", "web", "6"))).as_deref(),
            Some("6"),
            "deleted"
        );
    }

    #[test]
    fn many_records_stay_findable_as_the_table_grows() {
        let (store, mut writer) = slim_store::<TenantPod>();
        for i in 0..2000 {
            writer.apply_watcher_event(&watcher::Event::Apply(pod(
                &format!("ns-{}", i % 7),
                &format!("p-{i}"),
                "1",
            )));
        }
        assert_eq!(store.len(), 2000);
        for i in (0..2000).step_by(37) {
            assert!(
                store
                    .get(&at(&format!("ns-{}", i % 7), &format!("p-{i}")))
                    .is_some(),
                "p-{i}"
            );
            assert!(
                store
                    .get(&at(&format!("ns-{}", (i + 1) % 7), &format!("p-{i}")))
                    .is_none()
            );
        }
    }
}
