//! `--wait`: following a VirtualCluster through a watch, printing one line per change of its phase or a
//! condition, until it is Running, fails, is gone, or time runs out.

use std::{collections::BTreeMap, ops::ControlFlow, time::Duration};

use crds::{
    ClusterPhase, VirtualCluster,
    wellknown::{
        CONDITION_APISERVER_READY, CONDITION_CONTROLLER_MANAGER_READY, CONDITION_ETCD_READY,
        CONDITION_PKI_READY, CONDITION_READY,
    },
};
use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, ResourceExt,
    api::{WatchEvent, WatchParams},
};

use crate::{Error, Result, Streams, table};

/// Condition types in the order they come true while a control plane starts.
const ORDER: [&str; 5] = [
    CONDITION_PKI_READY,
    CONDITION_ETCD_READY,
    CONDITION_APISERVER_READY,
    CONDITION_CONTROLLER_MANAGER_READY,
    CONDITION_READY,
];

/// A condition as the progress lines show it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConditionView {
    /// `True`, `False`, `Unknown`.
    pub status: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// What the progress lines compare between two versions of a VirtualCluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Phase.
    pub phase: Option<String>,
    /// Reason of the phase.
    pub reason: Option<String>,
    /// Message of the phase.
    pub message: Option<String>,
    /// Conditions by type.
    pub conditions: BTreeMap<String, ConditionView>,
}

fn rank(type_: &str) -> usize {
    ORDER.iter().position(|t| *t == type_).unwrap_or(ORDER.len())
}

impl Snapshot {
    /// The snapshot of a VirtualCluster.
    pub fn of(vc: &VirtualCluster) -> Self {
        let status = vc.status.clone().unwrap_or_default();
        Self {
            phase: status.phase.map(|p| p.to_string()),
            reason: status.reason.filter(|r| !r.is_empty()),
            message: status.message.filter(|m| !m.is_empty()),
            conditions: status
                .conditions
                .into_iter()
                .map(|c| {
                    (
                        c.type_,
                        ConditionView {
                            status: c.status,
                            reason: c.reason,
                            message: c.message,
                        },
                    )
                })
                .collect(),
        }
    }

    /// `phase Pending: WaitingForEtcd: etcd starts once ...` (`no status yet` before vc-manager wrote one).
    pub fn phase_line(&self) -> String {
        let Some(phase) = &self.phase else {
            return "no status yet (is vc-manager running?)".into();
        };
        let mut line = format!("phase {phase}");
        for part in [&self.reason, &self.message].into_iter().flatten() {
            line.push_str(": ");
            line.push_str(part);
        }
        table::truncate(&line, 300)
    }
}

fn condition_line(type_: &str, c: &ConditionView) -> String {
    let mut line = format!("{type_}={}", c.status);
    if !c.reason.is_empty() {
        line.push(' ');
        line.push_str(&c.reason);
    }
    if !c.message.is_empty() {
        line.push_str(": ");
        line.push_str(&c.message);
    }
    table::truncate(&line, 300)
}

/// The lines that describe the change from `before` to `after`: the phase (with reason and message) when
/// any of them changed, then each new or changed condition, in start order.
pub fn changes(before: Option<&Snapshot>, after: &Snapshot) -> Vec<String> {
    let empty = Snapshot::default();
    let before_ = before.unwrap_or(&empty);
    let mut lines = Vec::new();
    if before.is_none()
        || (&before_.phase, &before_.reason, &before_.message)
            != (&after.phase, &after.reason, &after.message)
    {
        lines.push(after.phase_line());
    }
    let mut changed: Vec<(&String, &ConditionView)> = after
        .conditions
        .iter()
        .filter(|(type_, c)| before_.conditions.get(*type_) != Some(*c))
        .collect();
    changed.sort_by_key(|(type_, _)| (rank(type_), type_.to_string()));
    lines.extend(changed.into_iter().map(|(t, c)| condition_line(t, c)));
    lines
}

/// Where a VirtualCluster being waited for stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not there yet.
    Waiting,
    /// Running, with a status for the generation waited for.
    Running,
    /// Failed: phase `Error` for the generation waited for.
    Failed {
        /// `Ready=False`, or `phase Error` without a matching condition.
        condition: String,
        /// Reason.
        reason: String,
        /// Message.
        message: String,
    },
}

/// The outcome of `vc` for `generation` (the generation the apply produced): Running counts once
/// `status.observedGeneration` has reached it; Error once vc-manager's conditions describe it (its
/// failures leave `observedGeneration` alone), so a stale status from before the apply is not taken.
pub fn outcome(vc: &VirtualCluster, generation: Option<i64>) -> Outcome {
    let Some(status) = &vc.status else {
        return Outcome::Waiting;
    };
    let reached = |observed: Option<i64>| match (generation, observed) {
        (Some(wanted), Some(seen)) => seen >= wanted,
        (Some(_), None) => false,
        (None, _) => true,
    };
    match status.phase {
        Some(ClusterPhase::Running) if status.observed_generation.is_none_or(|g| reached(Some(g))) => {
            Outcome::Running
        }
        Some(ClusterPhase::Error) => {
            let current = status
                .conditions
                .iter()
                .filter(|c| ORDER.contains(&c.type_.as_str()))
                .any(|c| reached(c.observed_generation));
            if !current {
                return Outcome::Waiting;
            }
            let reason = status.reason.clone().unwrap_or_default();
            let mut failing: Vec<_> = status
                .conditions
                .iter()
                .filter(|c| c.status == "False" && ORDER.contains(&c.type_.as_str()))
                .collect();
            failing.sort_by_key(|c| (c.reason != reason, rank(&c.type_)));
            match failing.first() {
                Some(c) => Outcome::Failed {
                    condition: format!("{}={}", c.type_, c.status),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                },
                None => Outcome::Failed {
                    condition: "phase Error".into(),
                    reason,
                    message: status.message.clone().unwrap_or_default(),
                },
            }
        }
        _ => Outcome::Waiting,
    }
}

fn transient(error: &kube::Error) -> bool {
    !matches!(error, kube::Error::Api(_))
}

/// Follows VirtualCluster `name` of `api` with a watch, calling `step` with its current version (`None`
/// once it is gone) at the start and after every change, until `step` breaks. API errors (forbidden...)
/// end it; connection errors are retried every second.
pub async fn follow<T>(
    api: &Api<VirtualCluster>,
    name: &str,
    mut step: impl FnMut(Option<&VirtualCluster>) -> Result<ControlFlow<T>> + Send,
) -> Result<T> {
    let vc_ref = format!("{}/{name}", api.namespace().unwrap_or_default());
    loop {
        let current = match api.get_opt(name).await {
            Ok(current) => current,
            Err(error) if transient(&error) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(error) => return Err(Error::api(format!("reading VirtualCluster {vc_ref}"), error)),
        };
        if let ControlFlow::Break(done) = step(current.as_ref())? {
            return Ok(done);
        }
        let Some(version) = current.as_ref().and_then(|vc| vc.resource_version()) else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let mut events = match api.watch(&params, &version).await {
            Ok(events) => events.boxed(),
            Err(error) if transient(&error) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(error) => return Err(Error::api(format!("watching VirtualCluster {vc_ref}"), error)),
        };
        loop {
            let event = match events.try_next().await {
                Ok(Some(event)) => event,
                // The watch timed out or the connection dropped: read the object again and watch anew.
                Ok(None) => break,
                Err(error) if transient(&error) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    break;
                }
                Err(error) => return Err(Error::api(format!("watching VirtualCluster {vc_ref}"), error)),
            };
            let flow = match event {
                WatchEvent::Added(vc) | WatchEvent::Modified(vc) => step(Some(&vc))?,
                WatchEvent::Deleted(_) => step(None)?,
                WatchEvent::Bookmark(_) => ControlFlow::Continue(()),
                // 410 Gone: the version is too old; start over.
                WatchEvent::Error(status) if status.code == 410 => break,
                WatchEvent::Error(status) => {
                    return Err(Error::api(
                        format!("watching VirtualCluster {vc_ref}"),
                        kube::Error::Api(status),
                    ));
                }
            };
            if let ControlFlow::Break(done) = flow {
                return Ok(done);
            }
        }
    }
}

/// Waits until VirtualCluster `name` of `api` is Running for `generation`, showing each change as progress
/// (`<namespace>/<name>: <change>`) and, with `report`, the result as a line on stdout; returns the
/// VirtualCluster as last seen. Fails when it reports phase Error, disappears, or `timeout` passes.
pub async fn wait_running(
    api: &Api<VirtualCluster>,
    name: &str,
    generation: Option<i64>,
    timeout: Duration,
    total: Duration,
    io: &mut Streams<'_>,
    report: bool,
) -> Result<VirtualCluster> {
    let vc_ref = format!("{}/{name}", api.namespace().unwrap_or_default());
    let mut last: Option<Snapshot> = None;
    let started = tokio::time::Instant::now();
    let followed = tokio::time::timeout(
        timeout,
        follow(api, name, |vc| {
            let Some(vc) = vc else {
                return Err(Error::Vanished { vc: vc_ref.clone() });
            };
            let snapshot = Snapshot::of(vc);
            for line in changes(last.as_ref(), &snapshot) {
                io.progress(&format!("{vc_ref}: {line}"))?;
            }
            last = Some(snapshot);
            Ok(match outcome(vc, generation) {
                Outcome::Waiting => ControlFlow::Continue(()),
                Outcome::Running => ControlFlow::Break(Ok(vc.clone())),
                Outcome::Failed {
                    condition,
                    reason,
                    message,
                } => ControlFlow::Break(Err(Error::Failed {
                    vc: vc_ref.clone(),
                    condition,
                    reason,
                    message,
                })),
            })
        }),
    )
    .await;
    match followed {
        Ok(Ok(Ok(vc))) => {
            if report {
                io.result(&format!(
                    "{vc_ref} is Running ({} after applying)",
                    crate::duration::age(started.elapsed().as_secs() as i64)
                ))?;
            }
            Ok(vc)
        }
        Ok(Ok(Err(failed))) | Ok(Err(failed)) => Err(failed),
        Err(_) => Err(Error::Timeout {
            what: format!("VirtualCluster {vc_ref} to be Running"),
            after: total,
            last: last.map_or_else(|| "nothing".into(), |s| s.phase_line()),
        }),
    }
}

/// Waits until VirtualCluster `name` with `uid` is gone from `api` (another object of that name counts as
/// gone), showing the finalizers it still waits for as progress whenever they change and, with `report`,
/// the result as a line on stdout.
pub async fn wait_deleted(
    api: &Api<VirtualCluster>,
    name: &str,
    uid: Option<String>,
    timeout: Duration,
    io: &mut Streams<'_>,
    report: bool,
) -> Result<()> {
    let vc_ref = format!("{}/{name}", api.namespace().unwrap_or_default());
    let mut last: Option<Vec<String>> = None;
    let followed = tokio::time::timeout(
        timeout,
        follow(api, name, |vc| {
            let Some(vc) = vc.filter(|vc| uid.is_none() || vc.uid() == uid) else {
                return Ok(ControlFlow::Break(()));
            };
            let finalizers = vc.finalizers().to_vec();
            if last.as_ref() != Some(&finalizers) {
                if finalizers.is_empty() {
                    io.progress(&format!(
                        "{vc_ref}: no finalizers left; waiting for the apiserver to remove it"
                    ))?;
                } else {
                    io.progress(&format!(
                        "{vc_ref}: waiting for finalizers {} (vc-manager deletes the tenant's namespaces first)",
                        finalizers.join(", ")
                    ))?;
                }
                last = Some(finalizers);
            }
            Ok(ControlFlow::Continue(()))
        }),
    )
    .await;
    match followed {
        Ok(result) => {
            result?;
            if report {
                io.result(&format!("{vc_ref} is gone"))?;
            }
            Ok(())
        }
        Err(_) => Err(Error::Timeout {
            what: format!("VirtualCluster {vc_ref} to be deleted"),
            after: timeout,
            last: match last {
                Some(finalizers) if !finalizers.is_empty() => format!(
                    "finalizers {} still set (is vc-manager running? `kubectl vc describe {name}` shows its events)",
                    finalizers.join(", ")
                ),
                _ => "still present".into(),
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        apimachinery::pkg::apis::meta::v1::{Condition, Time},
        jiff::Timestamp,
    };

    use super::*;

    fn condition(type_: &str, status: &str, reason: &str, message: &str, generation: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(generation),
            last_transition_time: Time(Timestamp::from_second(1_700_000_000).expect("time")),
        }
    }

    fn vc(
        phase: Option<ClusterPhase>,
        reason: &str,
        conditions: Vec<Condition>,
        observed: Option<i64>,
    ) -> VirtualCluster {
        let mut vc = VirtualCluster::new("vc-1", Default::default());
        vc.metadata.generation = Some(2);
        vc.status = Some(crds::VirtualClusterStatus {
            phase,
            reason: Some(reason.into()),
            message: Some(format!("{reason} message")),
            conditions,
            observed_generation: observed,
            ..Default::default()
        });
        vc
    }

    #[test]
    fn each_change_is_one_line() {
        let pending = Snapshot::of(&vc(
            Some(ClusterPhase::Pending),
            "WaitingForEtcd",
            vec![
                condition(
                    "EtcdReady",
                    "False",
                    "StatefulSetNotReady",
                    "0/1 replicas ready",
                    2,
                ),
                condition("PKIReady", "True", "CertificatesValid", "12 Secrets", 2),
            ],
            None,
        ));
        assert_eq!(
            changes(None, &pending),
            [
                "phase Pending: WaitingForEtcd: WaitingForEtcd message",
                "PKIReady=True CertificatesValid: 12 Secrets",
                "EtcdReady=False StatefulSetNotReady: 0/1 replicas ready",
            ]
        );
        assert!(changes(Some(&pending), &pending).is_empty());
        let mut etcd_ready = pending.clone();
        etcd_ready.conditions.insert(
            "EtcdReady".into(),
            ConditionView {
                status: "True".into(),
                reason: "StatefulSetReady".into(),
                message: "1/1 replicas ready".into(),
            },
        );
        assert_eq!(
            changes(Some(&pending), &etcd_ready),
            ["EtcdReady=True StatefulSetReady: 1/1 replicas ready"]
        );
        assert_eq!(
            Snapshot::default().phase_line(),
            "no status yet (is vc-manager running?)"
        );
    }

    #[test]
    fn running_counts_once_the_applied_generation_is_observed() {
        let running = vc(
            Some(ClusterPhase::Running),
            "TenantControlPlaneRunning",
            vec![],
            Some(1),
        );
        assert_eq!(outcome(&running, Some(2)), Outcome::Waiting);
        assert_eq!(outcome(&running, Some(1)), Outcome::Running);
        assert_eq!(outcome(&running, None), Outcome::Running);
        let pending = vc(Some(ClusterPhase::Pending), "WaitingForEtcd", vec![], None);
        assert_eq!(outcome(&pending, Some(1)), Outcome::Waiting);
        assert_eq!(
            outcome(&VirtualCluster::new("x", Default::default()), Some(1)),
            Outcome::Waiting
        );
    }

    #[test]
    fn errors_name_the_failing_condition_unless_they_are_stale() {
        let failed = vc(
            Some(ClusterPhase::Error),
            "ClusterVersionNotFound",
            vec![
                condition("PKIReady", "Unknown", "Reconciling", "not evaluated yet", 2),
                condition(
                    "Ready",
                    "False",
                    "ClusterVersionNotFound",
                    "ClusterVersion cv does not exist",
                    2,
                ),
                condition("EtcdReady", "False", "WaitingForEtcd", "x", 2),
            ],
            None,
        );
        assert_eq!(
            outcome(&failed, Some(2)),
            Outcome::Failed {
                condition: "Ready=False".into(),
                reason: "ClusterVersionNotFound".into(),
                message: "ClusterVersion cv does not exist".into(),
            }
        );
        // The same status written for generation 2 says nothing about generation 3 yet.
        assert_eq!(outcome(&failed, Some(3)), Outcome::Waiting);
        let bare = vc(
            Some(ClusterPhase::Error),
            "MissingIdentity",
            vec![condition("Ready", "True", "x", "y", 2)],
            None,
        );
        assert_eq!(
            outcome(&bare, Some(2)),
            Outcome::Failed {
                condition: "phase Error".into(),
                reason: "MissingIdentity".into(),
                message: "MissingIdentity message".into(),
            }
        );
    }
}
