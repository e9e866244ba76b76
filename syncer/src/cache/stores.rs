//! Watch-fed caches holding only what sync needs.

use std::{fmt::Debug, future::Future, hash::Hash, sync::Arc};

use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Resource,
    api::ObjectMeta,
    runtime::{
        WatchStreamExt, reflector,
        reflector::{Lookup, Store},
        watcher,
    },
};
use serde::{Serialize, de::DeserializeOwned};
use tokio::task::JoinHandle;

use crate::{
    cache::slim_store::{SlimStore, slim_store},
    engine::budget::Ledger,
};

/// Drops what sync never reads: managed fields and the last-applied annotation are often larger than the
/// rest of the object.
pub fn trim<K: Resource>(object: &mut K) {
    trim_meta(object.meta_mut());
}

/// [`trim`] of an object's metadata. Lists lose their spare room as well (read without a length first, a
/// `Vec` keeps capacity for up to twice its items; an owner reference is 150 bytes).
pub fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    if let Some(owners) = &mut meta.owner_references {
        owners.shrink_to_fit();
    }
    if let Some(finalizers) = &mut meta.finalizers {
        finalizers.shrink_to_fit();
    }
}

/// A kind's cache on one side: a store, `Option` of one for a kind synced by flag, or `()` for a kind with
/// no cache on that side.
pub trait Cache: Send + Sync + Sized + 'static {
    /// Waits until the cache has listed once.
    fn wait_ready(&self) -> impl Future<Output = ()> + Send;

    /// A cache that is never filled, for tests to fill by hand.
    #[cfg(test)]
    fn empty() -> Self;
}

impl<K> Cache for Store<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    async fn wait_ready(&self) {
        let _ = self.wait_until_ready().await;
    }

    #[cfg(test)]
    fn empty() -> Self {
        reflector::store().0
    }
}

impl<K> Cache for SlimStore<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
{
    async fn wait_ready(&self) {
        self.wait_until_ready().await;
    }

    #[cfg(test)]
    fn empty() -> Self {
        slim_store().0
    }
}

impl<C: Cache> Cache for Option<C> {
    async fn wait_ready(&self) {
        if let Some(cache) = self {
            cache.wait_ready().await;
        }
    }

    #[cfg(test)]
    fn empty() -> Self {
        None
    }
}

impl Cache for () {
    async fn wait_ready(&self) {}

    #[cfg(test)]
    fn empty() -> Self {}
}

/// What happened to a cached object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Added or modified (also when listed at start).
    Applied,
    /// Deleted.
    Deleted,
}

/// Starts a reflector on `api` and calls `on_change` with every object it adds, changes or deletes,
/// after the store reflects the change. The task ends when the returned handle is aborted.
pub fn reflect<K, F>(api: Api<K>, config: watcher::Config, on_change: F) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
    F: Fn(&K) + Send + 'static,
{
    reflect_with(api, config, trim::<K>, move |object, _| on_change(object))
}

/// Called when a watch starts to list anew, before the cache takes the new list: the cache is about to be
/// replaced wholesale (after a restarted apiserver, an expired watch, or at the start).
pub type OnRelist = std::sync::Arc<dyn Fn() + Send + Sync>;

/// Like [`reflect`] with the kind of change, and calls `on_relist` whenever the watch lists anew.
pub fn reflect_relisting<K, F>(
    api: Api<K>,
    config: watcher::Config,
    on_relist: OnRelist,
    on_change: F,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    F: Fn(&K, Change) + Send + 'static,
{
    let (reader, apply) = kube_store();
    let task = reflect_inner(
        api,
        config,
        std::convert::identity,
        Hooks::relisting(on_relist),
        apply,
        ignoring_previous(on_change),
    );
    (reader, task)
}

/// Like [`reflect_relisting`], and every object the cache takes is charged to `ledger`'s budget: an object
/// that does not fit is not cached (and `on_change` does not hear of it).
pub fn reflect_budgeted<K, F>(
    api: Api<K>,
    config: watcher::Config,
    on_relist: OnRelist,
    ledger: Ledger<K>,
    on_change: F,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    F: Fn(&K, Change) + Send + 'static,
{
    let (reader, apply) = kube_store();
    let hooks = Hooks::budgeted(on_relist, ledger);
    let task = reflect_inner(
        api,
        config,
        std::convert::identity,
        hooks,
        apply,
        ignoring_previous(on_change),
    );
    (reader, task)
}

/// Like [`reflect_budgeted`], caching each watched object `W` (weighed as read) as what `convert` makes
/// of it, in a [`SlimStore`]; `on_change` also hears the record an added or modified one replaced.
pub fn reflect_budgeted_slim<W, K, C, F>(
    api: Api<W>,
    config: watcher::Config,
    on_relist: OnRelist,
    ledger: Ledger<W>,
    convert: C,
    on_change: F,
) -> (SlimStore<K>, JoinHandle<()>)
where
    W: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + 'static,
    W::DynamicType: Default,
    K: Lookup + Clone + Send + Sync + 'static,
    C: FnMut(W) -> K + Send + 'static,
    F: Fn(&K, Change, Option<&K>) + Send + 'static,
{
    let (reader, apply) = slim();
    let hooks = Hooks::budgeted(on_relist, ledger);
    let task = reflect_inner(api, config, convert, hooks, apply, on_change);
    (reader, task)
}

/// Decides whether a watch event reaches the cache.
type Admit<K> = Box<dyn FnMut(&watcher::Event<K>) -> bool + Send>;

/// Like [`reflect`], with a further trimming step (after [`trim`], which every watch applies) and the kind
/// of change.
pub fn reflect_with<K, T, F>(
    api: Api<K>,
    config: watcher::Config,
    mut trim: T,
    on_change: F,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    T: FnMut(&mut K) + Send + 'static,
    F: Fn(&K, Change) + Send + 'static,
{
    let convert = move |mut object: K| {
        trim(&mut object);
        object
    };
    let (reader, apply) = kube_store();
    let task = reflect_inner(
        api,
        config,
        convert,
        Hooks::none(),
        apply,
        ignoring_previous(on_change),
    );
    (reader, task)
}

/// Like [`reflect_with`], caching each watched object `W` as what `convert` makes of it (a record that
/// keeps less than the type the apiserver's JSON is read into), in a [`SlimStore`]; `on_change` also
/// hears the record an added or modified one replaced, so that it can tell what changed.
pub fn reflect_slim<W, K, C, F>(
    api: Api<W>,
    config: watcher::Config,
    convert: C,
    on_change: F,
) -> (SlimStore<K>, JoinHandle<()>)
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    W::DynamicType: Default,
    K: Lookup + Clone + Send + Sync + 'static,
    C: FnMut(W) -> K + Send + 'static,
    F: Fn(&K, Change, Option<&K>) + Send + 'static,
{
    let (reader, apply) = slim();
    let task = reflect_inner(api, config, convert, Hooks::none(), apply, on_change);
    (reader, task)
}

/// `on_change` for a cache that does not say what a change replaced.
fn ignoring_previous<K>(
    on_change: impl Fn(&K, Change) + Send + 'static,
) -> impl Fn(&K, Change, Option<&K>) + Send + 'static {
    move |object, change, _| on_change(object, change)
}

/// Applies a watch event to a cache: kube's `Writer`, or a [`SlimWriter`], which also returns the record
/// an added or modified one replaced.
type Apply<K> = Box<dyn FnMut(&watcher::Event<K>) -> Option<Arc<K>> + Send>;

/// kube's store, and how its watch applies events to it.
fn kube_store<K>() -> (Store<K>, Apply<K>)
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, mut writer) = reflector::store();
    (
        reader,
        Box::new(move |event| {
            writer.apply_watcher_event(event);
            None
        }),
    )
}

/// A [`SlimStore`], and how its watch applies events to it.
fn slim<K>() -> (SlimStore<K>, Apply<K>)
where
    K: Lookup + Clone + Send + Sync + 'static,
{
    let (reader, mut writer) = slim_store();
    (
        reader,
        Box::new(move |event| writer.apply_returning_previous(event)),
    )
}

/// What a watch calls besides its cache's writer and `on_change`.
struct Hooks<W> {
    /// Called when the watch lists anew.
    on_relist: Option<OnRelist>,
    /// Decides which events the cache takes.
    admit: Option<Admit<W>>,
}

impl<W> Hooks<W> {
    fn none() -> Self {
        Self {
            on_relist: None,
            admit: None,
        }
    }

    fn relisting(on_relist: OnRelist) -> Self {
        Self {
            on_relist: Some(on_relist),
            admit: None,
        }
    }

    /// Relisting, and every event charged to `ledger`'s budget.
    fn budgeted(on_relist: OnRelist, mut ledger: Ledger<W>) -> Self
    where
        W: Resource + Serialize + 'static,
    {
        Self {
            on_relist: Some(on_relist),
            admit: Some(Box::new(move |event| ledger.admit(event))),
        }
    }
}

fn reflect_inner<W, K, C, F>(
    api: Api<W>,
    config: watcher::Config,
    mut convert: C,
    hooks: Hooks<W>,
    mut apply: Apply<K>,
    on_change: F,
) -> JoinHandle<()>
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    W::DynamicType: Default,
    K: Lookup + Clone + Send + Sync + 'static,
    C: FnMut(W) -> K + Send + 'static,
    F: Fn(&K, Change, Option<&K>) + Send + 'static,
{
    let Hooks { on_relist, mut admit } = hooks;
    let resource = std::any::type_name::<K>().rsplit("::").next().unwrap_or("object");
    // Trimmed, admitted (the budget weighs what is left), then converted to what the cache keeps.
    let watched = watcher(api, config)
        .default_backoff()
        .modify(|object| trim(object))
        .filter(move |event| {
            let admitted = match (event, admit.as_mut()) {
                (Ok(event), Some(admit)) => admit(event),
                _ => true,
            };
            std::future::ready(admitted)
        })
        .map_ok(move |event| match event {
            watcher::Event::Apply(o) => watcher::Event::Apply(convert(o)),
            watcher::Event::InitApply(o) => watcher::Event::InitApply(convert(o)),
            watcher::Event::Delete(o) => watcher::Event::Delete(convert(o)),
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
        });
    // The cache takes each event before `on_change` hears of it.
    let stream = watched.map_ok(move |event| {
        let previous = apply(&event);
        (event, previous)
    });
    // The task carries the caller's span, so its log lines say which cluster they are about.
    let span = tracing::Span::current();
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok((watcher::Event::Apply(object) | watcher::Event::InitApply(object), previous)) => {
                        on_change(&object, Change::Applied, previous.as_deref())
                    }
                    Ok((watcher::Event::Delete(object), _)) => on_change(&object, Change::Deleted, None),
                    // The store swaps in the new list at InitDone, so this runs before it shows.
                    Ok((watcher::Event::Init, _)) => {
                        if let Some(on_relist) = &on_relist {
                            on_relist();
                        }
                    }
                    Ok((watcher::Event::InitDone, _)) => {}
                    Err(error) => tracing::debug!(resource, %error, "watch interrupted; retrying"),
                }
            }
        },
        span,
    ))
}
