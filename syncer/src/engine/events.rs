//! Kubernetes events: the syncer's own, in tenants, and the inbox where copies of super-cluster events
//! wait for the upward workers (the copying is [`crate::resources::event`]'s).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use kube::{
    ResourceExt,
    runtime::events::{Event, EventType},
};

use crate::{engine::queue::TenantId, metrics::Metrics, tenancy::tenant::Tenant};

/// Refuses to write a tenant object, the one way every kind does it: a warning in the log (the sync's
/// span names the tenant and the object), the refusal metric, and a Warning event on the object when
/// there is one to put it on (`None`: the caller tells the tenant later, in one event for several).
pub async fn refuse(
    metrics: &Metrics,
    tenant: &Tenant,
    reference: Option<&ObjectReference>,
    resource: &'static str,
    reason: &'static str,
    message: &str,
) {
    let api_version = reference
        .and_then(|r| r.api_version.as_deref())
        .unwrap_or_default();
    let kind = reference.and_then(|r| r.kind.as_deref()).unwrap_or_default();
    tracing::warn!(resource, reason, api_version, kind, "{message}");
    metrics.resources.refused(resource, reason);
    if let Some(reference) = reference {
        warn(tenant, reference, reason, message).await;
    }
}

/// Publishes a warning about a tenant object in the tenant.
pub async fn warn(tenant: &Tenant, reference: &ObjectReference, reason: &str, note: &str) {
    publish(tenant, reference, EventType::Warning, reason, note).await;
}

/// Publishes a normal event about a tenant object in the tenant.
pub async fn normal(tenant: &Tenant, reference: &ObjectReference, reason: &str, note: &str) {
    publish(tenant, reference, EventType::Normal, reason, note).await;
}

async fn publish(tenant: &Tenant, reference: &ObjectReference, type_: EventType, reason: &str, note: &str) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note.to_owned()),
        action: "Sync".into(),
        secondary: None,
    };
    if let Err(error) = tenant.recorder.publish(&event, reference).await {
        tracing::warn!(
            tenant = %tenant.identity.vc_ref(),
            object = %reference.name.clone().unwrap_or_default(),
            reason,
            %error,
            "publishing an event in the tenant"
        );
    }
}

/// Most events of one tenant waiting to be copied up. Events are advice: past this, a tenant whose pods
/// cause an event storm loses the newest of its own events (counted in `syncer_events_dropped`), and the
/// syncer's memory does not grow with the storm.
pub const PENDING_EVENTS_PER_TENANT: usize = 1000;

/// Tenant copies of super events, waiting for an upward worker. The upward queue carries only their names:
/// it shares the workers fairly between tenants, so one tenant's storm waits behind its own events, never
/// in front of another tenant's; a newer version of a waiting event replaces it.
#[derive(Default)]
pub struct EventInbox {
    pending: std::sync::Mutex<HashMap<TenantId, Waiting>>,
}

/// One tenant's waiting event copies, by tenant namespace and name.
type Waiting = HashMap<(String, String), CoreEvent>;

impl EventInbox {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, Waiting>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds a tenant event until a worker copies it; refuses it when the tenant already has
    /// [`PENDING_EVENTS_PER_TENANT`] other events waiting.
    pub fn put(&self, tenant: &TenantId, event: CoreEvent) -> bool {
        let key = (event.namespace().unwrap_or_default(), event.name_any());
        let mut pending = self.pending();
        let waiting = pending.entry(tenant.clone()).or_default();
        if waiting.len() >= PENDING_EVENTS_PER_TENANT && !waiting.contains_key(&key) {
            return false;
        }
        waiting.insert(key, event);
        true
    }

    /// Takes the waiting event `namespace/name` of a tenant.
    pub fn take(&self, tenant: &TenantId, namespace: &str, name: &str) -> Option<CoreEvent> {
        let mut pending = self.pending();
        let waiting = pending.get_mut(tenant)?;
        let event = waiting.remove(&(namespace.to_owned(), name.to_owned()));
        if waiting.is_empty() {
            pending.remove(tenant);
        }
        event
    }

    /// Puts back a copy a worker took but could not write, unless a newer version arrived meanwhile (it
    /// waits again for the worker's retry).
    pub fn put_back(&self, tenant: &TenantId, namespace: &str, name: &str, event: CoreEvent) {
        self.pending()
            .entry(tenant.clone())
            .or_default()
            .entry((namespace.to_owned(), name.to_owned()))
            .or_insert(event);
    }

    /// Drops the waiting events of a detached tenant.
    pub fn forget(&self, tenant: &TenantId) {
        self.pending().remove(tenant);
    }

    /// Events waiting, over every tenant.
    pub fn len(&self) -> usize {
        self.pending().values().map(HashMap::len).sum()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
