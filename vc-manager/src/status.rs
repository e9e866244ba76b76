//! VirtualCluster status: readiness of the control-plane StatefulSets, the phase and conditions derived
//! from it, and the server-side-apply patch that writes only the fields vc-manager owns (the syncer's
//! `TenantSynced` condition is left alone).

use crds::{
    ClusterPhase, VirtualCluster,
    wellknown::{CONDITION_PAUSED, CONDITION_READY},
};
use k8s_openapi::{
    api::apps::v1::StatefulSet,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::Resource;

use crate::component::Component;

pub use crds::wellknown::{ADOPTED_CONDITIONS, NATIVE_CONDITIONS};

/// The conditions vc-manager owns for this VirtualCluster's mode.
pub fn owned_conditions(vc: &VirtualCluster) -> &'static [&'static str] {
    match vc.adoption() {
        Some(_) => &ADOPTED_CONDITIONS,
        None => &NATIVE_CONDITIONS,
    }
}

/// Reason of the `Paused` phase and condition.
pub const REASON_PAUSED: &str = "Paused";

/// The `Paused` condition vc-manager writes: True while `spec.paused` is set, False ("Resumed") once a
/// paused tenant was resumed, none for a tenant that was never paused (so nothing changes for those). Its
/// transition time says since when the tenant is paused, or runs again.
pub fn paused_condition(vc: &VirtualCluster) -> Option<ConditionState> {
    if vc.spec.paused {
        return Some(ConditionState::met(
            CONDITION_PAUSED,
            REASON_PAUSED,
            "spec.paused is true: the tenant's pods are removed from the super cluster and nothing in the tenant is deleted",
        ));
    }
    let was_paused = vc
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == CONDITION_PAUSED));
    was_paused.then(|| {
        ConditionState::unmet(
            CONDITION_PAUSED,
            "Resumed",
            "spec.paused is false: the tenant runs again",
        )
    })
}

/// Phase, reason and message of a paused provisioned tenant, from its components.
pub fn paused_phase(components: &[(Component, ComponentState)]) -> (ClusterPhase, String, String) {
    let stopping: Vec<String> = components
        .iter()
        .filter(|(_, s)| matches!(s, ComponentState::Observed { ready, .. } if *ready > 0))
        .map(|(c, _)| c.to_string())
        .collect();
    if stopping.is_empty() {
        return (
            ClusterPhase::Paused,
            REASON_PAUSED.to_owned(),
            "spec.paused is true: the control plane is scaled to zero (volumes, PKI and Services kept)"
                .to_owned(),
        );
    }
    (
        ClusterPhase::Paused,
        "Pausing".to_owned(),
        format!(
            "spec.paused is true: scaling the control plane to zero; still running: {}",
            stopping.join(", ")
        ),
    )
}

/// A condition to write, before timestamps are filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionState {
    /// `PKIReady`, `EtcdReady`, ...
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

impl ConditionState {
    /// A condition that holds.
    pub fn met(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "True",
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    /// A condition that does not hold.
    pub fn unmet(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "False",
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    /// A condition not evaluated yet.
    pub fn unknown(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: "Unknown",
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    /// Whether it holds.
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }

    fn from_existing(condition: &Condition, type_: &'static str) -> Self {
        let status = match condition.status.as_str() {
            "True" => "True",
            "False" => "False",
            _ => "Unknown",
        };
        Self {
            type_,
            status,
            reason: condition.reason.clone(),
            message: condition.message.clone(),
        }
    }
}

/// How far a control-plane StatefulSet is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ComponentState {
    /// Not created yet: waiting for the component before it.
    Waiting {
        /// The component waited for.
        on: Component,
    },
    /// Running; `ready` of `desired` replicas are ready; `rolling` while a new template rolls out.
    Observed {
        /// Ready replicas.
        ready: i32,
        /// Desired replicas.
        desired: i32,
        /// Replicas on the current template.
        updated: i32,
        /// A template change is not rolled out yet.
        rolling: bool,
    },
}

impl ComponentState {
    /// The state of a StatefulSet from its status.
    pub fn of(sts: &StatefulSet) -> Self {
        let desired = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let status = sts.status.clone().unwrap_or_default();
        let ready = status.ready_replicas.unwrap_or(0);
        let updated = status.updated_replicas.unwrap_or(0);
        let generation = sts.meta().generation.unwrap_or(0);
        let observed = status.observed_generation.unwrap_or(0);
        let on_delete = sts
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|u| u.type_.as_deref())
            == Some("OnDelete");
        // With OnDelete, pods change only when someone deletes them; nothing rolls on its own.
        let revision_pending = !on_delete
            && (updated < desired
                || status
                    .update_revision
                    .as_ref()
                    .is_some_and(|u| status.current_revision.as_ref() != Some(u)));
        Self::Observed {
            ready,
            desired,
            updated,
            rolling: observed < generation || revision_pending,
        }
    }

    /// Every desired replica is ready.
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Observed { ready, desired, .. } if ready >= desired)
    }

    /// A new template is rolling out.
    pub fn is_rolling(&self) -> bool {
        matches!(self, Self::Observed { rolling: true, .. })
    }

    /// The component's condition.
    pub fn condition(&self, component: Component) -> ConditionState {
        let type_ = component.condition();
        match *self {
            Self::Waiting { on } => ConditionState::unmet(
                type_,
                &format!("WaitingFor{}", on.camel()),
                format!("{component} starts once {on} is ready"),
            ),
            Self::Observed {
                ready,
                desired,
                updated,
                rolling,
            } => {
                let replicas = format!("{ready}/{desired} replicas ready");
                match (ready >= desired, rolling) {
                    (true, false) => ConditionState::met(type_, "StatefulSetReady", replicas),
                    (true, true) => ConditionState::met(
                        type_,
                        "RollingOut",
                        format!("{replicas}, {updated}/{desired} on the new template"),
                    ),
                    (false, true) => ConditionState::unmet(
                        type_,
                        "RollingOut",
                        format!("{replicas}, {updated}/{desired} on the new template"),
                    ),
                    (false, false) => ConditionState::unmet(type_, "StatefulSetNotReady", replicas),
                }
            }
        }
    }
}

/// The status vc-manager writes.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredStatus {
    /// Phase.
    pub phase: ClusterPhase,
    /// Reason of the phase.
    pub reason: String,
    /// Message of the phase.
    pub message: String,
    /// The root namespace.
    pub cluster_namespace: String,
    /// How the control plane is run; written once and kept (see [`crds::VirtualCluster::mode`]).
    pub mode: crds::ControlPlaneMode,
    /// vc-manager's conditions, all of them (a condition left out would be removed by server-side apply).
    pub conditions: Vec<ConditionState>,
    /// The generation this status describes.
    pub observed_generation: Option<i64>,
}

/// Phase, reason and message of a provisioned tenant from its components, in start order.
pub fn native_phase(
    previous: Option<ClusterPhase>,
    components: &[(Component, ComponentState)],
) -> (ClusterPhase, String, String) {
    let was_running = matches!(previous, Some(ClusterPhase::Running | ClusterPhase::Updating));
    let rolling: Vec<String> = components
        .iter()
        .filter(|(_, s)| s.is_rolling())
        .map(|(c, _)| c.to_string())
        .collect();
    let not_ready = components.iter().find(|(_, s)| !s.is_ready());
    match (not_ready, rolling.is_empty()) {
        (None, true) => (
            ClusterPhase::Running,
            "TenantControlPlaneRunning".into(),
            "etcd, apiserver and controller-manager are ready".into(),
        ),
        (None, false) => (
            if was_running {
                ClusterPhase::Updating
            } else {
                ClusterPhase::Pending
            },
            "RollingOut".into(),
            format!("rolling out {}", rolling.join(", ")),
        ),
        (Some((component, state)), _) => {
            let condition = state.condition(*component);
            (
                if was_running {
                    ClusterPhase::Updating
                } else {
                    ClusterPhase::Pending
                },
                condition.reason,
                format!("{component}: {}", condition.message),
            )
        }
    }
}

/// Phase, reason and message of a provisioned tenant whose StatefulSets are ready but whose apiserver did
/// not answer: not Running yet (a tenant that ran before keeps its phase while it is checked again).
pub fn apiserver_silent(
    previous: Option<ClusterPhase>,
    reason: &str,
    message: &str,
) -> (ClusterPhase, String, String) {
    let phase = match previous {
        Some(phase @ (ClusterPhase::Running | ClusterPhase::Updating)) => phase,
        _ => ClusterPhase::Pending,
    };
    (
        phase,
        format!("APIServer{}", reason.trim_start_matches("APIServer")),
        format!("the control plane's StatefulSets are ready but its apiserver does not answer: {message}"),
    )
}

/// The `Ready` condition of a provisioned tenant.
pub fn native_ready(
    phase: ClusterPhase,
    reason: &str,
    message: &str,
    components: &[(Component, ComponentState)],
) -> ConditionState {
    if components.iter().all(|(_, s)| s.is_ready()) {
        let reason = if phase == ClusterPhase::Running {
            "TenantControlPlaneRunning"
        } else {
            reason
        };
        ConditionState::met(CONDITION_READY, reason, message)
    } else {
        ConditionState::unmet(CONDITION_READY, reason, message)
    }
}

/// vc-manager's conditions as they are now on the object (missing ones as `Unknown`).
pub fn current_conditions(vc: &VirtualCluster) -> Vec<ConditionState> {
    let existing = vc
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    owned_conditions(vc)
        .iter()
        .map(|type_| {
            existing
                .iter()
                .find(|c| c.type_ == *type_)
                .map(|c| ConditionState::from_existing(c, type_))
                .unwrap_or_else(|| ConditionState::unknown(type_, "Reconciling", "not evaluated yet"))
        })
        .collect()
}

/// Conditions a reconcile established before it failed (the steps that succeeded), so that the failure
/// status reports them rather than their previous values.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    settled: Vec<ConditionState>,
}

impl Progress {
    /// Records the outcome of a step.
    pub fn settle(&mut self, condition: ConditionState) {
        self.settled.retain(|c| c.type_ != condition.type_);
        self.settled.push(condition);
    }

    /// The recorded outcomes.
    pub fn settled(&self) -> &[ConditionState] {
        &self.settled
    }
}

/// The status after a failed reconcile: steps that succeeded report their outcome; the failed step's
/// condition turns False unless it holds already (a working component stays reported as working); `Ready`
/// turns False and the phase `Error` only when the tenant is not running (nor being updated after it ran),
/// or when the failure makes the tenant unusable.
pub fn failed(
    vc: &VirtualCluster,
    cluster_namespace: &str,
    error: &crate::Error,
    progress: &Progress,
) -> DesiredStatus {
    let reason = error.reason().to_owned();
    let message = error.full_message();
    let mut conditions = current_conditions(vc);
    let ready_before = conditions
        .iter()
        .any(|c| c.type_ == CONDITION_READY && c.is_true());
    for condition in &mut conditions {
        if let Some(settled) = progress.settled().iter().find(|s| s.type_ == condition.type_) {
            *condition = settled.clone();
        }
    }
    let unusable = error.tenant_unusable();
    for condition in &mut conditions {
        let failed_step = condition.type_ == error.condition();
        let is_ready = condition.type_ == CONDITION_READY;
        if (failed_step && (!condition.is_true() || unusable)) || (is_ready && (!ready_before || unusable)) {
            *condition = ConditionState::unmet(condition.type_, &reason, message.clone());
        }
    }
    conditions.extend(paused_condition(vc));
    let previous = vc.phase();
    let phase = match previous {
        // An update in progress is not an error either: its components were not all ready when it failed.
        Some(phase @ (ClusterPhase::Running | ClusterPhase::Updating))
            if !unusable && (ready_before || phase == ClusterPhase::Updating) =>
        {
            phase
        }
        _ => ClusterPhase::Error,
    };
    let status = vc.status.clone().unwrap_or_default();
    DesiredStatus {
        phase,
        reason,
        message,
        cluster_namespace: cluster_namespace.to_owned(),
        mode: vc.mode(),
        conditions,
        observed_generation: status.observed_generation,
    }
}

impl DesiredStatus {
    /// Whether writing it would change the object (timestamps aside).
    pub fn differs_from(&self, vc: &VirtualCluster) -> bool {
        let Some(status) = vc.status.as_ref() else {
            return true;
        };
        if status.phase != Some(self.phase)
            || status.reason.as_deref() != Some(self.reason.as_str())
            || status.message.as_deref() != Some(self.message.as_str())
            || status.cluster_namespace.as_deref() != Some(self.cluster_namespace.as_str())
            || status.mode != Some(self.mode)
            || status.observed_generation != self.observed_generation
        {
            return true;
        }
        let generation = vc.meta().generation;
        self.conditions.iter().any(|want| {
            !status.conditions.iter().any(|have| {
                have.type_ == want.type_
                    && have.status == want.status
                    && have.reason == want.reason
                    && have.message == want.message
                    && have.observed_generation == generation
            })
        })
    }

    /// The conditions with timestamps: a condition keeps its last transition time while its status stays.
    pub fn conditions_at(&self, vc: &VirtualCluster, now: Timestamp) -> Vec<Condition> {
        let existing = vc
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        self.conditions
            .iter()
            .map(|c| {
                let last_transition_time = existing
                    .iter()
                    .find(|e| e.type_ == c.type_ && e.status == c.status)
                    .map(|e| e.last_transition_time.clone())
                    .unwrap_or(Time(now));
                Condition {
                    type_: c.type_.to_owned(),
                    status: c.status.to_owned(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    observed_generation: vc.meta().generation,
                    last_transition_time,
                }
            })
            .collect()
    }

    /// The server-side-apply body for the status subresource.
    pub fn patch(&self, vc: &VirtualCluster, now: Timestamp) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1",
            "kind": "VirtualCluster",
            "metadata": {
                "name": vc.meta().name,
                "namespace": vc.meta().namespace,
            },
            "status": {
                "phase": self.phase,
                "reason": self.reason,
                "message": self.message,
                "clusterNamespace": self.cluster_namespace,
                "mode": self.mode,
                "observedGeneration": self.observed_generation,
                "conditions": self.conditions_at(vc, now),
            }
        })
    }

    /// Conditions that changed status compared with the object: `(new state, whether it held before)`.
    pub fn transitions(&self, vc: &VirtualCluster) -> Vec<(ConditionState, bool)> {
        let before = current_conditions(vc);
        self.conditions
            .iter()
            .filter_map(|c| {
                let old = before.iter().find(|b| b.type_ == c.type_)?;
                (old.status != c.status).then(|| (c.clone(), old.is_true()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crds::{
        VirtualClusterSpec, VirtualClusterStatus,
        wellknown::{CONDITION_APISERVER_READY, CONDITION_ETCD_READY, CONDITION_PKI_READY},
    };
    use k8s_openapi::api::apps::v1::{StatefulSetSpec, StatefulSetStatus};

    use super::*;

    fn sts(replicas: i32, ready: i32, updated: i32, generation: i64, observed: i64) -> StatefulSet {
        StatefulSet {
            metadata: kube::api::ObjectMeta {
                generation: Some(generation),
                ..Default::default()
            },
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: Some(StatefulSetStatus {
                replicas,
                ready_replicas: Some(ready),
                updated_replicas: Some(updated),
                observed_generation: Some(observed),
                current_revision: Some("r1".into()),
                update_revision: Some(if updated >= replicas { "r1" } else { "r2" }.into()),
                ..Default::default()
            }),
        }
    }

    fn vc_with(phase: Option<ClusterPhase>, conditions: Vec<Condition>) -> VirtualCluster {
        let mut vc = VirtualCluster::new(
            "vc",
            VirtualClusterSpec {
                cluster_version_name: Some("cv".into()),
                ..Default::default()
            },
        );
        vc.metadata.namespace = Some("team".into());
        vc.metadata.generation = Some(3);
        vc.status = Some(VirtualClusterStatus {
            phase,
            conditions,
            observed_generation: Some(2),
            ..Default::default()
        });
        vc
    }

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: "m".into(),
            observed_generation: Some(3),
            last_transition_time: Time(Timestamp::from_second(1_000).expect("time")),
        }
    }

    #[test]
    fn statefulset_readiness() {
        assert!(ComponentState::of(&sts(3, 3, 3, 2, 2)).is_ready());
        assert!(!ComponentState::of(&sts(3, 3, 3, 2, 2)).is_rolling());
        assert!(!ComponentState::of(&sts(3, 2, 3, 2, 2)).is_ready());
        // Not observed yet: rolling.
        assert!(ComponentState::of(&sts(1, 1, 1, 3, 2)).is_rolling());
        // Some replicas on the old template.
        let rolling = ComponentState::of(&sts(3, 3, 1, 2, 2));
        assert!(rolling.is_ready() && rolling.is_rolling());
        assert_eq!(
            rolling.condition(Component::Etcd),
            ConditionState::met(
                CONDITION_ETCD_READY,
                "RollingOut",
                "3/3 replicas ready, 1/3 on the new template"
            )
        );
        assert_eq!(
            ComponentState::of(&sts(1, 0, 1, 1, 1)).condition(Component::ApiServer),
            ConditionState::unmet(
                CONDITION_APISERVER_READY,
                "StatefulSetNotReady",
                "0/1 replicas ready"
            )
        );
        // A fresh StatefulSet without status.
        let mut fresh = sts(1, 0, 0, 1, 0);
        fresh.status = None;
        assert!(!ComponentState::of(&fresh).is_ready());
        // OnDelete: an old template is not "rolling".
        let mut on_delete = sts(1, 1, 0, 2, 2);
        on_delete.spec.as_mut().expect("spec").update_strategy =
            Some(k8s_openapi::api::apps::v1::StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                ..Default::default()
            });
        assert!(!ComponentState::of(&on_delete).is_rolling());
    }

    #[test]
    fn a_paused_tenant_is_pausing_until_no_component_runs() {
        let stopping = [
            (Component::Etcd, ComponentState::of(&sts(0, 0, 0, 2, 2))),
            (Component::ApiServer, ComponentState::of(&sts(0, 1, 0, 2, 2))),
        ];
        let (phase, reason, message) = paused_phase(&stopping);
        assert_eq!(
            (phase, reason.as_str(), message.as_str()),
            (
                ClusterPhase::Paused,
                "Pausing",
                "spec.paused is true: scaling the control plane to zero; still running: apiserver"
            )
        );
        let stopped = [(Component::Etcd, ComponentState::of(&sts(0, 0, 0, 2, 2)))];
        assert_eq!(paused_phase(&stopped).1, REASON_PAUSED);
    }

    #[test]
    fn the_paused_condition_appears_with_a_pause_and_stays_after_it() {
        let mut vc = vc_with(Some(ClusterPhase::Running), vec![]);
        assert_eq!(paused_condition(&vc), None);
        vc.spec.paused = true;
        let paused = paused_condition(&vc).expect("paused");
        assert!(paused.is_true() && paused.reason == REASON_PAUSED, "{paused:?}");
        vc.spec.paused = false;
        vc.status.as_mut().expect("status").conditions = vec![condition(CONDITION_PAUSED, "True")];
        let resumed = paused_condition(&vc).expect("resumed");
        assert_eq!((resumed.status, resumed.reason.as_str()), ("False", "Resumed"));
    }

    #[test]
    fn a_silent_apiserver_keeps_a_new_tenant_pending() {
        let (phase, reason, message) = apiserver_silent(None, "APIServerUnreachable", "connection refused");
        assert_eq!(phase, ClusterPhase::Pending);
        assert_eq!(reason, "APIServerUnreachable");
        assert!(message.contains("connection refused"), "{message}");
        let (phase, reason, _) = apiserver_silent(Some(ClusterPhase::Running), "Unauthorized", "401");
        assert_eq!(phase, ClusterPhase::Running);
        assert_eq!(reason, "APIServerUnauthorized");
    }

    #[test]
    fn phase_follows_the_components() {
        let ready = ComponentState::of(&sts(1, 1, 1, 1, 1));
        let waiting = ComponentState::Waiting { on: Component::Etcd };
        let starting = ComponentState::of(&sts(1, 0, 1, 1, 1));
        let all_ready = [
            (Component::Etcd, ready.clone()),
            (Component::ApiServer, ready.clone()),
            (Component::ControllerManager, ready.clone()),
        ];
        assert_eq!(native_phase(None, &all_ready).0, ClusterPhase::Running);
        let provisioning = [
            (Component::Etcd, starting.clone()),
            (Component::ApiServer, waiting.clone()),
            (
                Component::ControllerManager,
                ComponentState::Waiting {
                    on: Component::ApiServer,
                },
            ),
        ];
        let (phase, reason, message) = native_phase(Some(ClusterPhase::Pending), &provisioning);
        assert_eq!(phase, ClusterPhase::Pending);
        assert_eq!(reason, "StatefulSetNotReady");
        assert_eq!(message, "etcd: 0/1 replicas ready");
        assert_eq!(
            provisioning[1].1.condition(Component::ApiServer),
            ConditionState::unmet(
                CONDITION_APISERVER_READY,
                "WaitingForEtcd",
                "apiserver starts once etcd is ready"
            )
        );
        // After having run, the same state is an update.
        assert_eq!(
            native_phase(Some(ClusterPhase::Running), &provisioning).0,
            ClusterPhase::Updating
        );
        let rolling = [
            (Component::Etcd, ready.clone()),
            (Component::ApiServer, ComponentState::of(&sts(1, 1, 1, 2, 1))),
            (Component::ControllerManager, ready),
        ];
        let (phase, reason, message) = native_phase(Some(ClusterPhase::Running), &rolling);
        assert_eq!(
            (phase, reason.as_str(), message.as_str()),
            (ClusterPhase::Updating, "RollingOut", "rolling out apiserver")
        );
        let ready_condition = native_ready(phase, &reason, &message, &rolling);
        assert!(ready_condition.is_true());
        assert_eq!(ready_condition.reason, "RollingOut");
    }

    #[test]
    fn failures_keep_a_running_tenant_running() {
        let running = vc_with(
            Some(ClusterPhase::Running),
            NATIVE_CONDITIONS.iter().map(|t| condition(t, "True")).collect(),
        );
        let error = crate::Error::ClusterVersionInvalid {
            name: "cv".into(),
            problem: "the etcd StatefulSet has no spec".into(),
        };
        let status = failed(&running, "ns", &error, &Progress::default());
        assert_eq!(status.phase, ClusterPhase::Running);
        assert_eq!(status.reason, "ClusterVersionInvalid");
        assert!(status.message.contains("has no spec"));
        assert!(status.conditions.iter().all(ConditionState::is_true));
        assert_eq!(status.observed_generation, Some(2));
    }

    #[test]
    fn failures_keep_an_update_in_progress_updating() {
        let mut conditions: Vec<_> = NATIVE_CONDITIONS.iter().map(|t| condition(t, "True")).collect();
        for c in &mut conditions {
            if c.type_ == CONDITION_APISERVER_READY || c.type_ == CONDITION_READY {
                c.status = "False".into();
            }
        }
        let updating = vc_with(Some(ClusterPhase::Updating), conditions);
        let error = crate::Error::ClusterVersionNotFound { name: "cv".into() };
        let status = failed(&updating, "ns", &error, &Progress::default());
        assert_eq!(status.phase, ClusterPhase::Updating);
        assert_eq!(status.reason, "ClusterVersionNotFound");
        // A tenant that has not run yet still turns to Error.
        let pending = vc_with(Some(ClusterPhase::Pending), vec![]);
        assert_eq!(
            failed(&pending, "ns", &error, &Progress::default()).phase,
            ClusterPhase::Error
        );
    }

    #[test]
    fn failures_of_a_pending_tenant_name_the_step() {
        let pending = vc_with(
            Some(ClusterPhase::Pending),
            vec![condition(CONDITION_PKI_READY, "True")],
        );
        let error = crate::Error::ClusterVersionNotFound { name: "cv".into() };
        let mut progress = Progress::default();
        progress.settle(ConditionState::met(
            CONDITION_ETCD_READY,
            "StatefulSetReady",
            "1/1 replicas ready",
        ));
        let status = failed(&pending, "ns", &error, &progress);
        assert_eq!(status.phase, ClusterPhase::Error);
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .expect("Ready");
        assert_eq!(
            (ready.status, ready.reason.as_str(), ready.message.as_str()),
            (
                "False",
                "ClusterVersionNotFound",
                "ClusterVersion cv does not exist"
            )
        );
        let pki = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_PKI_READY)
            .expect("PKI");
        assert!(pki.is_true());
        let etcd = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_ETCD_READY)
            .expect("etcd");
        assert_eq!(etcd.status, "True", "a step that succeeded before the failure");
        let apiserver = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_APISERVER_READY)
            .expect("apiserver");
        assert_eq!(apiserver.status, "Unknown");
    }

    #[test]
    fn patch_writes_only_owned_fields_and_keeps_transition_times() {
        let mut vc = vc_with(
            Some(ClusterPhase::Running),
            vec![condition(CONDITION_READY, "True")],
        );
        vc.status
            .as_mut()
            .expect("status")
            .conditions
            .push(condition("TenantSynced", "True"));
        let status = DesiredStatus {
            phase: ClusterPhase::Running,
            reason: "TenantControlPlaneRunning".into(),
            message: "ok".into(),
            cluster_namespace: "ns".into(),
            mode: crds::ControlPlaneMode::Provisioned,
            conditions: vec![
                ConditionState::met(CONDITION_READY, "TenantControlPlaneRunning", "ok"),
                ConditionState::met(CONDITION_PKI_READY, "CertificatesValid", "ok"),
            ],
            observed_generation: Some(3),
        };
        let now = Timestamp::from_second(2_000).expect("time");
        let patch = status.patch(&vc, now);
        let conditions = patch["status"]["conditions"].as_array().expect("conditions");
        assert_eq!(
            conditions.len(),
            2,
            "the syncer's condition is not part of the patch"
        );
        assert_eq!(conditions[0]["lastTransitionTime"], "1970-01-01T00:16:40Z");
        assert_eq!(conditions[1]["lastTransitionTime"], "1970-01-01T00:33:20Z");
        assert_eq!(conditions[0]["observedGeneration"], 3);
        assert_eq!(patch["status"]["phase"], "Running");
        assert_eq!(patch["status"]["mode"], "Provisioned");
        assert_eq!(patch["status"]["observedGeneration"], 3);
        assert_eq!(patch["metadata"]["namespace"], "team");
        assert!(status.differs_from(&vc));
        let transitions = status.transitions(&vc);
        assert_eq!(transitions.len(), 1);
        assert_eq!(transitions[0].0.type_, CONDITION_PKI_READY);
        assert!(!transitions[0].1);
    }

    #[test]
    fn an_identical_status_is_not_written_again() {
        let mut vc = vc_with(None, vec![]);
        let status = DesiredStatus {
            phase: ClusterPhase::Pending,
            reason: "StatefulSetNotReady".into(),
            message: "etcd: 0/1 replicas ready".into(),
            cluster_namespace: "ns".into(),
            mode: crds::ControlPlaneMode::Provisioned,
            conditions: vec![ConditionState::unmet(
                CONDITION_READY,
                "StatefulSetNotReady",
                "etcd: 0/1 replicas ready",
            )],
            observed_generation: Some(3),
        };
        let now = Timestamp::from_second(2_000).expect("time");
        vc.status = Some(VirtualClusterStatus {
            phase: Some(ClusterPhase::Pending),
            reason: Some(status.reason.clone()),
            message: Some(status.message.clone()),
            cluster_namespace: Some("ns".into()),
            conditions: status.conditions_at(&vc, now),
            observed_generation: Some(3),
            mode: Some(crds::ControlPlaneMode::Provisioned),
            usage: None,
            snapshots: None,
            attach_backoff: None,
        });
        assert!(!status.differs_from(&vc));
    }
}
