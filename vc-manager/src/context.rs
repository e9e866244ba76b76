//! What reconciles share: clients, caches, metrics, settings.

use std::{sync::Arc, time::Duration};

use crds::VirtualCluster;
use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::ObjectReference};
use kube::{
    Client,
    runtime::{
        events::{Event, EventType, Recorder, Reporter},
        reflector::Store,
    },
};
use tokio::sync::mpsc;
use vc_runtime::{backoff::Backoff, clients::ClientTimeouts};

use crate::{
    ca_bundle::BundleRef, cached::CachedClusterVersion, leader::LeaderFlag, metrics::Metrics,
    probe::TenantProbe,
};

/// The reporting controller of vc-manager's events.
pub const REPORTER: &str = "vc-manager";

/// Tunables of the controllers (flags of the binary).
#[derive(Clone, Debug)]
pub struct Settings {
    /// DNS domain of the super cluster, for the FQDNs in control-plane certificates.
    pub super_cluster_domain: String,
    /// Healthy VirtualClusters are reconciled at least this often (drift not seen by a watch, renewals).
    pub resync_interval: Duration,
    /// How often an adopted apiserver is checked.
    pub adopt_check_interval: Duration,
    /// How often deletion checks whether the tenant's namespaces are gone.
    pub deletion_poll_interval: Duration,
    /// First delay after a failed reconcile.
    pub backoff_base: Duration,
    /// Longest delay after failed reconciles.
    pub backoff_max: Duration,
    /// Timeouts for calls to adopted apiservers.
    pub tenant_timeouts: ClientTimeouts,
    /// How many VirtualClusters are reconciled at once.
    pub concurrency: u16,
    /// Triggers for one VirtualCluster within this long are merged into one reconcile (a reconcile's own
    /// writes come back as a burst of watch events).
    pub debounce: Duration,
    /// When a provisioned tenant counts as Running.
    pub native_readiness: NativeReadiness,
    /// The longest a tenant's leaf certificate may live, whatever its `pkiExpireDays` (platform policy).
    pub max_certificate_lifetime: Option<Duration>,
    /// The ConfigMap vc-manager keeps the tenants' kubelet-client CAs in, for vn-agent (none: not kept).
    pub kubelet_client_ca_bundle: Option<BundleRef>,
    /// Longest wait between checks of a provisioned tenant whose apiserver does not answer yet (the wait
    /// starts at [`NOT_READY_RECHECK_MIN`] and doubles).
    pub not_ready_recheck_max: Duration,
}

/// First wait before a provisioned tenant whose apiserver did not answer is checked again.
pub const NOT_READY_RECHECK_MIN: Duration = Duration::from_secs(3);

/// When a provisioned tenant counts as Running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NativeReadiness {
    /// Its StatefulSets are ready and its apiserver answers an authenticated request made with the admin
    /// kubeconfig from its Secret (at the apiserver Service's cluster IP).
    #[default]
    ApiserverAnswers,
    /// Its StatefulSets are ready. Only for tests and benchmarks on simulated nodes, where the control
    /// plane's pods are marked running and nothing serves.
    StatefulSetsReady,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            super_cluster_domain: "cluster.local".into(),
            resync_interval: Duration::from_secs(600),
            adopt_check_interval: Duration::from_secs(60),
            deletion_poll_interval: Duration::from_secs(2),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            tenant_timeouts: ClientTimeouts {
                connect: Duration::from_secs(5),
                read: Duration::from_secs(10),
            },
            concurrency: 16,
            debounce: Duration::from_millis(200),
            native_readiness: NativeReadiness::default(),
            max_certificate_lifetime: None,
            kubelet_client_ca_bundle: None,
            not_ready_recheck_max: Duration::from_secs(60),
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    /// The super-cluster client.
    pub client: Client,
    /// Publishes Kubernetes events.
    pub events: Events,
    /// Metrics.
    pub metrics: Metrics,
    /// Tunables.
    pub settings: Settings,
    /// Cache of VirtualClusters (the VirtualCluster controller's store).
    pub virtual_clusters: Store<VirtualCluster>,
    /// Cache of ClusterVersions (the ClusterVersion controller's store).
    pub cluster_versions: Store<CachedClusterVersion>,
    /// Cache of the control-plane StatefulSets vc-manager created.
    pub statefulsets: Store<StatefulSet>,
    /// Per-object backoff after failures.
    pub backoff: Backoff<String>,
    /// Leadership.
    pub leader: LeaderFlag,
    /// Checks adopted apiservers.
    pub probe: Arc<dyn TenantProbe>,
    /// What vc-manager last applied to each control-plane object: unchanged objects are not applied again.
    pub applied: crate::applied::AppliedMemo,
    /// Per-VirtualCluster backoff of the checks of a tenant whose apiserver does not answer.
    pub rechecks: Backoff<String>,
}

impl Context {
    /// A context with fresh metrics and backoff.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        settings: Settings,
        virtual_clusters: Store<VirtualCluster>,
        cluster_versions: Store<CachedClusterVersion>,
        statefulsets: Store<StatefulSet>,
        leader: LeaderFlag,
        probe: Arc<dyn TenantProbe>,
        metrics: Metrics,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: REPORTER.into(),
                instance: Some(vc_runtime::leader::identity()),
            },
        );
        Self {
            backoff: Backoff::new(settings.backoff_base, settings.backoff_max),
            applied: Default::default(),
            rechecks: Backoff::new(
                NOT_READY_RECHECK_MIN,
                settings.not_ready_recheck_max.max(NOT_READY_RECHECK_MIN),
            ),
            client,
            events: Events::Inline(recorder),
            metrics,
            settings,
            virtual_clusters,
            cluster_versions,
            statefulsets,
            leader,
            probe,
        }
    }

    /// Waits until the caches hold a full list, so that "not found" in a cache means not found.
    pub async fn caches_ready(&self) {
        synced(&self.virtual_clusters).await;
        synced(&self.cluster_versions).await;
        synced(&self.statefulsets).await;
    }

    /// Publishes an event about `regarding`; a failure is logged, never fatal.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1024)),
            action: action.to_owned(),
            secondary: None,
        };
        match &self.events {
            Events::Inline(recorder) => publish_now(recorder, regarding, &event).await,
            Events::Queued(shards) => {
                // One shard per object keeps each object's events in order.
                let shard = regarding
                    .uid
                    .as_deref()
                    .or(regarding.name.as_deref())
                    .unwrap_or_default()
                    .bytes()
                    .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(usize::from(b)))
                    % shards.len().max(1);
                if let Err(error) = shards[shard].try_send((regarding.clone(), event)) {
                    tracing::warn!(
                        object = ?regarding.name,
                        namespace = ?regarding.namespace,
                        reason,
                        error = %error,
                        "dropping event: the event queue is full"
                    );
                }
            }
        }
    }

    /// Publishes events from background tasks from now on, so that reconciles never wait for them. Needs a
    /// Tokio runtime; the tasks end when the context is dropped.
    #[must_use]
    pub fn with_queued_events(mut self) -> Self {
        if let Events::Inline(recorder) = &self.events {
            let shards = (0..EVENT_SHARDS)
                .map(|_| {
                    let (tx, mut rx) = mpsc::channel::<(ObjectReference, Event)>(EVENT_QUEUE);
                    let recorder = recorder.clone();
                    tokio::spawn(async move {
                        while let Some((regarding, event)) = rx.recv().await {
                            publish_now(&recorder, &regarding, &event).await;
                        }
                    });
                    tx
                })
                .collect();
            self.events = Events::Queued(shards);
        }
        self
    }
}

/// Background event publishers.
const EVENT_SHARDS: usize = 4;
/// Events waiting per publisher before new ones are dropped (events are best effort).
const EVENT_QUEUE: usize = 1024;

/// How events are published.
pub enum Events {
    /// During the reconcile, in order (tests see them between the other requests).
    Inline(Recorder),
    /// Handed to background publishers (one per shard of objects).
    Queued(Vec<mpsc::Sender<(ObjectReference, Event)>>),
}

async fn publish_now(recorder: &Recorder, regarding: &ObjectReference, event: &Event) {
    if let Err(error) = recorder.publish(event, regarding).await {
        tracing::warn!(
            object = ?regarding.name,
            namespace = ?regarding.namespace,
            reason = %event.reason,
            error = &error as &dyn std::error::Error,
            "publishing event"
        );
    }
}

/// Waits until `store` has its first full list.
///
/// `Store::wait_until_ready` wakes only the last of several concurrent waiters (its one-shot channel keeps a
/// single waker), and the controller itself waits on the same store; so wait in short rounds, each of which
/// polls again.
pub async fn synced<K>(store: &Store<K>)
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready()).await {
            Ok(Ok(())) => return,
            // The writer is gone: the controller stopped; nothing will ever be synced.
            Ok(Err(_)) => std::future::pending::<()>().await,
            Err(_) => continue,
        }
    }
}

/// Event notes are limited to 1 kB by the apiserver.
fn truncate(mut note: String, max: usize) -> String {
    if note.len() > max {
        let mut end = max.saturating_sub(3);
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("short".into(), 10), "short");
        let cut = truncate("é".repeat(600), 1024);
        assert!(cut.len() <= 1024);
        assert!(cut.ends_with("..."));
    }
}
