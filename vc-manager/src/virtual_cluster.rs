//! The VirtualCluster controller: finalizer, then provisioning ([`crate::native`]) or adoption
//! ([`crate::adopt`]), or deletion ([`crate::cleanup`]). A failure is written where people look (status,
//! a Warning event, a log line with the object's name) and retried with per-object exponential backoff.

use std::{sync::Arc, time::Instant};

use crds::{VirtualCluster, wellknown::FINALIZER_VIRTUAL_CLUSTER};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};

use crate::{
    Error, Result, adopt, cleanup,
    context::Context,
    finalizer,
    identity::TenantIdentity,
    native,
    status::{self, Progress},
    steps,
};

/// The `controller` label of this controller's metrics.
pub const CONTROLLER: &str = "virtualcluster";

fn key(vc: &VirtualCluster) -> String {
    ObjectRef::from_obj(vc).to_string()
}

/// Reconciles one VirtualCluster (only on the leader).
pub async fn reconcile(vc: Arc<VirtualCluster>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.leader.is_leader() {
        return Ok(Action::await_change());
    }
    ctx.caches_ready().await;
    let started = Instant::now();
    let result = crate::steps::on_own_stack(reconcile_one_owned(vc.clone(), ctx.clone())).await;
    let result_label = match &result {
        Ok(_) => {
            ctx.backoff.reset(&key(&vc));
            "success"
        }
        Err(error) => error.reason(),
    };
    ctx.metrics.observe(CONTROLLER, result_label, started.elapsed());
    result
}

/// After a failure: retry with exponential backoff for this object.
pub fn error_policy(vc: Arc<VirtualCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&key(&vc));
    tracing::warn!(
        virtualcluster = %key(&vc),
        reason = error.reason(),
        error = %error.full_message(),
        failures = ctx.backoff.failures(&key(&vc)),
        retry_in_seconds = delay.as_secs_f64(),
        "reconcile failed"
    );
    Action::requeue(delay)
}

async fn reconcile_one_owned(vc: Arc<VirtualCluster>, ctx: Arc<Context>) -> Result<Action> {
    reconcile_one(&vc, &ctx).await
}

async fn reconcile_one(vc: &VirtualCluster, ctx: &Context) -> Result<Action> {
    if vc.meta().deletion_timestamp.is_some() {
        let result = cleanup::delete(vc, ctx).await;
        if let Err(error) = &result {
            // The status of an object on its way out is rarely read; the event is.
            ctx.publish(
                &vc.object_ref(&()),
                EventType::Warning,
                error.reason(),
                "Delete",
                error.full_message(),
            )
            .await;
        }
        return result;
    }
    let identity = TenantIdentity::of(vc)?;
    let mut progress = Progress::default();
    let result = provision(vc, &identity, ctx, &mut progress).await;
    if let Err(error) = &result {
        report_failure(vc, &identity, error, &progress, ctx).await;
    }
    result
}

async fn provision(
    vc: &VirtualCluster,
    identity: &TenantIdentity,
    ctx: &Context,
    progress: &mut Progress,
) -> Result<Action> {
    let api: Api<VirtualCluster> = Api::namespaced(ctx.client.clone(), &identity.vc_namespace);
    finalizer::ensure(&api, vc, FINALIZER_VIRTUAL_CLUSTER, "VirtualCluster").await?;
    if let Some(annotation) = vc.ignored_adopt_annotation() {
        // The mode is fixed at the first reconcile: an adopt annotation added later (or next to
        // spec.kubeconfigSecretRef) must not switch a tenant to a kubeconfig its editor chose.
        let message = format!(
            "annotation {annotation} is ignored: this VirtualCluster is {} ({}); the original project's adopt annotations count only on VirtualClusters created with them",
            vc.mode().as_str(),
            match vc.spec.kubeconfig_secret_ref {
                Some(_) => "spec.kubeconfigSecretRef names its kubeconfig",
                None => "status.mode, fixed when vc-manager first saw it",
            }
        );
        tracing::warn!(virtualcluster = %key(vc), annotation, "adopt annotation ignored");
        ctx.publish(
            &vc.object_ref(&()),
            EventType::Warning,
            "AdoptAnnotationIgnored",
            "Reconcile",
            message,
        )
        .await;
    }
    match vc.adoption() {
        Some(adoption) => adopt::reconcile(vc, identity, &adoption, ctx, progress).await,
        None => native::reconcile(vc, identity, ctx, progress).await,
    }
}

/// Publishes the failure as a Warning event and writes it into the status.
async fn report_failure(
    vc: &VirtualCluster,
    identity: &TenantIdentity,
    error: &Error,
    progress: &Progress,
    ctx: &Context,
) {
    ctx.publish(
        &vc.object_ref(&()),
        EventType::Warning,
        error.reason(),
        "Reconcile",
        error.full_message(),
    )
    .await;
    let desired = status::failed(vc, identity.root_namespace(), error, progress);
    if let Err(status_error) = steps::write_status(vc, &desired, ctx, false).await {
        tracing::warn!(
            virtualcluster = %format!("{}/{}", identity.vc_namespace, vc.name_any()),
            error = %status_error.full_message(),
            "writing the failure into the status"
        );
    }
}
