//! `kubectl vc pause` and `resume`: set or clear a VirtualCluster's `spec.paused` (a merge patch under
//! kubectl-vc's field manager) and, with `--wait`, follow it until it is paused or Running again.

use std::{ops::ControlFlow, time::Duration};

use crds::{
    ClusterPhase, VirtualCluster,
    wellknown::{CONDITION_PAUSED, CONDITION_TENANT_SYNCED},
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::{
    Error, Result, Streams,
    args::PauseArgs,
    manifest::{FIELD_MANAGER, Kind},
    output,
    progress::{self, Snapshot},
};

/// The patch that pauses (`spec.paused: true`) or resumes (the field removed, as in a VirtualCluster that
/// was never paused) a VirtualCluster.
pub fn patch(pause: bool) -> serde_json::Value {
    json!({ "spec": { "paused": if pause { json!(true) } else { serde_json::Value::Null } } })
}

/// Whether a paused VirtualCluster has got there for `generation`: vc-manager says `Paused` (its control
/// plane at zero), and the syncer, if it ever synced the tenant, says it removed its pods.
pub fn is_paused(vc: &VirtualCluster, generation: Option<i64>) -> bool {
    let Some(status) = &vc.status else {
        return false;
    };
    let find = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let current =
        find(CONDITION_PAUSED).is_some_and(|c| c.status == "True" && c.observed_generation >= generation);
    status.phase == Some(ClusterPhase::Paused)
        && status.reason.as_deref() == Some("Paused")
        && current
        && find(CONDITION_TENANT_SYNCED).is_none_or(|c| c.reason == "TenantPaused")
}

/// `kubectl vc pause` (`pause`) and `kubectl vc resume`.
pub async fn command(
    client: &Client,
    namespace: &str,
    args: &PauseArgs,
    pause: bool,
    io: &mut Streams<'_>,
) -> Result<()> {
    let api: Api<VirtualCluster> = Api::namespaced(client.clone(), namespace);
    let name = args.name.as_str();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    let verb = if pause { "paused" } else { "resumed" };
    let patched = api
        .patch(name, &params, &Patch::Merge(patch(pause)))
        .await
        .map_err(|error| match &error {
            kube::Error::Api(status) if status.code == 404 => Error::NotFound {
                kind: "VirtualCluster",
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            },
            _ => Error::api(
                format!("setting spec.paused of VirtualCluster {namespace}/{name}"),
                error,
            ),
        })?;
    let report = args.output.output.is_none();
    if report {
        io.result(&format!("{} {name:?} {verb}", Kind::VirtualCluster.resource()))?;
    }
    let generation = patched.meta().generation;
    let last = match (args.wait, pause) {
        (false, _) => patched,
        (true, true) => wait_paused(&api, name, generation, args.timeout, io, report).await?,
        (true, false) => {
            progress::wait_running(&api, name, generation, args.timeout, args.timeout, io, report).await?
        }
    };
    if let Some(format) = args.output.output {
        let value = output::without_managed_fields(&last)?;
        io.out
            .write_all(output::serialize(&value, format, "the VirtualCluster")?.as_bytes())?;
    }
    Ok(())
}

/// Waits until VirtualCluster `name` is paused for `generation` (see [`is_paused`]), showing each change
/// as progress and, with `report`, the result on stdout; returns it as last seen.
async fn wait_paused(
    api: &Api<VirtualCluster>,
    name: &str,
    generation: Option<i64>,
    timeout: Duration,
    io: &mut Streams<'_>,
    report: bool,
) -> Result<VirtualCluster> {
    let vc_ref = format!("{}/{name}", api.namespace().unwrap_or_default());
    let mut last: Option<Snapshot> = None;
    let started = tokio::time::Instant::now();
    let followed = tokio::time::timeout(
        timeout,
        progress::follow(api, name, |vc| {
            let Some(vc) = vc else {
                return Err(Error::Vanished { vc: vc_ref.clone() });
            };
            let snapshot = Snapshot::of(vc);
            for line in progress::changes(last.as_ref(), &snapshot) {
                io.progress(&format!("{vc_ref}: {line}"))?;
            }
            last = Some(snapshot);
            Ok(match is_paused(vc, generation) {
                true => ControlFlow::Break(vc.clone()),
                false => ControlFlow::Continue(()),
            })
        }),
    )
    .await;
    match followed {
        Ok(Ok(vc)) => {
            if report {
                io.result(&format!(
                    "{vc_ref} is Paused ({} after the patch)",
                    crate::duration::age(started.elapsed().as_secs() as i64)
                ))?;
            }
            Ok(vc)
        }
        Ok(Err(failed)) => Err(failed),
        Err(_) => Err(Error::Timeout {
            what: format!("VirtualCluster {vc_ref} to be Paused"),
            after: timeout,
            last: last.map_or_else(|| "nothing".into(), |s| s.phase_line()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(3),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn vc(reason: &str, conditions: Vec<Condition>) -> VirtualCluster {
        let mut vc = VirtualCluster::new("vc-1", Default::default());
        vc.status = Some(crds::VirtualClusterStatus {
            phase: Some(ClusterPhase::Paused),
            reason: Some(reason.into()),
            conditions,
            ..Default::default()
        });
        vc
    }

    #[test]
    fn pausing_sets_the_field_and_resuming_removes_it() {
        assert_eq!(patch(true), json!({"spec": {"paused": true}}));
        assert_eq!(patch(false), json!({"spec": {"paused": null}}));
    }

    #[test]
    fn paused_means_control_plane_at_zero_and_pods_removed_for_this_generation() {
        let paused = condition(CONDITION_PAUSED, "True", "Paused");
        let synced = condition(CONDITION_TENANT_SYNCED, "False", "TenantPaused");
        assert!(is_paused(
            &vc("Paused", vec![paused.clone(), synced.clone()]),
            Some(3)
        ));
        // Never synced (the syncer has nothing to remove).
        assert!(is_paused(&vc("Paused", vec![paused.clone()]), Some(3)));
        // Still scaling down; the syncer has not got there; a status of an older generation.
        assert!(!is_paused(
            &vc("Pausing", vec![paused.clone(), synced.clone()]),
            Some(3)
        ));
        let attached = condition(CONDITION_TENANT_SYNCED, "True", "TenantAttached");
        assert!(!is_paused(&vc("Paused", vec![paused.clone(), attached]), Some(3)));
        assert!(!is_paused(&vc("Paused", vec![paused, synced]), Some(4)));
        assert!(!is_paused(&VirtualCluster::new("vc-1", Default::default()), None));
    }
}
