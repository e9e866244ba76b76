//! Watches of the super cluster that keep the index current: VirtualClusters (cluster domains), the
//! syncer's namespaces, Services and pods (label `tenancy.x-k8s.io/vcname`, which only the syncer sets),
//! and the EndpointSlices of those Services (which the super cluster's controllers label like their
//! Service). Each event changes the index at once, so an answer reflects a change as soon as the watch
//! delivers it; a relist replaces a kind's records in one step when it completes.

use std::sync::{Arc, RwLock};

use crds::{VirtualCluster, wellknown::LABEL_VC_NAME};
use futures::{Stream, StreamExt};
use k8s_openapi::api::{
    core::v1::{Namespace, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    Error, Result,
    index::{ClearKind, Index},
    metrics::Metrics,
    objects::{self, PodView},
};

/// The shared index.
pub type SharedIndex = Arc<RwLock<Index>>;

/// Told whenever a watch changed the index: a query from an address not known yet waits on it for the pod
/// watch to learn the address.
pub type IndexChanges = Arc<watch::Sender<()>>;

/// A new [`IndexChanges`].
pub fn index_changes() -> IndexChanges {
    Arc::new(watch::channel(()).0)
}

/// How many watches have listed once; ready when all have.
#[derive(Clone, Debug)]
pub struct Synced {
    listed: watch::Receiver<usize>,
    total: usize,
}

impl Synced {
    /// Waits until every watch has listed once.
    pub async fn wait(&self) -> Result<()> {
        let mut listed = self.listed.clone();
        listed
            .wait_for(|n| *n >= self.total)
            .await
            .map(|_| ())
            .map_err(|_| Error::NeverSynced("super-cluster"))
    }

    /// Whether every watch has listed once.
    pub fn is_ready(&self) -> bool {
        *self.listed.borrow() >= self.total
    }
}

/// What a watch does with its objects.
trait Kind:
    Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static
{
    const NAME: &'static str;
    fn apply(index: &mut Index, object: &Self, present: bool);
    fn clear(index: &mut Index);
}

fn namespaced_name<K: Resource>(object: &K) -> (String, String) {
    (
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

impl Kind for Namespace {
    const NAME: &'static str = "namespaces";
    fn apply(index: &mut Index, object: &Self, present: bool) {
        index.set_namespace(
            &object.name_any(),
            present.then(|| objects::namespace_owner(object)).flatten(),
        );
    }
    fn clear(index: &mut Index) {
        index.clear(ClearKind::Namespaces);
    }
}

impl Kind for Service {
    const NAME: &'static str = "services";
    fn apply(index: &mut Index, object: &Self, present: bool) {
        let (namespace, name) = namespaced_name(object);
        index.set_service(
            &namespace,
            &name,
            present.then(|| objects::service_record(object)).flatten(),
        );
    }
    fn clear(index: &mut Index) {
        index.clear(ClearKind::Services);
    }
}

impl Kind for EndpointSlice {
    const NAME: &'static str = "endpointslices";
    fn apply(index: &mut Index, object: &Self, present: bool) {
        let (namespace, name) = namespaced_name(object);
        index.set_slice(
            &namespace,
            &name,
            present.then(|| objects::slice_record(object)).flatten(),
        );
    }
    fn clear(index: &mut Index) {
        index.clear(ClearKind::Slices);
    }
}

impl Kind for PodView {
    const NAME: &'static str = "pods";
    fn apply(index: &mut Index, object: &Self, present: bool) {
        let (namespace, name) = namespaced_name(object);
        index.set_pod(
            &namespace,
            &name,
            present.then(|| objects::pod_addresses(object)).flatten(),
        );
    }
    fn clear(index: &mut Index) {
        index.clear(ClearKind::Pods);
    }
}

fn write(index: &SharedIndex) -> std::sync::RwLockWriteGuard<'_, Index> {
    index.write().unwrap_or_else(|e| e.into_inner())
}

/// Feeds one watch's events into the index until `cancel`.
async fn feed<K: Kind>(
    stream: impl Stream<Item = std::result::Result<watcher::Event<K>, watcher::Error>> + Send,
    index: SharedIndex,
    metrics: Metrics,
    listed: Arc<watch::Sender<usize>>,
    changes: IndexChanges,
    cancel: CancellationToken,
) {
    let mut stream = std::pin::pin!(stream);
    let mut relist: Option<Vec<K>> = None;
    let mut counted = false;
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            event = stream.next() => event,
        };
        let Some(event) = event else {
            tracing::error!(kind = K::NAME, "watch ended");
            return;
        };
        match event {
            Ok(watcher::Event::Apply(object)) => K::apply(&mut write(&index), &object, true),
            Ok(watcher::Event::Delete(object)) => K::apply(&mut write(&index), &object, false),
            Ok(watcher::Event::Init) => relist = Some(Vec::new()),
            Ok(watcher::Event::InitApply(object)) => relist.get_or_insert_with(Vec::new).push(object),
            Ok(watcher::Event::InitDone) => {
                let objects = relist.take().unwrap_or_default();
                let count = objects.len();
                {
                    let mut index = write(&index);
                    K::clear(&mut index);
                    for object in &objects {
                        K::apply(&mut index, object, true);
                    }
                    metrics.records.set(index.records() as i64);
                }
                changes.send_replace(());
                tracing::info!(kind = K::NAME, objects = count, "listed");
                if !counted {
                    counted = true;
                    listed.send_modify(|n| *n += 1);
                }
                continue;
            }
            Err(error) => {
                tracing::warn!(
                    kind = K::NAME,
                    error = &error as &dyn std::error::Error,
                    "watch error; retrying"
                );
                continue;
            }
        }
        changes.send_replace(());
        metrics
            .records
            .set(index.read().map(|i| i.records()).unwrap_or_default() as i64);
    }
}

fn spawn<K: Kind>(
    api: Api<K>,
    config: watcher::Config,
    index: &SharedIndex,
    metrics: &Metrics,
    listed: &Arc<watch::Sender<usize>>,
    changes: &IndexChanges,
    cancel: &CancellationToken,
) {
    let stream = watcher(api, config).default_backoff();
    tokio::spawn(feed::<K>(
        stream,
        index.clone(),
        metrics.clone(),
        listed.clone(),
        changes.clone(),
        cancel.clone(),
    ));
}

/// VirtualClusters: every tenant's cluster key and domain.
async fn feed_domains(
    client: Client,
    index: SharedIndex,
    metrics: Metrics,
    listed: Arc<watch::Sender<usize>>,
    cancel: CancellationToken,
) {
    let stream = watcher(Api::<VirtualCluster>::all(client), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut relist: Option<Vec<VirtualCluster>> = None;
    let mut counted = false;
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            event = stream.next() => event,
        };
        let Some(event) = event else {
            tracing::error!("VirtualCluster watch ended");
            return;
        };
        let mut index_guard = match &event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) | Err(_) => None,
            _ => Some(write(&index)),
        };
        match event {
            Ok(watcher::Event::Apply(vc)) => {
                if let (Some(index), Some((key, domain))) =
                    (index_guard.as_mut(), objects::tenant_domain(&vc))
                {
                    // A tenant being deleted keeps its names until its VirtualCluster is gone.
                    index.set_domain(key, &domain);
                }
            }
            Ok(watcher::Event::Delete(vc)) => {
                if let (Some(index), Some((key, _))) = (index_guard.as_mut(), objects::tenant_domain(&vc)) {
                    index.remove_domain(&key);
                }
            }
            Ok(watcher::Event::Init) => relist = Some(Vec::new()),
            Ok(watcher::Event::InitApply(vc)) => relist.get_or_insert_with(Vec::new).push(vc),
            Ok(watcher::Event::InitDone) => {
                if let Some(index) = index_guard.as_mut() {
                    index.replace_domains(
                        relist
                            .take()
                            .unwrap_or_default()
                            .iter()
                            .filter_map(objects::tenant_domain),
                    );
                }
                if !counted {
                    counted = true;
                    listed.send_modify(|n| *n += 1);
                }
            }
            Err(error) => {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "VirtualCluster watch error; retrying"
                );
            }
        }
        if let Some(index) = index_guard {
            metrics.tenants.set(index.tenants() as i64);
        }
    }
}

/// Starts the watches; they run until `cancel`, and tell `changes` of every change of the index.
pub fn start(
    client: Client,
    index: SharedIndex,
    metrics: Metrics,
    changes: IndexChanges,
    cancel: CancellationToken,
) -> Synced {
    let (sender, listed) = watch::channel(0usize);
    let sender = Arc::new(sender);
    let ours = watcher::Config::default().labels(LABEL_VC_NAME);
    tokio::spawn(feed_domains(
        client.clone(),
        index.clone(),
        metrics.clone(),
        sender.clone(),
        cancel.clone(),
    ));
    spawn(
        Api::<Namespace>::all(client.clone()),
        ours.clone(),
        &index,
        &metrics,
        &sender,
        &changes,
        &cancel,
    );
    spawn(
        Api::<Service>::all(client.clone()),
        ours.clone(),
        &index,
        &metrics,
        &sender,
        &changes,
        &cancel,
    );
    spawn(
        Api::<EndpointSlice>::all(client.clone()),
        ours.clone(),
        &index,
        &metrics,
        &sender,
        &changes,
        &cancel,
    );
    spawn(
        Api::<PodView>::all(client),
        ours,
        &index,
        &metrics,
        &sender,
        &changes,
        &cancel,
    );
    Synced { listed, total: 5 }
}
