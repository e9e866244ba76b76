//! A running tenant pod's changes brought to its copy: labels, annotations, images and deadline with the
//! pod itself, added tolerations the policy allows, resources through `resize`, ephemeral containers, its
//! tokens kept, and readiness gates; what the policy or the super cluster refuses is told once.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Pod, PodCondition, PodStatus, Toleration},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api,
    api::{GetParams, Patch},
};

use super::{
    convert,
    desired::{desired_state, with_annotation},
    ephemeral, policy,
    refusal::{REASON_POLICY_VIOLATION, is_refusal},
};
use crate::{
    cache::{
        meta::Tagged,
        pods::{CachedPodSpec, SuperPod, TenantPod},
    },
    engine::{context::Context, events},
    error::{Result, on_super},
    resources::{
        outcome::Outcome,
        write::{self, apply},
    },
    tenancy::{identity, tenant::Tenant},
    tokens::mounts::{ANNOTATION_POD_TOKENS, ANNOTATION_TOKEN_SECRET},
};

/// Annotation on a super pod: hash of the resize the super cluster refused. The tenant was told; the
/// resize is not asked again until the tenant's resources change.
pub const ANNOTATION_REFUSED_RESIZE: &str = "tenancy.x-k8s.io/refused-resize";

/// Annotation on a super pod: hash of the added tolerations the pod policy refused (told once).
pub const ANNOTATION_REFUSED_TOLERATIONS: &str = "tenancy.x-k8s.io/refused-tolerations";

/// Reason of the event on a tenant pod whose change the super cluster refused.
pub const REASON_UPDATE_REFUSED: &str = "UpdateRefused";

/// Reason of the event on a tenant pod whose in-place resize the super cluster refused.
pub const REASON_RESIZE_REFUSED: &str = "ResizeRefused";

/// A running tenant pod's changes go down: labels, annotations, images and deadline with the pod itself,
/// added tolerations the policy allows, and resources through the super pod's `resize` subresource.
/// What the policy or the super cluster refuses is told to the tenant in one event per change.
pub(super) async fn update(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    api: &Api<Pod>,
) -> Result<Outcome> {
    let mut writes = 0;
    let name = super_pod.name_any();
    let (desired_meta, hash) = desired_state(
        ctx,
        tenant,
        &tenant_pod.metadata.to_object_meta(),
        &tenant_pod.spec,
    );
    let reference = tenant_pod.object_ref(&());

    let missing = convert::missing_tolerations(&tenant_pod.spec, &super_pod.spec);
    let refused = policy::refused_tolerations(
        missing.iter().copied(),
        &ctx.config.pod_policy,
        &tenant.settings().pod_policy,
    );
    let added: Vec<Toleration> = missing
        .iter()
        .filter(|t| !refused.iter().any(|(r, _)| r == *t))
        .map(|t| (*t).clone())
        .collect();
    let refused_tolerations = (!refused.is_empty())
        .then(|| identity::sync_hash(&refused.iter().map(|(t, _)| t).collect::<Vec<_>>()));
    if let Some(refusal) = &refused_tolerations
        && super_pod.meta().annotation(ANNOTATION_REFUSED_TOLERATIONS) != Some(refusal.as_str())
    {
        let described: Vec<&str> = refused.iter().map(|(_, d)| d.as_str()).collect();
        let message = format!(
            "the pod policy does not allow adding the {} (the syncer's --pod-allowed-taints, or podPolicy.allowedTaints for keys in --pod-grantable-taints); the running pod keeps its tolerations",
            described.join(", ")
        );
        events::refuse(&ctx.metrics, tenant, Some(&reference), "pod", REASON_POLICY_VIOLATION, &message).await;
    }

    let mut resized = false;
    let refused_resize = match convert::resize_patch(&tenant_pod.spec, &super_pod.spec) {
        None => None,
        Some(patch) => {
            let wanted = identity::sync_hash(&patch);
            if super_pod.meta().annotation(ANNOTATION_REFUSED_RESIZE) == Some(wanted.as_str()) {
                Some(wanted)
            } else {
                ctx.metrics.resources.super_write("pod", "resize");
                let result = api
                    .patch_subresource(
                        "resize",
                        &name,
                        &crate::resources::write::apply_params(),
                        &Patch::Strategic(&patch),
                    )
                    .await
                    .map_err(on_super(format!(
                        "resizing pod {}/{name}",
                        super_pod.namespace().unwrap_or_default()
                    )));
                match result {
                    Ok(_) => {
                        writes += 1;
                        resized = true;
                        None
                    }
                    Err(error) if is_refusal(&error) => {
                        let message = format!(
                            "the super cluster refused to resize {} in place: {}",
                            convert::resized_containers(&patch).join(", "),
                            error.status_message().unwrap_or_default()
                        );
                        events::refuse(&ctx.metrics, tenant, Some(&reference), "pod", REASON_RESIZE_REFUSED, &message).await;
                        Some(wanted)
                    }
                    Err(error) => return Err(error),
                }
            }
        }
    };

    let ephemeral = ephemeral::sync(ctx, tenant, tenant_pod, super_pod, api).await?;
    writes += ephemeral.writes;

    let metadata_in_sync = identity::recorded_hash(super_pod.meta()) == Some(hash.as_str())
        && identity::metadata_covers(&desired_meta, super_pod.meta());
    let in_sync = metadata_in_sync
        && convert::mutable_view(&super_pod.spec) == convert::mutable_view(&tenant_pod.spec)
        && added.is_empty()
        && super_pod.meta().annotation(ANNOTATION_REFUSED_RESIZE) == refused_resize.as_deref()
        && super_pod.meta().annotation(ANNOTATION_REFUSED_TOLERATIONS) == refused_tolerations.as_deref()
        && super_pod.meta().annotation(ephemeral::ANNOTATION_REFUSED) == ephemeral.refused.as_deref();
    if !in_sync {
        // The whole super pod is applied back with the tenant's changes, which keeps the syncer's ownership
        // of every field it set at creation; read it as it is now (after a resize, the resized one).
        let params = match resized || ephemeral.added {
            true => GetParams::default(),
            false => GetParams::at(super_pod.meta().resource_version.as_deref().unwrap_or("0")),
        };
        let full = api.get_with(&name, &params).await.map_err(on_super(format!(
            "reading pod {}/{name}",
            super_pod.namespace().unwrap_or_default()
        )))?;
        // A copy created by POST: the fields set then become the syncer's applied ones first, so that this
        // apply removes what the tenant no longer sets.
        if write::adopt_as_applied(ctx, api, &full).await? {
            writes += 1;
        }
        let mut meta = with_annotation(desired_meta, identity::ANNOTATION_SYNC_HASH, hash);
        for key in [ANNOTATION_POD_TOKENS, ANNOTATION_TOKEN_SECRET] {
            if let Some(value) = super_pod.meta().annotation(key) {
                meta = with_annotation(meta, key, value.to_owned());
            }
        }
        for (key, value) in [
            (ANNOTATION_REFUSED_RESIZE, refused_resize),
            (ANNOTATION_REFUSED_TOLERATIONS, refused_tolerations),
            (ephemeral::ANNOTATION_REFUSED, ephemeral.refused),
        ] {
            if let Some(value) = value {
                meta = with_annotation(meta, key, value);
            }
        }
        let desired = updated_pod(&full, meta, &tenant_pod.spec, &added);
        match apply(ctx, api, desired, super_pod.uid()).await {
            Ok(_) => writes += 1,
            Err(error) if is_refusal(&error) => {
                let message = format!(
                    "the super cluster refused the pod's change of {}: {}; the running pod keeps its previous settings",
                    changed_fields(
                        &tenant_pod.spec,
                        &super_pod.spec,
                        !metadata_in_sync,
                        !added.is_empty()
                    ),
                    error.status_message().unwrap_or_default()
                );
                events::refuse(&ctx.metrics, tenant, Some(&reference), "pod", REASON_UPDATE_REFUSED, &message).await;
                return Ok(Outcome::Waiting {
                    reason: message,
                    retry_after: None,
                });
            }
            Err(error) => return Err(error),
        }
    }
    // Tokens only for a bound pod: its first ones are minted after the binding (`up`), to name its node.
    if tenant_pod.spec.node_name.is_some() {
        writes += ctx.tokens.keep(ctx, tenant, tenant_pod, super_pod).await?;
    }
    writes += sync_readiness_gates(ctx, tenant_pod, super_pod, api).await?;
    Ok(match (ephemeral.waiting, writes) {
        (Some(reason), _) => Outcome::Waiting {
            reason,
            retry_after: Some(Duration::from_secs(1)),
        },
        (None, 0) => Outcome::InSync,
        (None, writes) => Outcome::Updated { writes },
    })
}

/// The fields of the tenant pod's change, for messages.
fn changed_fields(
    tenant: &CachedPodSpec,
    super_spec: &CachedPodSpec,
    metadata: bool,
    tolerations: bool,
) -> String {
    let mut fields = Vec::new();
    if metadata {
        fields.push("metadata.labels/annotations".to_owned());
    }
    for (list, wanted, have) in [
        ("containers", &tenant.containers, &super_spec.containers),
        (
            "initContainers",
            &tenant.init_containers,
            &super_spec.init_containers,
        ),
    ] {
        for container in wanted {
            if have
                .iter()
                .any(|h| h.name == container.name && h.image != container.image)
            {
                fields.push(format!("spec.{list}[{}].image", container.name));
            }
        }
    }
    if tenant.active_deadline_seconds != super_spec.active_deadline_seconds {
        fields.push("spec.activeDeadlineSeconds".to_owned());
    }
    if tolerations {
        fields.push("spec.tolerations".to_owned());
    }
    fields.join(", ")
}

/// The super pod as it is, with the tenant's metadata, images and deadline, and the added tolerations.
fn updated_pod(super_pod: &Pod, metadata: ObjectMeta, tenant: &CachedPodSpec, added: &[Toleration]) -> Pod {
    let mut spec = super_pod.spec.clone().unwrap_or_default();
    if !added.is_empty() {
        spec.tolerations
            .get_or_insert_with(Vec::new)
            .extend(added.iter().cloned());
    }
    let image_of = |containers: &[crate::cache::pods::ContainerImage], name: &str| {
        containers
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.image.clone())
    };
    for container in &mut spec.containers {
        if let Some(image) = image_of(&tenant.containers, &container.name) {
            container.image = Some(image);
        }
    }
    for container in spec.init_containers.iter_mut().flatten() {
        if let Some(image) = image_of(&tenant.init_containers, &container.name) {
            container.image = Some(image);
        }
    }
    spec.active_deadline_seconds = tenant.active_deadline_seconds;
    spec.node_name = None;
    // Ephemeral containers are the `ephemeralcontainers` subresource's: an apply of the pod that carried
    // them would own them, and one from a read that missed a container just added would remove it.
    spec.ephemeral_containers = None;
    Pod {
        metadata: ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            labels: metadata.labels,
            annotations: metadata.annotations,
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Readiness-gate conditions set by tenant controllers go down to the super pod, whose readiness depends
/// on them.
async fn sync_readiness_gates(
    ctx: &Context,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    api: &Api<Pod>,
) -> Result<u32> {
    let gates = &tenant_pod.spec.readiness_gates;
    if gates.is_empty() {
        return Ok(0);
    }
    let wanted: Vec<PodCondition> = tenant_pod
        .status
        .conditions
        .iter()
        .filter(|c| gates.contains(&c.type_))
        .map(|c| PodCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_transition_time: Some(Time(Timestamp::now())),
            ..Default::default()
        })
        .collect();
    let have = super_pod
        .parsed_status()
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    let differs = wanted
        .iter()
        .any(|w| !have.iter().any(|h| h.type_ == w.type_ && h.status == w.status));
    if wanted.is_empty() || !differs {
        return Ok(0);
    }
    let status = Pod {
        metadata: ObjectMeta {
            name: Some(super_pod.name_any()),
            ..Default::default()
        },
        status: Some(PodStatus {
            conditions: Some(wanted),
            ..Default::default()
        }),
        ..Default::default()
    };
    ctx.metrics.resources.super_write("pod", "apply");
    api.patch_status(
        &super_pod.name_any(),
        &crate::resources::write::apply_params().force(),
        &Patch::Apply(&status),
    )
    .await
    .map_err(on_super(format!(
        "setting readiness gates of pod {}",
        super_pod.name_any()
    )))?;
    Ok(1)
}
