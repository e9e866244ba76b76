//! What a tenant pod and its super copy need next on the way down, decided from the caches alone: a pure
//! function of the two cached pods, tested with plain tables. The executors ([`super::down`],
//! [`super::create`], [`super::update`]) do the writes.

use super::end::has_ended;
use crate::{
    cache::{
        meta::PackedMeta,
        pods::{CachedCondition, POD_SCHEDULED, SuperPod, TenantPod},
    },
    tenancy::identity,
};

/// The next step of a tenant pod's down sync, naming the cached pods it acts on.
#[derive(Clone, Copy, Debug)]
pub enum DownStep<'a> {
    /// The super pod of that name is another tenant's, or another tenant namespace's: nothing of it is
    /// read, written or deleted.
    Foreign,
    /// The tenant pod is gone and so is its copy; the quota stops holding it.
    Gone,
    /// The tenant pod is gone: the quota stops holding it and its copy is deleted.
    Orphaned(&'a SuperPod),
    /// A new tenant pod of the same name: the old copy is deleted first.
    Stale(&'a SuperPod),
    /// The tenant deletes its pod: the copy goes with the same grace period, then the deletion completes.
    Terminate(&'a TenantPod, Option<&'a SuperPod>),
    /// The pod ended and needs no copy (one the super cluster collected stays as it ended).
    Ended,
    /// The pod ended before the super scheduler placed its copy (its node refused it): the copy is deleted,
    /// unless it is going already, so that it never starts later.
    Unplaced(&'a SuperPod),
    /// The copy of a scheduled pod disappeared behind the syncer's back: the tenant pod is replaced.
    ReplaceLost(&'a TenantPod),
    /// No copy yet: admit the pod and create it.
    Create(&'a TenantPod),
    /// A copy runs: bring the tenant's changes to it.
    Update(&'a TenantPod, &'a SuperPod),
}

/// Steps are equal when they are the same step of the same cached pods.
impl PartialEq for DownStep<'_> {
    fn eq(&self, other: &Self) -> bool {
        use std::ptr::eq;
        let same_copy = |a: Option<&SuperPod>, b: Option<&SuperPod>| match (a, b) {
            (Some(a), Some(b)) => eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        match (self, other) {
            (Self::Foreign, Self::Foreign) | (Self::Gone, Self::Gone) | (Self::Ended, Self::Ended) => true,
            (Self::Orphaned(a), Self::Orphaned(b))
            | (Self::Stale(a), Self::Stale(b))
            | (Self::Unplaced(a), Self::Unplaced(b)) => eq(*a, *b),
            (Self::Terminate(a, x), Self::Terminate(b, y)) => eq(*a, *b) && same_copy(*x, *y),
            (Self::ReplaceLost(a), Self::ReplaceLost(b)) | (Self::Create(a), Self::Create(b)) => eq(*a, *b),
            (Self::Update(a, x), Self::Update(b, y)) => eq(*a, *b) && eq(*x, *y),
            _ => false,
        }
    }
}

/// What the down sync of one pod decides on.
#[derive(Clone, Copy, Debug)]
pub struct DownView<'a> {
    /// The tenant's cluster key.
    pub cluster_key: &'a str,
    /// The tenant namespace of the item.
    pub namespace: &'a str,
    /// The tenant pod, as cached.
    pub tenant_pod: Option<&'a TenantPod>,
    /// The super pod of that name in the tenant namespace's super namespace, as cached.
    pub super_pod: Option<&'a SuperPod>,
    /// Whether a pause removed the super pod ([`crate::tenancy::tenant::Tenant::paused_away`]).
    pub paused_away: bool,
}

/// Whether a tenant pod was placed by the syncer (bound after its super pod was scheduled), as opposed to
/// a pod the tenant created with a node name.
pub fn was_scheduled(pod: &TenantPod) -> bool {
    let status = &pod.status;
    status.pod_ip.is_some()
        || status.phase.as_deref().is_some_and(|p| p != "Pending")
        || status
            .conditions
            .iter()
            .any(|c| c.type_ == POD_SCHEDULED && c.status == "True")
}

/// Whether a change of a super pod may call for a down sync of its tenant pod: [`plan_down`] and the
/// executors read of a copy its metadata (identity, deletion, labels and annotations), its spec, whether it
/// exists, and, of a pod with readiness gates, the conditions in its status. Of its node they read only
/// whether it has none (a pod that ended before its copy was placed), which the scheduler's binding never
/// makes true. A change of nothing else (the binding, the kubelet's status writes: most of a pod's events)
/// is left to the up sync alone.
pub fn copy_change_needs_down_sync(previous: Option<&SuperPod>, now: &SuperPod) -> bool {
    let Some(previous) = previous else {
        return true;
    };
    // The spec but its node (`CachedPodSpec` dereferences to the rest).
    let spec_changed = *previous.spec != *now.spec;
    let node_lost = previous.spec.node_name.is_some() && now.spec.node_name.is_none();
    let gated_status_same = || now.spec.readiness_gates.is_empty() || previous.status == now.status;
    spec_changed || node_lost || !same_but_version(&previous.metadata, &now.metadata) || !gated_status_same()
}

/// Whether a change of a tenant pod may call for its down sync. Its metadata and spec are read throughout;
/// of its status, [`plan_down`] reads whether it ended and whether it was scheduled, creation (of an
/// unbound pod) its conditions, and the update of a pod with readiness gates their conditions. So a status
/// change of a bound pod that changes none of these (the syncer's own status copy) needs none.
pub fn tenant_change_needs_down_sync(previous: Option<&TenantPod>, now: &TenantPod) -> bool {
    let Some(previous) = previous else {
        return true;
    };
    if previous.spec != now.spec
        || !same_but_version(&previous.metadata, &now.metadata)
        || previous.unbound_spec.as_ref().map(|raw| raw.get()) != now.unbound_spec.as_ref().map(|raw| raw.get())
    {
        return true;
    }
    if previous.status == now.status {
        return false;
    }
    let gates = &now.spec.readiness_gates;
    let gated = |pod: &TenantPod| -> Vec<CachedCondition> {
        let conditions = pod.status.conditions.iter();
        conditions.filter(|c| gates.contains(&c.type_)).cloned().collect()
    };
    now.spec.node_name.is_none()
        || has_ended(previous) != has_ended(now)
        || was_scheduled(previous) != was_scheduled(now)
        || (!gates.is_empty() && gated(previous) != gated(now))
}

/// Whether two records' metadata are the same but for the resource version.
fn same_but_version(previous: &PackedMeta, now: &PackedMeta) -> bool {
    // Every field named, so that one added to the cache is compared too.
    let PackedMeta {
        name,
        namespace,
        uid,
        resource_version: _,
        creation_timestamp,
        deletion_timestamp,
        deletion_grace_period_seconds,
        owner_references,
        labels,
        annotations,
    } = previous;
    *name == now.name
        && *namespace == now.namespace
        && *uid == now.uid
        && *creation_timestamp == now.creation_timestamp
        && *deletion_timestamp == now.deletion_timestamp
        && *deletion_grace_period_seconds == now.deletion_grace_period_seconds
        && *owner_references == now.owner_references
        && *labels == now.labels
        && *annotations == now.annotations
}

/// The next step for one tenant pod and its copy.
pub fn plan_down<'a>(view: &DownView<'a>) -> DownStep<'a> {
    if let Some(existing) = view.super_pod
        && (!identity::belongs_to(existing.meta(), view.cluster_key)
            || identity::tenant_namespace(existing.meta()) != Some(view.namespace))
    {
        return DownStep::Foreign;
    }
    let Some(tenant_pod) = view.tenant_pod else {
        return match view.super_pod {
            Some(existing) => DownStep::Orphaned(existing),
            None => DownStep::Gone,
        };
    };
    if let Some(existing) = view.super_pod
        && identity::tenant_uid(existing.meta()) != tenant_pod.uid().as_deref()
    {
        return DownStep::Stale(existing);
    }
    if tenant_pod.meta().deletion_timestamp.is_some() {
        return DownStep::Terminate(tenant_pod, view.super_pod);
    }
    match view.super_pod {
        None if has_ended(tenant_pod) => DownStep::Ended,
        Some(existing) if has_ended(tenant_pod) && existing.spec.node_name.is_none() => {
            DownStep::Unplaced(existing)
        }
        None if was_scheduled(tenant_pod) && !view.paused_away => DownStep::ReplaceLost(tenant_pod),
        None => DownStep::Create(tenant_pod),
        Some(existing) => DownStep::Update(tenant_pod, existing),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::engine::context::testing::from_json;

    const KEY: &str = "team-abc123-vc";

    fn tenant_pod(uid: &str, phase: &str, deleting: bool, scheduled: bool) -> TenantPod {
        let mut metadata = json!({"name": "p", "namespace": "ns", "uid": uid, "resourceVersion": "1"});
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-11-29T00:00:00Z");
        }
        let conditions: Vec<Value> = match scheduled {
            true => vec![json!({"type": "PodScheduled", "status": "True"})],
            false => vec![],
        };
        from_json(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": phase, "conditions": conditions},
        }))
    }

    fn super_pod(cluster: &str, namespace: &str, uid: &str, node: Option<&str>, deleting: bool) -> SuperPod {
        let mut metadata = json!({
            "name": "p", "namespace": format!("{KEY}-ns"), "uid": format!("super-{uid}"), "resourceVersion": "1",
            "labels": {"tenancy.x-k8s.io/vcname": "vc"},
            "annotations": {
                "tenancy.x-k8s.io/cluster": cluster,
                "tenancy.x-k8s.io/namespace": namespace,
                "tenancy.x-k8s.io/uid": uid,
            },
        });
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-11-29T00:00:00Z");
        }
        from_json(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": node},
            "status": {"phase": "Pending"},
        }))
    }

    fn step<'a>(
        tenant: Option<&'a TenantPod>,
        copy: Option<&'a SuperPod>,
        paused_away: bool,
    ) -> DownStep<'a> {
        plan_down(&DownView {
            cluster_key: KEY,
            namespace: "ns",
            tenant_pod: tenant,
            super_pod: copy,
            paused_away,
        })
    }

    #[test]
    fn each_pair_of_tenant_pod_and_copy_has_its_step() {
        let pending = tenant_pod("u1", "Pending", false, false);
        let running = tenant_pod("u1", "Running", false, true);
        let deleting = tenant_pod("u1", "Running", true, true);
        let failed = tenant_pod("u1", "Failed", false, false);
        let placed = super_pod(KEY, "ns", "u1", Some("node-1"), false);
        let unplaced = super_pod(KEY, "ns", "u1", None, false);
        let unplaced_going = super_pod(KEY, "ns", "u1", None, true);
        let other_uid = super_pod(KEY, "ns", "u0", Some("node-1"), false);
        let other_tenant = super_pod("other-tenant", "ns", "u1", Some("node-1"), false);
        let other_namespace = super_pod(KEY, "ns2", "u1", Some("node-1"), false);
        let (t, c) = (Some, Some);
        for (tenant, copy, paused_away, want, case) in [
            (
                t(&running),
                c(&other_tenant),
                false,
                DownStep::Foreign,
                "another tenant's copy",
            ),
            (
                None,
                c(&other_namespace),
                false,
                DownStep::Foreign,
                "another namespace's copy",
            ),
            (None, None, false, DownStep::Gone, "nothing on either side"),
            (
                None,
                c(&placed),
                false,
                DownStep::Orphaned(&placed),
                "the tenant pod deleted",
            ),
            (
                t(&running),
                c(&other_uid),
                false,
                DownStep::Stale(&other_uid),
                "a new pod of that name",
            ),
            (
                t(&deleting),
                c(&placed),
                false,
                DownStep::Terminate(&deleting, c(&placed)),
                "the tenant deletes its pod",
            ),
            (
                t(&deleting),
                None,
                false,
                DownStep::Terminate(&deleting, None),
                "deleted, its copy gone",
            ),
            (t(&failed), None, false, DownStep::Ended, "ended, no copy"),
            (
                t(&failed),
                c(&unplaced),
                false,
                DownStep::Unplaced(&unplaced),
                "ended before its copy was placed",
            ),
            (
                t(&failed),
                c(&unplaced_going),
                false,
                DownStep::Unplaced(&unplaced_going),
                "ended, its unplaced copy going",
            ),
            (
                t(&failed),
                c(&placed),
                false,
                DownStep::Update(&failed, &placed),
                "ended on a node: status flows up",
            ),
            (
                t(&running),
                None,
                false,
                DownStep::ReplaceLost(&running),
                "a scheduled pod's copy lost",
            ),
            (
                t(&running),
                None,
                true,
                DownStep::Create(&running),
                "a scheduled pod a pause removed",
            ),
            (t(&pending), None, false, DownStep::Create(&pending), "a new pod"),
            (
                t(&running),
                c(&placed),
                false,
                DownStep::Update(&running, &placed),
                "a running pod",
            ),
        ] {
            assert_eq!(step(tenant, copy, paused_away), want, "{case}");
        }
        assert_ne!(
            DownStep::Create(&pending),
            DownStep::Create(&running),
            "the same step of another pod"
        );
    }

    /// A running super pod as the kubelet leaves it, changed by `change`.
    fn copy_changed(change: impl FnOnce(&mut Value)) -> SuperPod {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": format!("{KEY}-ns"), "uid": "super-u1", "resourceVersion": "7",
                "labels": {"tenancy.x-k8s.io/vcname": "vc", "app": "web"},
                "annotations": {"tenancy.x-k8s.io/cluster": KEY, "tenancy.x-k8s.io/namespace": "ns",
                    "tenancy.x-k8s.io/uid": "u1"},
            },
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": "node-1"},
            "status": {"phase": "Running", "podIP": "10.244.0.9",
                "conditions": [{"type": "Ready", "status": "True"}]},
        });
        change(&mut pod);
        from_json(pod)
    }

    #[test]
    fn only_a_change_the_down_sync_reads_queues_one() {
        let before = copy_changed(|_| {});
        let unplaced = copy_changed(|p| {
            p["spec"]["nodeName"] = json!(null);
            p["status"] = json!({"phase": "Pending"});
        });
        let gated = |pod: &mut Value| pod["spec"]["readinessGates"] = json!([{"conditionType": "example.com/lb"}]);
        let gated_before = copy_changed(gated);
        for (previous, now, want, case) in [
            (None, copy_changed(|_| {}), true, "first seen (created, or listed anew)"),
            (Some(&before), copy_changed(|p| p["metadata"]["resourceVersion"] = json!("8")), false, "nothing but the version"),
            (
                Some(&before),
                copy_changed(|p| {
                    p["metadata"]["resourceVersion"] = json!("8");
                    p["status"]["conditions"][0]["status"] = json!("False");
                    p["status"]["phase"] = json!("Succeeded");
                }),
                false,
                "the kubelet's status write",
            ),
            (Some(&before), copy_changed(|p| p["spec"]["nodeName"] = json!(null)), true, "no node any more"),
            (
                Some(&unplaced),
                copy_changed(|p| p["metadata"]["resourceVersion"] = json!("8")),
                false,
                "placed by the super scheduler",
            ),
            (
                Some(&before),
                copy_changed(|p| p["metadata"]["deletionTimestamp"] = json!("2026-11-29T00:00:00Z")),
                true,
                "deleted",
            ),
            (
                Some(&before),
                copy_changed(|p| p["metadata"]["labels"].as_object_mut().unwrap().clear()),
                true,
                "a label removed behind the syncer's back",
            ),
            (
                Some(&before),
                copy_changed(|p| p["metadata"]["annotations"]["tenancy.x-k8s.io/uid"] = json!("u2")),
                true,
                "another tenant pod's copy",
            ),
            (
                Some(&before),
                copy_changed(|p| p["spec"]["containers"][0]["image"] = json!("nginx")),
                true,
                "an image",
            ),
            (
                Some(&gated_before),
                copy_changed(|p| {
                    gated(p);
                    p["status"]["conditions"] = json!([]);
                }),
                true,
                "the status of a pod with readiness gates",
            ),
            (
                Some(&gated_before),
                copy_changed(|p| {
                    gated(p);
                    p["metadata"]["resourceVersion"] = json!("8");
                }),
                false,
                "a pod with readiness gates, its status as it was",
            ),
        ] {
            assert_eq!(copy_change_needs_down_sync(previous, &now), want, "{case}");
        }
    }

    /// A tenant pod bound to `node-1` and running, changed by `change`.
    fn tenant_changed(change: impl FnOnce(&mut Value)) -> TenantPod {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": "node-1"},
            "status": {"phase": "Running", "podIP": "10.244.0.9",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]},
        });
        change(&mut pod);
        from_json(pod)
    }

    #[test]
    fn only_a_tenant_pods_change_the_down_sync_reads_queues_one() {
        let running = tenant_changed(|_| {});
        let bound_pending = tenant_changed(|p| {
            p["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]});
        });
        let unbound = tenant_changed(|p| {
            p["spec"]["nodeName"] = json!(null);
            p["status"] = json!({"phase": "Pending"});
        });
        let gated = |p: &mut Value| {
            p["spec"]["readinessGates"] = json!([{"conditionType": "example.com/lb"}]);
            let conditions = p["status"]["conditions"].as_array_mut().expect("conditions");
            conditions.push(json!({"type": "example.com/lb", "status": "False"}));
        };
        let gated_running = tenant_changed(gated);
        let version = |p: &mut Value| p["metadata"]["resourceVersion"] = json!("8");
        for (previous, now, want, case) in [
            (None, tenant_changed(|_| {}), true, "created, or listed anew"),
            (Some(&running), tenant_changed(version), false, "nothing but the version"),
            (Some(&bound_pending), tenant_changed(version), false, "the syncer's status copy of a bound pod"),
            (
                Some(&unbound),
                tenant_changed(|p| p["status"]["phase"] = json!("Pending")),
                true,
                "the syncer's binding",
            ),
            (
                Some(&unbound),
                tenant_changed(|p| {
                    p["spec"]["nodeName"] = json!(null);
                    p["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
                        "status": "False", "reason": "QuotaExceeded"}]});
                }),
                true,
                "the status of an unbound pod (waiting for quota)",
            ),
            (
                Some(&running),
                tenant_changed(|p| p["status"]["phase"] = json!("Succeeded")),
                true,
                "ended",
            ),
            (
                Some(&running),
                tenant_changed(|p| p["metadata"]["labels"] = json!({})),
                true,
                "a label removed",
            ),
            (
                Some(&running),
                tenant_changed(|p| p["metadata"]["deletionTimestamp"] = json!("2026-11-29T00:00:00Z")),
                true,
                "deleted",
            ),
            (
                Some(&running),
                tenant_changed(|p| p["spec"]["containers"][0]["image"] = json!("nginx")),
                true,
                "an image",
            ),
            (
                Some(&gated_running),
                tenant_changed(|p| {
                    gated(p);
                    p["status"]["conditions"][2] = json!({"type": "example.com/lb", "status": "True"});
                }),
                true,
                "a readiness gate's condition",
            ),
            (
                Some(&gated_running),
                tenant_changed(|p| {
                    gated(p);
                    p["status"]["podIP"] = json!("10.244.0.10");
                }),
                false,
                "a gated pod's other status",
            ),
        ] {
            assert_eq!(tenant_change_needs_down_sync(previous, &now), want, "{case}");
        }
    }

    #[test]
    fn a_pod_is_scheduled_once_it_has_an_address_a_phase_past_pending_or_the_condition() {
        assert!(!was_scheduled(&tenant_pod("u", "Pending", false, false)));
        assert!(was_scheduled(&tenant_pod("u", "Pending", false, true)));
        assert!(was_scheduled(&tenant_pod("u", "Running", false, false)));
    }
}
