//! The supervisors: one task per VirtualCluster, started, fed and stopped as the VirtualCluster watch
//! says, each following its tenant through its lifecycle — attached, checked, waiting, paused, held back by
//! the journal, owned by another replica, backing off after failures (apart by cause) — and reporting
//! where it stands.

use std::{collections::HashMap, sync::Arc, time::Duration};

use crds::VirtualCluster;
use futures::{Stream, StreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Resource, ResourceExt,
    runtime::{events::Recorder, watcher},
};
use tokio::{sync::watch, task::JoinHandle};
use vc_runtime::backoff::Backoff;

use super::{
    attempt::{JournalEntry, REASON_QUEUED, attach_or_check},
    cleanup::{clean_up, detach, remove_paused_pods},
    connect::REASON_RESPONSE_TOO_LARGE,
    eligibility::{REASON_TENANT_PAUSED, eligible, identity_of},
    report::{limited_settings, recorder, report, report_limits},
};
use crate::{
    engine::{budget::REASON_LIMIT_EXCEEDED, context::Context},
    tenancy::metrics::StateLabels,
    tenancy::tenant::Tenant,
};

const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// How often a tenant attached again after a detach for its cache limits is looked at until it is ready.
const LIMIT_RECHECK: Duration = Duration::from_millis(500);

/// Why attaching a tenant failed, as far as its retries go: each cause backs off on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Failing {
    Unreachable,
    OverLimit,
}

/// How soon a paused tenant's super pods are looked at again while some are still there.
const PAUSED_RECHECK: Duration = Duration::from_secs(2);

fn set_state(ctx: &Context, state: &'static str, delta: i64) {
    ctx.metrics
        .tenancy
        .tenants
        .get_or_create(&StateLabels { state })
        .inc_by(delta);
}

struct Supervised {
    updates: watch::Sender<Arc<VirtualCluster>>,
    task: JoinHandle<()>,
    cluster_key: Option<String>,
}

/// Follows every VirtualCluster: one supervisor each, detaching and cleaning up when one is deleted.
pub async fn supervise<S>(ctx: Arc<Context>, events: S)
where
    S: Stream<Item = Result<watcher::Event<VirtualCluster>, watcher::Error>>,
{
    let recorder = Arc::new(recorder(&ctx));
    let mut supervised: HashMap<String, Supervised> = HashMap::new();
    let mut listed: Vec<String> = Vec::new();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(vc)) => {
                listed.push(vc.uid().unwrap_or_default());
                upsert(&ctx, &recorder, &mut supervised, vc);
            }
            Ok(watcher::Event::InitDone) => {
                let gone: Vec<String> = supervised
                    .keys()
                    .filter(|uid| !listed.contains(uid))
                    .cloned()
                    .collect();
                for uid in gone {
                    remove(&ctx, &mut supervised, &uid).await;
                }
            }
            Ok(watcher::Event::Apply(vc)) => upsert(&ctx, &recorder, &mut supervised, vc),
            Ok(watcher::Event::Delete(vc)) => {
                remove(&ctx, &mut supervised, &vc.uid().unwrap_or_default()).await
            }
            Err(error) => tracing::debug!(%error, "VirtualCluster watch interrupted; retrying"),
        }
    }
}

fn upsert(
    ctx: &Arc<Context>,
    recorder: &Arc<Recorder>,
    supervised: &mut HashMap<String, Supervised>,
    vc: VirtualCluster,
) {
    let Some(uid) = vc.uid() else { return };
    let cluster_key = crds::naming::cluster_key_of(&vc);
    let vc = Arc::new(vc);
    match supervised.get_mut(&uid) {
        Some(entry) => {
            entry.cluster_key = cluster_key;
            let _ = entry.updates.send(vc);
        }
        None => {
            let (updates, receiver) = watch::channel(vc);
            let task = tokio::spawn(supervise_one(ctx.clone(), recorder.clone(), receiver));
            supervised.insert(
                uid,
                Supervised {
                    updates,
                    task,
                    cluster_key,
                },
            );
        }
    }
}

async fn remove(ctx: &Arc<Context>, supervised: &mut HashMap<String, Supervised>, uid: &str) {
    let Some(entry) = supervised.remove(uid) else {
        return;
    };
    entry.task.abort();
    if let Some(key) = entry.cluster_key {
        detach(ctx, &key);
        // Sharded: the replica that held the tenant removes its namespaces when it sees the VirtualCluster
        // gone (see `shards::handover::balance`), and the cluster-wide patrol catches what a dead one left.
        if ctx.shards.is_none() {
            clean_up(ctx, &key).await;
        }
    }
}

/// Follows one VirtualCluster for as long as it exists.
async fn supervise_one(
    ctx: Arc<Context>,
    recorder: Arc<Recorder>,
    mut updates: watch::Receiver<Arc<VirtualCluster>>,
) {
    let mut attached: Option<(Arc<Tenant>, String)> = None;
    // Failed attempts in a row, apart by cause. Detaches for the cache limits back off until the tenant
    // fits, even though each attempt attaches (only a full listing within the limits shows that it fits).
    let retry = Backoff::<Failing>::new(RETRY_MIN, RETRY_MAX);
    let mut state: Option<&'static str> = None;
    // Sharded: which tenants this replica holds changes under the supervisor's feet.
    let mut ownership = ctx.ownership_changes();
    let mut enter = |ctx: &Context, new: Option<&'static str>| {
        if state != new {
            if let Some(old) = state {
                set_state(ctx, old, -1);
            }
            if let Some(new) = new {
                set_state(ctx, new, 1);
            }
            state = new;
        }
    };
    loop {
        let vc = updates.borrow_and_update().clone();
        let Some(identity) = identity_of(&vc) else {
            if updates.changed().await.is_err() {
                break;
            }
            continue;
        };
        // Detached meanwhile (handed over to another replica): nothing of it is attached here any more.
        if attached.as_ref().is_some_and(|(tenant, _)| {
            ctx.tenants
                .get(&identity.cluster_key)
                .is_none_or(|current| !Arc::ptr_eq(&current, tenant))
        }) {
            attached = None;
        }
        let owned = ctx.owns(&identity.cluster_key);
        let wait = if !owned {
            // Another replica syncs it (or will, once it takes the Lease): nothing is attached, reported or
            // removed from here.
            if attached.take().is_some() {
                detach(&ctx, &identity.cluster_key);
            }
            enter(&ctx, Some("elsewhere"));
            None
        } else if vc.spec.paused && vc.meta().deletion_timestamp.is_none() {
            // Paused: stop watching (a provisioned apiserver is going away) and remove the super pods; the
            // super Services and every other copy stay, so resuming gets the same cluster IPs back.
            if attached.take().is_some() {
                detach(&ctx, &identity.cluster_key);
            }
            enter(&ctx, Some("paused"));
            let remaining = remove_paused_pods(&ctx, &identity.cluster_key).await;
            report(
                &ctx,
                &recorder,
                &vc,
                false,
                REASON_TENANT_PAUSED,
                "spec.paused is true: the tenant's pods are removed from the super cluster and not recreated until it is resumed; nothing in the tenant is deleted",
            )
            .await;
            (remaining > 0).then_some(PAUSED_RECHECK)
        } else if !eligible(&vc, attached.is_some()) {
            if attached.take().is_some() {
                detach(&ctx, &identity.cluster_key);
            }
            enter(&ctx, Some("waiting"));
            None
        } else {
            // A syncer process that stopped while attaching it holds it back (for any replica).
            let judged = match (&ctx.journal, attached.is_some()) {
                (Some(journal), false) => {
                    Some(crate::tenancy::journal::stops::judge(&ctx, journal, &recorder, &vc).await)
                }
                _ => None,
            };
            if let Some((crate::tenancy::journal::Standing::HeldBack { until }, Some(record))) = judged {
                // A syncer process stopped while attaching it: not attached (by any replica) before `until`.
                enter(&ctx, Some("held_back"));
                report(
                    &ctx,
                    &recorder,
                    &vc,
                    false,
                    crate::tenancy::journal::REASON_TENANT_HELD_BACK,
                    &crate::tenancy::journal::stop_message(&record),
                )
                .await;
                let wait = until.duration_since(Timestamp::now());
                Some(
                    Duration::try_from(wait)
                        .unwrap_or_default()
                        .max(Duration::from_secs(1)),
                )
            } else {
                let kind = match judged {
                    Some((crate::tenancy::journal::Standing::Attach(kind), _)) => kind,
                    _ => crate::tenancy::journal::kind_of(&vc),
                };
                let recovering = retry.failures(&Failing::Unreachable) > 0;
                let (settings, limited) = limited_settings(&ctx, &vc);
                let mut ticket = None;
                let journal = ctx.journal.as_ref().map(|journal| JournalEntry {
                    journal,
                    kind,
                    interrupt: updates.clone(),
                    ticket: &mut ticket,
                });
                // After the attempt: the first attach pins the tenant's identity with a resourceVersion-pinned
                // patch of the VirtualCluster, which a status write just before would make conflict.
                let attempt =
                    attach_or_check(&ctx, &vc, &identity, &mut attached, recovering, settings, journal).await;
                if let (Some(ticket), Some((tenant, _))) = (ticket, attached.as_ref()) {
                    // In the journal until it has listed and stayed attached for the probation.
                    crate::tenancy::journal::stops::probation(ctx.clone(), tenant.clone(), ticket);
                }
                if ctx.owns(&identity.cluster_key) {
                    report_limits(&ctx, &recorder, &vc, &limited).await;
                }
                match attempt {
                    Err(failed) if failed.reason == REASON_QUEUED => {
                        // The VirtualCluster changed while the tenant waited for its turn: looked at again.
                        None
                    }
                    Ok(_)
                        if retry.failures(&Failing::OverLimit) > 0
                            && !attached.as_ref().is_some_and(|(tenant, _)| tenant.is_ready()) =>
                    {
                        // Attached again after a detach for the cache limits, still listing: the condition keeps
                        // saying why it was detached until the tenant shows that it fits.
                        Some(LIMIT_RECHECK)
                    }
                    Ok(version) => {
                        enter(&ctx, Some("attached"));
                        retry.reset(&Failing::Unreachable);
                        retry.reset(&Failing::OverLimit);
                        report(
                            &ctx,
                            &recorder,
                            &vc,
                            true,
                            "TenantAttached",
                            &format!("syncing with the tenant apiserver ({version})"),
                        )
                        .await;
                        Some(ctx.config.tenant_health_period)
                    }
                    Err(_) if !ctx.owns(&identity.cluster_key) => {
                        // Handed over while attaching: the new owner reports.
                        enter(&ctx, Some("elsewhere"));
                        None
                    }
                    Err(failed) => {
                        let over_limit = failed.reason == REASON_LIMIT_EXCEEDED
                            || failed.reason == REASON_RESPONSE_TOO_LARGE;
                        enter(&ctx, Some(if over_limit { "over_limit" } else { "unreachable" }));
                        let wait = retry.failed(&if over_limit {
                            Failing::OverLimit
                        } else {
                            Failing::Unreachable
                        });
                        tracing::warn!(vc = %identity.vc_ref(), reason = failed.reason, message = %failed.message, retry_in_s = wait.as_secs(), "tenant not synced");
                        report(&ctx, &recorder, &vc, false, failed.reason, &failed.message).await;
                        Some(wait)
                    }
                }
            }
        };
        // A tenant that goes over its cache limits is detached at once, not at the next health check.
        let over_limit = {
            let budgets = attached
                .as_ref()
                .map(|(tenant, _)| (tenant.budget.clone(), tenant.responses.clone()));
            async move {
                match budgets {
                    Some((cache, responses)) => tokio::select! {
                        () = cache.wait_exceeded() => {}
                        _ = responses.wait_exceeded() => {}
                    },
                    None => std::future::pending().await,
                }
            }
        };
        // Wakes only when this tenant's ownership changed since the look above, not on every other
        // tenant's handover.
        let owner_changed = async {
            match ownership.as_mut() {
                Some(ownership) => loop {
                    if ownership.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    if ctx.owns(&identity.cluster_key) != owned {
                        break;
                    }
                },
                None => std::future::pending().await,
            }
        };
        let changed = match wait {
            Some(wait) => tokio::select! {
                changed = updates.changed() => changed,
                _ = tokio::time::sleep(wait) => Ok(()),
                _ = over_limit => Ok(()),
                () = owner_changed => Ok(()),
            },
            None => tokio::select! {
                changed = updates.changed() => changed,
                () = owner_changed => Ok(()),
            },
        };
        if changed.is_err() {
            break;
        }
    }
    enter(&ctx, None);
}
