//! What attaching reports on the VirtualCluster: the `TenantSynced` condition (and an event when it
//! changes), the `SpecLimited` condition with the settings the platform lets the tenant run with, and the
//! recorder of those events.

use crds::{VirtualCluster, wellknown::CONDITION_TENANT_SYNCED};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};

use crate::{engine::context::Context, tenancy::settings::TenantSettings};

/// Writes the syncer's condition on a VirtualCluster (only when it changes) and an event on changes.
pub(super) async fn report(
    ctx: &Context,
    recorder: &Recorder,
    vc: &VirtualCluster,
    ok: bool,
    reason: &str,
    message: &str,
) {
    let status = if ok { "True" } else { "False" };
    let current = vc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_TENANT_SYNCED)
            .cloned()
    });
    if current
        .as_ref()
        .is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
    {
        return;
    }
    let transition = match &current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(Timestamp::now()),
    };
    let condition = Condition {
        type_: CONDITION_TENANT_SYNCED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: transition,
        observed_generation: vc.metadata.generation,
    };
    let patch = serde_json::json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1",
        "kind": "VirtualCluster",
        "status": { "conditions": [condition] },
    });
    let api: Api<VirtualCluster> =
        Api::namespaced(ctx.super_client.clone(), &vc.namespace().unwrap_or_default());
    let params = crate::resources::write::apply_params().force();
    if let Err(error) = api
        .patch_status(&vc.name_any(), &params, &Patch::Apply(&patch))
        .await
    {
        tracing::warn!(vc = %vc.name_any(), namespace = %vc.namespace().unwrap_or_default(), %error, "writing the TenantSynced condition");
    }
    let changed_status = current
        .as_ref()
        .is_none_or(|c| c.status != status || c.reason != reason);
    if changed_status {
        let event = Event {
            type_: if ok { EventType::Normal } else { EventType::Warning },
            reason: reason.to_owned(),
            note: Some(message.chars().take(1000).collect()),
            action: "Attach".into(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &vc.object_ref(&())).await {
            tracing::debug!(vc = %vc.name_any(), %error, "publishing an event on the VirtualCluster");
        }
    }
}

/// The settings the syncer runs a VirtualCluster with, within the platform's limits, and a note for each
/// field of its spec the platform limits ([`TenantSettings::within`]), the forced RuntimeClass included.
pub fn limited_settings(ctx: &Context, vc: &VirtualCluster) -> (TenantSettings, Vec<String>) {
    let (settings, mut notes) = TenantSettings::within(vc, &ctx.config.limits, &ctx.virtual_clusters.state());
    if let Some(forced) = settings.runtime_class_name.as_deref()
        && !crate::resources::runtime_class::forcible(ctx, forced)
    {
        notes.push(format!(
            "spec.runtimeClassName {forced:?} is neither published (label {}=true) nor listed by the platform (--pod-forcible-runtime-classes): the tenant's pods are refused until it is",
            crds::wellknown::LABEL_SUPER_PUBLIC
        ));
    }
    (settings, notes)
}

/// Type of the syncer's condition on a VirtualCluster saying whether its spec asks for more than the
/// platform allows (True: the tenant runs with less, as the message says field by field).
pub const CONDITION_SPEC_LIMITED: &str = "SpecLimited";

/// Reason of [`CONDITION_SPEC_LIMITED`] when the platform limited the spec.
pub const REASON_PLATFORM_LIMITS: &str = "PlatformLimits";

/// Field manager of [`CONDITION_SPEC_LIMITED`]: apart from the one of `TenantSynced`, so that applying one
/// condition never removes the other.
const FIELD_MANAGER_LIMITS: &str = "vc-syncer-limits";

/// Writes the `SpecLimited` condition (only when it changes) and a Warning event when the platform newly
/// limits the spec or limits it otherwise.
pub(super) async fn report_limits(ctx: &Context, recorder: &Recorder, vc: &VirtualCluster, notes: &[String]) {
    let (status, reason, message) = match notes.is_empty() {
        true => (
            "False",
            "WithinPlatformLimits",
            "the spec is within the platform's limits".to_owned(),
        ),
        false => ("True", REASON_PLATFORM_LIMITS, notes.join("; ")),
    };
    let current = vc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_SPEC_LIMITED)
            .cloned()
    });
    if current
        .as_ref()
        .is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
    {
        return;
    }
    ctx.metrics
        .tenancy
        .spec_limited
        .inc_by(u64::try_from(notes.len()).unwrap_or(0));
    let condition = Condition {
        type_: CONDITION_SPEC_LIMITED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.clone(),
        last_transition_time: match &current {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => Time(Timestamp::now()),
        },
        observed_generation: vc.metadata.generation,
    };
    let patch = serde_json::json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1",
        "kind": "VirtualCluster",
        "status": { "conditions": [condition] },
    });
    let api: Api<VirtualCluster> =
        Api::namespaced(ctx.super_client.clone(), &vc.namespace().unwrap_or_default());
    let params = PatchParams::apply(FIELD_MANAGER_LIMITS).force();
    if let Err(error) = api
        .patch_status(&vc.name_any(), &params, &Patch::Apply(&patch))
        .await
    {
        tracing::warn!(vc = %vc.name_any(), namespace = %vc.namespace().unwrap_or_default(), %error, "writing the SpecLimited condition");
    }
    if notes.is_empty() {
        return;
    }
    tracing::warn!(vc = %vc.name_any(), namespace = %vc.namespace().unwrap_or_default(), %message, "the platform limits the VirtualCluster's spec");
    let event = Event {
        type_: EventType::Warning,
        reason: REASON_PLATFORM_LIMITS.to_owned(),
        note: Some(message.chars().take(1000).collect()),
        action: "Limit".into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &vc.object_ref(&())).await {
        tracing::debug!(vc = %vc.name_any(), %error, "publishing an event on the VirtualCluster");
    }
}

/// The recorder of the syncer's events on VirtualClusters.
pub fn recorder(ctx: &Context) -> Recorder {
    Recorder::new(
        ctx.super_client.clone(),
        Reporter {
            controller: crds::wellknown::FIELD_MANAGER_SYNCER.into(),
            instance: Some(vc_runtime::leader::identity()),
        },
    )
}
