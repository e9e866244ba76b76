//! Watch-fed caches: the tenant pods on the served nodes, and the trust set built from VirtualClusters and
//! the kubelet-client CA bundle vc-manager keeps (one ConfigMap: vn-agent reads no Secret).

use std::{
    collections::BTreeSet,
    sync::{Arc, RwLock},
};

use crds::{VirtualCluster, wellknown::LABEL_CLUSTER};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::{
    Error, Result,
    identity::{TrustSet, Untrusted},
    metrics::Metrics,
    settings::{CaBundle, NodeScope},
    tls,
};

/// The caches vn-agent answers from.
pub struct Caches {
    client: Client,
    nodes: NodeScope,
    pods: Vec<Store<Pod>>,
    trust: Arc<RwLock<Arc<TrustSet>>>,
    /// The generation of the current trust set; bumped by every rebuild.
    trust_generation: Arc<watch::Sender<u64>>,
    ready: watch::Receiver<Readiness>,
}

/// Whether the caches are synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Readiness {
    Waiting,
    Ready,
    /// A cache stopped before it synced.
    Failed(&'static str),
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl Caches {
    /// Starts the watches; they run until `cancel`.
    pub fn start(
        client: Client,
        nodes: NodeScope,
        ca_bundle: &CaBundle,
        metrics: Metrics,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let label = watcher::Config::default().labels(LABEL_CLUSTER);
        let pod_configs: Vec<(String, watcher::Config)> = match &nodes {
            NodeScope::All => vec![("all nodes".to_owned(), label)],
            NodeScope::Named(names) => names
                .iter()
                .map(|node| {
                    (
                        node.clone(),
                        label.clone().fields(&format!("spec.nodeName={node}")),
                    )
                })
                .collect(),
        };
        let mut pods = Vec::new();
        for (scope, config) in pod_configs {
            let (store, writer) = reflector::store();
            let stream = watcher(Api::<Pod>::all(client.clone()), config)
                .default_backoff()
                .modify(|pod| pod.managed_fields_mut().clear())
                .reflect(writer);
            spawn_watch(stream, "pods", scope, None, cancel.clone());
            pods.push(store);
        }

        let changed = Arc::new(Notify::new());
        let (vc_store, vc_writer) = reflector::store();
        let vcs = watcher(
            Api::<VirtualCluster>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(|vc| vc.managed_fields_mut().clear())
        .reflect(vc_writer);
        spawn_watch(
            vcs,
            "virtualclusters",
            String::new(),
            Some(changed.clone()),
            cancel.clone(),
        );
        // Only the one ConfigMap: RBAC grants vn-agent that name alone.
        let (bundle_store, bundle_writer) = reflector::store();
        let bundle = watcher(
            Api::<ConfigMap>::namespaced(client.clone(), &ca_bundle.namespace),
            watcher::Config::default().fields(&format!("metadata.name={}", ca_bundle.name)),
        )
        .default_backoff()
        .modify(|config_map| config_map.managed_fields_mut().clear())
        .reflect(bundle_writer);
        spawn_watch(
            bundle,
            "kubelet-client CA bundle",
            format!("{}/{}", ca_bundle.namespace, ca_bundle.name),
            Some(changed.clone()),
            cancel.clone(),
        );

        let trust = Arc::new(RwLock::new(Arc::new(TrustSet::empty())));
        let trust_generation = Arc::new(watch::channel(0).0);
        let generation_changes = trust_generation.subscribe();
        tokio::spawn(maintain_trust(
            vc_store,
            bundle_store,
            changed,
            trust.clone(),
            trust_generation.clone(),
            metrics,
            cancel,
        ));
        // One task waits on the stores: a store wakes only the last of several concurrent waiters.
        let (ready_tx, ready) = watch::channel(Readiness::Waiting);
        let stores = pods.clone();
        tokio::spawn(async move {
            let synced = async {
                for store in &stores {
                    store.wait_until_ready().await.map_err(|_| "pod")?;
                }
                let mut generation = generation_changes;
                generation.wait_for(|g| *g > 0).await.map_err(|_| "trust")?;
                Ok::<_, &'static str>(())
            };
            match synced.await {
                Ok(()) => {
                    tracing::info!("caches synced");
                    ready_tx.send_replace(Readiness::Ready);
                }
                Err(cache) => {
                    ready_tx.send_replace(Readiness::Failed(cache));
                }
            }
        });
        Arc::new(Self {
            client,
            nodes,
            pods,
            trust,
            trust_generation,
            ready,
        })
    }

    /// Caches filled with `pods` and `trust`, without watches, for tests of request handling.
    #[cfg(test)]
    pub(crate) fn filled(client: Client, nodes: NodeScope, pods: Vec<Pod>, trust: TrustSet) -> Arc<Self> {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for pod in pods {
            writer.apply_watcher_event(&watcher::Event::InitApply(pod));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (_, ready) = watch::channel(Readiness::Ready);
        Arc::new(Self {
            client,
            nodes,
            pods: vec![store],
            trust: Arc::new(RwLock::new(Arc::new(trust))),
            trust_generation: Arc::new(watch::channel(0).0),
            ready,
        })
    }

    /// Replaces the trust set, as a rebuild does.
    #[cfg(test)]
    pub(crate) fn set_trust(&self, trust: TrustSet) {
        let generation = trust.generation();
        *self.trust.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(trust);
        self.trust_generation.send_replace(generation);
    }

    /// Waits until every cache is filled and the trust set was built once.
    pub async fn wait_ready(&self) -> Result<()> {
        let mut ready = self.ready.clone();
        let state = *ready
            .wait_for(|state| *state != Readiness::Waiting)
            .await
            .map_err(|_| Error::CacheSync { cache: "every" })?;
        match state {
            Readiness::Failed(cache) => Err(Error::CacheSync { cache }),
            _ => Ok(()),
        }
    }

    /// Whether requests can be answered (the caches are synced).
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow() == Readiness::Ready
    }

    /// Wakes on every rebuild of the trust set.
    pub fn trust_changes(&self) -> watch::Receiver<u64> {
        self.trust_generation.subscribe()
    }

    /// The current trust set.
    pub fn trust(&self) -> Arc<TrustSet> {
        self.trust.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A cached super pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        let key = ObjectRef::new(name).within(namespace);
        self.pods.iter().find_map(|store| store.get(&key))
    }

    /// Every cached super pod (tenant pods on the served nodes).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.iter().flat_map(Store::state).collect()
    }

    /// Whose pods are served.
    pub fn nodes(&self) -> &NodeScope {
        &self.nodes
    }

    /// Reads a pod the cache does not (yet) hold, e.g. one created a moment ago; `None` unless it is bound
    /// to a served node.
    pub async fn fetch_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>> {
        let pod = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|source| Error::Kube {
                context: format!("reading pod {namespace}/{name}"),
                source,
            })?;
        Ok(pod.filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|node| self.nodes.contains(node))
        }))
    }
}

fn spawn_watch<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    what: &'static str,
    scope: String,
    changed: Option<Arc<Notify>>,
    cancel: CancellationToken,
) where
    K: Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                _ = cancel.cancelled() => return,
                event = stream.next() => event,
            };
            match event {
                None => return,
                Some(Ok(watcher::Event::InitApply(_) | watcher::Event::Init)) => {}
                Some(Ok(_)) => {
                    if let Some(changed) = &changed {
                        changed.notify_one();
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(
                        cache = what,
                        scope,
                        error = &error as &dyn std::error::Error,
                        "watch failed; retrying"
                    )
                }
            }
        }
    });
}

async fn maintain_trust(
    virtual_clusters: Store<VirtualCluster>,
    bundle: Store<ConfigMap>,
    changed: Arc<Notify>,
    trust: Arc<RwLock<Arc<TrustSet>>>,
    generation_tx: Arc<watch::Sender<u64>>,
    metrics: Metrics,
    cancel: CancellationToken,
) {
    let synced = async {
        virtual_clusters.wait_until_ready().await.is_ok() && bundle.wait_until_ready().await.is_ok()
    };
    tokio::select! {
        _ = cancel.cancelled() => return,
        ok = synced => if !ok { return },
    }
    let provider = tls::provider();
    let mut generation = 0;
    let mut trusted: BTreeSet<String> = BTreeSet::new();
    let mut problems: Vec<Untrusted> = Vec::new();
    loop {
        generation += 1;
        let vcs = virtual_clusters.state();
        // No bundle (vc-manager has not written it yet): nobody is trusted.
        let entries: Vec<(String, String)> = bundle
            .state()
            .first()
            .and_then(|config_map| config_map.data.clone())
            .unwrap_or_default()
            .into_iter()
            .collect();
        let (set, untrusted) =
            TrustSet::build(generation, vcs.iter().map(AsRef::as_ref), &entries, &provider);
        let now: BTreeSet<String> = set.tenant_keys().into_iter().map(str::to_owned).collect();
        for added in now.difference(&trusted) {
            tracing::info!(tenant = %added, "trusting tenant's kubelet-client CA");
        }
        for removed in trusted.difference(&now) {
            tracing::info!(tenant = %removed, "no longer trusting tenant (VirtualCluster or its CA gone)");
        }
        for problem in untrusted.iter().filter(|u| !problems.contains(u)) {
            tracing::warn!(entry = %problem.entry, reason = %problem.reason, "kubelet-client CA bundle entry not trusted");
        }
        metrics
            .trusted_tenants
            .set(i64::try_from(set.len()).unwrap_or(i64::MAX));
        metrics
            .untrusted_cas
            .set(i64::try_from(untrusted.len()).unwrap_or(i64::MAX));
        metrics.trust_rebuilds.inc();
        *trust.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
        generation_tx.send_replace(generation);
        trusted = now;
        problems = untrusted;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = changed.notified() => {}
        }
    }
}
