//! Reconcile steps shared by provisioned and adopted tenants: the root namespace, the PKI Secrets, the
//! status and the events that go with them.

use std::{collections::BTreeMap, time::Duration};

use crds::{
    ClusterPhase, VirtualCluster,
    wellknown::{
        ANNOTATION_VC_NAME, ANNOTATION_VC_NAMESPACE, ANNOTATION_VC_UID, CONDITION_PKI_READY, CONDITION_READY,
        FIELD_MANAGER_VC_MANAGER,
    },
};
use k8s_openapi::{
    api::core::v1::{Namespace, Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};

use crate::{
    Error, Result,
    context::Context,
    identity::{TenantIdentity, managed_labels},
    status::{ConditionState, DesiredStatus, current_conditions},
};
use tenant_pki::secrets::{self, Change, Lifetimes, PkiInput, PkiPlan, Scope};

/// Server-side apply under vc-manager's field manager, taking over fields others changed (drift repair).
pub fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER_VC_MANAGER).force()
}

/// Now, Unix seconds.
pub use vc_runtime::clock::now;

/// State of the root namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootNamespace {
    /// It exists with vc-manager's labels and annotations.
    Ready {
        /// It was created by this call.
        created: bool,
    },
    /// It is being deleted (by someone else); it is recreated once gone.
    Terminating,
}

/// Creates or repairs the root namespace. Refuses a namespace of that name that belongs to another
/// VirtualCluster.
pub async fn ensure_root_namespace(identity: &TenantIdentity, ctx: &Context) -> Result<RootNamespace> {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let name = identity.root_namespace();
    let failed = |source| Error::RootNamespace {
        namespace: name.to_owned(),
        source,
    };
    let existing = api.get_opt(name).await.map_err(failed)?;
    let labels = managed_labels();
    let annotations = identity.root_namespace_annotations();
    if let Some(namespace) = &existing {
        let have = namespace.annotations();
        if let Some(owner_uid) = have.get(ANNOTATION_VC_UID)
            && owner_uid != &identity.vc_uid
        {
            return Err(Error::RootNamespaceConflict {
                namespace: name.to_owned(),
                owner: format!(
                    "{}/{}",
                    have.get(ANNOTATION_VC_NAMESPACE).map_or("?", String::as_str),
                    have.get(ANNOTATION_VC_NAME).map_or("?", String::as_str)
                ),
                owner_uid: owner_uid.clone(),
            });
        }
        if namespace.meta().deletion_timestamp.is_some() {
            return Ok(RootNamespace::Terminating);
        }
        let contains = |have: &BTreeMap<String, String>, want: &BTreeMap<String, String>| {
            want.iter().all(|(k, v)| have.get(k) == Some(v))
        };
        if contains(namespace.labels(), &labels) && contains(have, &annotations) {
            return Ok(RootNamespace::Ready { created: false });
        }
    }
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        ..Default::default()
    };
    api.patch(name, &apply_params(), &Patch::Apply(&namespace))
        .await
        .map_err(failed)?;
    Ok(RootNamespace::Ready {
        created: existing.is_none(),
    })
}

/// The root namespace is being deleted by someone: report it (keeping the tenant's `mode`, provisioned or
/// adopted) and come back once it is gone.
pub async fn wait_for_root_namespace(
    vc: &VirtualCluster,
    identity: &TenantIdentity,
    mode: crds::ControlPlaneMode,
    ctx: &Context,
) -> Result<Action> {
    let namespace = identity.root_namespace();
    let message = format!("root namespace {namespace} is being deleted; it is recreated once it is gone");
    let mut conditions = current_conditions(vc);
    for condition in &mut conditions {
        if condition.type_ == CONDITION_READY || condition.type_ == CONDITION_PKI_READY {
            *condition = ConditionState::unmet(condition.type_, "RootNamespaceTerminating", message.clone());
        }
    }
    let phase = match vc.phase() {
        Some(ClusterPhase::Running | ClusterPhase::Updating) => ClusterPhase::Updating,
        _ => ClusterPhase::Pending,
    };
    let desired = DesiredStatus {
        phase,
        reason: "RootNamespaceTerminating".into(),
        message,
        cluster_namespace: namespace.to_owned(),
        mode,
        conditions,
        observed_generation: vc.status.as_ref().and_then(|s| s.observed_generation),
    };
    write_status(vc, &desired, ctx, true).await?;
    Ok(Action::requeue(ctx.settings.deletion_poll_interval))
}

/// Reads the root namespace's Secrets, writes those the plan changes, announces the changes and records
/// certificate expiries. Returns the plan and the Secrets as they now are.
pub async fn apply_pki(
    vc: &VirtualCluster,
    identity: &TenantIdentity,
    scope: &Scope,
    ctx: &Context,
) -> Result<(PkiPlan, BTreeMap<String, Secret>)> {
    let namespace = identity.root_namespace();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let mut secrets: BTreeMap<String, Secret> = api
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::SecretList {
            namespace: namespace.to_owned(),
            source,
        })?
        .items
        .into_iter()
        .map(|s| (s.name_any(), s))
        .collect();
    let plan = secrets::plan(
        &secrets,
        &PkiInput {
            identity,
            lifetimes: Lifetimes::for_days(vc.spec.pki_expire_days)
                .capped(ctx.settings.max_certificate_lifetime),
            now: now(),
            scope,
        },
    )?;
    // Authorities first, then what they sign; within each group all at once.
    for authorities in [true, false] {
        let writes = plan
            .changed()
            .filter(|planned| secrets::is_authority(planned.name()) == authorities)
            .map(|planned| {
                let api = api.clone();
                async move {
                    let name = planned.name();
                    api.patch(name, &apply_params(), &Patch::Apply(&planned.secret))
                        .await
                        .map_err(|source| Error::SecretApply {
                            namespace: namespace.to_owned(),
                            name: name.to_owned(),
                            source,
                        })?;
                    tracing::info!(secret = name, namespace, change = ?planned.change, "wrote Secret");
                    Ok::<_, Error>(())
                }
            });
        futures::future::try_join_all(writes).await?;
    }
    for planned in &plan.secrets {
        secrets.insert(planned.name().to_owned(), planned.secret.clone());
    }
    announce_pki(vc, namespace, &plan, ctx).await;
    ctx.metrics
        .set_expiries(&ObjectRef::from_obj(vc), plan.expiries.clone());
    Ok((plan, secrets))
}

async fn announce_pki(vc: &VirtualCluster, namespace: &str, plan: &PkiPlan, ctx: &Context) {
    let mut created = Vec::new();
    let mut renewed = Vec::new();
    let mut replaced = Vec::new();
    let mut updated = Vec::new();
    for planned in plan.changed() {
        let name = planned.name().to_owned();
        match &planned.change {
            Some(Change::Created) => created.push(name),
            Some(Change::Renewed(why)) => renewed.push(format!("{name} ({why})")),
            Some(Change::Replaced(why)) => replaced.push(format!("{name} ({why})")),
            Some(Change::Updated) => updated.push(name),
            None => {}
        }
    }
    let regarding = vc.object_ref(&());
    let announcements = [
        (created, EventType::Normal, "CertificatesIssued", "created"),
        (renewed, EventType::Normal, "CertificatesRenewed", "renewed"),
        (
            replaced,
            EventType::Warning,
            "CertificatesReplaced",
            "replaced unusable",
        ),
        (updated, EventType::Normal, "SecretsUpdated", "updated"),
    ];
    for (names, type_, reason, verb) in announcements {
        if !names.is_empty() {
            let note = format!("{verb} Secrets in {namespace}: {}", names.join(", "));
            ctx.publish(&regarding, type_, reason, "Provision", note).await;
        }
    }
}

/// When to reconcile a healthy tenant again: at the resync interval, or when the next certificate is due.
pub fn requeue_after(interval: Duration, next_renewal: Option<i64>) -> Duration {
    let until_renewal = next_renewal
        .map(|at| Duration::from_secs(u64::try_from(at - now()).unwrap_or(0).max(1)))
        .unwrap_or(interval);
    interval.min(until_renewal)
}

/// Writes the status if it changed and announces phase and condition changes (`announce`: false when the
/// caller publishes a failure event of its own).
pub async fn write_status(
    vc: &VirtualCluster,
    desired: &DesiredStatus,
    ctx: &Context,
    announce: bool,
) -> Result<()> {
    if !desired.differs_from(vc) {
        return Ok(());
    }
    let api: Api<VirtualCluster> = Api::namespaced(ctx.client.clone(), &vc.namespace().unwrap_or_default());
    api.patch_status(
        &vc.name_any(),
        &apply_params(),
        &Patch::Apply(desired.patch(vc, Timestamp::now())),
    )
    .await
    .map_err(|source| Error::StatusApply {
        kind: "VirtualCluster",
        name: format!("{}/{}", vc.namespace().unwrap_or_default(), vc.name_any()),
        source,
    })?;
    if announce {
        announce_status(vc, desired, ctx).await;
    }
    Ok(())
}

/// `EtcdReady` → `EtcdNotReady`, `Ready` → `NotReady`: each condition falls with its own event reason,
/// because the event recorder merges events of the same reason into one series.
fn not_ready_reason(condition: &str) -> String {
    match condition.strip_suffix("Ready") {
        Some(prefix) => format!("{prefix}NotReady"),
        None => format!("{condition}False"),
    }
}

async fn announce_status(vc: &VirtualCluster, desired: &DesiredStatus, ctx: &Context) {
    let regarding = vc.object_ref(&());
    for (condition, held_before) in desired.transitions(vc) {
        let ConditionState {
            type_,
            reason,
            message,
            ..
        } = &condition;
        if condition.is_true() {
            ctx.publish(&regarding, EventType::Normal, type_, "Provision", message.clone())
                .await;
        } else if held_before {
            ctx.publish(
                &regarding,
                EventType::Warning,
                &not_ready_reason(type_),
                "Provision",
                format!("{type_} is no longer true ({reason}): {message}"),
            )
            .await;
        }
    }
    if vc.phase() != Some(desired.phase) {
        let type_ = match desired.phase {
            ClusterPhase::Error => EventType::Warning,
            _ => EventType::Normal,
        };
        ctx.publish(
            &regarding,
            type_,
            desired.phase.as_str(),
            "Provision",
            format!("phase {}: {}", desired.phase, desired.message),
        )
        .await;
    }
}

/// Runs a reconcile as its own task, so that its calls (client, TLS, certificate generation) start from
/// the scheduler's stack instead of below the controller's stream machinery. A panic is passed on.
pub(crate) async fn on_own_stack(
    reconcile: impl std::future::Future<Output = Result<Action>> + Send + 'static,
) -> Result<Action> {
    match tokio::spawn(reconcile).await {
        Ok(result) => result,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // Cancelled: the runtime is shutting down.
        Err(_) => Ok(Action::await_change()),
    }
}
