//! The end of a tenant pod, as its node's kubelet makes it on a plain cluster: once the pod's copy is gone,
//! its deletion is completed; a pod a finalizer still holds stays, with the terminal status the kubelet
//! writes (its containers terminated, phase `Succeeded` or `Failed`, not ready) until the finalizer goes.
//! Also the tenant pod status write that the upward sync shares.
//!
//! The kubelet writes that status a moment before it deletes the pod, so the copy's last status seldom
//! reaches the syncer's cache before the deletion does: the terminal status is made from the tenant pod's
//! own last status, as the kubelet's `TerminatePod` makes it for containers whose end it did not see.

use k8s_openapi::{
    api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use kube::{
    Api,
    api::{DeleteParams, Patch, Preconditions},
};

use crate::{
    cache::{meta::Tagged, pods::TenantPod},
    engine::context::Context,
    error::{Result, on_tenant},
    resources::{outcome::Outcome, upward::params},
    tenancy::tenant::Tenant,
};

/// The kubelet's reason for a container whose end it did not see.
pub const REASON_CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// Message of a container reported terminated because its copy's final state was not seen.
const UNSEEN_END: &str = "The container stopped with the pod's copy in the super cluster, whose final state was not seen";

/// The kubelet's reason on the `Ready` and `ContainersReady` conditions of a pod that has ended.
const POD_COMPLETED: &str = "PodCompleted";

/// Whether a tenant pod has ended (`Succeeded` or `Failed`): its phase never changes again.
pub(super) fn has_ended(pod: &TenantPod) -> bool {
    matches!(pod.status.phase.as_deref(), Some("Succeeded" | "Failed"))
}

/// Whether a deleted tenant pod needs nothing more: its deletion was completed (grace period 0: only a
/// finalizer keeps it) and its status already ended.
fn finished(pod: &TenantPod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod.metadata.deletion_grace_period_seconds == Some(0)
        && has_ended(pod)
}

/// Completes a tenant pod's deletion (grace period 0, uid-pinned). A pod a finalizer holds stays: it gets
/// the terminal status its node's kubelet would have written ([`terminal_status`]). `Deleted` when the
/// deletion was asked for, `Updated` when the status was written too, `InSync` when nothing was left to do.
pub async fn finalize_tenant_pod(ctx: &Context, tenant: &Tenant, tenant_pod: &TenantPod) -> Result<Outcome> {
    if finished(tenant_pod) {
        return Ok(Outcome::InSync);
    }
    let meta = &tenant_pod.metadata;
    let namespace = meta.object_namespace().unwrap_or_default().to_owned();
    let name = meta.name.to_string();
    let api: Api<Pod> = Api::namespaced(tenant.client.clone(), &namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: meta.uid.as_deref().map(str::to_owned),
            resource_version: None,
        }),
        ..Default::default()
    };
    ctx.metrics.resources.tenant_write("pod", "delete");
    let remaining = match api.delete(&name, &params).await {
        // The apiserver answers with the pod while finalizers keep it.
        Ok(answer) => answer.left(),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => None,
        Err(e) => {
            return Err(on_tenant(
                &tenant.identity.cluster_key,
                format!("completing deletion of pod {namespace}/{name}"),
            )(e));
        }
    };
    let Some(status) = remaining.and_then(|pod| terminal_status(&pod, &Time(k8s_openapi::jiff::Timestamp::now())))
    else {
        return Ok(Outcome::Deleted);
    };
    tracing::info!(
        phase = status.phase.as_deref().unwrap_or_default(),
        "a finalizer holds the deleted pod: its containers are reported terminated"
    );
    let written = write_status(ctx, tenant, &api, &namespace, &name, status).await?;
    Ok(Outcome::Updated { writes: 1 + written })
}

/// The status a node's kubelet gives a bound pod that was deleted and has stopped (its `TerminatePod` and
/// the phase it computes for a terminal pod): every container that has not terminated (once the pod has
/// initialized; of the init containers, those up to the last that started) is terminated with reason
/// [`REASON_CONTAINER_STATUS_UNKNOWN`] and exit code 137, none is ready or started, the phase is
/// `Succeeded` when every container has a status and exited 0 and `Failed` otherwise (an ended phase
/// stays), and `Ready` and `ContainersReady` are `False` (`PodCompleted`). Conditions the tenant's
/// readiness gates name are left out: they are not the syncer's to write.
///
/// `None` for a pod no node ran (no kubelet would write it) and for a status that already says all that.
pub fn terminal_status(pod: &Pod, now: &Time) -> Option<PodStatus> {
    let spec = pod.spec.as_ref()?;
    spec.node_name.as_ref()?;
    let gates: Vec<&str> = spec
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| g.condition_type.as_str())
        .collect();
    let before = applied_fields(pod.status.clone().unwrap_or_default(), &gates);
    let mut status = before.clone();

    let has_init_containers = spec.init_containers.as_ref().is_some_and(|c| !c.is_empty());
    let initialized = !has_init_containers || status.container_statuses.iter().flatten().any(started);
    if initialized {
        status.container_statuses.iter_mut().flatten().for_each(stop);
    }
    if let Some(init) = status.init_container_statuses.as_mut()
        && let Some(last) = init.iter().rposition(started)
    {
        init[..=last].iter_mut().for_each(stop);
    }
    status.ephemeral_container_statuses.iter_mut().flatten().for_each(stop);
    for container in status
        .container_statuses
        .iter_mut()
        .chain(status.init_container_statuses.iter_mut())
        .chain(status.ephemeral_container_statuses.iter_mut())
        .flatten()
    {
        container.ready = false;
        if container.started.is_some() {
            container.started = Some(false);
        }
    }

    if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        let statuses = status.container_statuses.as_deref().unwrap_or_default();
        let succeeded = spec.containers.iter().all(|container| {
            statuses
                .iter()
                .find(|s| s.name == container.name)
                .and_then(|s| s.state.as_ref()?.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        });
        status.phase = Some(if succeeded { "Succeeded" } else { "Failed" }.to_owned());
    }

    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for type_ in ["ContainersReady", "Ready"] {
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(condition) if condition.status == "False" && condition.reason.as_deref() == Some(POD_COMPLETED) => {}
            Some(condition) => {
                if condition.status != "False" {
                    condition.last_transition_time = Some(now.clone());
                }
                condition.status = "False".to_owned();
                condition.reason = Some(POD_COMPLETED.to_owned());
                condition.message = None;
            }
            None => conditions.push(PodCondition {
                type_: type_.to_owned(),
                status: "False".to_owned(),
                reason: Some(POD_COMPLETED.to_owned()),
                last_transition_time: Some(now.clone()),
                ..Default::default()
            }),
        }
    }
    (status != before).then_some(status)
}

/// Whether a container shows that it started: it is not waiting, or it ran before.
fn started(container: &ContainerStatus) -> bool {
    let waiting = container.state.as_ref().is_some_and(|s| s.waiting.is_some());
    let ran_before = container
        .last_state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some());
    !waiting || ran_before
}

/// A container that has not terminated is reported terminated, its end unseen.
fn stop(container: &mut ContainerStatus) {
    if container.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
        return;
    }
    container.state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(REASON_CONTAINER_STATUS_UNKNOWN.to_owned()),
            message: Some(UNSEEN_END.to_owned()),
            exit_code: 137,
            ..Default::default()
        }),
        ..Default::default()
    });
}

/// The fields of a tenant pod's status the syncer writes (as the upward sync writes them from the copy's
/// status), without the conditions the tenant's readiness gates name.
fn applied_fields(status: PodStatus, gates: &[&str]) -> PodStatus {
    PodStatus {
        phase: status.phase,
        message: status.message,
        reason: status.reason,
        host_ip: status.host_ip,
        pod_ip: status.pod_ip,
        pod_ips: status.pod_ips,
        start_time: status.start_time,
        conditions: status
            .conditions
            .map(|cs| cs.into_iter().filter(|c| !gates.contains(&c.type_.as_str())).collect()),
        container_statuses: status.container_statuses,
        init_container_statuses: status.init_container_statuses,
        ephemeral_container_statuses: status.ephemeral_container_statuses,
        ..Default::default()
    }
}

/// Writes a tenant pod's status (server-side apply under the syncer's field manager); 1 when written, 0
/// when the pod is gone.
pub(super) async fn write_status(
    ctx: &Context,
    tenant: &Tenant,
    api: &Api<Pod>,
    namespace: &str,
    name: &str,
    status: PodStatus,
) -> Result<u32> {
    let patch = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        spec: None,
        status: Some(status),
    };
    ctx.metrics.resources.tenant_write("pod", "status");
    match api.patch_status(name, &params(), &Patch::Apply(&patch)).await {
        Ok(_) => Ok(1),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(0),
        Err(e) => Err(on_tenant(
            &tenant.identity.cluster_key,
            format!("updating status of pod {namespace}/{name}"),
        )(e)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::{engine::context::testing::{self, from_json, put}, tenancy::settings::TenantSettings};

    fn at(time: &str) -> Time {
        from_json(json!(time))
    }

    /// A bound pod of one container `app`, with `status`.
    fn bound_pod(status: Value) -> Pod {
        from_json(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid",
                "deletionTimestamp": "2026-11-29T10:00:00Z", "deletionGracePeriodSeconds": 0,
                "finalizers": ["example.com/hold"]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "nginx"}]},
            "status": status
        }))
    }

    fn running_status() -> Value {
        json!({"phase": "Running", "podIP": "10.244.1.9", "hostIP": "10.243.0.11",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T09:00:00Z"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-29T09:00:00Z"}],
            "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": true, "started": true,
                "restartCount": 0, "state": {"running": {"startedAt": "2026-11-29T09:00:00Z"}}}]})
    }

    fn condition<'a>(status: &'a PodStatus, type_: &str) -> &'a PodCondition {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} condition"))
    }

    fn terminated(status: &ContainerStatus) -> &ContainerStateTerminated {
        status
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .unwrap_or_else(|| panic!("{} not terminated: {:?}", status.name, status.state))
    }

    /// A running container whose end the syncer did not see is reported as the kubelet reports one whose
    /// status it lost: terminated, ContainerStatusUnknown, 137; the pod Failed and not ready.
    #[test]
    fn a_running_pod_ends_failed_with_its_containers_terminated() {
        let now = at("2026-11-29T10:00:31Z");
        let status = terminal_status(&bound_pod(running_status()), &now).expect("a terminal status");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let container = &status.container_statuses.as_deref().unwrap_or_default()[0];
        let end = terminated(container);
        assert_eq!(end.reason.as_deref(), Some(REASON_CONTAINER_STATUS_UNKNOWN));
        assert_eq!(end.exit_code, 137);
        assert!(!container.ready);
        assert_eq!(container.started, Some(false));
        for type_ in ["Ready", "ContainersReady"] {
            let c = condition(&status, type_);
            assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some(POD_COMPLETED)), "{type_}");
            assert_eq!(c.last_transition_time.as_ref(), Some(&now), "{type_}");
        }
        // What the syncer wrote before stays: addresses and the other conditions.
        assert_eq!(status.pod_ip.as_deref(), Some("10.244.1.9"));
        assert_eq!(condition(&status, "PodScheduled").status, "True");
    }

    /// The copy's last status did reach the tenant (its containers exited 0, still Running as the kubelet
    /// says before the pod is terminal): the pod ends Succeeded, with the real exit codes kept.
    #[test]
    fn containers_that_exited_0_end_the_pod_succeeded() {
        let status = terminal_status(
            &bound_pod(json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False",
                "reason": "ContainersNotReady"}],
                "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]})),
            &at("2026-11-29T10:00:31Z"),
        )
        .expect("a terminal status");
        assert_eq!(status.phase.as_deref(), Some("Succeeded"));
        let end = terminated(&status.container_statuses.as_deref().unwrap_or_default()[0]);
        assert_eq!((end.exit_code, end.reason.as_deref()), (0, Some("Completed")));
        // Ready was False already: its transition time is not touched, only the kubelet's reason.
        let ready = condition(&status, "Ready");
        assert_eq!(ready.reason.as_deref(), Some(POD_COMPLETED));
        assert_eq!(ready.last_transition_time, None);
    }

    /// A container with no status at all, or one that failed, makes the pod Failed.
    #[test]
    fn a_container_without_status_or_that_failed_makes_the_pod_failed() {
        let mut pod = bound_pod(json!({"phase": "Running",
            "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]}));
        pod.spec.as_mut().expect("spec").containers.push(from_json(json!({"name": "side", "image": "x"})));
        let status = terminal_status(&pod, &at("2026-11-29T10:00:31Z")).expect("terminal");
        assert_eq!(status.phase.as_deref(), Some("Failed"));

        let pod = bound_pod(json!({"phase": "Running",
            "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}]}));
        let status = terminal_status(&pod, &at("2026-11-29T10:00:31Z")).expect("terminal");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
    }

    /// Nothing to write: a pod no node ran (no kubelet would write its status), and a status that says it
    /// all already (written once, the next pass finds it so).
    #[test]
    fn no_status_for_an_unbound_pod_or_one_that_already_says_it() {
        let now = at("2026-11-29T10:00:31Z");
        let mut unbound = bound_pod(json!({"phase": "Pending"}));
        unbound.spec.as_mut().expect("spec").node_name = None;
        assert_eq!(terminal_status(&unbound, &now), None);

        let ended = terminal_status(&bound_pod(running_status()), &now).expect("terminal");
        let again = bound_pod(serde_json::to_value(&ended).expect("status"));
        assert_eq!(terminal_status(&again, &at("2026-11-29T10:05:00Z")), None);
    }

    /// An ended phase stays (a Job's pod that Succeeded, then deleted), and the conditions the tenant's
    /// readiness gates name are not the syncer's to write.
    #[test]
    fn an_ended_phase_stays_and_readiness_gates_are_left_out() {
        let mut pod = bound_pod(json!({"phase": "Succeeded",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "example.com/gate", "status": "True"}],
            "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]}));
        pod.spec.as_mut().expect("spec").readiness_gates =
            Some(vec![from_json(json!({"conditionType": "example.com/gate"}))]);
        let status = terminal_status(&pod, &at("2026-11-29T10:00:31Z")).expect("terminal");
        assert_eq!(status.phase.as_deref(), Some("Succeeded"));
        assert!(
            !status.conditions.iter().flatten().any(|c| c.type_ == "example.com/gate"),
            "{:?}",
            status.conditions
        );
        assert_eq!(condition(&status, "Ready").status, "False");
    }

    /// Init containers: those up to the last that started are terminated; the ones after it never ran and
    /// keep waiting; regular containers of a pod that never initialized keep waiting too.
    #[test]
    fn init_containers_that_never_started_keep_waiting() {
        let mut pod = bound_pod(json!({"phase": "Pending",
            "initContainerStatuses": [
                {"name": "one", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0}}},
                {"name": "two", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"running": {}}},
                {"name": "three", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "PodInitializing"}}}],
            "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]}));
        pod.spec.as_mut().expect("spec").init_containers = Some(from_json(json!([
            {"name": "one", "image": "x"}, {"name": "two", "image": "x"}, {"name": "three", "image": "x"}])));
        let status = terminal_status(&pod, &at("2026-11-29T10:00:31Z")).expect("terminal");
        let init = status.init_container_statuses.as_deref().unwrap_or_default();
        assert_eq!(terminated(&init[0]).exit_code, 0);
        assert_eq!(terminated(&init[1]).reason.as_deref(), Some(REASON_CONTAINER_STATUS_UNKNOWN));
        assert!(init[2].state.as_ref().is_some_and(|s| s.waiting.is_some()));
        let app = &status.container_statuses.as_deref().unwrap_or_default()[0];
        assert!(app.state.as_ref().is_some_and(|s| s.waiting.is_some()));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
    }

    /// A deleted tenant pod whose copy is gone: its deletion is completed (grace 0, uid-pinned); a pod a
    /// finalizer holds comes back from the apiserver and gets its terminal status; a pod that went needs
    /// no status; and a pod already finished is left alone.
    #[tokio::test]
    async fn a_deleted_pod_a_finalizer_holds_gets_its_terminal_status() {
        const DELETE: &str = "/api/v1/namespaces/shop/pods/web?";
        const STATUS: &str = "/api/v1/namespaces/shop/pods/web/status?&force=true&fieldManager=vc-syncer";
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, _super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let mut cached = bound_pod(running_status());
        cached.metadata.deletion_grace_period_seconds = Some(30);
        put(&mut caches.pods, from_json(serde_json::to_value(&cached).expect("pod")));
        let tenant_pod = tenant
            .stores
            .pods
            .get(&kube::runtime::reflector::ObjectRef::new("web").within("shop"))
            .expect("cached");

        let held = serde_json::to_value(bound_pod(running_status())).expect("pod");
        let (outcome, (delete, status)) = tokio::join!(finalize_tenant_pod(&ctx, &tenant, &tenant_pod), async {
            let delete = tenants.expect("DELETE", DELETE).await;
            let body = delete.body.clone();
            delete.ok(held);
            let status = tenants.expect("PATCH", STATUS).await;
            let patch = status.body.clone();
            status.echo();
            (body, patch)
        });
        assert_eq!(outcome.expect("finalized"), Outcome::Updated { writes: 2 });
        assert_eq!(delete["gracePeriodSeconds"], json!(0));
        assert_eq!(delete["preconditions"]["uid"], json!("pod-uid"));
        assert_eq!(status["status"]["phase"], json!("Failed"));
        assert_eq!(
            status["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
            json!(REASON_CONTAINER_STATUS_UNKNOWN)
        );

        // Without a finalizer the apiserver answers with a Status: the pod is gone, nothing more to write.
        let (outcome, ()) = tokio::join!(finalize_tenant_pod(&ctx, &tenant, &tenant_pod), async {
            tenants.expect("DELETE", DELETE).await.ok(
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": "web"}}),
            );
        });
        assert_eq!(outcome.expect("finalized"), Outcome::Deleted);

        // Finished (grace 0, ended): no request at all, however often the pod is looked at again.
        let mut finished = bound_pod(json!({"phase": "Failed"}));
        finished.metadata.deletion_grace_period_seconds = Some(0);
        put(&mut caches.pods, from_json(serde_json::to_value(&finished).expect("pod")));
        let tenant_pod = tenant
            .stores
            .pods
            .get(&kube::runtime::reflector::ObjectRef::new("web").within("shop"))
            .expect("cached");
        assert_eq!(
            finalize_tenant_pod(&ctx, &tenant, &tenant_pod).await.expect("finalized"),
            Outcome::InSync
        );
        supers.idle().await;
        tenants.idle().await;
    }
}
