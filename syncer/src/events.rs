//! Kubernetes events: the syncer's own, in tenants and on VirtualClusters, and super-cluster events about
//! synced pods and services copied up to their tenants.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType},
        reflector::ObjectRef,
        watcher,
    },
};

use crate::{context::Context, identity, tenant::Tenant};

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

/// Copies new super-cluster events about synced pods and services into their tenants, with names and
/// namespaces translated back. Events that existed before the syncer started are not copied again.
pub async fn forward(ctx: Arc<Context>) {
    let api: Api<CoreEvent> = Api::all(ctx.super_client.clone());
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listed = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::InitDone) => listed = true,
            Ok(watcher::Event::Apply(event)) if listed => {
                let ctx = ctx.clone();
                tokio::spawn(async move { copy_up(&ctx, &event).await });
            }
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "super event watch interrupted; retrying"),
        }
    }
}

/// The tenant event for a super event, if it concerns a synced pod or service.
async fn copy_up(ctx: &Context, event: &CoreEvent) {
    let involved = &event.involved_object;
    let (Some(kind), Some(super_namespace), Some(name)) =
        (&involved.kind, &involved.namespace, &involved.name)
    else {
        return;
    };
    let meta = match kind.as_str() {
        "Pod" => ctx
            .supers
            .pods
            .get(&ObjectRef::new(name).within(super_namespace))
            .map(|p| p.meta().clone()),
        "Service" => ctx
            .supers
            .services
            .get(&ObjectRef::new(name).within(super_namespace))
            .map(|s| s.meta().clone()),
        _ => None,
    };
    let Some(meta) = meta else { return };
    let (Some(cluster), Some(tenant_namespace), Some(tenant_uid)) = (
        identity::owner_cluster(&meta),
        identity::tenant_namespace(&meta),
        identity::tenant_uid(&meta),
    ) else {
        return;
    };
    let Some(tenant) = ctx.tenants.get(cluster) else {
        return;
    };
    let translate = |text: &str| text.replace(super_namespace.as_str(), tenant_namespace);
    let copy = CoreEvent {
        metadata: kube::api::ObjectMeta {
            name: event.metadata.name.clone(),
            namespace: Some(tenant_namespace.to_owned()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            namespace: Some(tenant_namespace.to_owned()),
            uid: Some(tenant_uid.to_owned()),
            resource_version: None,
            ..involved.clone()
        },
        message: event.message.as_deref().map(translate),
        reason: event.reason.clone(),
        type_: event.type_.clone(),
        count: event.count,
        first_timestamp: event.first_timestamp.clone(),
        last_timestamp: event.last_timestamp.clone(),
        event_time: event.event_time.clone(),
        source: event.source.clone(),
        reporting_component: event.reporting_component.clone(),
        reporting_instance: event.reporting_instance.clone(),
        action: event.action.clone(),
        series: event.series.clone(),
        related: None,
    };
    let api: Api<CoreEvent> = Api::namespaced(tenant.client.clone(), tenant_namespace);
    ctx.metrics.tenant_write("event", "apply");
    let params = PatchParams::apply(crds::wellknown::FIELD_MANAGER_SYNCER).force();
    if let Err(error) = api.patch(&copy.name_any(), &params, &Patch::Apply(&copy)).await {
        tracing::debug!(tenant = %tenant.identity.vc_ref(), event = %copy.name_any(), %error, "copying an event up");
    }
}
