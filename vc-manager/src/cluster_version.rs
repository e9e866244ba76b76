//! The ClusterVersion controller: its status lists the VirtualClusters provisioned from it, and its
//! finalizer keeps it while any remain, with a Warning event and an `InUse` condition naming them.

use std::{sync::Arc, time::Instant};

use crds::{VirtualCluster, VirtualClusterRef, wellknown::FINALIZER_CLUSTER_VERSION};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::Patch,
    runtime::{controller::Action, events::EventType, reflector::Store},
};

use crate::{
    Error, Result, cached::CachedClusterVersion as ClusterVersion, context::Context, finalizer, render,
    steps::apply_params,
};

/// The `controller` label of this controller's metrics.
pub const CONTROLLER: &str = "clusterversion";
/// ClusterVersion condition: VirtualClusters use it (deletion waits for them).
pub const CONDITION_IN_USE: &str = "InUse";
/// ClusterVersion condition: rendering adapts templates written for the original project (the message
/// lists each change), or renders them as written.
pub const CONDITION_TEMPLATES_ADAPTED: &str = "TemplatesAdapted";
/// At most this many users are named in messages.
const NAMED_USERS: usize = 20;

/// Whether a VirtualCluster is provisioned from ClusterVersion `name` (an adopted one that also names a
/// ClusterVersion, through the original project's annotations, is not).
pub fn provisioned_from(vc: &VirtualCluster, name: &str) -> bool {
    vc.spec.cluster_version_name.as_deref() == Some(name) && vc.adoption().is_none()
}

/// The VirtualClusters provisioned from ClusterVersion `name`, sorted.
pub fn users_of(name: &str, virtual_clusters: &Store<VirtualCluster>) -> Vec<VirtualClusterRef> {
    let mut users: Vec<VirtualClusterRef> = virtual_clusters
        .state()
        .iter()
        .filter(|vc| provisioned_from(vc, name))
        .map(|vc| VirtualClusterRef {
            namespace: vc.namespace().unwrap_or_default(),
            name: vc.name_any(),
        })
        .collect();
    users.sort();
    users
}

fn named(users: &[VirtualClusterRef]) -> String {
    let mut names: Vec<String> = users
        .iter()
        .take(NAMED_USERS)
        .map(|u| format!("{}/{}", u.namespace, u.name))
        .collect();
    if users.len() > NAMED_USERS {
        names.push(format!("and {} more", users.len() - NAMED_USERS));
    }
    names.join(", ")
}

/// The `InUse` condition.
pub fn in_use_condition(users: &[VirtualClusterRef], deleting: bool) -> (String, String, String) {
    match (users.is_empty(), deleting) {
        (true, _) => (
            "False".into(),
            "NotInUse".into(),
            "no VirtualCluster uses it".into(),
        ),
        (false, false) => (
            "True".into(),
            "InUse".into(),
            format!("used by {} VirtualCluster(s): {}", users.len(), named(users)),
        ),
        (false, true) => (
            "True".into(),
            "DeletionBlocked".into(),
            format!(
                "deletion waits until no VirtualCluster uses it; used by {} VirtualCluster(s): {}",
                users.len(),
                named(users)
            ),
        ),
    }
}

/// Reconciles one ClusterVersion (only on the leader).
pub async fn reconcile(cv: Arc<ClusterVersion>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.leader.is_leader() {
        return Ok(Action::await_change());
    }
    ctx.caches_ready().await;
    let started = Instant::now();
    let result = crate::steps::on_own_stack(reconcile_one_owned(cv.clone(), ctx.clone())).await;
    let label = match &result {
        Ok(_) => {
            ctx.backoff.reset(&format!("ClusterVersion/{}", cv.name_any()));
            "success"
        }
        Err(error) => error.reason(),
    };
    ctx.metrics.observe(CONTROLLER, label, started.elapsed());
    result
}

/// After a failure: retry with exponential backoff for this object.
pub fn error_policy(cv: Arc<ClusterVersion>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!("ClusterVersion/{}", cv.name_any());
    let delay = ctx.backoff.failed(&key);
    tracing::warn!(
        clusterversion = %cv.name_any(),
        reason = error.reason(),
        error = %error.full_message(),
        retry_in_seconds = delay.as_secs_f64(),
        "reconcile failed"
    );
    Action::requeue(delay)
}

async fn reconcile_one_owned(cv: Arc<ClusterVersion>, ctx: Arc<Context>) -> Result<Action> {
    reconcile_one(&cv, &ctx).await
}

async fn reconcile_one(cv: &ClusterVersion, ctx: &Context) -> Result<Action> {
    let api: Api<ClusterVersion> = Api::all(ctx.client.clone());
    let users = users_of(&cv.name_any(), &ctx.virtual_clusters);
    if cv.meta().deletion_timestamp.is_some() {
        if !finalizer::has(cv, FINALIZER_CLUSTER_VERSION) {
            return Ok(Action::await_change());
        }
        if users.is_empty() {
            finalizer::remove(&api, cv, FINALIZER_CLUSTER_VERSION, "ClusterVersion").await?;
            tracing::info!(clusterversion = %cv.name_any(), "released ClusterVersion for deletion");
            return Ok(Action::await_change());
        }
        let changed = write_status(cv, &users, true, ctx).await?;
        if changed {
            let (_, _, message) = in_use_condition(&users, true);
            ctx.publish(
                &cv.object_ref(&()),
                EventType::Warning,
                "DeletionBlocked",
                "Delete",
                message,
            )
            .await;
        }
        // Changes to VirtualClusters trigger this again.
        return Ok(Action::await_change());
    }
    finalizer::ensure(&api, cv, FINALIZER_CLUSTER_VERSION, "ClusterVersion").await?;
    write_status(cv, &users, false, ctx).await?;
    Ok(Action::requeue(ctx.settings.resync_interval))
}

/// What rendering adapts in a cached ClusterVersion (the full copy lives only in this plain function,
/// never in a reconcile future's state).
fn adaptations_of(cv: &ClusterVersion) -> Vec<String> {
    render::adaptations(&cv.to_cluster_version())
}

/// The `TemplatesAdapted` condition for the changes rendering makes: status, reason, message.
pub fn adapted_condition(changes: &[String]) -> (String, String, String) {
    if changes.is_empty() {
        return (
            "False".into(),
            "AsWritten".into(),
            "templates are rendered as written".into(),
        );
    }
    (
        "True".into(),
        "OriginalProjectTemplates".into(),
        format!(
            "{} changes for current Kubernetes and vc-manager's Secrets: {}",
            changes.len(),
            changes.join("; ")
        ),
    )
}

/// Writes the users and the `InUse` and `TemplatesAdapted` conditions if they changed. Returns whether it wrote.
async fn write_status(
    cv: &ClusterVersion,
    users: &[VirtualClusterRef],
    deleting: bool,
    ctx: &Context,
) -> Result<bool> {
    let current = cv.status.clone().unwrap_or_default();
    let conditions = [
        (CONDITION_IN_USE, in_use_condition(users, deleting)),
        (
            CONDITION_TEMPLATES_ADAPTED,
            adapted_condition(&adaptations_of(cv)),
        ),
    ]
    .map(|(type_, (status, reason, message))| {
        let existing = current.conditions.iter().find(|c| c.type_ == type_);
        let unchanged = existing.is_some_and(|c| {
            c.status == status
                && c.reason == reason
                && c.message == message
                && c.observed_generation == cv.meta().generation
        });
        let last_transition_time = existing
            .filter(|c| c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(Timestamp::now()));
        let condition = Condition {
            type_: type_.into(),
            status,
            reason,
            message,
            observed_generation: cv.meta().generation,
            last_transition_time,
        };
        (condition, unchanged)
    });
    let count = i64::try_from(users.len()).unwrap_or(i64::MAX);
    let same = current.virtual_clusters == users
        && current.virtual_cluster_count == Some(count)
        && conditions.iter().all(|(_, unchanged)| *unchanged);
    if same {
        return Ok(false);
    }
    if let [_, (adapted, false)] = &conditions
        && adapted.status == "True"
    {
        tracing::info!(clusterversion = %cv.name_any(), changes = %adapted.message, "adapting templates written for the original project");
    }
    let conditions: Vec<Condition> = conditions.into_iter().map(|(c, _)| c).collect();
    let patch = serde_json::json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1",
        "kind": "ClusterVersion",
        "metadata": { "name": cv.name_any() },
        "status": {
            "virtualClusters": users,
            "virtualClusterCount": count,
            "conditions": conditions,
        }
    });
    let api: Api<ClusterVersion> = Api::all(ctx.client.clone());
    api.patch_status(&cv.name_any(), &apply_params(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::StatusApply {
            kind: "ClusterVersion",
            name: cv.name_any(),
            source,
        })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(namespace: &str, name: &str) -> VirtualClusterRef {
        VirtualClusterRef {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_in_use_condition_names_users() {
        assert_eq!(in_use_condition(&[], true).1, "NotInUse");
        let (status, reason, message) = in_use_condition(&[user("a", "x"), user("b", "y")], true);
        assert_eq!((status.as_str(), reason.as_str()), ("True", "DeletionBlocked"));
        assert!(
            message.ends_with("used by 2 VirtualCluster(s): a/x, b/y"),
            "{message}"
        );
        let many: Vec<VirtualClusterRef> = (0..25).map(|i| user("ns", &format!("vc-{i:02}"))).collect();
        let (_, reason, message) = in_use_condition(&many, false);
        assert_eq!(reason, "InUse");
        assert!(message.ends_with("ns/vc-19, and 5 more"), "{message}");
    }
}
